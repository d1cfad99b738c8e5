"""One engine, many adapters: a sweep of N distinct adapters, then Zipf traffic over more adapters
than the CPU cache holds, demand-grouped waves versus FIFO, side by side on ONE vLLM engine.

- sweep: one request for each of N distinct revisions (stored, fetched, verified, loaded, served,
  evicted) through the working set (max_loras GPU slots, max_cpu_loras CPU cache);
- zipf: the same request sequence (Zipf over K > max_cpu_loras adapters, arriving in bursts)
  served twice from a cold working set: FIFO batches (arrival order, cut where a batch would need
  one adapter more than the GPU slots) and demand-grouped waves (workers.serving.scheduler: the
  most-waited-for adapters first, all their waiting requests together). Greedy outputs of the two
  runs are compared request by request.

- kafka_sweep: the sweep on the production path first (``--kafka-adapters``, default 10,000):
  one request per policy through ``infer.requests``, the catalog, ``load.requests`` and an
  engine process (benchmarks._engine_group's harness); the in-process sweep is the second row.

Prints ONE JSON line (``targets`` / ``met``: demand / FIFO throughput >= 3).

    python benchmarks/adapter_sweep.py                       # N = 100,000
    python benchmarks/adapter_sweep.py --adapters 10000
    python benchmarks/adapter_sweep.py --smoke               # N = 400 (what CI runs)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._harness import parser, targets_and_met  # noqa: E402

PROMPTS = ["hello world", "the cat sat", "2 + 2 =", "once upon a time", "red green blue"]
TARGET_DEMAND_OVER_FIFO = 3.0  # demand-grouped / FIFO requests per second, at least


def serve(engine, ws, requests, *, fifo: bool, burst: int, max_tokens: int):
    """Serve (adapter ref, prompt) requests arriving in bursts; returns (seconds, outputs, waves)."""
    from workers.serving.engine import GenRequest
    from workers.serving.scheduler import DemandScheduler

    sched: DemandScheduler[int] = DemandScheduler(fifo=fifo)
    outputs: dict[int, list[int]] = {}
    waves = 0
    t0 = time.perf_counter()
    for start in range(0, len(requests), burst):
        for i in range(start, min(start + burst, len(requests))):
            sched.add(requests[i][0].digest, i)
        while len(sched):
            wave = sched.next_wave(ws.max_loras, engine.config.max_num_seqs)
            handles = {}
            for digest, i in wave:
                if digest not in handles:
                    handles[digest] = ws.ensure(requests[i][0])
            ws.used_in_batch(list(handles))
            outs = engine.generate(
                [GenRequest(requests[i][1], max_tokens, 0.0, lora=handles[d]) for d, i in wave]
            )
            for (_, i), o in zip(wave, outs, strict=True):
                outputs[i] = o.samples[0].token_ids
            waves += 1
    return time.perf_counter() - t0, outputs, waves


def kafka_sweep(n: int, args: argparse.Namespace) -> dict:
    """The same sweep on the production path: ``n`` policies in the catalog, one request each for
    ``tenant/policy@prod`` published to ``infer.requests``; one engine process (``mint worker
    serving``) resolves it through the catalog, asks ``load.requests`` for the cold adapter,
    loads it, answers on ``infer.results``. Timed from the first publish to the last answer."""
    from benchmarks._engine_group import (
        EngineGroup,
        build_catalog,
        delete_topics,
        drop_keyspace,
        prepare,
        run_settings,
        tiny_model,
    )
    from benchmarks._traffic import Collector, Upstream

    work = Path(tempfile.mkdtemp(prefix="mint-sweep-kafka-"))
    settings = run_settings(work, partitions=3)
    prepare(settings)
    try:
        model = tiny_model(settings)
        t0 = time.perf_counter()
        adapters = build_catalog(settings, model, n, work)
        build_s = time.perf_counter() - t0
        with (
            EngineGroup(
                settings,
                model,
                work / "logs",
                max_loras=args.max_loras,
                max_cpu_loras=args.max_cpu_loras,
                max_num_seqs=args.max_num_seqs,
            ) as engines,
            Collector(settings) as seen,
        ):
            engines.start("sweep-0")
            engines.wait_members(["sweep-0"])
            upstream = Upstream(settings, adapters, max_tokens=args.sweep_tokens)
            t0 = time.perf_counter()
            ids = []
            for wave, start in enumerate(range(0, n, args.burst)):
                ids += [
                    x.request_id
                    for x in upstream.publish(wave, list(range(start, min(n, start + args.burst))))
                ]
            upstream.close()
            if not seen.wait_answered(ids, timeout_s=max(600.0, n / 5), check=engines.check):
                raise SystemExit(f"{n - seen.answered(ids)} of {n} sweep requests unanswered")
            secs = time.perf_counter() - t0
            results, loads = seen.snapshot()
        ok = sum(1 for i in ids if any(r.ok for r in results[i]))
        return {
            "adapters": n,
            "build_catalog_s": round(build_s, 2),
            "seconds": round(secs, 2),
            "adapters_per_s": round(n / secs, 1),
            "answered": ok,
            "failed": sum(1 for i in ids if results[i] and not results[i][0].ok),
            "answers": sum(len(results[i]) for i in ids),
            "load_requests": sum(1 for e in loads if e.kind == "load.requested"),
            "loads": sum(1 for e in loads if e.kind == "load.loaded"),
            "path": "infer.requests -> catalog resolve -> load.requests -> engine process -> "
            "infer.results",
        }
    finally:
        drop_keyspace(settings)
        delete_topics(settings)
        shutil.rmtree(work, ignore_errors=True)


def zipf_indices(rng: random.Random, k: int, m: int, s: float) -> list[int]:
    weights = [1.0 / (r + 1) ** s for r in range(k)]
    return rng.choices(range(k), weights=weights, k=m)


def main() -> None:
    ap = parser(__doc__, "400 adapters, short Zipf run")
    ap.size("--adapters", 400, 100_000, "N for the sweep")
    ap.size("--zipf-requests", 256, 2048, "M, the Zipf run's requests")
    ap.size(
        "--kafka-adapters", 100, 10_000, "N of the sweep through Kafka and the catalog (0: skip it)"
    )
    ap.add_argument("--zipf-adapters", type=int, default=64, help="K (> max_cpu_loras)")
    ap.add_argument("--zipf-s", type=float, default=1.1)
    ap.add_argument("--burst", type=int, default=512, help="requests arriving together")
    ap.add_argument("--max-loras", type=int, default=4)
    ap.add_argument("--max-cpu-loras", type=int, default=16)
    ap.add_argument("--max-num-seqs", type=int, default=32, help="engine batch size")
    ap.add_argument("--sweep-tokens", type=int, default=4, help="max_tokens in the sweep")
    ap.add_argument("--max-tokens", type=int, default=32, help="max_tokens of Zipf requests")
    args = ap.parse_args()
    n, m = args.adapters, args.zipf_requests
    if args.zipf_adapters <= args.max_cpu_loras:
        ap.error("--zipf-adapters must exceed --max-cpu-loras (traffic over more than the cache)")

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from benchmarks._adapters import make_adapters, make_template
    from catalog.artifacts import model_fingerprint
    from catalog.store import AdapterStore
    from schemas.logs import configure_logging
    from workers.models import TinySpec, build_tiny
    from workers.serving.engine import EngineConfig, VllmEngine
    from workers.serving.working_set import WorkingSet

    configure_logging("WARNING", "console")
    through_kafka = kafka_sweep(args.kafka_adapters, args) if args.kafka_adapters else None
    work = Path(tempfile.mkdtemp(prefix="mint-sweep-"))
    try:
        model = build_tiny(TinySpec("llama", "test"), work / "model")
        fp = model_fingerprint(model)
        template = make_template(model, work / "template")
        store = AdapterStore(work / "store")
        t0 = time.perf_counter()
        refs = make_adapters(template, store, fp, n, work)
        build_s = time.perf_counter() - t0
        engine = VllmEngine(
            EngineConfig(
                model=str(model),
                max_loras=args.max_loras,
                max_cpu_loras=args.max_cpu_loras,
                max_lora_rank=8,
                max_model_len=64,
                max_num_seqs=args.max_num_seqs,
            )
        )

        def fresh_ws(name: str) -> WorkingSet:
            return WorkingSet(
                engine,
                store,
                work / f"cache-{name}",
                base_model_fingerprint=fp,
                max_loras=args.max_loras,
                max_cpu_loras=args.max_cpu_loras,
                max_disk_loras=4 * args.max_cpu_loras,
                max_lora_rank=8,
            )

        rng = random.Random(0)
        try:
            ws = fresh_ws("sweep")
            sweep_reqs = [(r, rng.choice(PROMPTS)) for r in refs]
            sweep_s, sweep_out, sweep_waves = serve(
                engine, ws, sweep_reqs, fifo=False, burst=args.burst, max_tokens=args.sweep_tokens
            )
            sweep_counters = ws.counters.as_dict()
            ws.clear()

            hot = refs[: args.zipf_adapters]
            zreqs = [
                (hot[i], rng.choice(PROMPTS)) for i in zipf_indices(rng, len(hot), m, args.zipf_s)
            ]
            runs = {}
            for mode in ("fifo", "demand"):
                ws = fresh_ws(mode)
                secs, out, waves = serve(
                    engine,
                    ws,
                    zreqs,
                    fifo=mode == "fifo",
                    burst=args.burst,
                    max_tokens=args.max_tokens,
                )
                runs[mode] = dict(seconds=secs, out=out, waves=waves, **ws.counters.as_dict())
                ws.clear()
        finally:
            engine.close()
        same = sum(runs["fifo"]["out"][i] == runs["demand"]["out"][i] for i in range(m)) / m
        ratio = (m / runs["demand"]["seconds"]) / (m / runs["fifo"]["seconds"])

        def summary(r):
            return {
                k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k != "out"
            }

        print(
            json.dumps(
                {
                    "benchmark": "adapter_sweep",
                    "smoke": args.smoke,
                    "adapters": n,
                    "kafka_sweep": through_kafka,
                    "sweep_path": "in-process working set of one engine (no Kafka, no catalog): the "
                    "second row, beside kafka_sweep",
                    "build_adapters_s": round(build_s, 2),
                    "sweep_s": round(sweep_s, 2),
                    "sweep_adapters_per_s": round(n / sweep_s, 1),
                    "sweep_served": len(sweep_out),
                    "sweep_waves": sweep_waves,
                    "sweep_loads": sweep_counters["loads"],
                    "sweep_evictions": sweep_counters["evictions"],
                    "max_loras": args.max_loras,
                    "max_num_seqs": args.max_num_seqs,
                    "max_cpu_loras": args.max_cpu_loras,
                    "zipf_adapters": args.zipf_adapters,
                    "zipf_requests": m,
                    "zipf_s": args.zipf_s,
                    "burst": args.burst,
                    "max_tokens": args.max_tokens,
                    "fifo": summary(runs["fifo"]),
                    "demand": summary(runs["demand"]),
                    "fifo_req_per_s": round(m / runs["fifo"]["seconds"], 1),
                    "demand_req_per_s": round(m / runs["demand"]["seconds"], 1),
                    "demand_over_fifo": round(ratio, 2),
                    "outputs_equal_share": round(same, 4),
                    **targets_and_met(demand_over_fifo=(ratio, ">=", TARGET_DEMAND_OVER_FIFO)),
                }
            )
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
