"""Serving at scale: N vLLM engine processes in one consumer group, all traffic through Kafka.

A catalog of policies (one stored PEFT adapter revision each, imported into Cassandra with a
``prod`` alias), N engines as real processes (``mint worker serving --engine-id eN``: one group
``<prefix>-serving`` over ``infer.requests`` + ``load.requests``) and an upstream producer that
publishes Zipf-distributed ``infer.requested`` events (``tenant/policy@prod``) in waves: each wave
reaches adapters that no engine holds yet, so each brings cold loads. A collector reads every
record of ``infer.results`` (read_committed), ``load.events`` and ``load.requests``. Figures:

- ``answered`` / ``failed`` / ``lost`` (requests without a result) / ``duplicates`` (request ids
  with more than one result record) / ``double_loads`` (a ``load.loaded`` by an engine that
  answered nothing for that adapter: the load should have happened on the engine that serves
  the policy);
- ``p50_ms`` / ``p99_ms``: end to end, request created → its result record (both stamped here,
  on one clock); ``cold_load_waves``: waves whose requests met at least one cold load.

Modes:

- ``--kill-one``: kill -9 one engine halfway through the traffic; the others take its partitions
  after the group's 10 s session timeout (static membership: no leave) and answer what it left
  waiting, skipping what it had answered already (``skipped_redelivered``, from their logs).
- ``--order-compare``: the same Zipf traffic twice over more adapters than the engines' CPU
  caches (1,000 policies, ``--max-cpu-loras`` 64 per engine), in waves of 240 every 10 s
  (about what the engines serve): demand-ordered engines, then ``--fifo`` engines. Mean wait
  (end to end) of the hottest decile of adapters by request count, FIFO / demand (target >= 3),
  and of all requests; a miss is reported as such (``met`` false).

An engine that joined the group and then silently fell out of it before the traffic starts (its
heartbeats stopped; seen under heavy CPU load) is restarted and named in ``engine_restarts``.

Prints progress to stderr and ONE JSON line last (``targets`` / ``met``). Every run has its own
topic prefix and keyspace (deleted at the end).

    python benchmarks/multi_engine.py                    # 3 engines, 1,000 adapters
    python benchmarks/multi_engine.py --kill-one         # ... one engine killed -9 halfway
    python benchmarks/multi_engine.py --order-compare    # demand-ordered vs FIFO engines
    python benchmarks/multi_engine.py --smoke            # 2 engines, 100 adapters (the test)

The harness is shared with tests/e2e/serving/test_multi_engine.py and poison_traffic.py:
benchmarks/_engine_group.py (run settings, catalog, engine processes) and benchmarks/_traffic.py
(upstream traffic, collector, figures, the kill -9 of one engine).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import _engine_group as eg  # noqa: E402
from benchmarks._engine_group import console, say  # noqa: E402
from benchmarks._harness import finish, overrides, parser  # noqa: E402
from benchmarks._traffic import (  # noqa: E402
    Collector,
    Upstream,
    figures,
    kill_one,
    taken_over,
    zipf_waves,
)
from schemas.settings import MintSettings  # noqa: E402

# Every figure must equal its target (a lost, duplicated or misplaced answer is a bug).
TARGETS = {"lost": 0, "duplicates": 0, "double_loads": 0, "failed": 0}
TARGET_HOT_RATIO = 3.0  # FIFO / demand-ordered mean wait of the hottest decile, at least


def met(fig: dict[str, Any], targets: dict[str, Any] = TARGETS) -> dict[str, bool]:
    return {k: fig[k] == v for k, v in targets.items()}


# ------------------------------------------------------------------ one run


@dataclass
class Plan:
    engines: int = 3
    adapters: int = 1000
    per_wave: int = 150
    waves: int = 20
    interval_s: float = 8.0
    zipf_s: float = 1.1
    max_tokens: int = 8
    max_loras: int = 4
    max_cpu_loras: int = 16
    max_num_seqs: int = 32
    partitions: int = 6
    seed: int = 0
    kill_one: bool = False
    kill_after_s: float = 1.0  # after the halfway wave was published
    answer_timeout_s: float = 600.0
    settle_s: float = 5.0

    @property
    def engine_ids(self) -> list[str]:
        return [f"e{i + 1}" for i in range(self.engines)]

    def sizes(self) -> dict[str, Any]:
        """How the run was sized, as its JSON line repeats it."""
        names = "engines partitions max_loras max_cpu_loras max_tokens zipf_s per_wave interval_s"
        return {k: getattr(self, k) for k in names.split()}


def drive(
    settings: MintSettings,
    engines: eg.EngineGroup,
    adapters: list[eg.Adapter],
    plan: Plan,
    waves: list[list[int]],
    *,
    label: str = "",
) -> dict[str, Any]:
    """Publish ``waves`` every ``plan.interval_s`` to running engines (killing one -9 halfway
    with ``plan.kill_one``), wait for every answer, then the figures."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    total = sum(len(w) for w in waves)
    extra: dict[str, Any] = {}
    with Collector(settings) as collector:
        up = Upstream(settings, adapters, max_tokens=plan.max_tokens, seed=plan.seed)
        progress = Progress(
            TextColumn(f"{label}{{task.description}}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        )
        try:
            with progress:
                pub = progress.add_task("published", total=total)
                ans = progress.add_task("answered", total=total)
                t0 = time.monotonic()

                def tick(_: int = 0) -> None:
                    progress.update(
                        ans, completed=collector.answered(s.request_id for s in up.sent)
                    )

                for w, indices in enumerate(waves):
                    up.publish(w, indices)
                    if plan.kill_one and w == len(waves) // 2:
                        # mid-wave: the victim has taken its share and waits for cold loads
                        time.sleep(plan.kill_after_s)
                        extra.update(kill_one(engines, collector, up.sent, t0))
                    progress.update(pub, completed=len(up.sent))
                    if not console.is_terminal:  # a log, not a live bar
                        n = collector.answered(s.request_id for s in up.sent)
                        say(
                            f"{label}wave {w + 1}/{len(waves)}: published {len(up.sent)}, "
                            f"answered {n}"
                        )
                    until = t0 + (w + 1) * plan.interval_s
                    while time.monotonic() < until:
                        engines.check()
                        tick()
                        time.sleep(0.25)
                traffic_s = time.monotonic() - t0
                ok = collector.wait_answered(
                    [s.request_id for s in up.sent],
                    plan.answer_timeout_s,
                    check=engines.check,
                    tick=lambda n: progress.update(ans, completed=n),
                )
                drained_s = time.monotonic() - t0
                time.sleep(plan.settle_s)  # a late duplicate would land here
        finally:
            up.close()
        results, loads = collector.snapshot()
    if not ok:
        say(f"[red]{label}not every request was answered within {plan.answer_timeout_s} s")
    fig = figures(up.sent, results, loads)
    fig.update(
        traffic_s=round(traffic_s, 1),
        drained_s=round(drained_s, 1),
        throughput_rps=round(total / drained_s, 1),
    )
    if "killed" in extra:
        fig.update(taken_over(extra, up.sent, results, engines))
    return fig


def run_once(
    settings: MintSettings,
    model: Path,
    adapters: list[eg.Adapter],
    plan: Plan,
    waves: list[list[int]],
    log_dir: Path,
    *,
    fifo: bool = False,
    label: str = "",
) -> dict[str, Any]:
    """Start the engines, wait until the group holds all of them, drive the traffic, stop."""
    engines = eg.EngineGroup(
        settings,
        model,
        log_dir,
        max_loras=plan.max_loras,
        max_cpu_loras=plan.max_cpu_loras,
        max_num_seqs=plan.max_num_seqs,
        fifo=fifo,
        threads=max(1, (os.cpu_count() or 1) // plan.engines),
    )
    with engines:
        t = time.monotonic()
        with console.status(f"{label}starting {plan.engines} engine processes"):
            engines.start(*plan.engine_ids)
            members = engines.wait_members(plan.engine_ids, steady_s=15)
        start_s = time.monotonic() - t
        say(
            f"{label}group stable after {start_s:.0f} s: "
            + ", ".join(f"{e}: {sorted(p)}" for e, p in sorted(members.items()))
        )
        fig = drive(settings, engines, adapters, plan, waves, label=label)
        members = engines.members()  # {} while it rebalances: nobody counted out
        fig["engines_out_of_group"] = sorted(set(plan.engine_ids) - set(members)) if members else []
        if idle := [e for e in plan.engine_ids if not fig["answered_by_engine"].get(e)]:
            say(  # why (CI keeps only stderr): where each engine waits, and its log's end
                f"[red]{label}{', '.join(idle)} answered nothing; the engines' stacks and logs:"
            )
            print(engines.workers.report(tail_chars=6000), file=sys.stderr)
        fig["engines_start_s"] = round(start_s, 1)
        fig["engine_restarts"] = list(engines.restarts)
    return fig


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, "2 engines, 100 adapters, short traffic")
    ap.add_argument("--kill-one", action="store_true", help="kill -9 one engine halfway")
    ap.add_argument(
        "--order-compare",
        action="store_true",
        help="demand-ordered vs --fifo engines on the same traffic",
    )
    ap.add_argument("--engines", type=int, default=None)
    ap.add_argument("--adapters", type=int, default=None, help="policies in the catalog")
    ap.add_argument("--per-wave", type=int, default=None, help="requests per wave")
    ap.add_argument("--waves", type=int, default=None)
    ap.add_argument("--interval", type=float, default=None, help="seconds between waves")
    ap.add_argument("--zipf-s", type=float, default=1.1)
    ap.add_argument("--max-tokens", type=int, default=None, help="per request (default 8)")
    ap.add_argument("--max-loras", type=int, default=4, help="each engine's GPU slots")
    ap.add_argument("--max-cpu-loras", type=int, default=None, help="each engine's CPU cache")
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", action="store_true", help="keep the work dir (logs) and topics")
    args = ap.parse_args(argv)

    plan = Plan()
    if args.smoke:
        plan.engines, plan.adapters, plan.per_wave, plan.waves, plan.interval_s = 2, 100, 40, 4, 5
    if args.order_compare:
        # More adapters than the CPU caches hold (1,000 policies; 64 per engine), in waves of
        # 240 every 10 s: about what the engines serve, so requests wait where order can show.
        plan.max_cpu_loras, plan.max_tokens = 64, 8
        plan.per_wave, plan.waves, plan.interval_s = 240, 6, 10.0
        if args.smoke:
            plan.adapters, plan.max_cpu_loras = 100, 8
            plan.per_wave, plan.waves, plan.interval_s = 80, 3, 8.0
    overrides(
        plan, args, "engines", "adapters", "max_tokens", "per_wave", "waves", interval_s="interval"
    )
    overrides(plan, args, "max_cpu_loras", "partitions", "zipf_s", "max_loras", "seed", "kill_one")
    if args.order_compare and plan.adapters <= plan.max_cpu_loras:
        ap.error("--order-compare needs more adapters than --max-cpu-loras")

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from schemas.logs import configure_logging

    configure_logging("WARNING", "json")  # stdout carries the one JSON line
    import logging

    logging.getLogger("kafka").setLevel(logging.ERROR)
    work = Path(tempfile.mkdtemp(prefix="mint-multi-engine-"))
    settings = eg.run_settings(work, partitions=plan.partitions)
    runs: list[MintSettings] = [settings]
    out: dict[str, Any] = {
        "benchmark": "multi_engine",
        "smoke": args.smoke,
        "mode": "order_compare"
        if args.order_compare
        else "kill_one"
        if args.kill_one
        else "steady",
    }
    try:
        t = time.monotonic()
        eg.prepare(settings)
        model = eg.tiny_model(settings)
        with console.status(f"storing {plan.adapters} adapters and importing the catalog"):
            adapters = eg.build_catalog(settings, model, plan.adapters, work)
        catalog_s = time.monotonic() - t
        say(f"catalog: {len(adapters)} policies with one revision each ({catalog_s:.0f} s)")
        waves = zipf_waves(len(adapters), plan.per_wave, plan.waves, plan.zipf_s, plan.seed)
        out.update(plan.sizes(), adapters=len(adapters), catalog_s=round(catalog_s, 1))
        if not args.order_compare:
            fig = run_once(settings, model, adapters, plan, waves, work / "logs")
            out.update(fig)
            out.update(targets=TARGETS, met=met(fig))
        else:
            both = {}
            for mode in ("demand", "fifo"):  # FIFO second: a warmer page cache, if anything
                s = eg.run_settings(work, partitions=plan.partitions, keyspace=settings.keyspace)
                runs.append(s)
                eg.prepare(s, migrate_keyspace=False)
                both[mode] = run_once(
                    s,
                    model,
                    adapters,
                    plan,
                    waves,
                    work / f"logs-{mode}",
                    fifo=mode == "fifo",
                    label=f"{mode}: ",
                )
                eg.delete_topics(s)
            d, f = both["demand"], both["fifo"]
            hot_ratio = f["hot_decile_mean_ms"] / max(d["hot_decile_mean_ms"], 1e-9)
            mean_ratio = f["mean_ms"] / max(d["mean_ms"], 1e-9)
            worst = {k: max(both[m][k] for m in both) for k in TARGETS}
            out.update(
                requests=d["requests"],
                answered=min(d["answered"], f["answered"]),
                **worst,
                p50_ms=d["p50_ms"],
                p99_ms=d["p99_ms"],
                cold_load_waves=d["cold_load_waves"],
                demand=d,
                fifo=f,
                hot_decile_wait_ratio=round(hot_ratio, 2),
                mean_wait_ratio=round(mean_ratio, 2),
            )
            targets = {**TARGETS, "hot_decile_wait_ratio": TARGET_HOT_RATIO}
            out.update(
                targets=targets,
                met={**met(out), "hot_decile_wait_ratio": hot_ratio >= TARGET_HOT_RATIO},
            )
    finally:
        if not args.keep:
            for s in runs:
                with contextlib.suppress(Exception):
                    eg.delete_topics(s)
            with contextlib.suppress(Exception):
                eg.drop_keyspace(settings)
            shutil.rmtree(work, ignore_errors=True)
        else:
            say(f"kept {work} (logs) and the topics under prefix {settings.topic_prefix}")
    finish(out, "multi_engine", argv, say)
    return 0


if __name__ == "__main__":
    sys.exit(main())
