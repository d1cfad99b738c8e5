"""What the front door costs: warm requests through gateway → Kafka → engine → gateway versus
the same vLLM engine called in-process, tiny Llama with one LoRA adapter.

- latency: N sequential requests, each path in turn (direct ``engine.generate``, then the same
  request as ``POST /v1/completions`` through a `mint gateway` process); the added latency of a
  pair is gateway − direct, reported as p50/p99 over the pairs (interleaving keeps both paths
  under the same machine load);
- throughput: 16 concurrent HTTP clients through the gateway (requests/s), beside the same
  engine called in-process by 16 threads (one request per call: generate is not re-entrant) and
  in batches of 16 (its best case).

The engine runs in this process (its serving worker in a thread, as `mint worker serving` runs
it); the gateway is its own process, as deployed. Prints ONE JSON line (``targets`` / ``met``:
added p50 ≤ 15 ms).

    python benchmarks/gateway_latency.py              # 200 pairs, 512 concurrent requests
    python benchmarks/gateway_latency.py --smoke      # 20 pairs, 64 concurrent (CI)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import _harness as h  # noqa: E402
from benchmarks._harness import pct  # noqa: E402

TARGET_ADDED_P50_MS = 15.0
PROMPT = "the cat sat on the"


def make_adapter(model: Path, out: Path) -> Path:
    """A rank-8 PEFT adapter with random non-zero A and B over ``model``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    get_peft_model(
        base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    ).save_pretrained(out)
    g = torch.Generator().manual_seed(0)
    weights = out / "adapter_model.safetensors"
    save_file(
        {
            k: (torch.randn(t.shape, generator=g) * 0.3).contiguous()
            for k, t in load_file(str(weights)).items()
        },
        str(weights),
    )
    return out


