"""The lifecycle controller's decisions, free of I/O so that they can be tested alone.

State lives in two tables keyed by policy id (``tenant/policy``): ``configs`` (the latest
``policy.configured`` payload) and ``lifecycle`` (revisions seen, alias targets, evaluation
metrics, the metrics each revision had when it was promoted, promotion candidates, and the
events the last few inputs led to). Values are plain JSON (dict keys are strings).

The transitions (each output is an event; alias moves also become catalog history rows):

- ``export.completed`` → ``eval.requested`` (when the policy auto-evaluates), with the gate.
- ``eval.requested`` → remembered; asking for the configured promotion makes the revision a
  candidate (a request cannot name another alias, and its thresholds are not the gate).
- ``eval.completed`` of the revision an alias serves, whose watched metric fell more than the
  tolerance below its value at promotion → ``serving.rollback`` (automatic rollback).
- ``eval.completed`` of a candidate that passes the *configured* gate (thresholds and suite from
  ``policy.configured``, recomputed here) → ``serving.promote``; a failed gate emits nothing
  further (the transition note and the ``eval.completed`` are the record).
- ``serving.promote`` / ``serving.rollback`` → carried out by compare-and-set on the catalog by
  the caller (I/O stays out of here) → the ``alias.moved`` it passes in is applied to the state
  at once and published; a refusal it passes in is published as ``serving.refused``.
- ``alias.moved`` (moves made elsewhere; the echo of an own move is a duplicate) → the alias's
  new target and its baseline metrics.

Output event ids derive from the cause's id, so a redelivered input re-emits the same events and
every consumer dedupes them. The state is saved before the outputs are published; a redelivered
input (the crash came in between) changes nothing and re-emits what it led to from the outbox.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from schemas import Envelope, decode_event, encode_event, make_event
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
from workers.controller import metrics as controller_metrics

log = structlog.get_logger()

PRODUCER = "controller"
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
            self.configs[pid] = {**p.model_dump(mode="json"), "event_id": str(env.event_id)}
            self._note(st, "configured", None, f"suite={p.suite} gate={_gate(p.thresholds)}")
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
            if (env.producer != self.producer and p.promote_to and cfg and cfg["auto_promote"]
                    and p.promote_to == cfg["promote_to"]):  # fmt: skip
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
            revision=revision, adapter_digest=digest, suite=cfg["suite"],
            thresholds=cfg["thresholds"],
            promote_to=cfg["promote_to"] if cfg["auto_promote"] else None,
        )  # fmt: skip
        return [self._event(req, cause, "eval" if cause.type == "export.completed"
                            else f"eval:{revision}")]  # fmt: skip

    def _on_eval(self, env: Envelope[EvalCompleted], st: dict) -> list[Envelope[Any]]:
        p = env.payload
        key = str(p.revision)
        st["evals"][key] = dict(p.metrics)
        cfg = self.configs.get(env.policy_id) or {}
        # The gate is the policy's configuration alone: thresholds carried by the request (and
        # echoed in the result) are the caller's wish for a verdict, never a licence to promote.
        gate = {k: Threshold.model_validate(v) for k, v in cfg.get("thresholds", {}).items()}
        failures = threshold_failures(dict(p.metrics), gate)
        if cfg and p.suite != cfg["suite"]:
            failures = [f"suite {p.suite} (the gate is {cfg['suite']})"]
        verdict = "passed" if not failures else f"failed on {', '.join(failures)}"
        if cfg:
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
            reason = (f"automatic rollback: {metric} of revision {p.revision} fell to {now:.4g} "
                      f"from {base:.4g} at promotion (tolerance {cfg['rollback_tolerance']})")  # fmt: skip
            cmd = RollbackCommand(alias=alias, expected_revision=p.revision, reason=reason,
                                  requested_by=self.producer)  # fmt: skip
            log.warning("regression: rolling back", policy=env.policy_id, alias=alias,
                        revision=p.revision, metric=metric, now=now, baseline=base)  # fmt: skip
            return [self._event(cmd, env, f"rollback:{alias}")]
        target = st["candidates"].pop(key, None)
        if not cfg or failures or target is None or st["aliases"].get(target) == p.revision:
            return []
        cmd = PromoteCommand(
            alias=target, revision=p.revision, expected_revision=st["aliases"].get(target),
            reason=f"evaluation gate passed on {p.suite}: "
            f"{_metrics({k: v for k, v in p.metrics.items() if k in gate} or p.metrics)}",
            requested_by=self.producer,
        )  # fmt: skip
        return [self._event(cmd, env, f"promote:{target}")]

    def _on_moved(self, st: dict, moved: Envelope[AliasMoved]) -> None:
        if str(moved.event_id) in st["recent"]:
            return  # the echo of a move this controller executed and applied already
        p = moved.payload
        st["aliases"][p.alias] = p.to_revision
        key = str(p.to_revision)
        if p.cause == "promote" or key not in st["baseline"]:
            st["baseline"][key] = st["evals"].get(key) or st["baseline"].get(key) or {}
        self._note(st, p.cause, p.to_revision, f"{p.alias}: {p.from_revision} → "
                   f"{p.to_revision} ({p.reason})")  # fmt: skip
        st["recent"] = (st["recent"] + [str(moved.event_id)])[-RECENT:]

    def _refused(self, cmd: Envelope[Any], st: dict, refusal: Refusal) -> Envelope[ServingRefused]:
        p = cmd.payload
        self._note(st, "refused", None, f"{cmd.type} {p.alias}: {refusal.reason}")
        controller_metrics.REFUSALS.labels(cmd.type).inc()
        log.warning("serving command refused", type=cmd.type, policy=cmd.policy_id,
                    event_id=str(cmd.event_id), reason=refusal.reason)  # fmt: skip
        return self._event(ServingRefused(command_id=cmd.event_id, command_type=cmd.type,
                                          alias=p.alias, reason=refusal.reason[:2048],
                                          current_revision=refusal.current_revision),
                           cmd, "refused")  # fmt: skip

    # ------------------------------------------------------------------ helpers

    def _event(self, payload: Any, cause: Envelope[Any], what: str) -> Envelope[Any]:
        return make_event(payload, tenant=cause.tenant, policy=cause.policy,
                          producer=self.producer, caused_by=cause,
                          event_id=derived_id(cause, what))  # fmt: skip

    @staticmethod
    def _note(st: dict, kind: str, revision: int | None, detail: str) -> None:
        st["transitions"] = (st["transitions"] + [[kind, revision, detail]])[-50:]


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
