"""The lifecycle controller's decisions, free of faust so that they can be tested alone.

State lives in two tables keyed by policy id (``tenant/policy``): ``configs`` (the latest
``policy.configured`` payload) and ``lifecycle`` (revisions seen, alias targets, evaluation
metrics, the metrics each revision had when it was promoted, open evaluation requests). Values
are plain JSON (faust tables serialize to JSON, so dict keys are strings).

The transitions (each output is an event; alias moves also become catalog history rows):

- ``export.completed`` → ``eval.requested`` (when the policy auto-evaluates), with the gate.
- ``eval.requested`` → remembered, so its result knows which alias it may promote to.
- ``eval.completed`` of the revision an alias serves, whose watched metric fell more than the
  tolerance below its value at promotion → ``serving.rollback`` (automatic rollback).
- ``eval.completed`` that passed, asked to promote → ``serving.promote`` (the evaluation gate;
  a failed gate emits nothing further: the ``eval.completed`` with ``passed=false`` is the record).
- ``serving.promote`` / ``serving.rollback`` → carried out by compare-and-set on the catalog by
  the caller (blocking I/O stays out of here) → the ``alias.moved`` it passes in is published.
- ``alias.moved`` → the alias's new target and its baseline metrics.

Output event ids derive from the cause's id, so a redelivered input re-emits the same events and
every consumer dedupes them.
"""

from __future__ import annotations

import uuid
from collections.abc import MutableMapping
from typing import Any

import structlog

from schemas import Envelope, make_event
from schemas.events import (
    AliasMoved,
    EvalCompleted,
    EvalRequested,
    ExportCompleted,
    PolicyConfigured,
    PromoteCommand,
    RollbackCommand,
)

log = structlog.get_logger()

PRODUCER = "controller"
RECENT = 256  # event ids remembered per policy for dedup of redeliveries
_NS = uuid.UUID("8a3c1f52-6e0d-4b7a-b2c4-91d7e5f0a6c3")


def derived_id(cause: Envelope[Any], what: str) -> uuid.UUID:
    return uuid.uuid5(_NS, f"{cause.event_id}:{what}")


def empty_state() -> dict[str, Any]:
    return {
        "revisions": {},  # "N" -> digest
        "aliases": {},  # alias -> revision
        "evals": {},  # "N" -> latest metrics
        "baseline": {},  # "N" -> metrics when it was promoted
        "requested": [],  # revisions whose evaluation was requested
        "pending": {},  # eval request id -> {"revision": N, "promote_to": alias | None}
        "transitions": [],  # [type, revision, detail] (the last few, for `mint policies`)
        "recent": [],  # event ids handled
    }


class Controller:
    """Applies one event to the tables and returns the events to publish."""

    def __init__(
        self,
        configs: MutableMapping[str, Any],
        lifecycle: MutableMapping[str, Any],
        producer: str = PRODUCER,
    ) -> None:
        self.configs, self.lifecycle = configs, lifecycle
        self.producer = producer

    def handle(
        self, env: Envelope[Any], executed: Envelope[AliasMoved] | None = None
    ) -> list[Envelope[Any]]:
        """The events ``env`` leads to. For a promote/rollback command, ``executed`` is the
        ``alias.moved`` its execution returned (None: refused)."""
        pid = env.policy_id
        st = self.lifecycle.get(pid) or empty_state()
        if str(env.event_id) in st["recent"]:
            return []  # a redelivery of an event already applied: same state, nothing new
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
                st["requested"].append(p.revision)
            st["pending"][str(env.event_id)] = {"revision": p.revision,
                                                "promote_to": p.promote_to}  # fmt: skip
        elif isinstance(p, EvalCompleted):
            out += self._on_eval(env, st)
        elif isinstance(p, (PromoteCommand, RollbackCommand)):
            if executed is not None:
                out.append(executed)
        elif isinstance(p, AliasMoved):
            st["aliases"][p.alias] = p.to_revision
            key = str(p.to_revision)
            if p.cause == "promote" or key not in st["baseline"]:
                st["baseline"][key] = st["evals"].get(key) or st["baseline"].get(key) or {}
            self._note(st, p.cause, p.to_revision, f"{p.alias}: {p.from_revision} → "
                       f"{p.to_revision} ({p.reason})")  # fmt: skip
        st["recent"] = (st["recent"] + [str(env.event_id)])[-RECENT:]
        self.lifecycle[pid] = st  # reassign: a faust table writes its changelog on set
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
        asked = st["pending"].pop(str(env.causation_id), None) if env.causation_id else None
        verdict = "passed" if p.passed else f"failed on {', '.join(p.failures)}"
        self._note(st, "evaluated", p.revision, f"{_metrics(p.metrics)} gate {verdict}")
        cfg = self.configs.get(env.policy_id) or {}
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
        target = asked.get("promote_to") if asked else None
        if not p.passed or target is None or st["aliases"].get(target) == p.revision:
            return []
        cmd = PromoteCommand(
            alias=target, revision=p.revision, expected_revision=st["aliases"].get(target),
            reason=f"evaluation gate passed on {p.suite}: "
            f"{_metrics({k: v for k, v in p.metrics.items() if k in p.thresholds} or p.metrics)}",
            requested_by=self.producer,
        )  # fmt: skip
        return [self._event(cmd, env, f"promote:{target}")]

    # ------------------------------------------------------------------ helpers

    def _event(self, payload: Any, cause: Envelope[Any], what: str) -> Envelope[Any]:
        return make_event(payload, tenant=cause.tenant, policy=cause.policy,
                          producer=self.producer, caused_by=cause,
                          event_id=derived_id(cause, what))  # fmt: skip

    @staticmethod
    def _note(st: dict, kind: str, revision: int | None, detail: str) -> None:
        st["transitions"] = (st["transitions"] + [[kind, revision, detail]])[-50:]


def _metrics(metrics: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()))


def _gate(thresholds: dict[str, Any]) -> str:
    parts = []
    for name, t in sorted(thresholds.items()):
        t = t if isinstance(t, dict) else t.model_dump()
        lo, hi = t.get("min"), t.get("max")
        parts.append(f"{lo if lo is not None else ''}≤{name}≤{hi if hi is not None else ''}")
    return ", ".join(parts) or "none"
