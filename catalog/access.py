"""Who may call the gateway: tenants' access rows (request rates) and their API keys.

Tables of migration 4 (``tenant_access``, ``api_keys``, ``api_keys_by_tenant``): configuration
written by operators (``mint tenants``, ``mint keys``), not a projection of the event log. A key
is made here and its text returned once; the catalog keeps the key id, the owner and a salted
scrypt hash (catalog.apikeys). Reads that the gateway makes per key (``get_key``) are one
partition read by key id.
"""

from __future__ import annotations

import re
from datetime import datetime

from cassandra import ConsistencyLevel
from cassandra.cluster import Session
from cassandra.query import BatchStatement, BatchType

from catalog.apikeys import NewKey, check_key_id, new_key
from catalog.cluster import Statements
from catalog.exceptions import (
    Conflict,
    InvalidReference,
    KeyNotFound,
    TenantNotFound,
)
from catalog.models import ApiKey, TenantAccess, from_row, utc
from catalog.refs import check_name

_KEY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._:-]{0,63}$")
_KEY_COLS = "key_id, tenant, name, kdf, salt, hash, created_at, created_by, revoked_at, revoked_by"
_MAX_ID_ATTEMPTS = 5
MAX_RATE_PER_S = 1_000_000.0

_STATEMENTS = {
    "_get_tenant": "SELECT * FROM {ks}.tenant_access WHERE tenant = ?",
    "_list_tenants": "SELECT * FROM {ks}.tenant_access",
    "_ins_key_listed": (
        "INSERT INTO {ks}.api_keys_by_tenant (tenant, key_id, name, created_at, revoked_at) "
        "VALUES (?, ?, ?, ?, ?)"
    ),
    "_get_key": "SELECT {key_cols} FROM {ks}.api_keys WHERE key_id = ?",
    "_list_keys": "SELECT key_id FROM {ks}.api_keys_by_tenant WHERE tenant = ?",
    "_revoke_key": "UPDATE {ks}.api_keys SET revoked_at = ?, revoked_by = ? WHERE key_id = ?",
    "_revoke_listed": (
        "UPDATE {ks}.api_keys_by_tenant SET revoked_at = ? WHERE tenant = ? AND key_id = ?"
    ),
}
_CONDITIONAL = {
    "_ins_tenant": (
        "INSERT INTO {ks}.tenant_access (tenant, created_at, created_by, rate_per_s, burst) "
        "VALUES (?, ?, ?, ?, ?) IF NOT EXISTS"
    ),
    "_set_limits": (
        "UPDATE {ks}.tenant_access SET rate_per_s = ?, burst = ? WHERE tenant = ? IF EXISTS"
    ),
    "_ins_key": (
        "INSERT INTO {ks}.api_keys ({key_cols}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS"
    ),
}


def check_limits(rate_per_s: float | None, burst: int | None) -> None:
    if rate_per_s is not None and not 0 < rate_per_s <= MAX_RATE_PER_S:
        raise InvalidReference(
            f"rate {rate_per_s!r} requests/s is out of range: expected 0 < rate <= "
            f"{MAX_RATE_PER_S:g} (leave it unset for the gateway's default)"
        )
    if burst is not None and not 1 <= burst <= 1_000_000:
        raise InvalidReference(f"burst {burst!r} is out of range: expected 1..1000000 requests")


