"""Aliases: their reads, their moves by compare-and-set, rollback, and history.

``AliasMoves`` is a part of ``CatalogRepository`` (mixed in, which prepares the statements
below), on ``CatalogBase`` (``base.py``): the plumbing (``_run``, ``_one``) and the policy,
revision and reference reads a move checks.

A move is one compare-and-set on the alias row, which carries the move's audit fields, then the
history row written from them; a crash between the two is completed by the next mover or
reader (``_complete_history``). Names: tenant and policy come from a decoded event or a parsed
reference; the alias is checked here unless the caller says it was (``checked``).
"""

from __future__ import annotations

import uuid
from datetime import datetime

import structlog

from catalog.base import CatalogBase
from catalog.exceptions import AliasConflict, AliasNotFound, Conflict, CrossTenantReference
from catalog.models import Alias, AliasMove, Revision, from_row, utc
from catalog.refs import Ref, check_alias, check_name, check_revision, parse_ref

log = structlog.get_logger()

ALIAS_FIELDS = {
    "alias_cols": "tenant, policy, alias, revision, digest, store_uri, seq, moved_at, moved_by, "
    "last_event_id, move_from, move_reason, move_kind",
    "history_cols": "tenant, policy, alias, seq, from_revision, to_revision, moved_at, moved_by, "
    "reason, kind, event_id",
}
ALIAS_STATEMENTS = {
    "_get_alias": "SELECT {alias_cols} FROM {ks}.aliases WHERE tenant = ? AND policy = ? AND alias = ?",
    "_list_aliases": "SELECT {alias_cols} FROM {ks}.aliases WHERE tenant = ? AND policy = ?",
    "_ins_history": (
        "INSERT INTO {ks}.alias_history ({history_cols}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    ),
    "_get_history": (
        "SELECT {history_cols} FROM {ks}.alias_history "
        "WHERE tenant = ? AND policy = ? AND alias = ? LIMIT ?"
    ),
    "_get_history_entry": (
        "SELECT {history_cols} FROM {ks}.alias_history "
        "WHERE tenant = ? AND policy = ? AND alias = ? AND seq = ?"
    ),
}
# Read at LOCAL_SERIAL: what decides a compare-and-set sees every compare-and-set before it.
ALIAS_SERIAL_READS = {
    "_get_alias_serial": (
        "SELECT {alias_cols} FROM {ks}.aliases WHERE tenant = ? AND policy = ? AND alias = ?"
    ),
}
ALIAS_CONDITIONAL = {
    "_ins_alias": (
        "INSERT INTO {ks}.aliases ({alias_cols}) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS"
    ),
    "_cas_alias": (
        "UPDATE {ks}.aliases SET revision = ?, digest = ?, store_uri = ?, seq = ?, "
        "moved_at = ?, moved_by = ?, last_event_id = ?, move_from = ?, move_reason = ?, "
        "move_kind = ? WHERE tenant = ? AND policy = ? AND alias = ? IF revision = ? AND seq = ?"
    ),
}


class AliasMoves(CatalogBase):
    """The alias half of ``CatalogRepository``."""

    def get_alias(self, tenant: str, policy: str, alias: str) -> Alias:
        """The alias as the latest compare-and-set left it (names as decoded from an event)."""
        row = self._one(self._get_alias_serial, (tenant, policy, alias))
        if row is None:
            self._read_policy(tenant, policy)
            raise AliasNotFound(f"alias {tenant}/{policy}@{alias} does not exist")
        return from_row(Alias, row)

    def list_aliases(self, tenant: str, policy: str) -> list[Alias]:
        return [from_row(Alias, r) for r in self._run(self._list_aliases, (tenant, policy))]

    def _target(self, tenant: str, policy: str, to: int | str | Ref) -> Revision:
        if isinstance(to, int) and not isinstance(to, bool):
            return self._read_revision(tenant, policy, check_revision(to))
        ref = parse_ref(to) if isinstance(to, str) else to
        if (ref.tenant, ref.policy) != (tenant, policy):
            what = "tenant" if ref.tenant != tenant else "policy"
            raise CrossTenantReference(
                f"target {ref} belongs to another {what}: an alias of {tenant}/{policy} can only "
                f"point at revisions of {tenant}/{policy}"
            )
        res = self.resolve(ref)
        return self._read_revision(tenant, policy, res.revision)

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
        checked: bool = False,
        fact: bool = False,
    ) -> AliasMove:
        """Point ``alias`` at revision ``to`` (a number or a reference in this policy; None
        deletes the pointer) if it currently points at ``expected`` (None: unset).

        Compare-and-set: of racing movers exactly one wins; the others get AliasConflict naming
        the current value. Every move writes one history row: the compare-and-set itself carries
        the move's audit fields, and the history row is written from them (again by the next
        mover or reader if a crash came in between). Repeating a move with the same
        ``event_id`` returns the recorded move and writes nothing. ``checked``: ``alias`` and
        ``expected`` come from a decoded event or from the catalog (the projection, rollback),
        so they are not checked again. ``fact``: the move already happened (an ``alias.moved``
        being projected): it is recorded even if the policy was retired since, so the catalog
        and a rebuild of the log agree.
        """
        if not checked:
            check_alias(alias)
            if expected is not None:
                check_revision(expected)
        if to is None:
            kind = "delete"
        target = None if to is None else self._target(tenant, policy, to)
        if not fact:
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
        key = (tenant, policy, alias)
        # The columns a move sets, in the order both statements take them after (insert) or
        # before (compare-and-set) the key.
        fields = (new_rev, new_digest, new_uri, seq, at, by, event_id, current, reason, kind)
        if cur is None:
            row = self._one(self._ins_alias, key + fields)
        else:
            row = self._one(self._cas_alias, fields + key + (current, cur.seq))
        if not row.applied:
            raise _conflict(tenant, policy, alias, expected, row.revision)
        move = AliasMove(*key, seq, current, new_rev, at, by, reason, kind, event_id)
        self._run(self._ins_history, (*key, seq, current, new_rev, at, by, reason, kind, event_id))
        log.info(
            "alias moved",
            tenant=tenant,
            policy=policy,
            alias=alias,
            from_revision=current,
            to_revision=new_rev,
            kind=kind,
            by=by,
        )
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
            tenant,
            policy,
            alias,
            to,
            expected=cur.revision,
            by=by,
            reason=reason,
            event_id=event_id,
            at=at,
            kind="rollback",
            checked=True,  # the alias and its revision were just read from the catalog
        )

    def alias_history(
        self, tenant: str, policy: str, alias: str, *, limit: int = 100
    ) -> list[AliasMove]:
        """The alias's moves, newest first."""
        check_name("tenant", tenant)
        check_name("policy", policy)
        check_alias(alias)
        self._complete_history(self._one(self._get_alias, (tenant, policy, alias)))
        rows = self._run(self._get_history, (tenant, policy, alias, limit))
        return [from_row(AliasMove, r) for r in rows]

    def _complete_history(self, cur) -> None:
        """Write the history row of the alias row's latest move if a crash left it unwritten
        (the same values the mover would have written: idempotent)."""
        if cur is None or cur.move_kind is None or not cur.seq:
            return  # no alias, or its last move predates migration 3 (written the old way)
        if self._one(self._get_history_entry, (cur.tenant, cur.policy, cur.alias, cur.seq)):
            return
        log.warning(
            "completing an alias move's history row",
            tenant=cur.tenant,
            policy=cur.policy,
            alias=cur.alias,
            seq=cur.seq,
        )
        self._run(
            self._ins_history,
            (
                cur.tenant,
                cur.policy,
                cur.alias,
                cur.seq,
                cur.move_from,
                cur.revision,
                cur.moved_at,
                cur.moved_by,
                cur.move_reason,
                cur.move_kind,
                cur.last_event_id,
            ),
        )

    def _find_move(
        self, tenant: str, policy: str, alias: str, event_id: uuid.UUID
    ) -> AliasMove | None:
        rows = self._run(self._get_history, (tenant, policy, alias, 10_000))
        return next((from_row(AliasMove, r) for r in rows if r.event_id == event_id), None)

    def _history_entry(self, tenant: str, policy: str, alias: str, seq: int) -> AliasMove:
        row = self._one(self._get_history_entry, (tenant, policy, alias, seq))
        if row is None:
            raise AliasNotFound(f"alias {tenant}/{policy}@{alias} has no history entry {seq}")
        return from_row(AliasMove, row)


def _conflict(tenant, policy, alias, expected, current) -> AliasConflict:
    where = "points nowhere" if current is None else f"is at revision {current}"
    want = "unset" if expected is None else str(expected)
    return AliasConflict(
        f"alias {tenant}/{policy}@{alias} {where}, not the expected {want}: "
        f"someone moved it first; re-read it and retry with expected={current} if still wanted",
        current=current,
    )
