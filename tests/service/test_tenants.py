"""Tenants and tokens through the service (what the CLI and the API call), on both backends."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pydantic import ValidationError

from broker.config import Settings
from broker.errors import NotFoundError
from broker.models import Role, TenantCreate, TenantPatch, TokenCreate
from broker.service import Lockstep
from broker.store import Store


@pytest.fixture
async def svc(store: Store) -> AsyncIterator[Lockstep]:
    yield Lockstep(Settings(db_url=store.url), providers={}, store=store)


async def test_tenant_caps_and_who_may_read_them(svc: Lockstep) -> None:
    made = await svc.create_tenant(TenantCreate(name="acme", monthly_budget_usd=100.0, max_gpus=8))
    assert (made.monthly_budget_usd, made.max_gpus) == (100.0, 8)
    patched = await svc.update_tenant("acme", TenantPatch(max_gpus=None))  # given: cleared
    assert (patched.monthly_budget_usd, patched.max_gpus) == (100.0, None)
    untouched = await svc.update_tenant("acme", TenantPatch())  # nothing given: nothing changes
    assert untouched.monthly_budget_usd == 100.0
    assert (await svc.get_tenant("acme", scope="acme")).name == "acme"
    with pytest.raises(NotFoundError, match="tenant acme not found"):
        await svc.get_tenant("acme", scope="globex")  # another tenant's caps are not a user's business
    assert [t.name for t in await svc.list_tenants()] == ["acme"]


async def test_tokens_verify_until_revoked(svc: Lockstep) -> None:
    info, plaintext = await svc.create_token(TokenCreate(tenant="globex", role=Role.admin, label="ci"))
    assert (await svc.verify_token(plaintext)) == info
    assert [t.id for t in await svc.list_tokens("globex")] == [info.id]
    await svc.revoke_token(info.id)
    assert await svc.verify_token(plaintext) is None
    with pytest.raises(NotFoundError):
        await svc.revoke_token("tok_nope")


def test_the_rules_live_in_the_request_models() -> None:
    for bad in ({"name": "no spaces"}, {"name": "ok", "monthly_budget_usd": -1}, {"name": "ok", "max_gpus": True},
                {"name": "ok", "colour": "red"}):
        with pytest.raises(ValidationError):
            TenantCreate.model_validate(bad)
    with pytest.raises(ValidationError):
        TenantPatch.model_validate({"monthly_budget_usd": True})  # JSON true is not a number
    with pytest.raises(ValidationError):
        TokenCreate(tenant="acme", label="x" * 257)