def main() -> None:
    ap = h.parser(__doc__, "20 pairs, 64 concurrent requests")
    ap.size("--requests", 20, 200, "sequential pairs")
    ap.size("--concurrent-requests", 64, 512, "requests through the gateway at once")
    ap.add_argument("--clients", type=int, default=16, help="concurrent HTTP clients")
    ap.add_argument("--max-tokens", type=int, default=8)
    args = ap.parse_args()
    pairs, total = args.requests, args.concurrent_requests
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # a shared small machine
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    import httpx
    import structlog

    from catalog.access import AccessRepository
    from catalog.artifacts import model_fingerprint
    from catalog.models import Resolved
    from catalog.repository import CatalogRepository
    from catalog.store import AdapterStore
    from schemas.logs import configure_logging
    from workers.models import TinySpec, build_tiny
    from workers.serving.core import ServingCore
    from workers.serving.engine import EngineConfig, GenRequest, VllmEngine
    from workers.serving.resolution import ResolutionCache
    from workers.serving.worker import ServingWorker
    from workers.serving.working_set import WorkingSet

    configure_logging("WARNING", "console")
    structlog.get_logger()
    work = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    settings = h.run_settings("gw", work)
    engine = serving = gateway = None
    stop = threading.Event()
    space = contextlib.ExitStack()  # the run's topics and keyspace, dropped in the finally
    session = space.enter_context(h.run_space(settings))
    try:
        model = build_tiny(TinySpec("llama", "test"), work / "llama")
        adapter = make_adapter(model, work / "adapter")
        repo = CatalogRepository(session, settings.keyspace)
        access = AccessRepository(session, settings.keyspace)
        store = AdapterStore.from_settings(settings)
        fingerprint = model_fingerprint(model)
        stored = store.put(
            adapter,
            tenant="bench",
            policy="chat",
            base_model="tiny",
            base_model_fingerprint=fingerprint,
        )
        repo.create_policy("bench", "chat", "tiny")
        rev = repo.register_revision("bench", "chat", digest=stored.digest, store_uri=stored.uri)
        repo.move_alias("bench", "chat", "prod", rev.revision, expected=None, by="bench")
        access.create_tenant("bench", rate_per_s=1e6, burst=1_000_000)
        key, _ = access.create_key("bench", name="bench")

        gateway, url = h.start_gateway(settings, work / "gateway.log")  # starts beside vLLM
        config = EngineConfig(
            model=str(model),
            engine_id="bench-engine",
            max_loras=2,
            max_cpu_loras=4,
            max_model_len=128,
            max_num_seqs=32,
        )
        engine = VllmEngine(config)
        ws = WorkingSet(
            engine,
            store,
            work / "cache",
            base_model_fingerprint=fingerprint,
            max_loras=2,
            max_cpu_loras=4,
            max_disk_loras=16,
            max_lora_rank=16,
        )
        core = ServingCore(
            engine,
            ws,
            ResolutionCache(repo.resolve, ttl_s=2.0),
            engine_id="bench-engine",
            base_model="tiny",
            max_num_seqs=32,
        )
        worker = ServingWorker(settings, core, stop=stop, instance_id="bench-engine")
        serving = threading.Thread(target=worker.run, name="serving", daemon=True)
        serving.start()
        h.wait_ready(url, gateway, work / "gateway.log")

        handle = ws.ensure(Resolved("bench", "chat", rev.revision, rev.digest, rev.store_uri))
        direct_req = GenRequest(PROMPT, args.max_tokens, 0.0, lora=handle)
        body = {
            "model": "chat@prod",
            "prompt": PROMPT,
            "max_tokens": args.max_tokens,
            "temperature": 0,
        }
        headers = {"Authorization": f"Bearer {key.text}"}
        http = httpx.Client(base_url=url, headers=headers, timeout=120)
        errors = 0

        engine_ms: list[float] = []

        def through_gateway() -> float:
            nonlocal errors
            t0 = time.perf_counter()
            r = http.post("/v1/completions", json=body)
            ms = (time.perf_counter() - t0) * 1000
            errors += r.status_code != 200
            engine_ms.append(float(r.headers.get("x-mint-engine-ms", "nan")))
            return ms

        def direct() -> float:
            t0 = time.perf_counter()
            engine.generate([direct_req])
            return (time.perf_counter() - t0) * 1000

        for _ in range(5):  # warm both paths (first requests resolve, load, compile)
            through_gateway()
            direct()
        gw_ms, direct_ms = [], []
        engine_ms.clear()
        for _ in range(pairs):
            direct_ms.append(direct())
            gw_ms.append(through_gateway())
        added = [g - d for g, d in zip(gw_ms, direct_ms, strict=True)]
        # outside the engine: HTTP, the gateway, Kafka both ways (the engine's own time, as its
        # answer reports it, taken off)
        outside = [g - e for g, e in zip(gw_ms, engine_ms, strict=True)]
        same = http.post("/v1/completions", json=body).json()["choices"][0]["text"]
        same_as_direct = same == engine.generate([direct_req])[0].samples[0].text

        clients = [
            httpx.Client(base_url=url, headers=headers, timeout=300) for _ in range(args.clients)
        ]

        def client_loop(k: int) -> int:
            bad = 0
            for _ in range(k, total, args.clients):
                bad += clients[k].post("/v1/completions", json=body).status_code != 200
            return bad

        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            errors += sum(pool.map(client_loop, range(args.clients)))
        gateway_rps = total / (time.perf_counter() - t0)
        # the same engine, in-process, 16 client threads: vLLM's generate is not re-entrant, so
        # each call serves one request (what a process without Kafka in front would get)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(lambda _: direct(), range(total // 4)))
        inprocess_threads_rps = (total // 4) / (time.perf_counter() - t0)
        batch = [direct_req] * args.clients
        rounds = max(2, total // args.clients // 4)
        t0 = time.perf_counter()
        for _ in range(rounds):
            engine.generate(batch)
        inprocess_rps = rounds * args.clients / (time.perf_counter() - t0)
        for c in [http, *clients]:
            c.close()

        added_p50 = pct(added, 0.5)
        h.emit(
            {
                "benchmark": "gateway_latency",
                "smoke": args.smoke,
                "model": "tiny-llama (test)",
                "max_tokens": args.max_tokens,
                "pairs": pairs,
                "clients": args.clients,
                "concurrent_requests": total,
                "errors": errors,
                "same_answer": same_as_direct,
                "direct_p50_ms": round(pct(direct_ms, 0.5), 2),
                "direct_p99_ms": round(pct(direct_ms, 0.99), 2),
                "gateway_p50_ms": round(pct(gw_ms, 0.5), 2),
                "gateway_p99_ms": round(pct(gw_ms, 0.99), 2),
                "added_p50_ms": round(added_p50, 2),
                "added_p99_ms": round(pct(added, 0.99), 2),
                "added_mean_ms": round(statistics.fmean(added), 2),
                "outside_engine_p50_ms": round(pct(outside, 0.5), 2),
                "outside_engine_p99_ms": round(pct(outside, 0.99), 2),
                "gateway_rps": round(gateway_rps, 1),
                "inprocess_batch_rps": round(inprocess_rps, 1),
                "inprocess_threads_rps": round(inprocess_threads_rps, 1),
                "gateway_over_inprocess_rps": round(gateway_rps / inprocess_rps, 3),
                **h.machine(),
                **h.targets_and_met(added_p50_ms=(added_p50, "<=", TARGET_ADDED_P50_MS)),
            }
        )
    finally:
        stop.set()
        if gateway is not None:
            h.stop_group(gateway, timeout_s=20)
        if serving is not None:
            serving.join(timeout=30)  # the worker's loop sees stop and closes its consumers
        if engine is not None:
            engine.close()
        space.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
