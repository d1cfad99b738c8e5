"""The catalog repository: policies, revisions, aliases (moved by compare-and-set) and history.

Every statement is prepared once per repository. Writes that must not race are lightweight
transactions (LOCAL_SERIAL); reads that decide a compare-and-set read at LOCAL_SERIAL so they see
the latest committed CAS. Plain reads (resolve, list) are LOCAL_QUORUM. Inputs are validated
before the first write, so a bad request writes nothing. The session, the policy and revision
reads and ``resolve`` are ``base.py``, which every part stands on; registration is
``registration.py``.

Names are checked where they enter: the envelope checks an event's on decode, ``parse_ref`` a
reference's, and the public reads and ``create_policy`` that the CLI, the SDK and the gateway
call with raw strings check theirs. What the projection and the workers pass on from a decoded
event is not checked again: registrations, alias moves (``checked=True``), a ``Ref`` built from
an event's fields (``resolve``), and the pages after the first of ``iter_revisions``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from cassandra.cluster import Session

from catalog.aliases import (
    ALIAS_CONDITIONAL,
    ALIAS_FIELDS,
    ALIAS_SERIAL_READS,
    ALIAS_STATEMENTS,
    AliasMoves,
)
from catalog.applied import APPLIED_STATEMENTS, AppliedEvents
from catalog.base import BASE_FIELDS, check_policy
from catalog.canaries import (
    CANARY_CONDITIONAL,
    CANARY_FIELDS,
    CANARY_SERIAL_READS,
    CANARY_STATEMENTS,
    Canaries,
)
from catalog.evaluations import EVALUATION_FIELDS, EVALUATION_STATEMENTS, RevisionEvaluations
from catalog.exceptions import Conflict, InvalidReference, PolicyExists
from catalog.models import Policy, Registration, Revision, aware, from_row, utc
from catalog.refs import check_name, check_revision
from catalog.registration import Registrar
from catalog.retirement import RETIREMENT_STATEMENTS, PolicyRetirements

_STATEMENTS = {
    "_list_policies": "SELECT * FROM {ks}.policies WHERE tenant = ?",
    # Operators' listing across tenants: one small table, read whole.
    "_list_tenants": "SELECT tenant FROM {ks}.tenants",
    "_list_revisions": "SELECT {revision_cols} FROM {ks}.revisions WHERE tenant = ? AND policy = ?",
}
_CONDITIONAL = {
    "_ins_tenant": "INSERT INTO {ks}.tenants (tenant, created_at) VALUES (?, ?) IF NOT EXISTS",
    "_earlier_tenant": "UPDATE {ks}.tenants SET created_at = ? WHERE tenant = ? IF created_at = ?",
    "_ins_policy": (
        "INSERT INTO {ks}.policies (tenant, policy, base_model, created_at, created_by) "
        "VALUES (?, ?, ?, ?, ?) IF NOT EXISTS"
    ),
}


class CatalogRepository(
    AliasMoves, AppliedEvents, Canaries, RevisionEvaluations, PolicyRetirements
):
    """All catalog reads and writes for one keyspace. Thread-safe (the driver session is).

    Policies, revisions and resolution are here and in ``catalog/base.py`` (the plumbing and the
    reads every part checks against); alias moves and history in ``catalog/aliases.py``,
    evaluation results in ``catalog/evaluations.py``, retirement in ``catalog/retirement.py``,
    the applied-events rows in ``catalog/applied.py``, canaries in ``catalog/canaries.py``
    (mixed in on the base: one object, one set of statements), registration in
    ``catalog/registration.py``."""

    def __init__(self, session: Session, keyspace: str) -> None:
        super().__init__(session, keyspace)
        fields = {
            "ks": keyspace,
            **BASE_FIELDS,
            **ALIAS_FIELDS,
            **CANARY_FIELDS,
            **EVALUATION_FIELDS,
        }
        prepare = self._cql.prepare_table
        for table in (
            _STATEMENTS,
            APPLIED_STATEMENTS,
            ALIAS_STATEMENTS,
            EVALUATION_STATEMENTS,
            RETIREMENT_STATEMENTS,
            CANARY_STATEMENTS,
        ):
            prepare(self, table, fields=fields)
        for table in (_CONDITIONAL, ALIAS_CONDITIONAL, CANARY_CONDITIONAL):
            prepare(self, table, fields=fields, serial=True)
        prepare(self, ALIAS_SERIAL_READS, fields=fields, serial_read=True)
        prepare(self, CANARY_SERIAL_READS, fields=fields, serial_read=True)
        self.registrar = Registrar(self)
        # tenant -> its created_at as this repository last saw it (a tenant row is never deleted)
        self._tenants: dict[str, datetime] = {}

    # ------------------------------------------------------------------ policies

    def create_policy(
        self,
        tenant: str,
        policy: str,
        base_model: str,
        *,
        by: str = "",
        at: datetime | None = None,
    ) -> Policy:
        """Create a policy (and its tenant). Idempotent for the same base model."""
        check_policy(tenant, policy)
        if not base_model:
            raise InvalidReference(f"base_model {base_model!r} is empty: name the base model")
        at = utc(at)
        known = self._tenants.get(tenant)
        if known is None or at < known:
            self._tenants[tenant] = self._tenant_since(tenant, at)
        row = self._one(self._ins_policy, (tenant, policy, base_model, at, by))
        if row.applied:
            return Policy(tenant, policy, base_model, at, by, is_new=True)
        if row.base_model != base_model:
            raise PolicyExists(
                f"policy {tenant}/{policy} exists with base_model {row.base_model!r}, not "
                f"{base_model!r}: use another policy name for another base model"
            )
        return from_row(Policy, row)  # the compare-and-set answers with the row it found

    def _tenant_since(self, tenant: str, at: datetime) -> datetime:
        """Record that ``tenant`` exists since ``at`` at the latest: its created_at is its
        earliest policy's, whatever order policies are created in (the projector applies them
        on parallel threads, a rebuild reads the log partition by partition), so a rebuilt
        catalog equals the live one. One LWT per tenant and process, more only when an earlier
        policy comes later."""
        row = self._one(self._ins_tenant, (tenant, at))
        while not row.applied:
            current = aware(row.created_at)
            if current <= at:
                return current
            row = self._one(self._earlier_tenant, (at, tenant, current))
        return at

    def get_policy(self, tenant: str, policy: str) -> Policy:
        check_policy(tenant, policy)
        return self._read_policy(tenant, policy)

    def list_policies(self, tenant: str) -> list[Policy]:
        check_name("tenant", tenant)
        return [from_row(Policy, r) for r in self._run(self._list_policies, (tenant,))]

    def list_tenants(self) -> list[str]:
        """Every tenant with a policy in the catalog, by name."""
        return sorted(r.tenant for r in self._run(self._list_tenants, ()))

    # ------------------------------------------------------------------ revisions

    def register_revision(
        self,
        tenant: str,
        policy: str,
        *,
        digest: str,
        store_uri: str,
        base_model: str | None = None,
        parent_revision: int | None = None,
        metadata: dict | None = None,
        source_event_id: uuid.UUID | None = None,
        revision: int | None = None,
        by: str = "",
        at: datetime | None = None,
        source_checked: bool = False,
        training: dict[str, float] | None = None,
    ) -> Revision:
        """Register an exported adapter as the policy's next revision (tenant and policy as
        decoded from an event: not checked again).

        Idempotent by digest (the same content is the same revision) and by source event id (a
        redelivered export returns the revision it created). ``is_new`` tells which happened.
        ``revision`` (e.g. ExportCompleted.revision) demands that exact number: it must be the
        next one, or already hold this digest; anything else is a Conflict. Its applied_events
        row is written as ``revision.registered``. ``training``: what the training measured
        (``TrainingFigures.figures()``), stored with the revision.
        ``source_checked``: the caller just read that ``source_event_id`` was not applied and
        records the event itself (the projection does), so neither is done here.

        Round trips of a new registration: the policy read, one lightweight transaction (the
        number, the digest's claim and index: ``registration.py``), the revision row and the
        applied-event row; without ``revision`` a read of the counter first.
        """
        if source_event_id is not None and not source_checked:
            done = self._one(self._get_applied, (source_event_id,))
            if done is not None and done.revision is not None:
                if (done.tenant, done.policy) != (tenant, policy):
                    raise Conflict(
                        f"source event {source_event_id} already registered revision "
                        f"{done.tenant}/{done.policy}@{done.revision}, not one of {tenant}/{policy}"
                    )
                return self._read_revision(tenant, policy, done.revision)
        reg = Registration(
            digest,
            store_uri,
            base_model,
            parent_revision,
            metadata or {},
            source_event_id,
            revision,
            by,
            at,
            training or {},
        )
        (rev,) = self.registrar.register(
            tenant, policy, [reg], record=not source_checked, created=None
        )
        return rev

    def register_revisions(
        self,
        tenant: str,
        policy: str,
        regs: Sequence[Registration],
        *,
        created: Policy | None = None,
    ) -> list[Revision]:
        """Register a run of one policy's exports, in order (as ``register_revision`` with
        ``source_checked``: the caller checked and records their events). Consecutive numbers
        take one lightweight transaction for the whole run; the first refused export raises
        after the ones before it were registered. ``created``: what ``create_policy`` just
        answered (a policy's first export), so the policy is not read again."""
        if not regs:
            return []
        return self.registrar.register(tenant, policy, regs, record=False, created=created)

    def get_revision(self, tenant: str, policy: str, revision: int) -> Revision:
        check_policy(tenant, policy)
        check_revision(revision)
        return self._read_revision(tenant, policy, revision)

    def list_revisions(
        self,
        tenant: str,
        policy: str,
        *,
        page_size: int = 100,
        page_state: bytes | None = None,
    ) -> tuple[list[Revision], bytes | None]:
        """One page of revisions, newest first, and the state for the next page (None at end)."""
        check_policy(tenant, policy)
        if not 1 <= page_size <= 5000:
            raise InvalidReference(f"page_size {page_size} must be between 1 and 5000")
        return self._revision_page(tenant, policy, page_size, page_state)

    def _revision_page(
        self, tenant: str, policy: str, page_size: int, page_state: bytes | None
    ) -> tuple[list[Revision], bytes | None]:
        bound = self._list_revisions.bind((tenant, policy))
        bound.fetch_size = page_size
        rs = self._run(bound, (), paging_state=page_state)
        rows = [from_row(Revision, r) for r in rs.current_rows if r.digest is not None]
        return rows, rs.paging_state

    def iter_revisions(self, tenant: str, policy: str, page_size: int = 500):
        # The first page checks the names and the page size; the next pages reuse them.
        page, state = self.list_revisions(tenant, policy, page_size=page_size)
        yield from page
        while state is not None:
            page, state = self._revision_page(tenant, policy, page_size, state)
            yield from page
