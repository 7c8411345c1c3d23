"""The API servers and the clean environment of tests/spec, for the views tested here (`lockstep gpus`)."""

from tests.spec.conftest import clean_env, postgres_server, server, sqlite_server  # noqa: F401