class AccessRepository:
    """Tenants' access rows and API keys in one keyspace. Thread-safe (the driver session is)."""

    def __init__(self, session: Session, keyspace: str) -> None:
        self.session, self.keyspace = session, keyspace
        self._cql = Statements(session, keyspace)
        fields = {"ks": keyspace, "key_cols": _KEY_COLS}
        self._cql.prepare_table(self, _STATEMENTS, fields=fields)
        self._cql.prepare_table(self, _CONDITIONAL, fields=fields, serial=True)

    # ------------------------------------------------------------------ tenants

    def create_tenant(
        self,
        tenant: str,
        *,
        rate_per_s: float | None = None,
        burst: int | None = None,
        by: str = "",
        at: datetime | None = None,
    ) -> TenantAccess:
        """Create the tenant's access row; idempotent (an existing row is returned unchanged,
        ``is_new`` False: change its rate with ``set_limits``)."""
        check_name("tenant", tenant)
        check_limits(rate_per_s, burst)
        row = self._cql.run(self._ins_tenant, (tenant, utc(at), by, rate_per_s, burst)).one()
        got = self.get_tenant(tenant)
        assert got is not None  # written or found by the compare-and-set above
        return TenantAccess(
            got.tenant,
            got.created_at,
            got.created_by,
            got.rate_per_s,
            got.burst,
            is_new=bool(row.applied),
        )

    def get_tenant(self, tenant: str) -> TenantAccess | None:
        check_name("tenant", tenant)
        r = self._cql.run(self._get_tenant, (tenant,)).one()
        return None if r is None else from_row(TenantAccess, r)

    def list_tenants(self) -> list[TenantAccess]:
        """Every tenant (a full scan of a small table: for operators, not for requests)."""
        return sorted(
            (from_row(TenantAccess, r) for r in self._cql.run(self._list_tenants)),
            key=lambda t: t.tenant,
        )

    def set_limits(self, tenant: str, rate_per_s: float | None, burst: int | None) -> TenantAccess:
        check_name("tenant", tenant)
        check_limits(rate_per_s, burst)
        if not self._cql.run(self._set_limits, (rate_per_s, burst, tenant)).one().applied:
            raise TenantNotFound(f"tenant {tenant} does not exist: `mint tenants create {tenant}`")
        got = self.get_tenant(tenant)
        assert got is not None
        return got

    # ------------------------------------------------------------------ keys

    def create_key(
        self, tenant: str, *, name: str = "", by: str = "", at: datetime | None = None
    ) -> tuple[NewKey, ApiKey]:
        """Make a key for ``tenant``: (the new key, whose ``text`` is shown once, and the stored
        record). The key id is claimed by compare-and-set, so two keys never share one."""
        check_name("tenant", tenant)
        if name and not _KEY_NAME.match(name):
            raise InvalidReference(
                f"key name {name!r} is not valid: up to 64 of [A-Za-z0-9 ._:-], e.g. 'ci'"
            )
        if self.get_tenant(tenant) is None:
            raise TenantNotFound(
                f"tenant {tenant} does not exist: create it first (`mint tenants create {tenant}`)"
            )
        at = utc(at)
        for _ in range(_MAX_ID_ATTEMPTS):
            key = new_key()
            row = self._cql.run(
                self._ins_key,
                (key.key_id, tenant, name, key.kdf, key.salt, key.hash, at, by, None, None),
            ).one()
            if row.applied:
                break
        else:
            raise Conflict(f"no free key id after {_MAX_ID_ATTEMPTS} random draws: retry")
        self._cql.run(self._ins_key_listed, (tenant, key.key_id, name, at, None))
        stored = self.get_key(key.key_id)
        assert stored is not None
        return key, stored

    def get_key(self, key_id: str) -> ApiKey | None:
        check_key_id(key_id)
        r = self._cql.run(self._get_key, (key_id,)).one()
        return None if r is None else from_row(ApiKey, r)

    def list_keys(self, tenant: str) -> list[ApiKey]:
        check_name("tenant", tenant)
        ids = [r.key_id for r in self._cql.run(self._list_keys, (tenant,))]
        keys = [self.get_key(i) for i in ids]
        return sorted(
            (k for k in keys if k is not None),
            key=lambda k: (k.created_at is None, k.created_at, k.key_id),
        )

    def revoke_key(
        self, key_id: str, *, tenant: str | None = None, by: str = "", at: datetime | None = None
    ) -> ApiKey:
        """Revoke a key (idempotent: a revoked key keeps its first revocation). ``tenant``, if
        given, must own the key."""
        key = self.get_key(key_id)
        if key is None or (tenant is not None and key.tenant != tenant):
            owner = f" of tenant {tenant}" if tenant is not None else ""
            raise KeyNotFound(f"no API key {key_id}{owner}: list them with `mint keys list`")
        if key.revoked:
            return key
        at = utc(at)
        batch = BatchStatement(
            batch_type=BatchType.LOGGED, consistency_level=ConsistencyLevel.LOCAL_QUORUM
        )
        batch.add(self._revoke_key, (at, by, key_id))
        batch.add(self._revoke_listed, (at, key.tenant, key_id))
        self._cql.run(batch)
        revoked = self.get_key(key_id)
        assert revoked is not None
        return revoked
