"""Poison traffic: a request's failure is its own, never an engine's exit or another's failure.

Three tenants (``alpha``, ``bravo``, ``carol``), two vLLM engine processes in one serving group
(``e1`` also hosts the evaluator), the projector and the controller, on the tiny Llama. Steady
ordinary ``infer.requested`` traffic from an upstream producer through Kafka, twice, side by
side: a baseline without bad traffic, then the same schedule mixed with every bad kind:

- ``temperature_5``, ``prompt_20k_tokens`` (past the engines' ``max_model_len`` of 256),
  ``max_tokens_30k``: bytes an upstream producer may send (built as raw JSON, so a tighter
  schema shows as a dead letter rather than an error here); each is followed by two ordinary
  requests of other tenants on the same engine (also sent in the baseline), which must still
  be answered;
- ``duplicate_send``: one envelope (same event id) sent twice at once and again 3 s later;
- ``unknown_adapter``: a policy the tenant does not have;
- ``foreign_digest``: ``bravo`` registers a revision that names ``alpha``'s digest (a catalog
  import: the digest is checked against the store only where the files are read) and pins it;
  ``alpha``'s adapter is resident on the engine that serves it;
- ``wrong_suite_eval``: ``eval.requested`` of ``carol/gated``'s prod revision on a suite the
  policy is not configured for (the one that scored lower, so that a rollback check that
  compares suites rolls back);
- ``replayed_alias_move``: the old ``alias.moved`` of ``carol/gated`` re-published from
  ``serving.events`` to ``serving.events`` (what ``mint replay serving.events --to-topic
  serving.events`` does), then requests through ``prod`` and the next gate-passing promotion.

Prints progress to stderr and ONE JSON line: ``engine_restarts`` (0), ``ordinary_answered_share``
(1.0), ``bad_failed_with_reason`` (every kind true: ``infer.failed`` with stage and reason, a
dead letter or an evaluation refused with its reason; one answer for the duplicate; no effect
of the replay), ``duplicates`` (0), ``wrong_rollbacks`` (0), ``p99_ms`` of ordinary requests
with bad traffic and without (``ratio`` <= 1.5), ``targets`` / ``met``. An engine that exits is
restarted (as a supervisor would) and counted, with its log's last lines.

    python benchmarks/poison_traffic.py           # 6 policies per tenant, 90 s per phase
    python benchmarks/poison_traffic.py --smoke   # 2 per tenant, 15 s per phase (the test)
    python benchmarks/poison_traffic.py --smoke --kinds wrong_suite_eval,replayed_alias_move
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import _engine_group as eg  # noqa: E402
from benchmarks._adapters import import_rows  # noqa: E402
from benchmarks._engine_group import say  # noqa: E402
from benchmarks._harness import finish, overrides, parser  # noqa: E402
from benchmarks._poison import Engines, Supervisor, Upstream  # noqa: E402
from benchmarks._poison_figures import figures  # noqa: E402
from benchmarks._poison_lifecycle import Lifecycle, store_revisions  # noqa: E402
from benchmarks._traffic import PROMPTS  # noqa: E402

TENANTS = ("alpha", "bravo", "carol")
KINDS = (
    "temperature_5",
    "prompt_20k_tokens",
    "max_tokens_30k",
    "duplicate_send",
    "unknown_adapter",
    "foreign_digest",
    "wrong_suite_eval",
    "replayed_alias_move",
)
# Per-request bad kinds: when in the phase (share of its length) and where they go.
INJECT = (
    ("temperature_5", 0.1),
    ("prompt_20k_tokens", 0.2),
    ("max_tokens_30k", 0.3),
    ("duplicate_send", 0.4),
    ("unknown_adapter", 0.5),
    ("foreign_digest", 0.6),
)
TARGETS = {
    "engine_restarts": 0,
    "ordinary_answered_share": 1.0,
    "bad_failed_with_reason": "all",
    "duplicates": 0,
    "wrong_rollbacks": 0,
    "p99_ms_ratio": 1.5,
}
# (tenant, index among its ordinary policies) of each per-request bad kind.
BAD_TARGETS = {
    "temperature_5": ("carol", 0),
    "prompt_20k_tokens": ("bravo", 0),
    "max_tokens_30k": ("alpha", 1),
    "duplicate_send": ("bravo", 1),
    "unknown_adapter": ("carol", 1),
    "foreign_digest": ("alpha", 0),
}


@dataclass
class Plan:
    per_tenant: int = 6
    interval_s: float = 0.25
    duration_s: float = 90.0
    answer_timeout_s: float = 240.0
    max_restarts: int = 4
    partitions: int = 6
    max_model_len: int = 256
    long_prompt_tokens: int = 20_000
    kinds: tuple[str, ...] = KINDS


def long_prompt(model: Path, tokens: int) -> tuple[str, int]:
    """About ``tokens`` tokens of ordinary words (and how many the tokenizer counts)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    rng = random.Random(1)
    words = " ".join(rng.choice(PROMPTS) for _ in range(tokens))
    text = tok.decode(tok(words).input_ids[:tokens], skip_special_tokens=True)
    return text, len(tok(text).input_ids)


