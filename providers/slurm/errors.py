"""slurmrestd answers → the broker.errors hierarchy."""

from __future__ import annotations

import providers.slurm.api as api
from broker.errors import BadRequestError, CapacityError, ProviderAuthError, TransientError

PROVIDER = "slurm"


def raise_for(status: int, errors: list[tuple[int | None, str]], what: str) -> None:
    """Map an HTTP status and Slurm's error list to the project's errors; always raises."""
    # -1 is SLURM_ERROR, "Unspecified error": it says nothing about the request, so it counts as no code.
    codes = [c for c, _ in errors if c is not None and c > 0]
    texts = "; ".join(t for _, t in errors if t)
    detail = f"{what}: HTTP {status}" + (f": {texts}" if texts else "")
    code = str(codes[0]) if codes else str(status)
    if status in (401, 403) or any(c in api.AUTH_ERRNOS for c in codes):
        raise ProviderAuthError(PROVIDER, f"{what}: HTTP {status}, credentials refused", code)
    if any(c in api.CAPACITY_ERRNOS for c in codes) or "not available" in texts.lower():
        raise CapacityError(PROVIDER, detail, code)
    if any(c in api.TRANSIENT_ERRNOS for c in codes) or status == 429:
        raise TransientError(PROVIDER, detail, code)
    if codes or 400 <= status < 500:
        raise BadRequestError(PROVIDER, detail, code)  # Slurm refused the request itself
    raise TransientError(PROVIDER, detail, code)  # 5xx without a Slurm error: the daemon is struggling
