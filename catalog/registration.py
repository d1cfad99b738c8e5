"""Registering exports as revisions: one lightweight transaction for a policy's run of exports.

The decision is one conditional batch in the policy's partition of ``revisions_by_digest``:

- ``UPDATE … SET latest_revision = N+K IF latest_revision = N`` on the partition's static counter
  (migration 5): numbers are gapless and never given twice;
- per export ``INSERT (digest, revision, claimed_by, claimed_at) … IF NOT EXISTS``: a digest is
  never two revisions of the policy, and the row is the digest index at once.

Both apply or neither, so one Paxos round decides the numbers, the claims and the index of K
exports. The ``revisions`` rows cannot join it (Cassandra refuses a conditional batch that spans
tables), so they are written right after from the registrant's own values, as one plain batch in
their one partition. A crash in between leaves numbers whose rows are missing; the same
registration retried (the projector's redelivery, the trainer's retried request: the same source
event) finds its digests claimed by itself and writes the rows; anyone else registering such a
digest meanwhile gets RegistrationInProgress.

Policies registered by an older build (or imported, ``bulk.py``) have their counter in
``revisions.latest_revision`` only: a null counter here is read as that one, and the first
registration sets it here (``IF latest_revision = null``). A digest row without a revision is an
older build's claim: resumed by its own registrant, taken over once it is ``CLAIM_TTL`` old.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import structlog
from cassandra import ConsistencyLevel
from cassandra.query import UNSET_VALUE, BatchStatement, BatchType

from catalog.applied import AppliedEvents
from catalog.exceptions import CatalogError, Conflict, InvalidReference, RegistrationInProgress
from catalog.models import Policy, Registration, Revision, aware, utc
from catalog.refs import check_digest, check_revision

log = structlog.get_logger()

# A digest claim (an older build's) older than this with no revision is from a crashed
# registrant and may be taken.
CLAIM_TTL = timedelta(seconds=30)
_MAX_CAS_RETRIES = 50


@dataclass(frozen=True)
class _Export:
    """A registration with what its writes need: the claim id and the values as stored."""

    reg: Registration
    claim: uuid.UUID
    at: datetime
    meta: str
    training: dict[str, float]


class Registrar:
    """The registration statements of one keyspace, run through ``catalog``: its plumbing, its
    policy and revision reads (``CatalogBase``) and its applied-events rows (``AppliedEvents``)."""

    def __init__(self, catalog: AppliedEvents) -> None:
        self.catalog = catalog
        ks, q, s = catalog.keyspace, catalog._prepare, catalog._prepare_serial
        counter = f"UPDATE {ks}.revisions_by_digest SET latest_revision = ? WHERE tenant = ? AND policy = ? "
        # Two forms because `IF latest_revision = ?` never matches the null of a new policy.
        self.counter_first = s(counter + "IF latest_revision = null")
        self.counter_next = s(counter + "IF latest_revision = ?")
        self.claim = s(
            f"INSERT INTO {ks}.revisions_by_digest (tenant, policy, digest, revision, claimed_by, "
            "claimed_at) VALUES (?, ?, ?, ?, ?, ?) IF NOT EXISTS"
        )
        self.take = s(
            f"UPDATE {ks}.revisions_by_digest SET revision = ?, claimed_by = ?, claimed_at = ? "
            "WHERE tenant = ? AND policy = ? AND digest = ? IF claimed_by = ? AND revision = null"
        )
        self.counter = q(
            f"SELECT latest_revision FROM {ks}.revisions_by_digest WHERE tenant = ? AND policy = ? "
            "LIMIT 1"
        )
        self.newest = q(
            f"SELECT latest_revision, revision, digest FROM {ks}.revisions "
            "WHERE tenant = ? AND policy = ? LIMIT 1"
        )
        self.set_index = q(
            f"UPDATE {ks}.revisions_by_digest SET revision = ? "
            "WHERE tenant = ? AND policy = ? AND digest = ?"
        )
        self.write_revision = q(
            f"INSERT INTO {ks}.revisions (tenant, policy, revision, digest, store_uri, base_model, "
            "parent_revision, created_at, created_by, source_event_id, metadata, training) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )

    # ------------------------------------------------------------------ entry

    def register(
        self,
        tenant: str,
        policy: str,
        regs: Sequence[Registration],
        *,
        record: bool,
        created: Policy | None,
    ) -> list[Revision]:
        """Register ``regs`` in order (names already validated). Consecutive numbered exports
        with distinct digests are decided in one conditional batch; anything else (no numbers,
        a repeat, a refusal) one by one, so the first refused export raises after the ones
        before it were registered. ``record``: write each source event's applied_events row
        (direct callers; the projection records its events itself). ``created``: the policy
        as its creation just answered; one made by it (``is_new``) has no older counter."""
        pol = self.catalog._live_policy(tenant, policy, known=created)
        exports: list[_Export] = []
        refused = None  # the first export that fails its checks: the ones before it go ahead
        for reg in regs:
            try:
                exports.append(self._export(pol, reg))
            except CatalogError as e:
                refused = e
                break
        out = self._register(tenant, policy, pol, exports, record, created) if exports else []
        if refused is not None:
            raise refused
        return out

    def _register(self, tenant, policy, pol, exports: list[_Export], record, created):
        known: _Known | None = None
        regs = [e.reg for e in exports]
        first = regs[0].revision
        if first is not None and _consecutive(regs) and self._parents_exist(tenant, policy, regs):
            cell = first - 1 if first > 1 else None
            fresh = created is not None and created.is_new
            if cell is not None or fresh or self._legacy_latest(tenant, policy) is None:
                numbered = [(first + i, e) for i, e in enumerate(exports)]
                applied, rows = self._decide(tenant, policy, cell, numbered)
                if applied:
                    return self._written(tenant, pol, numbered, record)
                known = _state(rows)
        out = []
        for e in exports:
            rev = self._one(tenant, policy, pol, e, known, record)
            if known is not None and rev.is_new:
                known = (rev.revision, known[1])  # the counter moved on
            out.append(rev)
        return out

    # ------------------------------------------------------------------ one export

    def _one(self, tenant, policy, pol: Policy, e: _Export, known: _Known | None, record):
        """One export, until it is registered, found, or refused. ``known``: what a refused
        batch compared (the counter, the digest rows that exist), instead of reading again."""
        want, digest = e.reg.revision, e.reg.digest
        row = known[1].get(digest) if known else None  # a digest row never goes away
        parent = e.reg.parent_revision
        if row is None and parent is not None and parent != (want or 0) - 1:
            self.catalog._read_revision(tenant, policy, parent)  # RevisionNotFound before any write
        if known is None:
            cell, base = self._start(tenant, policy, want)
        else:
            cell, base = known[0], known[0] or self._legacy_latest(tenant, policy) or 0
        take = None  # the claimed_by of a claim row (no revision) that we resume or take over
        for _ in range(_MAX_CAS_RETRIES):
            if row is not None and row.revision is not None:
                return self._existing(tenant, policy, pol, e, row, record)
            if row is not None:
                take = self._claim_row(tenant, policy, e, row)
                if isinstance(take, _Found):
                    row = take
                    continue
            if want is not None and want != base + 1:
                raise Conflict(
                    f"export of {tenant}/{policy} says revision {want} but the next revision is "
                    f"{base + 1} (latest is {base or 'none'}): exports must be registered in "
                    "order, each exactly once"
                )
            numbered = [(base + 1, e)]
            applied, rows = self._decide(tenant, policy, cell, numbered, take)
            if applied:
                return self._written(tenant, pol, numbered, record)[0]
            cell, by_digest = _state(rows)
            row = by_digest.get(digest)
            base = cell if cell is not None else self._legacy_latest(tenant, policy) or 0
        raise Conflict(
            f"could not allocate a revision number for {tenant}/{policy} after "
            f"{_MAX_CAS_RETRIES} compare-and-set attempts (heavy contention): retry"
        )

    def _start(self, tenant, policy, want: int | None) -> tuple[int | None, int]:
        """(the counter cell as we expect it, the latest number): a demanded number is trusted
        at once (its compare-and-set says if it was wrong); otherwise one plain read."""
        if want is not None and want > 1:
            return want - 1, want - 1
        cell = None
        if want is None:
            row = self.catalog._one(self.counter, (tenant, policy))
            cell = row.latest_revision if row is not None else None
        return cell, cell if cell is not None else self._legacy_latest(tenant, policy) or 0

    def _existing(self, tenant, policy, pol, e: _Export, row, record) -> Revision:
        """The digest is revision ``row.revision`` already: a repeat, or our own registration
        whose revision row a crash left unwritten (written now)."""
        want, number = e.reg.revision, row.revision
        if want is not None and want != number:
            raise Conflict(
                f"digest {e.reg.digest} is revision {number} of {tenant}/{policy}, but the export "
                f"says revision {want}: the same content cannot be two revisions"
            )
        rev = self.catalog._revision_or_none(tenant, policy, number)
        if rev is None:
            if row.claimed_by != e.claim:
                raise RegistrationInProgress(
                    f"digest {e.reg.digest} is revision {number} of {tenant}/{policy}, whose row "
                    f"its registrant (claim {row.claimed_by}) has not written yet: retry in a few "
                    "seconds"
                )
            if row.claimed_at is not None:
                # Our own earlier attempt won the compare-and-set and then failed (a crash, or
                # a timeout on a cluster whose write went through anyway): the revision takes
                # that attempt's time, which its claim row keeps, so the event says the same
                # time and a replay of it writes the same row.
                e = replace(e, at=aware(row.claimed_at))
            return self._written(tenant, pol, [(number, e)], record)[0]
        if record:  # the revision's own time, as its export.completed (and so a replay) has it
            self.catalog._record_applied(e.reg.source_event_id, rev, "duplicate", rev.created_at)
        return rev

    def _claim_row(self, tenant, policy, e: _Export, row) -> uuid.UUID | _Found:
        """A digest row without a revision: an older build's claim. Its registrant may have
        written the revision but not the index (then that revision is the answer, indexed
        now); otherwise the claim is resumed by its own registrant, or taken once stale."""
        newest = self.catalog._one(self.newest, (tenant, policy))
        if newest is not None and newest.digest == e.reg.digest:
            self.catalog._run(self.set_index, (newest.revision, tenant, policy, e.reg.digest))
            return _Found(newest.revision, row.claimed_by)
        claimed_at = aware(row.claimed_at)
        mine = row.claimed_by == e.claim
        if not mine and claimed_at is not None and datetime.now(UTC) - claimed_at < CLAIM_TTL:
            raise RegistrationInProgress(
                f"digest {e.reg.digest} of {tenant}/{policy} is being registered by claim "
                f"{row.claimed_by} since {claimed_at.isoformat()}: retry in a few seconds"
            )
        return row.claimed_by

    # ------------------------------------------------------------------ writes

    def _decide(self, tenant, policy, cell, numbered, take=None) -> tuple[bool, list]:
        """The one conditional batch: the counter from ``cell`` to the last number, and each
        digest's row (new, or ``take``'s claim row). Returns (applied, the rows compared)."""
        batch = BatchStatement(
            BatchType.UNLOGGED,
            consistency_level=ConsistencyLevel.LOCAL_QUORUM,
            serial_consistency_level=ConsistencyLevel.LOCAL_SERIAL,
        )
        last = numbered[-1][0]
        if cell is None:
            batch.add(self.counter_first, (last, tenant, policy))
        else:
            batch.add(self.counter_next, (last, tenant, policy, cell))
        for number, e in numbered:
            if take is None:
                batch.add(self.claim, (tenant, policy, e.reg.digest, number, e.claim, e.at))
            else:
                batch.add(self.take, (number, e.claim, e.at, tenant, policy, e.reg.digest, take))
        rs = self.catalog._run(batch, ())
        return rs.was_applied, list(rs)

    def _written(self, tenant, pol: Policy, numbered, record: bool) -> list[Revision]:
        """Write the revision rows of numbers just decided (one partition: one plain batch) and
        return them as stored; then, when ``record``, their applied_events rows."""
        rows = [
            (
                tenant,
                pol.policy,
                number,
                e.reg.digest,
                e.reg.store_uri,
                pol.base_model,
                _unset(e.reg.parent_revision),
                e.at,
                e.reg.by,
                _unset(e.reg.source_event_id),
                e.meta,
                _unset(e.training or None),
            )
            for number, e in numbered
        ]
        if len(rows) == 1:
            self.catalog._run(self.write_revision, rows[0])
        else:
            batch = BatchStatement(
                BatchType.UNLOGGED, consistency_level=ConsistencyLevel.LOCAL_QUORUM
            )
            for values in rows:
                batch.add(self.write_revision, values)
            self.catalog._run(batch, ())
        revs = []
        for number, e in numbered:
            reg = e.reg
            rev = Revision(
                tenant,
                pol.policy,
                number,
                reg.digest,
                reg.store_uri,
                pol.base_model,
                reg.parent_revision,
                e.at,
                reg.by,
                reg.source_event_id,
                json.loads(e.meta),
                dict(e.training),
                is_new=True,
            )
            if record:
                self.catalog._record_applied(reg.source_event_id, rev, "created", e.at)
            log.info(
                "revision registered",
                tenant=tenant,
                policy=pol.policy,
                revision=number,
                digest=reg.digest,
            )
            revs.append(rev)
        return revs

    # ------------------------------------------------------------------ checks and reads

    def _export(self, pol: Policy, reg: Registration) -> _Export:
        """Check what the caller sent (before anything is written); fix the values stored."""
        check_digest(reg.digest)
        if not reg.store_uri:
            raise InvalidReference(f"store_uri {reg.store_uri!r} is empty: give the adapter's URI")
        if reg.parent_revision is not None:
            check_revision(reg.parent_revision)
        if reg.revision is not None:
            check_revision(reg.revision)
        if reg.base_model is not None and reg.base_model != pol.base_model:
            raise Conflict(
                f"base_model {reg.base_model!r} of the export differs from policy {pol.name}'s "
                f"{pol.base_model!r}: export against the policy's base model"
            )
        meta = json.dumps(reg.metadata or {}, sort_keys=True, separators=(",", ":"))
        training = _figures(reg.training)
        return _Export(reg, reg.source_event_id or uuid.uuid4(), utc(reg.at), meta, training)

    def _parents_exist(self, tenant, policy, regs: Sequence[Registration]) -> bool:
        """Each parent is the number before its export (the batch's counter condition proves
        that it exists), or is read now; False for a missing one (one by one refuses it)."""
        for reg in regs:
            parent = reg.parent_revision
            if (
                parent is not None
                and parent != reg.revision - 1
                and self.catalog._revision_or_none(tenant, policy, parent) is None
            ):
                return False
        return True

    def _legacy_latest(self, tenant, policy) -> int | None:
        """``revisions.latest_revision``: the counter of an import or of an older build."""
        row = self.catalog._one(self.newest, (tenant, policy))
        return row.latest_revision if row is not None else None


_Known = tuple[int | None, dict[str, Any]]


class _Found(NamedTuple):
    """A digest row as the index now has it."""

    revision: int
    claimed_by: uuid.UUID | None


def _consecutive(regs: Sequence[Registration]) -> bool:
    """Numbered one after the other with distinct digests: decidable in one batch (a digest
    twice in one batch would pass both of its IF NOT EXISTS)."""
    first = regs[0].revision
    return len({r.digest for r in regs}) == len(regs) and all(
        r.revision == first + i for i, r in enumerate(regs)
    )


def _state(rows: list) -> _Known:
    """What a refused batch compared: the counter, and the digest rows that exist. An empty
    partition answers with the ``[applied]`` column alone."""
    if not rows or "latest_revision" not in rows[0]._fields:
        return None, {}
    return rows[0].latest_revision, {r.digest: r for r in rows if r.digest is not None}


def _figures(training: dict[str, float] | None) -> dict[str, float]:
    """A registration's training figures as stored: finite doubles by name (the event's model
    keeps NaN out; this guards the direct callers too)."""
    out = {}
    for name, value in (training or {}).items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if not isinstance(name, str) or not name or not math.isfinite(number):
            raise InvalidReference(
                f"training figure {name!r} = {value!r} is not a finite number: give finite "
                "numbers by name (steps, tokens, loss, reward, learning_rate) or leave it out"
            )
        out[name] = number
    return out


def _unset(value):
    return UNSET_VALUE if value is None else value  # a bound null would write a tombstone
