"""Is a running attempt's in-job wrapper still alive? The lifecycle's question at each poll (issue 27).

The wrapper beats every ``heartbeat_s`` from its main loop (docs/runtime.md); a market that carries the beats
(:class:`~providers.capabilities.HasHeartbeat`) answers when each node's last one came, and
:func:`~providers.runtime.logs.wrapper_silent` is the rule. Only a wrapper that has beaten and then stopped is
silent here: one that never beat (an allocation launched before wrappers beat, a market without them, a
wrapper still in its rendezvous) is left to ``max_duration`` and the market's own end.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

from broker.errors import ProviderError
from broker.models import Allocation, as_utc
from providers.base import Provider
from providers.capabilities import HasHeartbeat
from providers.runtime.logs import wrapper_silent
from providers.runtime.manifest import HEARTBEAT_S

log = logging.getLogger(__name__)

POLL_ALLOWANCE_S = 15.0  # two polls at the broker's default 5 s, and a margin for a slow store


async def wrapper_silence(provider: Provider | None, alloc: Allocation, now: datetime, *,
                          heartbeat_s: float = HEARTBEAT_S, poll_interval_s: float = POLL_ALLOWANCE_S) -> str:
    """Why ``alloc`` must be released because a node's wrapper went silent; '' while every node beats (or the
    market carries no heartbeat, or none has arrived yet)."""
    since = alloc.attrs.get("running_since")
    if not isinstance(provider, HasHeartbeat) or not since:
        return ""
    try:
        beats = await asyncio.gather(*(provider.heartbeat(alloc, rank=r) for r in range(max(1, alloc.nodes))))
    except ProviderError as exc:  # an unreadable heartbeat decides nothing; the next poll reads again
        log.info("heartbeat of %s not read: %s", alloc.id, exc)
        return ""
    for rank, beat in enumerate(beats):
        if beat is not None and wrapper_silent(beat, as_utc(since), now, heartbeat_s=heartbeat_s,
                                               poll_interval_s=poll_interval_s):
            return (f"the wrapper on node {rank} went silent (last heartbeat {beat.isoformat()}): "
                    f"the machine is released and the job requeued")
    return ""
