"""Alembic migrations for the Lockstep store (run by ``Store.migrate()``)."""
