"""The controller's canaries: start one on a ``serving.canary`` command, count what serving sees
of each side, and promote or end it when the policy's rule decides.

One canary per policy at a time (the view's key is the policy). Per input:

- ``serving.canary`` → compare-and-set on the alias row (``catalog.canaries``) → the view is
  saved → ``canary.started`` (or ``serving.refused``).
- ``infer.completed`` / ``infer.failed`` of the canary's alias → counted on the side of the
  revision that answered (a failure of stage load or generate is the revision's; a refusal of
  the request or an expiry is not), and the answer joined to its revision in
  ``canary_answers``; ``feedback.submitted`` → its score counted on the side that answered it
  (a score read before its answer waits in the view).
- After each count the rule is applied; a decision is saved before it is carried out, so a
  crash in between carries it out again with the same event ids. ``promoted``: the alias moves
  to the canary (``alias.moved``, its reason the figures) and the canary ends; ``rolled_back``:
  the canary ends and the alias stays. A ``serving.rollback`` of the alias ends a running canary.

Every input counts once: the view keeps the highest offset it counted per partition.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

import structlog

from catalog.exceptions import AliasConflict, CatalogError, CatalogUnavailable
from catalog.projection import alias_moved
from catalog.refs import parse_ref
from catalog.state import StateTable
from schemas import Envelope
from schemas.envelope import make_event, make_reply
from schemas.events import (
    CanaryCommand,
    CanaryEnded,
    CanaryRule,
    CanarySide,
    CanaryStarted,
    FeedbackSubmitted,
    InferCompleted,
    InferFailed,
    ServingRefused,
)
from workers.controller import metrics
from workers.controller.canary_view import (
    EARLY_SCORES,
    CanaryDecision,
    CanaryView,
    canary_key,
    verdict,
)

log = structlog.get_logger()

_NS = uuid.UUID("3b0f6a0e-9c1d-4f6e-8a57-2e4c1d9b7a10")
NO_VIEW_TTL_S = 2.0  # a policy without a canary is looked up again after this
REVISION_FAILURES = ("load", "generate")  # stages whose failure is the revision's, not the caller's


def derived(canary_id: uuid.UUID, what: str) -> uuid.UUID:
    return uuid.uuid5(_NS, f"{canary_id}:{what}")


class CanaryJudge:
    """Canaries of the policies this controller instance holds (the catalog is ``repo``)."""

    def __init__(self, repo: Any, views: StateTable | Any, configs: Any, *, producer: str):
        self.repo, self.views, self.configs, self.producer = repo, views, configs, producer
        self._none_until: dict[str, float] = {}  # policy -> when to look for a canary again
        self._poll: dict[str, CanaryView] = {}  # views read or changed in this poll
        self._dirty: set[str] = set()  # of those, the ones whose counts changed

    # ------------------------------------------------------------------ reads

    def view(self, tenant: str, policy: str) -> CanaryView | None:
        key = canary_key(tenant, policy)
        if key in self._poll:
            return self._poll[key]
        if self._none_until.get(key, 0.0) > time.monotonic():
            return None
        raw = self.views.get(key)
        if raw is None:
            self._none_until[key] = time.monotonic() + NO_VIEW_TTL_S
            return None
        view = self._poll[key] = CanaryView.model_validate(raw)
        return view

    def live(self, tenant: str, policy: str, alias: str) -> CanaryView | None:
        v = self.view(tenant, policy)
        return v if v is not None and v.alias == alias and v.live else None

    def _save(self, tenant: str, policy: str, view: CanaryView, *, now: bool = True) -> None:
        """Keep ``view``; written at once (``now``: a start or a decision, before its effects)
        or with the poll's other counts in ``flush``."""
        key = canary_key(tenant, policy)
        self._poll[key] = view
        self._none_until.pop(key, None)
        if now:
            self.views[key] = view.model_dump(mode="json")
            self._dirty.discard(key)
        else:
            self._dirty.add(key)

    def flush(self) -> None:
        """Write the poll's counts: the consumer loop calls this before it commits the poll's
        offsets, so a crash before it redelivers the records and they are counted again (the
        saved offsets say which were counted)."""
        for key in sorted(self._dirty):
            self.views[key] = self._poll[key].model_dump(mode="json")
        self._dirty.clear()
        self._poll.clear()

    # ------------------------------------------------------------------ start

    def start(self, cmd: Envelope[CanaryCommand]) -> list[Envelope[Any]]:
        p, t, pol = cmd.payload, cmd.tenant, cmd.policy
        held = self.view(t, pol)
        if held is not None and held.canary_id == cmd.event_id:
            return [self._started(cmd, held)]  # a redelivered command
        if held is not None and held.live:
            return [
                self._refused(
                    cmd,
                    f"{cmd.policy_id} already runs a canary of revision {held.revision} on "
                    f"@{held.alias}: wait for its decision, or end it with `mint rollback "
                    f"{cmd.policy_id}@{held.alias}`",
                    held.incumbent_revision,
                )
            ]
        try:
            route = self.repo.start_canary(
                t,
                pol,
                p.alias,
                p.revision,
                p.share,
                canary_id=cmd.event_id,
                expected=p.expected_revision,
                by=p.requested_by or cmd.producer,
                reason=p.reason,
                at=cmd.occurred_at,
            )
        except CatalogUnavailable:
            raise
        except AliasConflict as e:
            return [self._refused(cmd, str(e), e.current)]
        except CatalogError as e:
            return [self._refused(cmd, f"{type(e).__name__}: {e}", None)]
        side = CanarySide
        view = CanaryView(
            canary_id=route.canary_id,
            alias=p.alias,
            revision=route.revision,
            incumbent_revision=route.incumbent_revision,
            share=route.share,
            started_at=route.started_at,
            started_by=route.started_by,
            rule=self._rule(cmd.policy_id),
            canary=side(revision=route.revision),
            incumbent=side(revision=route.incumbent_revision),
        )
        self._save(t, pol, view)
        fact = self._started(cmd, view)
        self.repo.record_canary(fact)
        metrics.CANARIES.labels("started").inc()
        return [fact]

    def _rule(self, policy_id: str) -> CanaryRule:
        cfg = self.configs.get(policy_id) or {}
        return CanaryRule.model_validate(cfg.get("canary") or {})

    def _started(self, cmd: Envelope[CanaryCommand], v: CanaryView) -> Envelope[CanaryStarted]:
        route = self.repo.resolve(f"{cmd.policy_id}@{v.revision}")
        fact = CanaryStarted(
            alias=v.alias,
            canary_id=v.canary_id,
            incumbent_revision=v.incumbent_revision,
            revision=v.revision,
            adapter_digest=route.digest,
            store_uri=route.store_uri,
            share=v.share,
            reason=cmd.payload.reason,
            requested_by=v.started_by,
        )
        return make_reply(
            fact,
            cmd,
            producer=self.producer,
            event_id=derived(v.canary_id, "started"),
            occurred_at=v.started_at,
        )

    def _refused(self, cmd: Envelope[Any], reason: str, current: int | None) -> Envelope[Any]:
        metrics.REFUSALS.labels(cmd.type).inc()
        log.warning("serving command refused", type=cmd.type, policy=cmd.policy_id, reason=reason)
        return make_reply(
            ServingRefused(
                command_id=cmd.event_id,
                command_type=cmd.type,
                alias=cmd.payload.alias,
                reason=reason[:2048],
                current_revision=current,
            ),
            cmd,
            producer=self.producer,
            event_id=derived(cmd.event_id, "refused"),
        )

    # ------------------------------------------------------------------ counting

    def observe(self, env: Envelope[Any], record: Any) -> list[Envelope[Any]]:
        """An answer, a failure or a score: count it if it belongs to a running canary."""
        view = self.view(env.tenant, env.policy)
        if view is None:
            return []
        if not view.live:
            if view.decision is not None and view.decision.done:  # nothing runs: look later
                self._none_until[canary_key(env.tenant, env.policy)] = (
                    time.monotonic() + NO_VIEW_TTL_S
                )
                self._poll.pop(canary_key(env.tenant, env.policy), None)
            return self._carry_out(env.tenant, env.policy, view)
        where = f"{record.topic}:{record.partition}"
        if record.offset <= view.offsets.get(where, -1):
            return []  # counted before a crash: redelivered
        view.offsets[where] = record.offset
        counted = self._count(env, view)
        if not counted:
            return []
        decided = verdict(view)
        if decided is not None:
            outcome, reason = decided
            view.decision = CanaryDecision(
                outcome=outcome,
                reason=reason,
                decided_at=datetime.now(UTC),
                deciding_event_at=env.occurred_at,
                deciding_event_id=env.event_id,
                requested_by=self.producer,
            )
        if decided is None:
            self._save(env.tenant, env.policy, view, now=False)  # written by flush
            return []
        self._save(env.tenant, env.policy, view)  # counts and the decision before any effect
        return self._carry_out(env.tenant, env.policy, view)

    def _count(self, env: Envelope[Any], view: CanaryView) -> bool:
        p = env.payload
        if isinstance(p, FeedbackSubmitted):
            joined = self.repo.canary_answer(env.tenant, env.policy, p.request_id)
            if joined is None:
                kept = list(view.early_scores.items())[-(EARLY_SCORES - 1) :]
                view.early_scores = dict(kept + [(p.request_id, p.score)])
                return True
            canary_id, revision = joined
            side = view.side(revision) if canary_id == view.canary_id else None
            if side is None:
                return False
            side.scores += 1
            side.score_sum += p.score
            return True
        if isinstance(p, InferCompleted):
            side = view.side(p.revision) if p.alias == view.alias else None
            if side is None:
                return False
            side.answers += 1
            side.latency_ms_sum += p.latency_ms
        elif isinstance(p, InferFailed):
            if p.stage not in REVISION_FAILURES or _alias_of(p.ref) != view.alias:
                return False
            side = view.side(p.revision)
            if side is None:
                return False
            side.failures += 1
        else:
            return False
        self.repo.record_canary_answer(
            env.tenant, env.policy, p.request_id, view.canary_id, side.revision
        )
        early = view.early_scores.pop(p.request_id, None)
        if early is not None:
            side.scores += 1
            side.score_sum += early
        return True

    # ------------------------------------------------------------------ ending

    def end_by_command(self, cmd: Envelope[Any], view: CanaryView) -> list[Envelope[Any]]:
        """A rollback of the alias while its canary runs ends the canary (the alias stays)."""
        p = cmd.payload
        view.decision = CanaryDecision(
            outcome="rolled_back",
            reason=f"rolled back by {p.requested_by or cmd.producer}: {p.reason or 'rollback'}",
            decided_at=datetime.now(UTC),
            deciding_event_id=cmd.event_id,
            requested_by=p.requested_by or cmd.producer,
        )
        self._save(cmd.tenant, cmd.policy, view)
        return self._carry_out(cmd.tenant, cmd.policy, view, command=cmd)

    def _carry_out(
        self, tenant: str, policy: str, view: CanaryView, command: Envelope[Any] | None = None
    ) -> list[Envelope[Any]]:
        """Carry out the saved decision (idempotent) and return the facts to publish."""
        d = view.decision
        if d is None or d.done:
            return []
        out: list[Envelope[Any]] = []
        outcome, reason = d.outcome, d.reason
        move = None
        if outcome == "promoted":
            try:
                move = self.repo.move_alias(
                    tenant,
                    policy,
                    view.alias,
                    view.revision,
                    expected=view.incumbent_revision,
                    by=self.producer,
                    reason=reason,
                    event_id=derived(view.canary_id, "promote"),
                    at=d.decided_at,
                    kind="promote",
                    checked=True,
                )
            except AliasConflict as e:  # moved by hand meanwhile: the canary no longer applies
                outcome, reason = "rolled_back", f"not promoted: {e}"
        self.repo.end_canary(tenant, policy, view.alias, view.canary_id)
        ended = CanaryEnded(
            alias=view.alias,
            canary_id=view.canary_id,
            revision=view.revision,
            incumbent_revision=view.incumbent_revision,
            outcome=outcome,
            reason=reason[:2048],
            canary=view.canary,
            incumbent=view.incumbent,
            deciding_event_at=d.deciding_event_at,
            requested_by=d.requested_by,
        )
        out.append(self._fact(ended, tenant, policy, view, "ended", d.decided_at, command))
        self.repo.record_canary(out[-1])
        if move is not None:
            moved = alias_moved(self.repo, move)
            out.append(self._fact(moved, tenant, policy, view, "promote", move.moved_at, command))
            metrics.ALIAS_MOVES.labels("promote").inc()
        view.decision = d.model_copy(update={"outcome": outcome, "reason": reason, "done": True})
        self._save(tenant, policy, view)
        metrics.CANARIES.labels(outcome).inc()
        log.info("canary decided", policy=f"{tenant}/{policy}", outcome=outcome, reason=reason)
        return out

    def _fact(self, payload, tenant, policy, view, what, at, command) -> Envelope[Any]:
        eid = derived(view.canary_id, what)
        if command is not None:
            return make_reply(
                payload, command, producer=self.producer, event_id=eid, occurred_at=at
            )
        return make_event(
            payload,
            tenant=tenant,
            policy=policy,
            producer=self.producer,
            event_id=eid,
            occurred_at=at,
        )


def _alias_of(ref: str) -> str | None:
    try:
        return parse_ref(ref).alias
    except ValueError:
        return None
