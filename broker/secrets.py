"""A job's secrets: names in the spec, values looked up at launch from the broker's sources.

Values live only in memory, as :class:`~pydantic.SecretStr`, between the lookup and the launch
payload (docs/runtime.md): never in the store, an event, a log line, an error or a response.
Errors name the secret and the sources searched, never a value.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from pydantic import SecretStr

from broker.config import SecretsConfig
from broker.errors import SpecError
from broker.models import JobSpec
from providers.runtime.manifest import REGISTRY_PASSWORD_VAR
from providers.runtime.wrapper import MASK, MIN_SECRET_LEN

MAX_SECRET_BYTES = 64 * 1024


def env_name(prefix: str, name: str) -> str:
    """The environment variable a secret may come from: ``LOCKSTEP_SECRET_`` + ``HF-PROD`` → ``..._HF_PROD``."""
    return prefix + re.sub(r"[^A-Za-z0-9_]", "_", name).upper()


class SecretSources:
    """The configured places secrets come from, in order: named files, the secrets directory, the environment."""

    def __init__(self, config: SecretsConfig, environ: Mapping[str, str] | None = None) -> None:
        self.config = config
        self.environ = os.environ if environ is None else environ

    def where(self, name: str) -> str:
        """The sources searched for ``name``, for an error message."""
        places = []
        if name in self.config.files:
            places.append(f"secrets.files[{name}]")
        if self.config.dir:
            places.append(f"{Path(self.config.dir) / name}")
        places.append(env_name(self.config.env_prefix, name))
        return ", ".join(places)

    def _read(self, path: Path) -> str | None:
        try:
            if path.stat().st_size > MAX_SECRET_BYTES:
                return None
            return path.read_text(encoding="utf-8").rstrip("\r\n")
        except (OSError, UnicodeDecodeError):
            return None

    def lookup(self, name: str) -> SecretStr | None:
        """The value of secret ``name``, or None when no source has it."""
        if name in self.config.files:
            value = self._read(Path(self.config.files[name]).expanduser())
            if value is not None:
                return SecretStr(value)
        if self.config.dir and "/" not in name and name not in (".", ".."):
            value = self._read(Path(self.config.dir).expanduser() / name)
            if value is not None:
                return SecretStr(value)
        value = self.environ.get(env_name(self.config.env_prefix, name))
        return SecretStr(value) if value is not None else None

    def resolve(self, spec: JobSpec) -> dict[str, SecretStr]:
        """Every secret the spec needs, by the variable it goes into (the registry password included).

        A missing one is a :class:`SpecError` naming the field and where it was looked for.
        """
        out: dict[str, SecretStr] = {}
        missing: list[tuple[str, str]] = []
        for field, var, name in self._wanted(spec):
            value = self.lookup(name)
            if value is None:
                missing.append((field, f"no secret named {name!r} in the broker's sources ({self.where(name)})"))
            else:
                out[var] = value
        if missing:
            raise SpecError(*missing[0], errors=missing)
        return out

    def values(self, spec: JobSpec) -> list[str]:
        """The values of the secrets ``spec`` names that the sources have now, for masking (never raises;
        values shorter than the wrapper's minimum are left out, as the wrapper leaves them: they would mask
        ordinary words). Used in memory only, never kept."""
        found = (self.lookup(name) for _, _, name in self._wanted(spec))
        return sorted({v.get_secret_value() for v in found if v is not None and
                       len(v.get_secret_value()) >= MIN_SECRET_LEN}, key=len, reverse=True)

    @staticmethod
    def _wanted(spec: JobSpec) -> Iterable[tuple[str, str, str]]:
        """(field, variable, secret name) for every secret the spec refers to."""
        for var, name in spec.secrets.items():
            yield f"secrets.{var}", var, name
        if spec.registry is not None:
            yield "registry.password_secret", REGISTRY_PASSWORD_VAR, spec.registry.password_secret



def mask(text: str, values: Iterable[str]) -> str:
    """``text`` with every one of ``values`` replaced by the wrapper's mask (longest first)."""
    for v in sorted(values, key=len, reverse=True):
        if v:
            text = text.replace(v, MASK)
    return text
