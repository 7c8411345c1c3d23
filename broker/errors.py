"""One exception hierarchy for all of Lockstep.

    LockstepError
    ├── SpecError             bad user input (a field and a reason) → CLI exit 2, HTTP 422
    ├── NotFoundError         → HTTP 404
    ├── ConflictError         → HTTP 409
    ├── NoFeasibleOption      nothing can run the job → CLI exit 3
    ├── BudgetExceeded        the tenant's caps forbid the placement (the job stays pending)
    ├── StoreError
    └── ProviderError         a market said no; subclasses tell the router what to do next
        ├── CapacityError     no capacity here now: try the next offer
        ├── QuotaError        account limit: try another provider, not this one again soon
        ├── ProviderAuthError credentials refused: do not retry
        ├── TransientError    throttled / 5xx / timeout: retry with backoff
        └── BadRequestError   the request itself is wrong: do not retry

Messages never carry secrets: adapters build them from status codes and the
provider's own error codes, never from request headers.
"""

from __future__ import annotations


class LockstepError(Exception):
    """Base of every error Lockstep raises on purpose."""


class SpecError(LockstepError):
    """Bad input: names the field and the reason; ``errors`` has every (field, reason) when there are several."""

    def __init__(self, field: str, reason: str, errors: list[tuple[str, str]] | None = None) -> None:
        self.errors = errors or [(field, reason)]
        self.field = field
        self.reason = reason
        text = "; ".join(f"{f}: {r}" if f else r for f, r in self.errors)
        # What follows the first field's name: the reason, then the other fields' errors.
        self.detail = text[len(field) + 2:] if field else text
        super().__init__(text)


class NotFoundError(LockstepError):
    pass


class ConflictError(LockstepError):
    pass


class NoFeasibleOption(LockstepError):
    def __init__(self, message: str, reasons: dict[str, int] | None = None) -> None:
        self.reasons = reasons or {}
        super().__init__(message)


class BudgetExceeded(LockstepError):
    pass


class StoreError(LockstepError):
    pass


class ProviderError(LockstepError):
    """A provider call failed. ``retryable`` tells generic code whether to retry."""

    retryable = False

    def __init__(self, provider: str, message: str, code: str = "") -> None:
        self.provider = provider
        self.code = code
        super().__init__(f"{provider}: {message}" + (f" [{code}]" if code else ""))


class CapacityError(ProviderError):
    """This offer cannot be had now (no capacity, ask gone, price too low): try the next one."""


class QuotaError(ProviderError):
    """An account limit was hit: other offers of this provider will fail too."""


class ProviderAuthError(ProviderError):
    """Credentials missing or refused: retrying will not help."""


class TransientError(ProviderError):
    """Throttling, 5xx, timeouts: retry with bounded exponential backoff and jitter."""

    retryable = True


class BadRequestError(ProviderError):
    """The provider rejected the request as malformed or unsupported."""
