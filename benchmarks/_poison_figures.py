"""The figures of benchmarks/poison_traffic.py, from what the SDK's watcher saw: each bad
kind's verdict, the ordinary requests' answers and latencies, duplicates, wrong rollbacks."""

from __future__ import annotations

import uuid
from collections import defaultdict
from typing import Any

from benchmarks._poison import Sent
from benchmarks._poison_lifecycle import PROBES, Lifecycle
from benchmarks._traffic import percentile


def _ms(result: Any, s: Sent) -> float:
    return (result.occurred_at - s.created).total_seconds() * 1000


def request_verdict(s: Sent, rs: list[Any], letter: Any) -> tuple[bool | str, str]:
    """(True or what went wrong, what happened) for one bad request."""
    completed = [e.payload for e in rs if e.type == "infer.completed"]
    failed = [e.payload for e in rs if e.type == "infer.failed"]
    if s.kind == "duplicate_send":
        what = f"{len(completed)} infer.completed, {len(failed)} infer.failed for 3 deliveries"
        return (True if len(rs) == 1 and completed else what), what
    if completed:
        p = completed[0]
        what = (
            f"answered by {s.tenant}/{s.policy}@{p.revision} ({p.adapter_digest[:19]}…, "
            f"{p.completion_tokens} tokens, finish {p.finish_reason}) instead of failing"
        )
        return what, what
    if failed:
        p = failed[0]
        return (
            True if p.stage and p.error.strip() else "infer.failed without a reason",
            f"infer.failed at {p.stage}: {p.error[:300]}",
        )
    if letter is not None:
        return True, (
            f"dead-lettered ({letter.reason}, {letter.attempts} attempt(s)): {letter.error[:300]}"
        )
    return "no answer and no dead letter", "nothing"


def lifecycle_verdicts(life: Lifecycle, results: dict) -> tuple[dict, dict, dict]:
    """(verdicts, details, wrong rollbacks by where) of the wrong-suite and replay kinds."""
    o = life.outcome
    verdict, detail = {}, {}
    kind, got = o.get("wrong_suite", ("none", None))
    if kind == "completed":
        r = got.payload.metrics.get("reward")
        verdict["wrong_suite_eval"] = detail["wrong_suite_eval"] = (
            f"evaluated on {life.wrong} (reward {r:.3f}) although {life.suite} is configured"
        )
    elif kind in ("refused", "dead"):
        verdict["wrong_suite_eval"] = True
        detail["wrong_suite_eval"] = (
            f"refused: {got}"
            if kind == "refused"
            else f"dead-lettered ({got.reason}): {got.error[:300]}"
        )
    else:
        verdict["wrong_suite_eval"] = detail["wrong_suite_eval"] = "no answer within 120 s"
    history = o.get("history", [])
    prod = o.get("prod_at_replay")
    answers = [results[s.event_id][0] for s in o.get("probes", []) if results[s.event_id]]
    stale = [
        e.payload.revision
        for e in answers
        if e.type == "infer.completed" and e.payload.revision != prod
    ]
    failed = [
        f"{e.payload.stage}: {e.payload.error[:200]}" for e in answers if e.type == "infer.failed"
    ]
    control = sorted(
        {
            results[s.event_id][0].payload.revision
            for s in o.get("probes_before", [])
            if results[s.event_id] and results[s.event_id][0].type == "infer.completed"
        }
    )
    problems = [f"the lifecycle steps stopped: {o['error']}"] if "error" in o else []
    if o.get("replayed") != 1:
        problems.append(f"the replay re-published {o.get('replayed')} records (expected 1)")
    if o.get("promoted_3") != "moved":
        problems.append(f"the promotion before the replay: {o.get('promoted_3')}")
    if o.get("prod_after_replay") != prod:
        problems.append(f"catalog prod moved from {prod} to {o.get('prod_after_replay')}")
    if stale:
        problems.append(
            f"{len(stale)} of {PROBES} requests through prod answered by revision(s) "
            f"{sorted(set(stale))} while prod is {prod} (before the replay: "
            f"revision(s) {control})"
        )
    if failed or len(answers) < len(o.get("probes", [])):
        problems.append(
            f"requests through prod after the replay: {len(answers)} answered, failures {failed}"
        )
    moved4 = o.get("promoted_4", ("none", None))
    if moved4[0] != "moved":
        problems.append(f"the next gate-passing promotion (to 4): {moved4[0]} {moved4[1] or ''}")
    verdict["replayed_alias_move"] = "; ".join(problems) or True
    detail["replayed_alias_move"] = {"history": history, "problems": problems}
    wrong = {
        "catalog_rollbacks": sum(1 for h in history if h[3] == "rollback"),
        "engines_served_replayed": 1 if stale else 0,
        "controller_refused_next_promotion": 1 if moved4[0] == "refused" else 0,
    }
    return verdict, detail, wrong


def figures(client: Any, sent: list[Sent], life: Lifecycle, kinds: tuple[str, ...]) -> dict:
    results: dict[uuid.UUID, list[Any]] = defaultdict(list)
    for e in client.watcher.events():
        if e.type in ("infer.completed", "infer.failed"):
            results[e.causation_id].append(e)
    dead = client.watcher.dead
    out: dict[str, Any] = {"ordinary": {}}
    lat: dict[str, list[float]] = {}
    for phase in ("baseline", "poison"):
        mine = [s for s in sent if s.kind == "ordinary" and s.phase == phase]
        first = {s.event_id: results[s.event_id][0] for s in mine if results[s.event_id]}
        ok = [
            s for s in mine if s.event_id in first and first[s.event_id].type == "infer.completed"
        ]
        lat[phase] = [_ms(first[s.event_id], s) for s in ok]
        errors = sorted(
            {
                f"{first[s.event_id].payload.stage}: {first[s.event_id].payload.error}"[:300]
                for s in mine
                if s.event_id in first and s not in ok
            }
        )
        out["ordinary"][phase] = {
            "sent": len(mine),
            "answered": len(ok),
            "failed": len(first) - len(ok),
            "unanswered": len(mine) - len(first),
            "errors": errors[:4],
        }
    p = out["ordinary"]["poison"]
    out["ordinary_answered_share"] = round(p["answered"] / p["sent"], 4) if p["sent"] else 0.0
    p99 = {k: round(percentile(v, 99), 1) for k, v in lat.items()}
    p50 = {k: round(percentile(v, 50), 1) for k, v in lat.items()}
    ratio = round(p99["poison"] / p99["baseline"], 2) if p99["baseline"] else None
    out["p99_ms"] = {"poison": p99["poison"], "baseline": p99["baseline"], "ratio": ratio}
    out["p50_ms"] = p50
    out["duplicates"] = sum(max(0, len(results[s.event_id]) - 1) for s in sent)
    verdict: dict[str, Any] = {}
    detail: dict[str, Any] = {}
    for s in sent:
        if s.kind in kinds:
            verdict[s.kind], detail[s.kind] = request_verdict(
                s, results[s.event_id], dead.get(str(s.event_id))
            )
    v, d, wrong = lifecycle_verdicts(life, results)
    verdict.update(v)
    detail.update(d)
    out["bad_failed_with_reason"] = {k: verdict.get(k, "not sent") for k in kinds}
    out["bad_outcomes"] = {k: detail.get(k, "not sent") for k in kinds}
    out["wrong_rollbacks"] = sum(wrong.values())
    out["wrong_rollbacks_detail"] = wrong
    out["lifecycle"] = life.setup_info
    return out
