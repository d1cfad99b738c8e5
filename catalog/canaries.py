"""Canaries: a share of an alias's callers routed to another revision (migration 7).

``Canaries`` is a part of ``CatalogRepository`` (mixed in, which prepares the statements
below), on ``CatalogBase`` (``base.py``, which also reads the route a resolve returns:
``route_of``). The running canary lives on the alias row beside the pointer, set and cleared by
compare-and-set on ``canary_id``, so a resolve stays one read and engines route from what it
returns (``Resolved.canary``). A canary belongs to the incumbent it was started on: an alias
moved underneath it (a promotion by hand) leaves the canary inert, and resolve ignores it.
``canary_answers`` joins a feedback score to the revision that answered; ``canary_history``
records each canary from start to end.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

import structlog

from catalog.base import CANARY_ROUTE, CatalogBase, route_of
from catalog.exceptions import AliasConflict, AliasNotFound, Conflict
from catalog.models import CanaryRecord, CanaryRoute, from_row, utc
from schemas.envelope import Envelope
from schemas.events import CanaryEnded, CanaryStarted

log = structlog.get_logger()

CANARY_FIELDS = {
    "canary_route": CANARY_ROUTE,
    "canary_cols": "tenant, policy, alias, canary_id, revision, incumbent, share, started_at, "
    "started_by, reason, ended_at, outcome, end_reason, figures",
}
CANARY_STATEMENTS = {
    "_get_canary": (
        "SELECT revision, {canary_route} FROM {ks}.aliases "
        "WHERE tenant = ? AND policy = ? AND alias = ?"
    ),
    "_ins_canary_history": (
        "INSERT INTO {ks}.canary_history (tenant, policy, alias, canary_id, revision, incumbent, "
        "share, started_at, started_by, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    ),
    "_end_canary_history": (
        "UPDATE {ks}.canary_history SET ended_at = ?, outcome = ?, end_reason = ?, figures = ? "
        "WHERE tenant = ? AND policy = ? AND alias = ? AND canary_id = ?"
    ),
    "_list_canary_history": (
        "SELECT {canary_cols} FROM {ks}.canary_history WHERE tenant = ? AND policy = ?"
    ),
    "_ins_canary_answer": (
        "INSERT INTO {ks}.canary_answers (tenant, policy, request_id, canary_id, revision) "
        "VALUES (?, ?, ?, ?, ?)"
    ),
    "_get_canary_answer": (
        "SELECT canary_id, revision FROM {ks}.canary_answers "
        "WHERE tenant = ? AND policy = ? AND request_id = ?"
    ),
}
CANARY_SERIAL_READS = {
    "_get_canary_serial": (
        "SELECT revision, {canary_route} FROM {ks}.aliases "
        "WHERE tenant = ? AND policy = ? AND alias = ?"
    ),
}
CANARY_CONDITIONAL = {
    "_cas_start_canary": (
        "UPDATE {ks}.aliases SET canary_id = ?, canary_revision = ?, canary_digest = ?, "
        "canary_store_uri = ?, canary_share = ?, canary_incumbent = ?, canary_started_at = ?, "
        "canary_by = ? WHERE tenant = ? AND policy = ? AND alias = ? "
        "IF revision = ? AND canary_id = ?"
    ),
    "_cas_end_canary": (
        "UPDATE {ks}.aliases SET canary_id = null, canary_revision = null, canary_digest = null, "
        "canary_store_uri = null, canary_share = null, canary_incumbent = null, "
        "canary_started_at = null, canary_by = null "
        "WHERE tenant = ? AND policy = ? AND alias = ? IF canary_id = ?"
    ),
}


class Canaries(CatalogBase):
    """The canary half of ``CatalogRepository``."""

    def get_canary(self, tenant: str, policy: str, alias: str) -> CanaryRoute | None:
        """The alias's running canary (None: none, or one left inert by a move under it)."""
        return route_of(self._one(self._get_canary_serial, (tenant, policy, alias)))

    def start_canary(
        self,
        tenant: str,
        policy: str,
        alias: str,
        revision: int,
        share: float,
        *,
        canary_id: uuid.UUID,
        expected: int | None = None,
        by: str = "",
        reason: str = "",
        at: datetime | None = None,
    ) -> CanaryRoute:
        """Route ``share`` of ``alias``'s callers to ``revision`` by compare-and-set (names and
        values come from a decoded command). Repeating it with the same ``canary_id`` returns
        the running canary and writes nothing."""
        cur = self._one(self._get_canary_serial, (tenant, policy, alias))
        if cur is not None and cur.canary_id == canary_id:
            return route_of(cur) or _inert(tenant, policy, alias, cur)
        ref = f"{tenant}/{policy}@{alias}"
        if cur is None or cur.revision is None:
            raise AliasNotFound(
                f"alias {ref} points nowhere: a canary shares an alias's traffic with the "
                "revision it serves, so promote a revision to it first"
            )
        if expected is not None and cur.revision != expected:
            raise AliasConflict(
                f"alias {ref} is at revision {cur.revision}, not the expected {expected}: "
                "re-read it and retry",
                current=cur.revision,
            )
        if route_of(cur) is not None:
            raise Conflict(
                f"alias {ref} already runs a canary of revision {cur.canary_revision} "
                f"({cur.canary_share:.0%}): wait for its decision, or end it with "
                f"`mint rollback {ref}` first"
            )
        if revision == cur.revision:
            raise Conflict(f"alias {ref} serves revision {revision} already: nothing to canary")
        self._live_policy(tenant, policy)
        target = self._read_revision(tenant, policy, revision)
        at = utc(at)
        row = self._one(
            self._cas_start_canary,
            (canary_id, revision, target.digest, target.store_uri, share, cur.revision, at, by)
            + (tenant, policy, alias, cur.revision, cur.canary_id),
        )
        if not row.applied:
            raise AliasConflict(
                f"alias {ref} moved while its canary was being started (now at revision "
                f"{row.revision}): re-read it and retry",
                current=row.revision,
            )
        log.info("canary started", ref=ref, revision=revision, incumbent=cur.revision, share=share)
        return CanaryRoute(
            canary_id, revision, target.digest, target.store_uri, share, cur.revision, at, by
        )

    def end_canary(
        self,
        tenant: str,
        policy: str,
        alias: str,
        canary_id: uuid.UUID,
    ) -> None:
        """Stop routing to the canary ``canary_id``. Idempotent: a canary already ended (or
        replaced) is left as it is."""
        self._one(self._cas_end_canary, (tenant, policy, alias, canary_id))
        log.info("canary ended", ref=f"{tenant}/{policy}@{alias}")

    def replay_canary_route(self, env: Envelope[Any]) -> None:
        """Set or clear an alias's canary route as the controller did when it published
        ``env`` (a rebuild: the live projector leaves routes to the controller, their one
        writer, which may have ended a canary before the projector reads its start). A start
        whose alias moved meanwhile is left inert, as the live route was."""
        p = env.payload
        if isinstance(p, CanaryEnded):
            self.end_canary(env.tenant, env.policy, p.alias, p.canary_id)
            return
        try:
            self.start_canary(
                env.tenant,
                env.policy,
                p.alias,
                p.revision,
                p.share,
                canary_id=p.canary_id,
                expected=p.incumbent_revision,
                by=p.requested_by,
                reason=p.reason,
                at=env.occurred_at,
            )
        except (AliasNotFound, Conflict) as e:
            log.warning("replay: canary left inert", canary_id=str(p.canary_id), reason=str(e))

    def record_canary(self, env: Envelope[Any]) -> None:
        """Write a ``canary.started`` or ``canary.ended`` fact to ``canary_history``: by the
        controller that carried it out, and by the projector that reads it back (the same
        values from the same fact, so a rebuild of the log writes the same rows)."""
        p, key = env.payload, (env.tenant, env.policy, env.payload.alias, env.payload.canary_id)
        at = utc(env.occurred_at)
        if isinstance(p, CanaryStarted):
            row = (p.revision, p.incumbent_revision, p.share, at, p.requested_by, p.reason)
            self._run(self._ins_canary_history, key + row)
        elif isinstance(p, CanaryEnded):
            figures = {
                side: getattr(p, side).model_dump(mode="json")
                for side in ("canary", "incumbent")
                if getattr(p, side) is not None
            }
            ended = (at, p.outcome, p.reason, json.dumps(figures, sort_keys=True))
            self._run(self._end_canary_history, ended + key)
        else:
            raise TypeError(f"{env.type!r} is not a canary fact")

    def canary_history(
        self, tenant: str, policy: str, alias: str | None = None
    ) -> list[CanaryRecord]:
        """Every canary of the policy (of ``alias`` when given), newest first."""
        rows = [
            from_row(CanaryRecord, r)
            for r in self._run(self._list_canary_history, (tenant, policy))
        ]
        rows = [r for r in rows if alias is None or r.alias == alias]
        return sorted(rows, key=lambda r: r.started_at, reverse=True)

    def record_canary_answer(
        self,
        tenant: str,
        policy: str,
        request_id: str,
        canary_id: uuid.UUID,
        revision: int,
    ) -> None:
        self._run(self._ins_canary_answer, (tenant, policy, request_id, canary_id, revision))

    def canary_answer(
        self, tenant: str, policy: str, request_id: str
    ) -> tuple[uuid.UUID, int] | None:
        """(canary id, revision) of an answer given while a canary ran, else None."""
        row = self._one(self._get_canary_answer, (tenant, policy, request_id))
        return None if row is None else (row.canary_id, row.revision)


def _inert(tenant: str, policy: str, alias: str, cur: Any) -> CanaryRoute:
    """A redelivered start whose canary the alias no longer honours (it moved since)."""
    raise Conflict(
        f"the canary of {tenant}/{policy}@{alias} was started, but the alias moved to revision "
        f"{cur.revision} since: start a new one"
    )
