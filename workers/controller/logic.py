"""The lifecycle controller's decisions, free of I/O so that they can be tested alone.

State lives in two tables keyed by policy id (``tenant/policy``): ``configs`` (the latest
``policy.configured`` payload) and ``lifecycle`` (revisions seen, alias targets, evaluation
metrics, the metrics each revision had when it was promoted, promotion candidates, and the
events the last few inputs led to). Values are plain JSON (dict keys are strings).

The transitions (each output is an event; alias moves also become catalog history rows):

- ``export.completed`` → ``eval.requested`` (when the policy auto-evaluates), with the gate.
- ``eval.requested`` → remembered; asking for the configured promotion makes the revision a
  candidate (a request cannot name another alias, and its thresholds are not the gate).
- ``eval.completed`` on the configured suite of the revision an alias serves, whose watched
  metric fell more than the tolerance below its value at promotion → ``serving.rollback``
  (automatic rollback). Results on another suite (anyone allowed to write ``eval.requests`` may
  ask for one) or refused by the evaluator are noted and decide nothing: no gate, no baseline, no
  rollback. A configuration that changes the suite sets the old suite's metrics aside.
- ``eval.completed`` of a candidate that passes the *configured* gate (thresholds and suite from
  ``policy.configured``, recomputed here) → ``serving.promote``; a failed gate emits nothing
  further (the transition note and the ``eval.completed`` are the record).
- ``serving.promote`` / ``serving.rollback`` → carried out by compare-and-set on the catalog by
  the caller (I/O stays out of here) → the ``alias.moved`` it passes in is applied to the state
  at once and published; a refusal it passes in is published as ``serving.refused``.
- ``alias.moved`` (moves made elsewhere; the echo of an own move is a duplicate) → the alias's
  new target and its baseline metrics, unless an older move than the one the view holds (by the
  catalog's per-alias ``seq``): a replayed move never takes the view back.
- ``serving.refused`` of a stale compare-and-set → the alias's ``current_revision`` becomes the
  view, so the next promotion carries the right expected revision.

Output event ids derive from the cause's id, so a redelivered input re-emits the same events and
every consumer dedupes them. The state is saved before the outputs are published; a redelivered
input (the crash came in between) changes nothing and re-emits what it led to from the outbox.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import structlog

from schemas import Envelope, decode_event, encode_event
from schemas.envelope import make_reply
from schemas.events import (
    AliasMoved,
    EvalCompleted,
    EvalRequested,
    ExportCompleted,
    PolicyConfigured,
    PromoteCommand,
    RollbackCommand,
    ServingRefused,
    Threshold,
    threshold_failures,
)
from schemas.events.lifecycle import suite_refusal
from workers.controller import metrics as controller_metrics

log = structlog.get_logger()

PRODUCER = "controller"
CONFIGS_STATE = (
    "controller.configs"  # worker_state name of the configurations (the evaluator reads)
)
LIFECYCLE_STATE = "controller.lifecycle"
RECENT = 256  # event ids remembered per policy for dedup of redeliveries
OUTBOX = 32  # inputs per policy whose outputs are kept for re-emission on redelivery
_NS = uuid.UUID("8a3c1f52-6e0d-4b7a-b2c4-91d7e5f0a6c3")


@dataclass(frozen=True)
class Refusal:
    """Why a serving command was not carried out (a stale compare-and-set, an unknown revision)."""

    reason: str
    current_revision: int | None = None


def derived_id(cause: Envelope[Any], what: str) -> uuid.UUID:
    return uuid.uuid5(_NS, f"{cause.event_id}:{what}")


def empty_state() -> dict[str, Any]:
    return {
        "revisions": {},  # "N" -> digest
        "aliases": {},  # alias -> revision
        "evals": {},  # "N" -> latest metrics
        "baseline": {},  # "N" -> metrics when it was promoted
        "requested": [],  # revisions whose evaluation was requested
        "candidates": {},  # "N" -> alias it moves to if it passes the configured gate
        "moves": {},  # alias -> {"seq", "at"} of the move the view holds (orders replays)
        "transitions": [],  # [type, revision, detail] (the last few, for `mint policies`)
        "recent": [],  # event ids handled
        "outbox": {},  # event id -> the encoded events it led to (the last OUTBOX inputs)
    }


class StateMap(Protocol):
    """What the controller needs of a table: a dict, or catalog.state.StateTable (Cassandra)."""

    def get(self, key: str, default: Any = None, /) -> Any: ...
    def __setitem__(self, key: str, value: Any, /) -> None: ...


class Controller:
    """Applies one event to the tables and returns the events to publish."""

    def __init__(
        self,
        configs: StateMap,
        lifecycle: StateMap,
        producer: str = PRODUCER,
    ) -> None:
        self.configs, self.lifecycle = configs, lifecycle
        self.producer = producer

    def handle(
        self,
        env: Envelope[Any],
        executed: Envelope[AliasMoved] | None = None,
        refusal: Refusal | None = None,
    ) -> list[Envelope[Any]]:
        """The events ``env`` leads to. For a promote/rollback command, ``executed`` is the
        ``alias.moved`` its execution returned, or ``refusal`` says why it was not carried out."""
        pid = env.policy_id
        st = {**empty_state(), **(self.lifecycle.get(pid) or {})}
        if str(env.event_id) in st["recent"]:
            # A redelivery: same state; what it led to again (same ids: consumers dedupe).
            return [decode_event(raw.encode()) for raw in st["outbox"].get(str(env.event_id), [])]
        p = env.payload
        out: list[Envelope[Any]] = []
        if isinstance(p, PolicyConfigured):
            before = (self.configs.get(pid) or {}).get("suite")
            self.configs[pid] = {**p.model_dump(mode="json"), "event_id": str(env.event_id)}
            self._note(st, "configured", None, f"suite={p.suite} gate={_gate(p.thresholds)}")
            if before is not None and before != p.suite:
                # Another suite's numbers are not comparable: never a baseline for this one;
                # and the latest revision is evaluated again, on the new suite.
                st["evals"], st["baseline"], st["requested"] = {}, {}, []
                self._note(
                    st,
                    "configured",
                    None,
                    f"suite {before} → {p.suite}: metrics and baselines of the old suite set aside",
                )
            # Topics are not ordered among each other: an export read before its policy's
            # configuration still gets its evaluation (the latest one not yet requested).
            if st["revisions"]:
                latest = max(int(r) for r in st["revisions"])
                out += self._request_eval(env, st, latest, st["revisions"][str(latest)])
        elif isinstance(p, ExportCompleted):
            out += self._on_export(env, st)
        elif isinstance(p, EvalRequested):
            if p.revision not in st["requested"]:
                st["requested"] = (st["requested"] + [p.revision])[-RECENT:]
            # A request may ask for the configured promotion, never for another alias. (The
            # controller's own requests were made candidates when it sent them.)
            cfg = self.configs.get(pid)
            if (
                env.producer != self.producer
                and p.promote_to
                and cfg
                and cfg["auto_promote"]
                and p.promote_to == cfg["promote_to"]
            ):
                _add_candidate(st, p.revision, p.promote_to)
        elif isinstance(p, EvalCompleted):
            out += self._on_eval(env, st)
        elif isinstance(p, (PromoteCommand, RollbackCommand)):
            if refusal is not None:
                out.append(self._refused(env, st, refusal))
            elif executed is not None:
                # Applied here, not when its echo comes back on serving.events: topics are not
                # ordered among each other, so after a restart an evaluation could otherwise be
                # judged before the move it follows (and miss its automatic rollback).
                self._on_moved(st, executed)
                out.append(executed)
                controller_metrics.ALIAS_MOVES.labels(executed.payload.cause).inc()
        elif isinstance(p, AliasMoved):
            self._on_moved(st, env)
        st["recent"] = (st["recent"] + [str(env.event_id)])[-RECENT:]
        for e in out:
            controller_metrics.EMITTED.labels(e.type).inc()
        if out:
            kept = list(st["outbox"].items())[-(OUTBOX - 1) :]
            st["outbox"] = dict(
                kept + [(str(env.event_id), [encode_event(e).decode() for e in out])]
            )
        self.lifecycle[pid] = st  # saved before the caller publishes ``out``
        return out

    # ------------------------------------------------------------------ transitions

    def _on_export(self, env: Envelope[ExportCompleted], st: dict) -> list[Envelope[Any]]:
        p = env.payload
        st["revisions"][str(p.revision)] = p.adapter_digest
        self._note(st, "exported", p.revision, p.adapter_digest[:19])
        return self._request_eval(env, st, p.revision, p.adapter_digest)

    def _request_eval(self, cause: Envelope[Any], st: dict, revision: int, digest: str):
        cfg = self.configs.get(cause.policy_id)
        if not cfg or not cfg["auto_evaluate"] or revision in st["requested"]:
            return []
        st["requested"] = (st["requested"] + [revision])[-RECENT:]
        if cfg["auto_promote"]:  # recorded now, not when the request's echo is read back
            _add_candidate(st, revision, cfg["promote_to"])
        req = EvalRequested(
            revision=revision,
            adapter_digest=digest,
            suite=cfg["suite"],
            thresholds=cfg["thresholds"],
            promote_to=cfg["promote_to"] if cfg["auto_promote"] else None,
        )
        return [
            self._event(
                req, cause, "eval" if cause.type == "export.completed" else f"eval:{revision}"
            )
        ]

    def _on_eval(self, env: Envelope[EvalCompleted], st: dict) -> list[Envelope[Any]]:
        p = env.payload
        key = str(p.revision)
        cfg = self.configs.get(env.policy_id) or {}
        if p.refused is not None:
            controller_metrics.IGNORED.labels("refused").inc()
            self._note(st, "eval refused", p.revision, f"suite {p.suite}: {p.refused[:200]}")
            return []
        if (why := suite_refusal(env.policy_id, cfg, p.suite)) is not None:
            # Only the configured suite's numbers gate, become baselines or roll back: a result
            # on another suite is noted, and its candidate still waits for the configured one.
            controller_metrics.IGNORED.labels("other_suite").inc()
            self._note(
                st,
                "evaluated",
                p.revision,
                f"{_metrics(p.metrics)}, decides nothing: {why.partition(':')[0]}",
            )
            return []
        st["evals"][key] = dict(p.metrics)
        # The gate is the policy's configuration alone: thresholds carried by the request (and
        # echoed in the result) are the caller's wish for a verdict, never a licence to promote.
        gate = {k: Threshold.model_validate(v) for k, v in cfg.get("thresholds", {}).items()}
        failures = threshold_failures(dict(p.metrics), gate)
        verdict = "passed" if not failures else f"failed on {', '.join(failures)}"
        (controller_metrics.FAILED if failures else controller_metrics.PASSED).inc()
        self._note(st, "evaluated", p.revision, f"{_metrics(p.metrics)} gate {verdict}")
        # Automatic rollback: an evaluation of a revision an alias serves now.
        metric = cfg.get("rollback_metric")
        for alias, serving in sorted(st["aliases"].items()):
            if serving != p.revision or not metric:
                continue
            base = st["baseline"].get(key, {}).get(metric)
            now = p.metrics.get(metric)
            if base is None or now is None or now >= base - cfg.get("rollback_tolerance", 0.0):
                continue
            reason = (
                f"automatic rollback: {metric} of revision {p.revision} fell to {now:.4g} "
                f"from {base:.4g} at promotion (tolerance {cfg['rollback_tolerance']})"
            )
            cmd = RollbackCommand(
                alias=alias, expected_revision=p.revision, reason=reason, requested_by=self.producer
            )
            log.warning(
                "regression: rolling back",
                policy=env.policy_id,
                alias=alias,
                revision=p.revision,
                metric=metric,
                now=now,
                baseline=base,
            )
            return [self._event(cmd, env, f"rollback:{alias}")]
        target = st["candidates"].pop(key, None)
        if failures or target is None or st["aliases"].get(target) == p.revision:
            return []
        cmd = PromoteCommand(
            alias=target,
            revision=p.revision,
            expected_revision=st["aliases"].get(target),
            reason=f"evaluation gate passed on {p.suite}: "
            f"{_metrics({k: v for k, v in p.metrics.items() if k in gate} or p.metrics)}",
            requested_by=self.producer,
        )
        return [self._event(cmd, env, f"promote:{target}")]

    def _on_moved(self, st: dict, moved: Envelope[AliasMoved]) -> None:
        if str(moved.event_id) in st["recent"]:
            return  # the echo of a move this controller executed and applied already
        p = moved.payload
        held = st["moves"].get(p.alias)
        if held is not None and not _newer(moved, held):
            # A replayed move (its id long out of ``recent``): the view holds a later one.
            controller_metrics.STALE_MOVES.inc()
            log.info(
                "older alias move not applied",
                policy=moved.policy_id,
                alias=p.alias,
                seq=p.seq,
                held_seq=held["seq"],
                event_id=str(moved.event_id),
            )
            return
        st["moves"][p.alias] = {"seq": p.seq, "at": moved.occurred_at.isoformat()}
        st["aliases"][p.alias] = p.to_revision
        key = str(p.to_revision)
        if p.cause == "promote" or key not in st["baseline"]:
            st["baseline"][key] = st["evals"].get(key) or st["baseline"].get(key) or {}
        self._note(
            st,
            p.cause,
            p.to_revision,
            f"{p.alias}: {p.from_revision} → {p.to_revision} ({p.reason})",
        )
        st["recent"] = (st["recent"] + [str(moved.event_id)])[-RECENT:]

    def _refused(self, cmd: Envelope[Any], st: dict, refusal: Refusal) -> Envelope[ServingRefused]:
        p = cmd.payload
        self._note(st, "refused", None, f"{cmd.type} {p.alias}: {refusal.reason}")
        current = refusal.current_revision
        if current is not None and st["aliases"].get(p.alias) != current:
            # The catalog's answer is the truth (a move this controller never saw): without it
            # every later promotion would carry the same stale expected revision.
            st["aliases"][p.alias] = current
            st["baseline"].setdefault(str(current), st["evals"].get(str(current)) or {})
            self._note(st, "view", current, f"{p.alias} is at {current} (from the refusal)")
        controller_metrics.REFUSALS.labels(cmd.type).inc()
        log.warning(
            "serving command refused",
            type=cmd.type,
            policy=cmd.policy_id,
            event_id=str(cmd.event_id),
            reason=refusal.reason,
        )
        return self._event(
            ServingRefused(
                command_id=cmd.event_id,
                command_type=cmd.type,
                alias=p.alias,
                reason=refusal.reason[:2048],
                current_revision=refusal.current_revision,
            ),
            cmd,
            "refused",
        )

    # ------------------------------------------------------------------ helpers

    def _event(self, payload: Any, cause: Envelope[Any], what: str) -> Envelope[Any]:
        return make_reply(payload, cause, producer=self.producer, event_id=derived_id(cause, what))

    @staticmethod
    def _note(st: dict, kind: str, revision: int | None, detail: str) -> None:
        st["transitions"] = (st["transitions"] + [[kind, revision, detail]])[-50:]


def _newer(moved: Envelope[AliasMoved], held: dict[str, Any]) -> bool:
    """Whether ``moved`` is newer than the move the view holds: by the catalog's per-alias seq;
    by time only for a move written before moves carried one."""
    if moved.payload.seq is not None and held["seq"] is not None:
        return moved.payload.seq > held["seq"]
    return moved.occurred_at > datetime.fromisoformat(held["at"])


def _add_candidate(st: dict, revision: int, alias: str) -> None:
    """Remember a promotion candidate; the oldest go when results never came (bounded)."""
    kept = [(k, v) for k, v in st["candidates"].items() if k != str(revision)][-(RECENT - 1) :]
    st["candidates"] = dict(kept + [(str(revision), alias)])


def _metrics(metrics: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()))


def _gate(thresholds: dict[str, Any]) -> str:
    parts = []
    for name, t in sorted(thresholds.items()):
        t = t if isinstance(t, dict) else t.model_dump()
        lo, hi = t.get("min"), t.get("max")
        parts.append(f"{lo if lo is not None else ''}≤{name}≤{hi if hi is not None else ''}")
    return ", ".join(parts) or "none"