def companions(run: Run, tenant: str, policy: str) -> list[tuple[str, str]]:
    """Two ordinary policies of other tenants served by the same engine as ``tenant/policy``."""
    parts = run.plan.partitions
    owner = {p: e for e, ps in run.members.items() for p in ps}
    mine = owner.get(eg.partition_of(tenant, policy, parts))
    same = [
        (t, p)
        for t, p in run.ordinary
        if t != tenant and owner.get(eg.partition_of(t, p, parts)) == mine
    ]
    others = [(t, p) for t, p in run.ordinary if t != tenant and (t, p) not in same]
    return (same + others)[:2]


@dataclass
class Run:
    plan: Plan
    settings: Any
    engines: Engines
    upstream: Upstream
    lifecycle: Lifecycle
    ordinary: list[tuple[str, str]]
    stolen: str  # bravo's policy that names alpha's digest
    prompt: str
    members: dict[str, set[int]]

    def target_of(self, kind: str) -> tuple[str, str]:
        """Where a per-request bad kind goes (``foreign_digest``: the victim's policy, whose
        engine answers the stolen one too)."""
        tenant, index = BAD_TARGETS[kind]
        return tenant, [p for t, p in self.ordinary if t == tenant][index]

    def bad(self, kind: str, phase: str) -> None:
        up = self.upstream
        tenant, policy = self.target_of(kind)
        if kind == "temperature_5":
            up.send(tenant, policy, kind, phase, raw={"temperature": 5.0})
        elif kind == "prompt_20k_tokens":
            up.send(tenant, policy, kind, phase, prompt=self.prompt)
        elif kind == "max_tokens_30k":
            up.send(tenant, policy, kind, phase, raw={"max_tokens": 30_000})
        elif kind == "duplicate_send":
            s = up.send(tenant, policy, kind, phase, times=2)
            threading.Timer(3.0, up.resend, (s,)).start()  # after its answer: a later poll
        elif kind == "unknown_adapter":
            up.send(tenant, "no-such-policy", kind, phase)
        elif kind == "foreign_digest":
            up.send("bravo", self.stolen, kind, phase, revision=1)

    def phase(self, name: str, with_bad: bool) -> None:
        """The ordinary schedule (plus companions at the injection points); with ``with_bad``
        each bad request goes out just before its companions and the lifecycle's bad kinds run
        beside it."""
        plan, up = self.plan, self.upstream
        ticks = int(plan.duration_s / plan.interval_s)
        inject = {int(share * ticks): kind for kind, share in INJECT}
        self.members = self.engines.members() or self.members
        script = threading.Thread(
            target=self.lifecycle.poisoned if with_bad else self.lifecycle.plain,
            args=(name,),
            daemon=True,
        )
        t0 = time.monotonic()
        for i in range(ticks):
            time.sleep(max(0.0, t0 + i * plan.interval_s - time.monotonic()))
            if i == ticks // 8:
                script.start()
            tenant, policy = self.ordinary[i % len(self.ordinary)]
            up.send(tenant, policy, "ordinary", name)
            kind = inject.get(i)
            if kind is not None:
                if with_bad and kind in plan.kinds:
                    self.bad(kind, name)
                for t, p in companions(self, *self.target_of(kind)):
                    up.send(t, p, "ordinary", name)
        say(f"{name}: {ticks} ticks sent in {time.monotonic() - t0:.0f} s; lifecycle steps …")
        script.join(timeout=600)


