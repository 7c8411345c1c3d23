"""Tenants and API tokens: who may call, for whom, and under which caps. The CLI (on the store) and the
API (admin routes) both come here; the request models carry the rules (broker/models.py)."""

from __future__ import annotations

import logging

from broker.errors import NotFoundError
from broker.models import DEFAULT_TENANT, Tenant, TenantCreate, TenantPatch, TokenCreate, TokenInfo, month_start
from broker.service.runtime import Runtime

log = logging.getLogger(__name__)


class TenantsService(Runtime):
    # ------------------------------------------------------------------ tenants
    async def _with_spend(self, tenants: list[Tenant]) -> list[Tenant]:
        """Each tenant with its month-to-date spend (UTC calendar month): booked plus accruing, the figure
        the router's budget check uses (``Store.tenant_spend``)."""
        now = self.clock()
        since = month_start(now)

        def spend() -> list[Tenant]:
            return [t.model_copy(update={"month_to_date_usd": self.store.tenant_spend(t.name, since, now)})
                    for t in tenants]

        return await self.db(spend)

    async def create_tenant(self, body: TenantCreate) -> Tenant:
        return (await self._with_spend([await self.db(self.store.create_tenant, Tenant(**body.model_dump()))]))[0]

    async def list_tenants(self) -> list[Tenant]:
        """Every tenant; plus ``default`` (no caps) when it has no row but is all there is (local mode) or has
        spent this month: jobs submitted without a tenant belong to it."""
        listed = await self._with_spend(await self.db(self.store.list_tenants))
        if any(t.name == DEFAULT_TENANT for t in listed):
            return listed
        [implicit] = await self._with_spend([Tenant(name=DEFAULT_TENANT, created_at=min(
            (t.created_at for t in listed), default=self.clock()))])
        return [implicit, *listed] if not listed or implicit.month_to_date_usd > 0 else listed

    async def get_tenant(self, name: str, scope: str | None = None) -> Tenant:
        """One tenant; with ``scope`` (the caller's own tenant, for a non-admin) any other is not found:
        another tenant's caps are not a user's business."""
        if scope is not None and scope != name:
            raise NotFoundError(f"tenant {name} not found")
        return (await self._with_spend([await self.db(self.store.get_tenant, name)]))[0]

    async def update_tenant(self, name: str, patch: TenantPatch) -> Tenant:
        """Set the caps ``patch`` names (the fields it was given; None clears a cap)."""
        tenant = await self.db(self.store.update_tenant, name, **patch.model_dump(exclude_unset=True))
        return (await self._with_spend([tenant]))[0]

    # ------------------------------------------------------------------ tokens
    async def create_token(self, body: TokenCreate) -> tuple[TokenInfo, str]:
        """A new token (its tenant created if new) and its plaintext, which is never shown again."""
        info, plaintext = await self.db(self.store.create_token, body.tenant, body.role, body.label)
        log.info("token %s created for tenant %s (role %s)", info.id, info.tenant, info.role.value)
        return info, plaintext

    async def list_tokens(self, tenant: str | None = None) -> list[TokenInfo]:
        return await self.db(self.store.list_tokens, tenant)

    async def revoke_token(self, token_id: str) -> None:
        await self.db(self.store.revoke_token, token_id)
        log.info("token %s revoked", token_id)

    async def token_hashes(self) -> frozenset[str]:
        """The hashes of every live token (the API tells a valid token from a stranger's with them)."""
        return await self.db(self.store.token_hashes)

    async def verify_token(self, plaintext: str) -> TokenInfo | None:
        """The token's tenant and role, or None when it is unknown or revoked."""
        return await self.db(self.store.verify_token, plaintext)
