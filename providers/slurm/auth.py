"""slurmrestd's JWT: where the token comes from, when it is read again, and why it is checked before use."""

from __future__ import annotations

import base64
import binascii
import json
import os
import time
from collections.abc import Generator

import httpx

from broker.errors import ProviderAuthError
from providers.slurm.config import SlurmConfig

PROVIDER = "slurm"


class TokenAuth(httpx.Auth):
    """``X-SLURM-USER-TOKEN`` on every request, from ``slurm.token`` or ``slurm.token_file``.

    Slurm JWTs are short-lived; a sidecar (or cron running ``scontrol token``) rewrites the
    file before they expire. The file is read again whenever it is a different file or its
    change time, modification time or size differ (a rename into place, a rewrite), and once
    more before giving up on a token that has expired or that slurmrestd answers 401 to, so a
    rotated token is used from the next request on, without a restart. Every token is
    checked before it is sent (:func:`check_token`).
    """

    def __init__(self, config: SlurmConfig) -> None:
        self.config = config
        # (file identity, token) replaced as one value: threads sharing a provider never pair them wrongly.
        self._cache: tuple[tuple[int, ...], str] | None = None

    def current(self, reread: bool = False) -> str:
        if self.config.token is not None:
            return self.config.token.get_secret_value()
        path = self.config.token_file
        if not path:
            raise ProviderAuthError(
                PROVIDER, "no token configured (slurm.token, slurm.token_file or LOCKSTEP_SLURM_TOKEN)"
            )
        try:
            st = os.stat(path)
            ident = (st.st_dev, st.st_ino, st.st_ctime_ns, st.st_mtime_ns, st.st_size)
            cache = self._cache
            if reread or cache is None or cache[0] != ident:
                with open(path, encoding="utf-8") as fh:
                    cache = self._cache = (ident, fh.read().strip())
        except OSError as exc:
            raise ProviderAuthError(PROVIDER, f"cannot read token_file ({exc.strerror})") from None
        except UnicodeDecodeError:  # its repr would carry the file's bytes: the token
            raise ProviderAuthError(PROVIDER, "token_file is not UTF-8 text") from None
        if not cache[1]:
            raise ProviderAuthError(PROVIDER, "token_file is empty")
        return cache[1]

    def _checked(self, reread: bool = False) -> str:
        token = self.current(reread)
        try:
            check_token(token, time.time())
        except ProviderAuthError:
            if reread or self.config.token is not None:
                raise
            return self._checked(reread=True)  # rotated within the same stat tick: look once more
        return token

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        token = self._checked()
        request.headers["X-SLURM-USER-TOKEN"] = token
        response = yield request
        if response.status_code == 401 and self.config.token is None:
            fresh = self._checked(reread=True)
            if fresh != token:
                request.headers["X-SLURM-USER-TOKEN"] = fresh
                yield request


def check_token(token: str, now: float) -> None:
    """Refuse a token that is not a JWT or has expired, before sending it.

    slurmrestd passes the token through to slurmctld, which answers a bad one
    with a bare "Unspecified error" (HTTP 500): without this check a stale
    token would look like a struggling daemon and be retried.
    """
    parts = token.split(".")
    if len(parts) != 3:
        raise ProviderAuthError(PROVIDER, "token is not a JWT (make one with `scontrol token`)")
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error):
        raise ProviderAuthError(PROVIDER, "token is not a JWT (make one with `scontrol token`)") from None
    exp = payload.get("exp") if isinstance(payload, dict) else None
    if isinstance(exp, int | float) and exp < now:
        raise ProviderAuthError(PROVIDER, f"token expired {int(now - exp)} s ago (make one with `scontrol token`)")
