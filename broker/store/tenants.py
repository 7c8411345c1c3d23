"""Tenants and API tokens in the store. Only a token's SHA-256 is kept; the plaintext is returned once."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any

import sqlalchemy as sa

from broker.errors import ConflictError, NotFoundError, StoreError
from broker.models import BudgetAction, Role, Tenant, TokenInfo, utcnow
from broker.store.engine import Database
from broker.tables import TenantRow, TokenRow, table_of

TENANTS = table_of(TenantRow)
TOKENS = table_of(TokenRow)
SELECT_TENANT = sa.select(TENANTS).where(TENANTS.c.name == sa.bindparam("tenant_key"))

TENANT_FIELDS: frozenset[str] = frozenset({"monthly_budget_usd", "max_gpus", "on_budget_exhausted"})
TOKEN_PREFIX = "lst_"
# What a TokenInfo is made of: never the hash.
_TOKEN_COLS = tuple(TOKENS.c[name] for name in TokenInfo.model_fields)


def _hash_token(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


class TenantStore(Database):
    """Tenants with their caps, and the bearer tokens that act for them."""

    # ------------------------------------------------------------------ tenants

    def create_tenant(self, t: Tenant) -> Tenant:
        try:
            with self._tx() as conn:
                conn.execute(TENANTS.insert().values(**t.model_dump(include=set(TENANTS.c.keys()))))
        except sa.exc.IntegrityError as exc:
            raise ConflictError(f"tenant {t.name} already exists") from exc
        return self.get_tenant(t.name)

    def get_tenant(self, name: str) -> Tenant:
        with self._tx(write=False) as conn:
            row = conn.execute(SELECT_TENANT, {"tenant_key": name}).first()
        if row is None:
            raise NotFoundError(f"tenant {name} not found")
        return Tenant.model_validate(row, from_attributes=True)

    def list_tenants(self) -> list[Tenant]:
        with self._tx(write=False) as conn:
            rows = conn.execute(sa.select(TENANTS).order_by(TENANTS.c.name))
            return [Tenant.model_validate(r, from_attributes=True) for r in rows]

    def update_tenant(self, name: str, **fields: Any) -> Tenant:
        unknown = set(fields) - TENANT_FIELDS
        if unknown:
            raise StoreError(f"not tenant fields: {', '.join(sorted(unknown))}")
        if fields.get("on_budget_exhausted", "") is None:  # not a cap: there is nothing to clear
            del fields["on_budget_exhausted"]
        elif "on_budget_exhausted" in fields:
            fields["on_budget_exhausted"] = BudgetAction(fields["on_budget_exhausted"]).value
        with self._tx() as conn:
            n = conn.execute(TENANTS.update().where(TENANTS.c.name == name).values(**fields)).rowcount if fields else 1
        if not n:
            raise NotFoundError(f"tenant {name} not found")
        return self.get_tenant(name)

    def budget_alert(self, name: str) -> str:
        """The budget alert last sent for the tenant ("YYYY-MM:percent", '' when none)."""
        with self._tx(write=False) as conn:
            value = conn.execute(sa.select(TENANTS.c.budget_alert).where(TENANTS.c.name == name)).scalar()
        return str(value or "")

    def set_budget_alert(self, name: str, alert: str, *, expected: str) -> bool:
        """Record the alert sent, only over the one read (``expected``): of two replicas crossing the same
        level, one sends it. True when this call recorded it."""
        with self._tx() as conn:
            n = conn.execute(TENANTS.update().where(TENANTS.c.name == name, TENANTS.c.budget_alert == expected)
                             .values(budget_alert=alert)).rowcount
        return bool(n)

    # ------------------------------------------------------------------ tokens

    def create_token(self, tenant: str, role: Role = Role.user, label: str = "") -> tuple[TokenInfo, str]:
        """A new API token (its tenant created if new); the plaintext is returned once and only its
        SHA-256 is stored."""
        plaintext = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token_id = "tok_" + secrets.token_hex(8)
        ensure = (
            self._insert_fn()(TENANTS)
            .values(name=tenant, created_at=utcnow())
            .on_conflict_do_nothing(index_elements=["name"])
        )
        with self._tx() as conn:
            conn.execute(ensure)
            conn.execute(
                TOKENS.insert().values(
                    id=token_id,
                    tenant=tenant,
                    role=Role(role).value,
                    token_hash=_hash_token(plaintext),
                    label=label,
                    created_at=utcnow(),
                    revoked=False,
                )
            )
            row = conn.execute(sa.select(*_TOKEN_COLS).where(TOKENS.c.id == token_id)).one()
        return TokenInfo.model_validate(row, from_attributes=True), plaintext

    def verify_token(self, plaintext: str) -> TokenInfo | None:
        """The token's info, or None when unknown or revoked (one indexed lookup)."""
        digest = _hash_token(plaintext)
        with self._tx(write=False) as conn:
            row = conn.execute(
                sa.select(TOKENS.c.token_hash, *_TOKEN_COLS).where(TOKENS.c.token_hash == digest)
            ).first()
        # The lookup is by hash, so timing reveals nothing of the plaintext; compare anyway, in constant time.
        if row is None or not hmac.compare_digest(row.token_hash, digest) or row.revoked:
            return None
        return TokenInfo.model_validate(row, from_attributes=True)

    def token_hashes(self) -> frozenset[str]:
        """The hashes of every token not revoked: what tells a valid token from a stranger's without a lookup
        per request (the API's bad-token limiter never throttles a valid one)."""
        with self._tx(write=False) as conn:
            return frozenset(conn.execute(sa.select(TOKENS.c.token_hash).where(TOKENS.c.revoked.is_(False)))
                             .scalars())

    def list_tokens(self, tenant: str | None = None) -> list[TokenInfo]:
        q = sa.select(*_TOKEN_COLS)
        if tenant is not None:
            q = q.where(TOKENS.c.tenant == tenant)
        with self._tx(write=False) as conn:
            rows = conn.execute(q.order_by(TOKENS.c.created_at, TOKENS.c.id))
            return [TokenInfo.model_validate(r, from_attributes=True) for r in rows]

    def revoke_token(self, token_id: str) -> None:
        with self._tx() as conn:
            n = conn.execute(TOKENS.update().where(TOKENS.c.id == token_id).values(revoked=True)).rowcount
        if not n:
            raise NotFoundError(f"token {token_id} not found")
