"""Tenants and tokens: only hashes stored, revocation, tenant CRUD."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from broker.errors import ConflictError, NotFoundError
from broker.models import Role, Tenant
from broker.store import Store


def test_token_is_hashed_and_verifies(store: Store) -> None:
    info, plaintext = store.create_token("acme", Role.admin, label="ci")
    assert plaintext.startswith("lst_") and len(plaintext) > 40
    assert info.tenant == "acme" and info.role is Role.admin and not info.revoked
    assert plaintext not in repr(info)
    got = store.verify_token(plaintext)
    assert got is not None and got.id == info.id and got.role is Role.admin and got.label == "ci"
    assert store.verify_token(plaintext + "x") is None
    assert store.verify_token("") is None
    # The plaintext appears nowhere in the database.
    with store.engine.connect() as conn:
        for table in ("tokens", "tenants"):
            for row in conn.execute(sa.text(f"SELECT * FROM {table}")):
                assert all(plaintext not in str(v) for v in row)
    assert store.get_tenant("acme").name == "acme"  # created on the way


def test_revoked_token_refused(store: Store) -> None:
    info, plaintext = store.create_token("acme")
    other, other_plain = store.create_token("acme")
    store.revoke_token(info.id)
    assert store.verify_token(plaintext) is None
    assert store.verify_token(other_plain) is not None
    assert {t.id: t.revoked for t in store.list_tokens("acme")} == {info.id: True, other.id: False}
    assert store.list_tokens("globex") == []
    with pytest.raises(NotFoundError):
        store.revoke_token("tok_nope")


def test_tenants(store: Store) -> None:
    t = store.create_tenant(Tenant(name="acme", monthly_budget_usd=1000.0, max_gpus=64))
    assert t.max_gpus == 64
    with pytest.raises(ConflictError):
        store.create_tenant(Tenant(name="acme"))
    store.create_token("globex")
    assert [x.name for x in store.list_tenants()] == ["acme", "globex"]
    u = store.update_tenant("acme", monthly_budget_usd=500.0)
    assert u.monthly_budget_usd == 500.0 and u.max_gpus == 64
    with pytest.raises(NotFoundError):
        store.get_tenant("nobody")
    with pytest.raises(NotFoundError):
        store.update_tenant("nobody", max_gpus=1)
