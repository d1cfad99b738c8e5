"""What every part of the catalog repository stands on: the session, its statements, and the
policy and revision reads that a write checks against.

``CatalogBase`` runs each statement through one ``catalog.cluster.Statements`` (``_run``,
``_one``) and prepares its own reads. The parts (``aliases.py``, ``applied.py``, ``canaries.py``,
``evaluations.py``, ``retirement.py``) are mixins on this base, each with its table of
statements; ``registration.py`` works through the applied-events part; ``repository.py``
assembles them into ``CatalogRepository``, which prepares every part's table. So the folder
reads top-down: the base, the parts, the repository, and no part imports the repository.
"""

from __future__ import annotations

from typing import Any

from cassandra.cluster import Session
from cassandra.query import PreparedStatement

from catalog.cluster import Statements
from catalog.exceptions import (
    AliasNotFound,
    NotFound,
    PolicyNotFound,
    PolicyRetired,
    RevisionNotFound,
)
from catalog.models import CanaryRoute, Policy, Resolved, Revision, from_row, utc
from catalog.refs import Ref, check_name, parse_ref

REVISION_COLS = (
    "tenant, policy, revision, digest, store_uri, base_model, parent_revision, created_at, "
    "created_by, source_event_id, metadata, training, tags"
)
# The alias row's canary columns (migration 7): a resolve reads them with the pointer.
CANARY_ROUTE = (
    "canary_id, canary_revision, canary_digest, canary_store_uri, canary_share, "
    "canary_incumbent, canary_started_at, canary_by"
)
BASE_FIELDS = {"revision_cols": REVISION_COLS, "canary_route": CANARY_ROUTE}
BASE_STATEMENTS = {
    "_get_policy": "SELECT * FROM {ks}.policies WHERE tenant = ? AND policy = ?",
    "_get_digest": (
        "SELECT revision FROM {ks}.revisions_by_digest WHERE tenant = ? AND policy = ? AND digest = ?"
    ),
    "_get_revision": (
        "SELECT {revision_cols} FROM {ks}.revisions WHERE tenant = ? AND policy = ? AND revision = ?"
    ),
    "_resolve_alias": (
        "SELECT revision, digest, store_uri, {canary_route} FROM {ks}.aliases "
        "WHERE tenant = ? AND policy = ? AND alias = ?"
    ),
}


def route_of(row: Any) -> CanaryRoute | None:
    """The canary a resolve row carries, if it still belongs to the alias's revision."""
    if row is None or row.canary_id is None or row.canary_incumbent != row.revision:
        return None
    return CanaryRoute(
        canary_id=row.canary_id,
        revision=row.canary_revision,
        digest=row.canary_digest,
        store_uri=row.canary_store_uri,
        share=row.canary_share,
        incumbent_revision=row.canary_incumbent,
        started_at=utc(row.canary_started_at),
        started_by=row.canary_by or "",
    )


def check_policy(tenant: str, policy: str) -> None:
    check_name("tenant", tenant)
    check_name("policy", policy)


class CatalogBase:
    """The session and plumbing of one keyspace, with the reads every part checks against:
    a policy (live or not), a revision, and what a reference resolves to."""

    def __init__(self, session: Session, keyspace: str) -> None:
        self.session = session
        self.keyspace = keyspace
        self._cql = Statements(session, keyspace)
        self._cql.prepare_table(self, BASE_STATEMENTS, fields={"ks": keyspace, **BASE_FIELDS})

    # ------------------------------------------------------------------ plumbing

    # One way for every catalog class (catalog.cluster.Statements); the names stay for
    # catalog/registration.py, which prepares and runs its statements through these.
    def _prepare(self, cql: str, *, serial_read: bool = False) -> PreparedStatement:
        return self._cql.prepare(cql, serial_read=serial_read)

    def _prepare_serial(self, cql: str) -> PreparedStatement:
        return self._cql.prepare(cql, serial=True)

    def _run(self, stmt, params: tuple, **kw):
        return self._cql.run(stmt, params, **kw)

    def _one(self, stmt: PreparedStatement, params: tuple):
        return self._run(stmt, params).one()

    # ------------------------------------------------------------------ policies

    def _read_policy(self, tenant: str, policy: str) -> Policy:
        row = self._one(self._get_policy, (tenant, policy))
        if row is None:
            raise PolicyNotFound(
                f"policy {tenant}/{policy} does not exist: create it first "
                f"(`mint catalog create-policy {tenant}/{policy} --base-model …`)"
            )
        return from_row(Policy, row)

    def _live_policy(self, tenant: str, policy: str, known: Policy | None = None) -> Policy:
        pol = known or self._read_policy(tenant, policy)
        if pol.retired_at is not None:
            raise PolicyRetired(
                f"policy {tenant}/{policy} was retired at {pol.retired_at.isoformat()}: "
                "nothing can be registered or promoted in it (restore it with "
                f"`mint policies retire {tenant}/{policy} --undo`)"
            )
        return pol

    # ------------------------------------------------------------------ revisions

    def _read_revision(self, tenant: str, policy: str, revision: int) -> Revision:
        rev = self._revision_or_none(tenant, policy, revision)
        if rev is None:
            self._read_policy(tenant, policy)  # PolicyNotFound names the real cause
            raise RevisionNotFound(
                f"revision {revision} of {tenant}/{policy} does not exist: list them with "
                f"`mint catalog revisions {tenant}/{policy}`"
            )
        return rev

    def _revision_or_none(self, tenant: str, policy: str, revision: int) -> Revision | None:
        row = self._one(self._get_revision, (tenant, policy, revision))
        return None if row is None or row.digest is None else from_row(Revision, row)

    # ------------------------------------------------------------------ resolve

    def resolve(self, ref: str | Ref) -> Resolved:
        """Resolve ``tenant/policy@alias``, ``@N`` or ``@sha256:…`` to a revision (one read for
        an alias: the alias row carries its target's digest and store URI)."""
        r = parse_ref(ref) if isinstance(ref, str) else ref
        if r.alias is not None:
            missing = AliasNotFound(
                f"alias {r} points nowhere: promote a revision to it first "
                f"(`mint catalog promote {r} --to N`)"
            )
            row = self._pointer(self._resolve_alias, r, r.alias, missing)
            return Resolved(
                r.tenant, r.policy, row.revision, row.digest, row.store_uri, r.alias, route_of(row)
            )
        number = r.revision
        if r.digest is not None:
            missing = RevisionNotFound(
                f"no revision of {r.tenant}/{r.policy} has digest {r.digest}: register the "
                "export first, or check the tenant and policy in the reference"
            )
            number = self._pointer(self._get_digest, r, r.digest, missing).revision
        rev = self._read_revision(r.tenant, r.policy, number)
        return Resolved(r.tenant, r.policy, rev.revision, rev.digest, rev.store_uri)

    def _pointer(self, stmt: PreparedStatement, r: Ref, key: str, missing: NotFound):
        """The row of an alias or a digest that points at a revision; ``missing`` when there is
        none, or PolicyNotFound when the policy itself is missing (the real cause)."""
        row = self._one(stmt, (r.tenant, r.policy, key))
        if row is None or row.revision is None:
            self._read_policy(r.tenant, r.policy)
            raise missing
        return row