def catalog(plan: Plan, settings: Any, model: Path, work: Path) -> tuple[list, str]:
    """The catalog: ``per_tenant`` policies per tenant with ``prod``, ``carol/gated`` revisions
    1-4 (``prod`` on 1), and ``bravo/stolen-N`` naming ``alpha/p00000``'s digest (on the same
    partition, so on the engine that holds it). Returns (ordinary policies, the stolen one)."""
    from catalog.cluster import connect
    from catalog.repository import CatalogRepository

    adapters = []
    for k, tenant in enumerate(TENANTS):
        adapters += eg.build_catalog(
            settings, model, plan.per_tenant, work, tenant=tenant, seed0=1000 * k
        )
    cluster, session = connect(settings)
    try:
        victim = CatalogRepository(session, settings.keyspace).get_revision("alpha", "p00000", 1)
    finally:
        cluster.shutdown()
    home = eg.partition_of("alpha", "p00000", plan.partitions)
    stolen = next(
        f"stolen-{i}"
        for i in range(1000)
        if eg.partition_of("bravo", f"stolen-{i}", plan.partitions) == home
    )
    uri = victim.store_uri.replace("/alpha/p00000/", f"/bravo/{stolen}/")
    if uri == victim.store_uri:
        raise RuntimeError(f"no alpha/p00000 folder in {uri!r}: the store's layout changed")
    rows = [
        {
            "tenant": "bravo",
            "policy": stolen,
            "revision": 1,
            "digest": victim.digest,
            "uri": uri,
            "base_model": eg.BASE_MODEL,
        }
    ]
    gated = store_revisions(settings, model, work, "carol", "gated", 4, seed0=5000)
    rows += [{**r, "aliases": ["prod"] if r["revision"] == 1 else []} for r in gated]
    import_rows(settings, rows, work / "lifecycle.jsonl")
    return [(a.tenant, a.policy) for a in adapters], stolen


