"""The catalog repository: policies, revisions, aliases (moved by compare-and-set) and history.

Every statement is prepared once per repository. Writes that must not race are lightweight
transactions (LOCAL_SERIAL); reads that decide a compare-and-set read at LOCAL_SERIAL so they see
the latest committed CAS. Plain reads (resolve, list) are LOCAL_QUORUM. Inputs are validated
before the first write, so a bad request writes nothing.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import structlog
from cassandra import ConsistencyLevel
from cassandra.cluster import Session
from cassandra.query import PreparedStatement

from catalog.cluster import DRIVER_ERRORS
from catalog.exceptions import (
    AliasConflict,
    AliasNotFound,
    CatalogUnavailable,
    Conflict,
    CrossTenantReference,
    InvalidReference,
    PolicyExists,
    PolicyInUse,
    PolicyNotFound,
    PolicyRetired,
    RegistrationInProgress,
    RevisionNotFound,
)
from catalog.models import Alias, AliasMove, Policy, Resolved, Revision
from catalog.refs import Ref, check_alias, check_digest, check_name, check_revision, parse_ref

log = structlog.get_logger()

# A digest claim older than this with no revision is from a crashed registrant and may be taken.
CLAIM_TTL = timedelta(seconds=30)
_MAX_CAS_RETRIES = 50

_REVISION_COLS = (
    "tenant, policy, revision, digest, store_uri, base_model, parent_revision, created_at, "
    "created_by, source_event_id, metadata"
)
_ALIAS_COLS = (
    "tenant, policy, alias, revision, digest, store_uri, seq, moved_at, moved_by, last_event_id, "
    "move_from, move_reason, move_kind"
)
_HISTORY_COLS = (
    "tenant, policy, alias, seq, from_revision, to_revision, moved_at, moved_by, reason, kind, "
    "event_id"
)


def utc(at: datetime | None = None) -> datetime:
    """A timezone-aware UTC time truncated to Cassandra's millisecond precision."""
    at = at or datetime.now(UTC)
    at = at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
    return at.replace(microsecond=at.microsecond // 1000 * 1000)


def _aware(at: datetime | None) -> datetime | None:
    return None if at is None else at.replace(tzinfo=UTC)


class CatalogRepository:
    """All catalog reads and writes for one keyspace. Thread-safe (the driver session is)."""

    def __init__(self, session: Session, keyspace: str) -> None:
        self.session = session
        self.keyspace = keyspace
        ks = keyspace
        q = self._prepare
        s = self._prepare_serial
        self._ins_tenant = s(
            f"INSERT INTO {ks}.tenants (tenant, created_at) VALUES (?, ?) IF NOT EXISTS"
        )
        self._ins_policy = s(
            f"INSERT INTO {ks}.policies (tenant, policy, base_model, created_at, created_by) "
            "VALUES (?, ?, ?, ?, ?) IF NOT EXISTS"
        )
        self._get_policy = q(f"SELECT * FROM {ks}.policies WHERE tenant = ? AND policy = ?")
        self._list_policies = q(f"SELECT * FROM {ks}.policies WHERE tenant = ?")
        self._retire_policy = s(
            f"UPDATE {ks}.policies SET retired_at = ?, retired_by = ? "
            "WHERE tenant = ? AND policy = ? IF retired_at = null"
        )
        self._get_digest_serial = q(
            f"SELECT revision, claimed_by, claimed_at FROM {ks}.revisions_by_digest "
            "WHERE tenant = ? AND policy = ? AND digest = ?",
            serial_read=True,
        )
        self._get_digest = q(
            f"SELECT revision FROM {ks}.revisions_by_digest "
            "WHERE tenant = ? AND policy = ? AND digest = ?"
        )
        self._claim_digest = s(
            f"INSERT INTO {ks}.revisions_by_digest (tenant, policy, digest, claimed_by, claimed_at)"
            " VALUES (?, ?, ?, ?, ?) IF NOT EXISTS"
        )
        self._take_claim = s(
            f"UPDATE {ks}.revisions_by_digest SET claimed_by = ?, claimed_at = ? "
            "WHERE tenant = ? AND policy = ? AND digest = ? IF claimed_by = ? AND revision = null"
        )
        self._del_claim = s(
            f"DELETE FROM {ks}.revisions_by_digest WHERE tenant = ? AND policy = ? AND digest = ? "
            "IF revision = null"
        )
        self._set_digest_revision = q(
            f"UPDATE {ks}.revisions_by_digest SET revision = ? "
            "WHERE tenant = ? AND policy = ? AND digest = ?"
        )
        self._latest_serial = q(
            f"SELECT latest_revision, revision, digest FROM {ks}.revisions "
            "WHERE tenant = ? AND policy = ? LIMIT 1",
            serial_read=True,
        )
        ins_rev = (
            f"UPDATE {ks}.revisions SET latest_revision = ?, digest = ?, store_uri = ?, "
            "base_model = ?, parent_revision = ?, created_at = ?, created_by = ?, "
            "source_event_id = ?, metadata = ? WHERE tenant = ? AND policy = ? AND revision = ? "
        )
        # Two forms because `IF latest_revision = ?` never matches the null of a new policy.
        self._ins_first_revision = s(ins_rev + "IF latest_revision = null")
        self._ins_next_revision = s(ins_rev + "IF latest_revision = ?")
        self._get_revision = q(
            f"SELECT {_REVISION_COLS} FROM {ks}.revisions "
            "WHERE tenant = ? AND policy = ? AND revision = ?"
        )
        self._list_revisions = q(
            f"SELECT {_REVISION_COLS} FROM {ks}.revisions WHERE tenant = ? AND policy = ?"
        )
        self._get_alias = q(
            f"SELECT {_ALIAS_COLS} FROM {ks}.aliases WHERE tenant = ? AND policy = ? AND alias = ?"
        )
        self._get_alias_serial = q(
            f"SELECT {_ALIAS_COLS} FROM {ks}.aliases WHERE tenant = ? AND policy = ? AND alias = ?",
            serial_read=True,
        )
        self._list_aliases = q(
            f"SELECT {_ALIAS_COLS} FROM {ks}.aliases WHERE tenant = ? AND policy = ?"
        )
        self._resolve_alias = q(
            f"SELECT revision, digest, store_uri FROM {ks}.aliases "
            "WHERE tenant = ? AND policy = ? AND alias = ?"
        )
        self._ins_alias = s(
            f"INSERT INTO {ks}.aliases ({_ALIAS_COLS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS"
        )
        self._cas_alias = s(
            f"UPDATE {ks}.aliases SET revision = ?, digest = ?, store_uri = ?, seq = ?, "
            "moved_at = ?, moved_by = ?, last_event_id = ?, move_from = ?, move_reason = ?, "
            "move_kind = ? WHERE tenant = ? AND policy = ? AND alias = ? "
            "IF revision = ? AND seq = ?"
        )
        self._ins_history = q(
            f"INSERT INTO {ks}.alias_history ({_HISTORY_COLS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self._get_history = q(
            f"SELECT {_HISTORY_COLS} FROM {ks}.alias_history "
            "WHERE tenant = ? AND policy = ? AND alias = ? LIMIT ?"
        )
        self._get_history_entry = q(
            f"SELECT {_HISTORY_COLS} FROM {ks}.alias_history "
            "WHERE tenant = ? AND policy = ? AND alias = ? AND seq = ?"
        )
        self._get_applied = q(
            f"SELECT event_id, type, tenant, policy, revision, outcome FROM {ks}.applied_events "
            "WHERE event_id = ?"
        )
        self._ins_applied = q(
            f"INSERT INTO {ks}.applied_events "
            "(event_id, type, tenant, policy, revision, outcome, applied_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)"
        )

    # ------------------------------------------------------------------ plumbing

    def _prepare(self, cql: str, *, serial_read: bool = False) -> PreparedStatement:
        stmt = self.session.prepare(cql)
        stmt.consistency_level = (
            ConsistencyLevel.LOCAL_SERIAL if serial_read else ConsistencyLevel.LOCAL_QUORUM
        )
        return stmt

    def _prepare_serial(self, cql: str) -> PreparedStatement:
        stmt = self.session.prepare(cql)
        stmt.consistency_level = ConsistencyLevel.LOCAL_QUORUM  # commit phase
        stmt.serial_consistency_level = ConsistencyLevel.LOCAL_SERIAL
        return stmt

    def _run(self, stmt, params: tuple, **kw):
        try:
            return self.session.execute(stmt, params or None, **kw)
        except DRIVER_ERRORS as e:
            raise CatalogUnavailable(
                f"Cassandra request on keyspace {self.keyspace!r} failed ({type(e).__name__}: "
                f"{e}); check `mint dev status` or the cluster, then retry"
            ) from e

    def _one(self, stmt: PreparedStatement, params: tuple):
        return self._run(stmt, params).one()

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
        check_name("tenant", tenant)
        check_name("policy", policy)
        if not base_model:
            raise InvalidReference(f"base_model {base_model!r} is empty: name the base model")
        at = utc(at)
        self._run(self._ins_tenant, (tenant, at))
        row = self._one(self._ins_policy, (tenant, policy, base_model, at, by))
        if not row.applied and row.base_model != base_model:
            raise PolicyExists(
                f"policy {tenant}/{policy} exists with base_model {row.base_model!r}, not "
                f"{base_model!r}: use another policy name for another base model"
            )
        return self.get_policy(tenant, policy)

    def get_policy(self, tenant: str, policy: str) -> Policy:
        check_name("tenant", tenant)
        check_name("policy", policy)
        row = self._one(self._get_policy, (tenant, policy))
        if row is None:
            raise PolicyNotFound(
                f"policy {tenant}/{policy} does not exist: create it first "
                f"(`mint catalog create-policy {tenant}/{policy} --base-model …`)"
            )
        return _policy(row)

    def list_policies(self, tenant: str) -> list[Policy]:
        check_name("tenant", tenant)
        return [_policy(r) for r in self._run(self._list_policies, (tenant,))]

    def retire_policy(self, tenant: str, policy: str, *, by: str = "", at: datetime | None = None):
        """Retire a policy; refused while any alias points into it. Idempotent."""
        pol = self.get_policy(tenant, policy)
        if pol.retired_at is not None:
            return pol
        pointing = [a for a in self.list_aliases(tenant, policy) if a.revision is not None]
        if pointing:
            names = ", ".join(f"@{a.alias}->{a.revision}" for a in pointing)
            raise PolicyInUse(
                f"policy {tenant}/{policy} cannot be retired: aliases still point into it "
                f"({names}); delete or move them first"
            )
        self._run(self._retire_policy, (utc(at), by, tenant, policy))
        return self.get_policy(tenant, policy)

    def _live_policy(self, tenant: str, policy: str) -> Policy:
        pol = self.get_policy(tenant, policy)
        if pol.retired_at is not None:
            raise PolicyRetired(
                f"policy {tenant}/{policy} was retired at {pol.retired_at.isoformat()}: "
                "nothing can be registered or promoted in it"
            )
        return pol

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
    ) -> Revision:
        """Register an exported adapter as the policy's next revision.

        Idempotent by digest (the same content is the same revision) and by source event id (a
        redelivered export returns the revision it created). ``is_new`` tells which happened.
        ``revision`` (e.g. ExportCompleted.revision) demands that exact number: it must be the
        next one, or already hold this digest; anything else is a Conflict.
        ``source_checked``: the caller just read that ``source_event_id`` was not applied (the
        projector does), so that read is not made again.

        Round trips of a new registration: the policy read, the digest claim (LWT), the revision
        insert (LWT; with ``revision`` given its compare-and-set expects ``revision - 1`` at once,
        without a serial read first), the digest index (LWT) and the applied-event row.
        """
        check_name("tenant", tenant)
        check_name("policy", policy)
        check_digest(digest)
        if not store_uri:
            raise InvalidReference(f"store_uri {store_uri!r} is empty: give the adapter's URI")
        if parent_revision is not None:
            check_revision(parent_revision)
        if revision is not None:
            check_revision(revision)
        if source_event_id is not None and not source_checked:
            done = self._one(self._get_applied, (source_event_id,))
            if done is not None and done.revision is not None:
                if (done.tenant, done.policy) != (tenant, policy):
                    raise Conflict(
                        f"source event {source_event_id} already registered revision "
                        f"{done.tenant}/{done.policy}@{done.revision}, not one of {tenant}/{policy}"
                    )
                return self.get_revision(tenant, policy, done.revision)
        pol = self._live_policy(tenant, policy)
        if base_model is not None and base_model != pol.base_model:
            raise Conflict(
                f"base_model {base_model!r} of the export differs from policy {tenant}/{policy}'s "
                f"{pol.base_model!r}: export against the policy's base model"
            )
        if parent_revision is not None:
            self.get_revision(tenant, policy, parent_revision)
        at = utc(at)
        meta = json.dumps(metadata or {}, sort_keys=True, separators=(",", ":"))

        claim = source_event_id or uuid.uuid4()
        existing = self._claim(tenant, policy, digest, claim, at)
        if existing is not None:
            rev = self.get_revision(tenant, policy, existing)
            if revision is not None and revision != existing:
                raise Conflict(
                    f"digest {digest} is revision {existing} of {tenant}/{policy}, but the export "
                    f"says revision {revision}: the same content cannot be two revisions"
                )
            # A retry after a crash mid-registration: the revision's own time, which its
            # export.completed event carries, so a replay of the log writes the same row.
            self._record_applied(source_event_id, "revision.registered", rev, "duplicate",
                                 rev.created_at)  # fmt: skip
            return rev

        number = self._allocate(
            tenant, policy, digest, store_uri, pol.base_model, parent_revision, at, by,
            source_event_id, meta, revision,
        )  # fmt: skip
        self._run(self._set_digest_revision, (number, tenant, policy, digest))
        # The row as written (read back it would be the same, the CAS having applied it).
        stored_at = at.replace(microsecond=at.microsecond // 1000 * 1000)  # Cassandra keeps ms
        rev = Revision(tenant, policy, number, digest, store_uri, pol.base_model, parent_revision,
                       stored_at, by, source_event_id, json.loads(meta))  # fmt: skip
        self._record_applied(source_event_id, "revision.registered", rev, "created", at)
        log.info("revision registered", tenant=tenant, policy=policy, revision=number,
                 digest=digest)  # fmt: skip
        return Revision(**{**rev.__dict__, "is_new": True})

    def _claim(self, tenant, policy, digest, claim: uuid.UUID, at: datetime) -> int | None:
        """Claim the digest for this registration; returns the revision if it already exists."""
        row = self._one(self._claim_digest, (tenant, policy, digest, claim, at))
        if row.applied:
            return None
        if row.revision is not None:
            return row.revision
        if row.claimed_by == claim:
            return None  # our own earlier attempt: resume it
        claimed_at = _aware(row.claimed_at)
        if claimed_at is not None and datetime.now(UTC) - claimed_at < CLAIM_TTL:
            # A crashed registrant may have written the revision but not the index.
            latest = self._one(self._latest_serial, (tenant, policy))
            if latest is not None and latest.digest == digest:
                return None
            raise RegistrationInProgress(
                f"digest {digest} of {tenant}/{policy} is being registered by claim "
                f"{row.claimed_by} since {claimed_at.isoformat()}: retry in a few seconds"
            )
        taken = self._one(
            self._take_claim, (claim, at, tenant, policy, digest, row.claimed_by)
        )  # fmt: skip
        if not taken.applied:
            if taken.revision is not None:
                return taken.revision
            raise RegistrationInProgress(
                f"digest {digest} of {tenant}/{policy} was claimed concurrently: retry"
            )
        return None

    def _allocate(
        self, tenant, policy, digest, store_uri, base_model, parent, at, by, src, meta, want
    ) -> int:
        if want is not None:  # the number is known: compare-and-set at once, read only if refused
            values = (want, digest, store_uri, base_model, parent, at, by, src, meta,
                      tenant, policy, want)  # fmt: skip
            if want == 1:
                row = self._one(self._ins_first_revision, values)
            else:
                row = self._one(self._ins_next_revision, (*values, want - 1))
            if row.applied:
                return want
        for _ in range(_MAX_CAS_RETRIES):
            latest = self._one(self._latest_serial, (tenant, policy))
            if latest is not None and latest.digest == digest:
                return latest.revision  # resumed after a crash between write and index
            current = latest.latest_revision if latest is not None else None
            number = (current or 0) + 1
            if want is not None and want != number:
                self._release(tenant, policy, digest)
                raise Conflict(
                    f"export of {tenant}/{policy} says revision {want} but the next revision is "
                    f"{number} (latest is {current or 'none'}): exports must be registered in "
                    "order, each exactly once"
                )
            values = (number, digest, store_uri, base_model, parent, at, by, src, meta,
                      tenant, policy, number)  # fmt: skip
            if current is None:
                row = self._one(self._ins_first_revision, values)
            else:
                row = self._one(self._ins_next_revision, (*values, current))
            if row.applied:
                return number
        raise Conflict(
            f"could not allocate a revision number for {tenant}/{policy} after "
            f"{_MAX_CAS_RETRIES} compare-and-set attempts (heavy contention): retry"
        )

    def next_revision(self, tenant: str, policy: str) -> int:
        """The number the policy's next registration will get (read at LOCAL_SERIAL), e.g. for
        ``ExportCompleted.revision``; registering with ``revision=`` it is refused if another
        registration took the number first."""
        self.get_policy(tenant, policy)
        latest = self._one(self._latest_serial, (tenant, policy))
        return ((latest.latest_revision or 0) if latest is not None else 0) + 1

    def _release(self, tenant: str, policy: str, digest: str) -> None:
        """Drop our digest claim when the registration is refused, so nothing stays written."""
        self._run(self._del_claim, (tenant, policy, digest))

    def get_revision(self, tenant: str, policy: str, revision: int) -> Revision:
        check_name("tenant", tenant)
        check_name("policy", policy)
        check_revision(revision)
        row = self._one(self._get_revision, (tenant, policy, revision))
        if row is None or row.digest is None:
            self.get_policy(tenant, policy)  # PolicyNotFound names the real cause
            raise RevisionNotFound(
                f"revision {revision} of {tenant}/{policy} does not exist: list them with "
                f"`mint catalog revisions {tenant}/{policy}`"
            )
        return _revision(row)

    def list_revisions(
        self,
        tenant: str,
        policy: str,
        *,
        page_size: int = 100,
        page_state: bytes | None = None,
    ) -> tuple[list[Revision], bytes | None]:
        """One page of revisions, newest first, and the state for the next page (None at end)."""
        check_name("tenant", tenant)
        check_name("policy", policy)
        if not 1 <= page_size <= 5000:
            raise InvalidReference(f"page_size {page_size} must be between 1 and 5000")
        bound = self._list_revisions.bind((tenant, policy))
        bound.fetch_size = page_size
        rs = self._run(bound, (), paging_state=page_state)
        rows = [_revision(r) for r in rs.current_rows if r.digest is not None]
        return rows, rs.paging_state

    def iter_revisions(self, tenant: str, policy: str, page_size: int = 500):
        state = None
        while True:
            page, state = self.list_revisions(tenant, policy, page_size=page_size, page_state=state)
            yield from page
            if state is None:
                return

    # ------------------------------------------------------------------ resolve

    def resolve(self, ref: str | Ref) -> Resolved:
        """Resolve ``tenant/policy@alias``, ``@N`` or ``@sha256:…`` to a revision (one read for
        an alias: the alias row carries its target's digest and store URI)."""
        r = parse_ref(ref) if isinstance(ref, str) else ref
        if r.alias is not None:
            row = self._one(self._resolve_alias, (r.tenant, r.policy, r.alias))
            if row is None or row.revision is None:
                self.get_policy(r.tenant, r.policy)
                raise AliasNotFound(
                    f"alias {r} points nowhere: promote a revision to it first "
                    f"(`mint catalog promote {r} --to N`)"
                )
            return Resolved(r.tenant, r.policy, row.revision, row.digest, row.store_uri, r.alias)
        number = r.revision
        if r.digest is not None:
            row = self._one(self._get_digest, (r.tenant, r.policy, r.digest))
            if row is None or row.revision is None:
                self.get_policy(r.tenant, r.policy)
                raise RevisionNotFound(
                    f"no revision of {r.tenant}/{r.policy} has digest {r.digest}: register the "
                    "export first, or check the tenant and policy in the reference"
                )
            number = row.revision
        rev = self.get_revision(r.tenant, r.policy, number)
        return Resolved(r.tenant, r.policy, rev.revision, rev.digest, rev.store_uri)

    # ------------------------------------------------------------------ aliases

    def get_alias(self, tenant: str, policy: str, alias: str) -> Alias:
        check_name("tenant", tenant)
        check_name("policy", policy)
        check_alias(alias)
        row = self._one(self._get_alias_serial, (tenant, policy, alias))
        if row is None:
            self.get_policy(tenant, policy)
            raise AliasNotFound(f"alias {tenant}/{policy}@{alias} does not exist")
        return _alias(row)

    def list_aliases(self, tenant: str, policy: str) -> list[Alias]:
        return [_alias(r) for r in self._run(self._list_aliases, (tenant, policy))]

    def _target(self, tenant: str, policy: str, to: int | str | Ref) -> Revision:
        if isinstance(to, int) and not isinstance(to, bool):
            return self.get_revision(tenant, policy, to)
        ref = parse_ref(to) if isinstance(to, str) else to
        if (ref.tenant, ref.policy) != (tenant, policy):
            what = "tenant" if ref.tenant != tenant else "policy"
            raise CrossTenantReference(
                f"target {ref} belongs to another {what}: an alias of {tenant}/{policy} can only "
                f"point at revisions of {tenant}/{policy}"
            )
        res = self.resolve(ref)
        return self.get_revision(tenant, policy, res.revision)

    def move_alias(
        self,
        tenant: str,
        policy: str,
        alias: str,
        to: int | str | Ref | None,
        *,
        expected: int | None,
        by: str = "",
        reason: str = "",
        event_id: uuid.UUID | None = None,
        at: datetime | None = None,
        kind: str = "promote",
    ) -> AliasMove:
        """Point ``alias`` at revision ``to`` (a number or a reference in this policy; None
        deletes the pointer) if it currently points at ``expected`` (None: unset).

        Compare-and-set: of racing movers exactly one wins; the others get AliasConflict naming
        the current value. Every move writes one history row: the compare-and-set itself carries
        the move's audit fields, and the history row is written from them (again by the next
        mover or reader if a crash came in between). Repeating a move with the same
        ``event_id`` returns the recorded move and writes nothing.
        """
        check_name("tenant", tenant)
        check_name("policy", policy)
        check_alias(alias)
        if expected is not None:
            check_revision(expected)
        if to is None:
            kind = "delete"
        target = None if to is None else self._target(tenant, policy, to)
        self._live_policy(tenant, policy)
        at = utc(at)
        cur = self._one(self._get_alias_serial, (tenant, policy, alias))
        self._complete_history(cur)
        if cur is not None and event_id is not None:
            if cur.last_event_id == event_id:
                return self._history_entry(tenant, policy, alias, cur.seq)
            # A redelivery after later moves (a projector lagging behind the controller): the
            # value may even be back at `expected` (A->B->A), so look the event up in history.
            done = self._find_move(tenant, policy, alias, event_id)
            if done is not None:
                return done
        current = cur.revision if cur is not None else None
        if current != expected:
            raise _conflict(tenant, policy, alias, expected, current)
        new_rev = target.revision if target else None
        new_digest = target.digest if target else None
        new_uri = target.store_uri if target else None
        seq = (cur.seq if cur is not None else 0) + 1
        if cur is None:
            row = self._one(
                self._ins_alias,
                (tenant, policy, alias, new_rev, new_digest, new_uri, seq, at, by, event_id,
                 current, reason, kind),
            )  # fmt: skip
        else:
            row = self._one(
                self._cas_alias,
                (new_rev, new_digest, new_uri, seq, at, by, event_id, current, reason, kind,
                 tenant, policy, alias, current, cur.seq),
            )  # fmt: skip
        if not row.applied:
            raise _conflict(tenant, policy, alias, expected, row.revision)
        move = AliasMove(tenant, policy, alias, seq, current, new_rev, at, by, reason, kind,
                         event_id)  # fmt: skip
        self._run(
            self._ins_history,
            (tenant, policy, alias, seq, current, new_rev, at, by, reason, kind, event_id),
        )
        log.info("alias moved", tenant=tenant, policy=policy, alias=alias, from_revision=current,
                 to_revision=new_rev, kind=kind, by=by)  # fmt: skip
        return move

    def rollback(
        self,
        tenant: str,
        policy: str,
        alias: str,
        *,
        to: int | str | None = None,
        by: str = "",
        reason: str = "rollback",
        event_id: uuid.UUID | None = None,
        at: datetime | None = None,
    ) -> AliasMove:
        """Move ``alias`` back to the target it had before its latest move (or to revision
        ``to``), by compare-and-set on its current value; recorded in history as a rollback.
        Like ``kubectl rollout undo``, two rollbacks in a row return to where they started."""
        cur = self.get_alias(tenant, policy, alias)
        self._complete_history(self._one(self._get_alias_serial, (tenant, policy, alias)))
        if event_id is not None:
            done = self._find_move(tenant, policy, alias, event_id)
            if done is not None:
                return done  # a redelivered rollback: already done
        if to is None:
            last = self._history_entry(tenant, policy, alias, cur.seq)
            if last.from_revision is None:
                raise Conflict(
                    f"alias {tenant}/{policy}@{alias} has no previous target to roll back to "
                    f"(its latest move set it from nothing to {last.to_revision}): name a "
                    "revision with --to"
                )
            to = last.from_revision
        return self.move_alias(
            tenant, policy, alias, to, expected=cur.revision, by=by, reason=reason,
            event_id=event_id, at=at, kind="rollback",
        )  # fmt: skip

    def alias_history(
        self, tenant: str, policy: str, alias: str, *, limit: int = 100
    ) -> list[AliasMove]:
        """The alias's moves, newest first."""
        check_name("tenant", tenant)
        check_name("policy", policy)
        check_alias(alias)
        self._complete_history(self._one(self._get_alias, (tenant, policy, alias)))
        return [_move(r) for r in self._run(self._get_history, (tenant, policy, alias, limit))]

    def _complete_history(self, cur) -> None:
        """Write the history row of the alias row's latest move if a crash left it unwritten
        (the same values the mover would have written: idempotent)."""
        if cur is None or cur.move_kind is None or not cur.seq:
            return  # no alias, or its last move predates migration 3 (written the old way)
        if self._one(self._get_history_entry, (cur.tenant, cur.policy, cur.alias, cur.seq)):
            return
        log.warning("completing an alias move's history row", tenant=cur.tenant,
                    policy=cur.policy, alias=cur.alias, seq=cur.seq)  # fmt: skip
        self._run(self._ins_history, (cur.tenant, cur.policy, cur.alias, cur.seq, cur.move_from,
                                      cur.revision, cur.moved_at, cur.moved_by, cur.move_reason,
                                      cur.move_kind, cur.last_event_id))  # fmt: skip

    def _find_move(self, tenant, policy, alias, event_id: uuid.UUID) -> AliasMove | None:
        rows = self._run(self._get_history, (tenant, policy, alias, 10_000))
        return next((_move(r) for r in rows if r.event_id == event_id), None)

    def _history_entry(self, tenant: str, policy: str, alias: str, seq: int) -> AliasMove:
        row = self._one(self._get_history_entry, (tenant, policy, alias, seq))
        if row is None:
            raise AliasNotFound(f"alias {tenant}/{policy}@{alias} has no history entry {seq}")
        return _move(row)

    # ------------------------------------------------------------------ applied events

    def is_applied(self, event_id: uuid.UUID) -> bool:
        return self._one(self._get_applied, (event_id,)) is not None

    def record_applied(
        self,
        event_id: uuid.UUID,
        type_: str,
        tenant: str,
        policy: str,
        *,
        revision: int | None = None,
        outcome: str = "applied",
        at: datetime | None = None,
    ) -> None:
        self._run(
            self._ins_applied, (event_id, type_, tenant, policy, revision, outcome, utc(at))
        )  # fmt: skip

    def _record_applied(self, event_id, type_, rev: Revision, outcome, at) -> None:
        if event_id is not None:
            self.record_applied(
                event_id, type_, rev.tenant, rev.policy, revision=rev.revision,
                outcome=outcome, at=at,
            )  # fmt: skip


def _conflict(tenant, policy, alias, expected, current) -> AliasConflict:
    where = "points nowhere" if current is None else f"is at revision {current}"
    want = "unset" if expected is None else str(expected)
    return AliasConflict(
        f"alias {tenant}/{policy}@{alias} {where}, not the expected {want}: "
        f"someone moved it first; re-read it and retry with expected={current} if still wanted",
        current=current,
    )


def _policy(r) -> Policy:
    return Policy(r.tenant, r.policy, r.base_model, _aware(r.created_at), r.created_by or "",
                  _aware(r.retired_at), r.retired_by)  # fmt: skip


def _revision(r) -> Revision:
    return Revision(
        r.tenant, r.policy, r.revision, r.digest, r.store_uri, r.base_model, r.parent_revision,
        _aware(r.created_at), r.created_by or "", r.source_event_id,
        json.loads(r.metadata) if r.metadata else {},
    )  # fmt: skip


def _alias(r) -> Alias:
    return Alias(r.tenant, r.policy, r.alias, r.revision, r.digest, r.store_uri, r.seq or 0,
                 _aware(r.moved_at), r.moved_by, r.last_event_id)  # fmt: skip


def _move(r) -> AliasMove:
    return AliasMove(r.tenant, r.policy, r.alias, r.seq, r.from_revision, r.to_revision,
                     _aware(r.moved_at), r.moved_by or "", r.reason or "", r.kind or "promote",
                     r.event_id)  # fmt: skip
