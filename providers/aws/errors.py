"""EC2 errors → the broker.errors hierarchy.

Messages are built from the operation name, the HTTP status and EC2's error
code only: never from headers or the request (which carry the signature).
"""

from __future__ import annotations

import asyncio

import aiohttp
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)
from botocore.parsers import ResponseParserError

from broker.errors import (
    BadRequestError,
    CapacityError,
    ProviderAuthError,
    ProviderError,
    QuotaError,
    TransientError,
)

CAPACITY_CODES: frozenset[str] = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientCapacityOnHost",
        "InsufficientCapacity",
        "SpotMaxPriceTooLow",
        "MaxSpotInstanceCountExceeded",
        "Unsupported",  # this type is not sold in this AZ: try the next AZ or type
        "ReservationCapacityExceeded",
    }
)
QUOTA_CODES: frozenset[str] = frozenset(
    {"InstanceLimitExceeded", "VcpuLimitExceeded", "PlacementGroupLimitExceeded", "ResourceLimitExceeded"}
)
AUTH_CODES: frozenset[str] = frozenset(
    {
        "AuthFailure",
        "UnauthorizedOperation",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "OptInRequired",
        "Blocked",
        "ExpiredToken",
        "RequestExpired",
        "AccessDenied",
    }
)
TRANSIENT_CODES: frozenset[str] = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "Unavailable",
        "RequestTimeout",
    }
)

def error_code(exc: BaseException) -> str:
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def map_error(exc: BaseException, provider: str, operation: str) -> ProviderError:
    """One EC2/botocore failure → Capacity-, Quota-, ProviderAuth-, Transient- or BadRequestError."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, ClientError):
        code = error_code(exc)
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        msg = f"{operation} failed (HTTP {status})"
        # EC2's own message helps users ("no p4d capacity in us-east-1a"); auth messages can carry
        # encoded policy details, so those keep only the code.
        detail = str(exc.response.get("Error", {}).get("Message", ""))[:200]
        if detail and code not in AUTH_CODES:
            msg = f"{msg}: {detail}"
        if code in CAPACITY_CODES:
            return CapacityError(provider, msg, code)
        if code in QUOTA_CODES:
            return QuotaError(provider, msg, code)
        if code in AUTH_CODES:
            return ProviderAuthError(provider, msg, code)
        if code in TRANSIENT_CODES or status >= 500 or status == 429:
            return TransientError(provider, msg, code)
        return BadRequestError(provider, msg, code)
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return ProviderAuthError(provider, f"{operation}: no usable AWS credentials", type(exc).__name__)
    if isinstance(exc, NoRegionError):
        return BadRequestError(provider, f"{operation}: no region", "NoRegion")
    # A body that is not EC2's XML comes with a 5xx (an HTML error page from a proxy or an emulator).
    if isinstance(exc, ResponseParserError):
        return TransientError(provider, f"{operation}: unreadable response", "ResponseParserError")
    if isinstance(exc, BotoConnectionError | HTTPClientError | aiohttp.ClientError | OSError):
        return TransientError(provider, f"{operation}: connection failed", type(exc).__name__)
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return TransientError(provider, f"{operation}: timed out", "Timeout")
    if isinstance(exc, BotoCoreError):
        return BadRequestError(provider, f"{operation}: {type(exc).__name__}", type(exc).__name__)
    return TransientError(provider, f"{operation}: {type(exc).__name__}", type(exc).__name__)