def run(plan: Plan, smoke: bool, keep: bool) -> dict[str, Any]:
    from mint.dev.workers import Workers
    from mint.sdk import MintClient

    t_start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="mint-poison-"))
    out: dict[str, Any] = {
        "benchmark": "poison_traffic",
        "smoke": smoke,
        "engines": 2,
        "tenants": len(TENANTS),
        "policies_per_tenant": plan.per_tenant,
        "interval_s": plan.interval_s,
        "phase_s": plan.duration_s,
        "max_model_len": plan.max_model_len,
        "kinds": list(plan.kinds),
    }
    settings = None
    engines = side = sup = client = upstream = None
    try:
        settings = eg.run_settings(work, partitions=plan.partitions)
        eg.prepare(settings)
        model = eg.tiny_model(settings)
        logs = work / "logs"
        side = Workers(settings, model, logs)
        side.start_worker("projector")
        side.start_worker("controller")
        engines = Engines(
            settings, model, logs, max_tokens_cap=plan.max_model_len, max_restarts=plan.max_restarts
        )
        t = time.monotonic()
        engines.start("e1", "e2")  # they start while the catalog is made
        ordinary, stolen = catalog(plan, settings, model, work)
        prompt, n_tokens = long_prompt(model, plan.long_prompt_tokens)
        out["long_prompt_tokens"] = n_tokens
        members = engines.wait_members(["e1", "e2"], steady_s=15)
        out["engines_start_s"] = round(time.monotonic() - t, 1)
        say(f"engines up after {out['engines_start_s']} s: {members}")
        sup = Supervisor(engines, side, settings)
        sup.start()
        client = MintClient(settings, "carol", producer="bench", timeout_s=120)
        upstream = Upstream(settings)
        life = Lifecycle(client, upstream, settings, plan.partitions, plan.kinds)
        r = Run(plan, settings, engines, upstream, life, ordinary, stolen, prompt, members)
        for tenant, policy in ordinary:  # warm: every adapter resident before the baseline
            upstream.send(tenant, policy, "warmup", "warmup")
        life.setup()
        life.wait_answered(upstream.sent, 180)
        say("warm; lifecycle set up: " + json.dumps(life.setup_info))
        r.phase("baseline", with_bad=False)
        r.phase("poison", with_bad=True)
        life.wait_answered(upstream.sent, plan.answer_timeout_s)
        time.sleep(3.0)  # a late duplicate answer would land here
        out.update(figures(client, upstream.sent, life, plan.kinds))
        out["engine_restarts"] = len(engines.exits)
        out["engine_exits"] = engines.exits
        out["engines_rejoined"] = list(engines.restarts)
        out["side_worker_exits"] = sup.side_exits
        out["workers_rejoined"] = sup.rejoined
        out["targets"] = TARGETS
        out["met"] = {
            "engine_restarts": out["engine_restarts"] == 0,
            "ordinary_answered_share": out["ordinary_answered_share"] == 1.0,
            "bad_failed_with_reason": all(
                v is True for v in out["bad_failed_with_reason"].values()
            ),
            "duplicates": out["duplicates"] == 0,
            "wrong_rollbacks": out["wrong_rollbacks"] == 0,
            "p99_ms_ratio": out["p99_ms"]["ratio"] is not None
            and out["p99_ms"]["ratio"] <= TARGETS["p99_ms_ratio"],
        }
    finally:
        if sup is not None:
            sup.halt.set()
            sup.join(5)
        for closer in (upstream, client):
            if closer is not None:
                with contextlib.suppress(Exception):
                    closer.close()
        if engines is not None:
            engines.close()
        if side is not None:
            side.stop_all()
        missed = not out.get("met") or not all(out["met"].values())
        if settings is not None and not keep:
            with contextlib.suppress(Exception):
                eg.delete_topics(settings)
            with contextlib.suppress(Exception):
                eg.drop_keyspace(settings)
        if keep or missed:
            say(f"worker logs kept in {work / 'logs'}")
            for sub in work.iterdir():
                if sub.name != "logs" and not keep:
                    shutil.rmtree(sub, ignore_errors=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
        out["seconds"] = round(time.monotonic() - t_start, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, "2 policies per tenant, 15 s per phase, each bad kind once")
    ap.add_argument("--per-tenant", type=int, default=None, help="ordinary policies per tenant")
    ap.add_argument("--phase-s", type=float, default=None, help="seconds of traffic per phase")
    ap.add_argument("--interval", type=float, default=None, help="seconds between requests")
    ap.add_argument(
        "--kinds", help=f"comma-separated bad kinds to send (default all: {','.join(KINDS)})"
    )
    ap.add_argument("--keep", action="store_true", help="keep the work dir (logs) and topics")
    args = ap.parse_args(argv)
    plan = Plan()
    if args.smoke:
        plan.per_tenant, plan.interval_s, plan.duration_s = 2, 0.4, 15.0
        plan.answer_timeout_s, plan.max_restarts = 90.0, 2
    overrides(plan, args, "per_tenant", duration_s="phase_s", interval_s="interval")
    if args.kinds:
        plan.kinds = tuple(args.kinds.split(","))
        unknown = [k for k in plan.kinds if k not in KINDS]
        if unknown:
            ap.error(f"unknown kind {unknown[0]!r}: choose from {', '.join(KINDS)}")
    if plan.per_tenant < 2:
        ap.error("--per-tenant must be at least 2 (the bad kinds use two policies per tenant)")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from schemas.logs import configure_logging

    configure_logging("WARNING", "json")  # stdout carries the one JSON line
    import logging

    logging.getLogger("kafka").setLevel(logging.ERROR)
    out = run(plan, args.smoke, args.keep)
    missed = finish(out, "poison_traffic", argv, say)
    return 0 if out.get("met") and not missed else 1


if __name__ == "__main__":
    sys.exit(main())
