"""AWS EC2 (aiobotocore): spot and on-demand (provider), capacity reservations and pools (reserved).

provider · client · errors · offers · instance_types · requests · prices · reserved
"""

from providers.aws.provider import AwsProvider
from providers.aws.reserved import ReservedProvider

__all__ = ["AwsProvider", "ReservedProvider"]
