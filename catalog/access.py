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
from cassandra.query import BatchStatement, BatchType, PreparedStatement

from catalog.apikeys import NewKey, check_key_id, new_key
from catalog.cluster import DRIVER_ERRORS
from catalog.exceptions import (
    CatalogUnavailable,
    Conflict,
    InvalidReference,
    KeyNotFound,
    TenantNotFound,
)
from catalog.models import ApiKey, TenantAccess
from catalog.refs import check_name
from catalog.repository import _aware, utc

_KEY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._:-]{0,63}$")
_KEY_COLS = "key_id, tenant, name, kdf, salt, hash, created_at, created_by, revoked_at, revoked_by"
_MAX_ID_ATTEMPTS = 5
MAX_RATE_PER_S = 1_000_000.0


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
        ks, q, s = keyspace, self._prepare, self._prepare_serial
        self._ins_tenant = s(
            f"INSERT INTO {ks}.tenant_access (tenant, created_at, created_by, rate_per_s, burst) "
            "VALUES (?, ?, ?, ?, ?) IF NOT EXISTS"
        )
        self._get_tenant = q(f"SELECT * FROM {ks}.tenant_access WHERE tenant = ?")
        self._list_tenants = q(f"SELECT * FROM {ks}.tenant_access")
        self._set_limits = s(
            f"UPDATE {ks}.tenant_access SET rate_per_s = ?, burst = ? WHERE tenant = ? IF EXISTS"
        )
        self._ins_key = s(
            f"INSERT INTO {ks}.api_keys ({_KEY_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "IF NOT EXISTS"
        )
        self._ins_key_listed = q(
            f"INSERT INTO {ks}.api_keys_by_tenant (tenant, key_id, name, created_at, revoked_at) "
            "VALUES (?, ?, ?, ?, ?)"
        )
        self._get_key = q(f"SELECT {_KEY_COLS} FROM {ks}.api_keys WHERE key_id = ?")
        self._list_keys = q(f"SELECT key_id FROM {ks}.api_keys_by_tenant WHERE tenant = ?")
        self._revoke_key = q(
            f"UPDATE {ks}.api_keys SET revoked_at = ?, revoked_by = ? WHERE key_id = ?"
        )
        self._revoke_listed = q(
            f"UPDATE {ks}.api_keys_by_tenant SET revoked_at = ? WHERE tenant = ? AND key_id = ?"
        )

    # ------------------------------------------------------------------ plumbing

    def _prepare(self, cql: str) -> PreparedStatement:
        stmt = self.session.prepare(cql)
        stmt.consistency_level = ConsistencyLevel.LOCAL_QUORUM
        return stmt

    def _prepare_serial(self, cql: str) -> PreparedStatement:
        stmt = self._prepare(cql)
        stmt.serial_consistency_level = ConsistencyLevel.LOCAL_SERIAL
        return stmt

    def _run(self, stmt, params: tuple | None = None):
        try:
            return self.session.execute(stmt, params)
        except DRIVER_ERRORS as e:
            raise CatalogUnavailable(
                f"Cassandra request on keyspace {self.keyspace!r} failed ({type(e).__name__}: "
                f"{e}); check `mint dev status` or the cluster, then retry"
            ) from e

    # ------------------------------------------------------------------ tenants

    def create_tenant(self, tenant: str, *, rate_per_s: float | None = None,
                      burst: int | None = None, by: str = "",
                      at: datetime | None = None) -> TenantAccess:  # fmt: skip
        """Create the tenant's access row; idempotent (an existing row is returned unchanged,
        ``is_new`` False: change its rate with ``set_limits``)."""
        check_name("tenant", tenant)
        check_limits(rate_per_s, burst)
        row = self._run(self._ins_tenant, (tenant, utc(at), by, rate_per_s, burst)).one()
        got = self.get_tenant(tenant)
        assert got is not None  # written or found by the compare-and-set above
        return TenantAccess(got.tenant, got.created_at, got.created_by, got.rate_per_s,
                            got.burst, is_new=bool(row.applied))  # fmt: skip

    def get_tenant(self, tenant: str) -> TenantAccess | None:
        check_name("tenant", tenant)
        r = self._run(self._get_tenant, (tenant,)).one()
        return None if r is None else _tenant(r)

    def list_tenants(self) -> list[TenantAccess]:
        """Every tenant (a full scan of a small table: for operators, not for requests)."""
        return sorted((_tenant(r) for r in self._run(self._list_tenants)), key=lambda t: t.tenant)

    def set_limits(self, tenant: str, rate_per_s: float | None, burst: int | None) -> TenantAccess:
        check_name("tenant", tenant)
        check_limits(rate_per_s, burst)
        if not self._run(self._set_limits, (rate_per_s, burst, tenant)).one().applied:
            raise TenantNotFound(f"tenant {tenant} does not exist: `mint tenants create {tenant}`")
        got = self.get_tenant(tenant)
        assert got is not None
        return got

    # ------------------------------------------------------------------ keys

    def create_key(self, tenant: str, *, name: str = "", by: str = "",
                   at: datetime | None = None) -> tuple[NewKey, ApiKey]:  # fmt: skip
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
            row = self._run(self._ins_key, (key.key_id, tenant, name, key.kdf, key.salt,
                                            key.hash, at, by, None, None)).one()  # fmt: skip
            if row.applied:
                break
        else:
            raise Conflict(f"no free key id after {_MAX_ID_ATTEMPTS} random draws: retry")
        self._run(self._ins_key_listed, (tenant, key.key_id, name, at, None))
        stored = self.get_key(key.key_id)
        assert stored is not None
        return key, stored

    def get_key(self, key_id: str) -> ApiKey | None:
        check_key_id(key_id)
        r = self._run(self._get_key, (key_id,)).one()
        return None if r is None else _key(r)

    def list_keys(self, tenant: str) -> list[ApiKey]:
        check_name("tenant", tenant)
        ids = [r.key_id for r in self._run(self._list_keys, (tenant,))]
        keys = [self.get_key(i) for i in ids]
        return sorted((k for k in keys if k is not None),
                      key=lambda k: (k.created_at is None, k.created_at, k.key_id))  # fmt: skip

    def revoke_key(self, key_id: str, *, tenant: str | None = None, by: str = "",
                   at: datetime | None = None) -> ApiKey:  # fmt: skip
        """Revoke a key (idempotent: a revoked key keeps its first revocation). ``tenant``, if
        given, must own the key."""
        key = self.get_key(key_id)
        if key is None or (tenant is not None and key.tenant != tenant):
            owner = f" of tenant {tenant}" if tenant is not None else ""
            raise KeyNotFound(f"no API key {key_id}{owner}: list them with `mint keys list`")
        if key.revoked:
            return key
        at = utc(at)
        batch = BatchStatement(batch_type=BatchType.LOGGED,
                               consistency_level=ConsistencyLevel.LOCAL_QUORUM)  # fmt: skip
        batch.add(self._revoke_key, (at, by, key_id))
        batch.add(self._revoke_listed, (at, key.tenant, key_id))
        self._run(batch)
        revoked = self.get_key(key_id)
        assert revoked is not None
        return revoked


def _tenant(r) -> TenantAccess:
    return TenantAccess(r.tenant, _aware(r.created_at), r.created_by or "", r.rate_per_s, r.burst)


def _key(r) -> ApiKey:
    return ApiKey(r.key_id, r.tenant, r.name or "", r.kdf, bytes(r.salt), bytes(r.hash),
                  _aware(r.created_at), r.created_by or "", _aware(r.revoked_at),
                  r.revoked_by)  # fmt: skip
