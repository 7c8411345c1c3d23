"""Running the service: is the store there (readiness)."""

from __future__ import annotations

import logging

from broker.service.runtime import Runtime

log = logging.getLogger(__name__)


class OperationsService(Runtime):
    async def store_ok(self) -> bool:
        """True when the store answers; any failure to reach it is False (and logged by its type only)."""
        try:
            return bool(await self.db(self.store.ping))
        except Exception as exc:  # any failure to reach the store means "not ready"
            log.warning("readiness: store unreachable (%s)", type(exc).__name__)
            return False
