"""Four policies' GRPO loops over ONE resident base: sequential versus concurrent.

Each policy's loop repeats: wait for its rollouts, then one GRPO (PPO-clip) optimizer step on
them. The wait is a measured ``time.sleep`` standing in for remote rollout latency (rollouts come
from vLLM serving workers in MinT, not from the trainer); it is set to ``--latency-factor`` times
the median measured train step, so the ratio says how much of the waiting the trainer fills with
other policies' steps. Rollouts are sampled once per policy from the model at start (with their
logprobs) and reused, so later steps are off-policy against them, as with a stale rollout.

Each mode runs in its own child process so that its peak RSS is its own: the sequential child
runs the four loops one after the other; the concurrent child runs them in four threads sharing
one trainer (one base model, four adapters and AdamW states; a lock serializes the steps).
Prints ONE JSON line with the wall-time ratio (sequential / concurrent, target >= 1.77, the
reference system's figure) and the peak-RSS ratio (concurrent / sequential, target <= 1.05), in
``targets`` / ``met``. ``rollouts`` says the wait is simulated: the ratio measures how well the
trainer interleaves policies around a wait, not real vLLM rollouts through Kafka.

    python benchmarks/multi_policy_training.py            # tiny Llama, 8 iterations per policy
    python benchmarks/multi_policy_training.py --size small --iterations 4   # ≈0.5B Llama
    python benchmarks/multi_policy_training.py --smoke    # what the test suite runs
    python benchmarks/multi_policy_training.py --rollouts kafka   # real rollouts, worker processes

``--rollouts kafka`` measures the production path instead: trainer, vLLM engine, projector and
controller as worker processes, each policy's rounds through Kafka by the SDK, sequential then
concurrent on the same workers; peak memory is the workers' summed PSS.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._harness import parser  # noqa: E402

POLICIES = 4
TARGET_WALL_TIME_RATIO = 1.77  # sequential / concurrent, at least (the reference anchor)
TARGET_PEAK_RSS_RATIO = 1.05  # concurrent / sequential, at most
PROMPTS = ["question: 1 plus 2", "hello world", "the model", "red green blue"]


def _child(args: argparse.Namespace) -> dict:
    """Run one mode in this process and return its figures."""
    import torch

    torch.set_num_threads(args.threads)
    from workers.trainer import LoraShape, MultiPolicyTrainer, Rollout, TrainerConfig

    trainer = MultiPolicyTrainer(
        TrainerConfig(base_model=args.model, backend=args.backend, dtype=args.dtype)
    )
    ptrs = trainer.base_parameter_ptrs()
    lora = LoraShape(rank=8, alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    batches = {}
    for i in range(POLICIES):
        pid = f"bench/policy-{i}"
        trainer.add_policy(pid, lora, seed=i)
        rows = trainer.sample(pid, PROMPTS, n=args.samples, max_new_tokens=args.tokens, seed=i)
        rollouts = [
            Rollout(**r, reward=sum(t % 2 == 0 for t in r["completion_ids"]) / args.tokens)
            for r in rows
        ]
        batches[pid] = trainer.collate(rollouts, add_eos=False)
    step_times: list[float] = []

    def step(pid: str) -> None:
        step_times.append(trainer.rl_step(pid, batches[pid], lr=1e-3).seconds)

    for pid in batches:  # warm-up (first-step allocations), also the latency calibration
        step(pid)
    latency = (
        args.latency_s
        if args.latency_s is not None
        else (args.latency_factor * statistics.median(step_times))
    )
    step_times.clear()
    waits: list[float] = []

    def loop(pid: str) -> None:
        for _ in range(args.iterations):
            t = time.perf_counter()
            time.sleep(latency)  # stand-in for remote rollout latency
            waits.append(time.perf_counter() - t)
            step(pid)

    t0 = time.perf_counter()
    if args.mode == "sequential":
        for pid in batches:
            loop(pid)
    else:
        threads = [threading.Thread(target=loop, args=(pid,)) for pid in batches]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    wall = time.perf_counter() - t0
    assert trainer.base_parameter_ptrs() == ptrs, "the base weights were copied"
    return {
        "mode": args.mode,
        "wall_s": wall,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "train_step_s_median": statistics.median(step_times),
        "rollout_wait_s_mean": statistics.mean(waits),
        "latency_s": latency,
        "steps": len(step_times),
        "base_parameters": sum(
            p.numel() for n, p in trainer.base.named_parameters() if "lora_" not in n
        ),
        "base_weight_copies": 1,
    }


def _run_child(args: argparse.Namespace, mode: str, latency: float | None) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        mode,
        "--model",
        args.model,
        "--iterations",
        str(args.iterations),
        "--threads",
        str(args.threads),
        "--samples",
        str(args.samples),
        "--tokens",
        str(args.tokens),
        "--backend",
        args.backend,
        "--dtype",
        args.dtype,
        "--latency-factor",
        str(args.latency_factor),
    ]
    if latency is not None:
        cmd += ["--latency-s", repr(latency)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MINT_LOG_LEVEL": "WARNING"}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def kafka_rollouts(args: argparse.Namespace) -> dict:
    """The production path: a trainer, a vLLM engine (rollout lane), a projector and a controller
    as worker processes, four policies' GRPO rounds through Kafka (``MintClient.train``: rollout
    requests to the engine, updates to the trainer, exports back), first one policy after the
    other, then all four at once. The workers' peak memory (sum of PSS) is sampled in each."""
    import uuid

    from catalog.cluster import connect
    from catalog.migrate import migrate
    from mint.demo import LORA_TARGETS, TENANT, demo_model, demo_settings
    from mint.demo import TINY as task
    from mint.dev.workers import Workers
    from mint.sdk import MintClient
    from schemas.events import LoraSpec
    from schemas.settings import get_settings
    from streams.topics import ensure_topics

    settings = demo_settings(get_settings(), f"mpt{uuid.uuid4().hex[:6]}")
    model = Path(args.model) if args.model else demo_model(settings, task)
    ensure_topics(settings)
    cluster, session = connect(settings)
    migrate(session, settings.keyspace, settings.keyspace_replication)
    work = Path(tempfile.mkdtemp(prefix="mint-bench-mpt-"))
    workers = Workers(settings, model, work / "logs", task)
    lora = LoraSpec(rank=8, alpha=16, target_modules=list(LORA_TARGETS))
    client = None

    def rounds(policy: str, start: int) -> None:
        own = MintClient(settings, TENANT, producer=f"bench-{policy}", timeout_s=900)  # per thread
        own.base_models[policy] = str(model)
        try:
            own.train(
                policy,
                PROMPTS,
                rounds=args.iterations,
                reward=task.reward,
                samples_per_prompt=args.samples,
                max_tokens=args.tokens,
                temperature=1.0,
                learning_rate=task.learning_rate,
                steps_per_round=1,
                start_revision=start,
                seed=1,
            )
        finally:
            own.close()

    phases = {}
    try:
        workers.start_all()
        client = MintClient(settings, TENANT, producer="bench", timeout_s=900)
        starts = {}
        for mode in ("warmup", "sequential", "concurrent"):
            for i in range(POLICIES if mode != "warmup" else 1):
                policy = f"{mode[:3]}-{i}"
                client.create_policy(
                    policy,
                    base_model=str(model),
                    suite=task.suite,
                    thresholds={"reward": {"min": 1.01}},
                )  # never promotes
                starts[policy] = client.init_policy(policy, lora=lora).revision
        rounds("war-0", starts["war-0"])  # first loads, compiles and caches: in neither phase
        for mode in ("sequential", "concurrent"):
            policies = [f"{mode[:3]}-{i}" for i in range(POLICIES)]
            workers.peak_rss_mb = 0.0
            with workers.sampling_rss():
                t0 = time.perf_counter()
                if mode == "sequential":
                    for policy in policies:
                        rounds(policy, starts[policy])
                else:
                    with ThreadPoolExecutor(len(policies)) as pool:
                        for done in [pool.submit(rounds, p, starts[p]) for p in policies]:
                            done.result()  # a failed round fails the benchmark
                wall = time.perf_counter() - t0
            phases[mode] = {"wall_s": wall, "peak_rss_mb": workers.peak_rss_mb}
            print(
                f"{mode}: {wall:.1f} s, workers' peak PSS {workers.peak_rss_mb:.0f} MB",
                file=sys.stderr,
            )
    finally:
        if client is not None:
            client.close()
        workers.stop_all()
        session.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}", timeout=120)
        cluster.shutdown()
    return phases


def main() -> None:
    ap = parser(__doc__, "tiny and short (the test suite)")
    ap.add_argument("--model", help="base model folder (default: build a tiny Llama)")
    ap.add_argument("--size", choices=["test", "small"], default="test")
    ap.add_argument("--iterations", type=int, default=8, help="GRPO steps per policy")
    ap.add_argument(
        "--latency-factor",
        type=float,
        default=3.0,
        help="rollout wait = factor × median train step",
    )
    ap.add_argument("--latency-s", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (both modes)")
    ap.add_argument("--samples", type=int, default=8, help="rollouts per prompt (4 prompts)")
    ap.add_argument("--tokens", type=int, default=16, help="tokens per rollout")
    ap.add_argument("--backend", choices=["torch", "deepspeed"], default="torch")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--child", choices=["sequential", "concurrent"], help=argparse.SUPPRESS)
    ap.add_argument(
        "--rollouts",
        choices=["simulated", "kafka"],
        default="simulated",
        help="kafka: real vLLM rollouts through Kafka by the worker processes",
    )
    args = ap.parse_args()
    if args.child:
        args.mode = args.child
        with contextlib.redirect_stdout(sys.stderr):
            result = _child(args)
        print(json.dumps(result))
        return
    if args.smoke:
        args.size, args.iterations, args.samples, args.tokens = "test", 3, 4, 8
    from schemas.logs import configure_logging

    configure_logging("WARNING", "console")  # logs to stderr: stdout carries the one JSON line
    if args.rollouts == "kafka":
        if args.smoke:
            args.iterations = 2
        print_kafka_line(args, kafka_rollouts(args))
        return
    with tempfile.TemporaryDirectory(prefix="mint-bench-") as tmp:
        if args.model is None:
            # Importing transformers' integrations may print to stdout (DeepSpeed's banner).
            with contextlib.redirect_stdout(sys.stderr):
                from workers.models import TinySpec, build_tiny

                args.model = str(build_tiny(TinySpec("llama", args.size), Path(tmp) / "base"))
        seq = _run_child(args, "sequential", None)
        conc = _run_child(args, "concurrent", seq["latency_s"])  # the same wait in both modes
    print(
        json.dumps(
            {
                "benchmark": "multi_policy_training",
                "smoke": args.smoke,
                "policies": POLICIES,
                "iterations_per_policy": args.iterations,
                "model": f"random-weight llama ({args.size})"
                if "mint-bench-" in args.model
                else args.model,
                "base_parameters": seq["base_parameters"],
                "backend": args.backend,
                "dtype": args.dtype,
                "torch_threads": args.threads,
                "loss": "GRPO ppo_clip, group-relative advantages, LoRA r=8 on q/k/v/o",
                "rollouts": "simulated (time.sleep)",
                "rollout_wait": (
                    f"time.sleep of {seq['latency_s']:.4f} s per iteration standing in for "
                    f"remote rollout latency ({args.latency_factor} x the median train "
                    "step); rollouts sampled from the model once at start and reused"
                ),
                # Steps after a sleep run on cold caches (and share the CPU with whatever else runs),
                # back-to-back steps on warm ones: both medians are shown.
                "sequential_train_step_s_median": round(seq["train_step_s_median"], 5),
                "concurrent_train_step_s_median": round(conc["train_step_s_median"], 5),
                "sequential_wall_s": round(seq["wall_s"], 3),
                "concurrent_wall_s": round(conc["wall_s"], 3),
                "sequential_peak_rss_mb": round(seq["peak_rss_mb"], 1),
                "concurrent_peak_rss_mb": round(conc["peak_rss_mb"], 1),
                "base_weight_copies": 1,
                **_versus(seq, conc),
            }
        )
    )


def _versus(seq: dict, conc: dict) -> dict:
    """The line's two ratios, sequential / concurrent wall time and concurrent / sequential peak
    memory, rounded, with their ``targets`` and ``met``."""
    from benchmarks._harness import targets_and_met

    wall_ratio = seq["wall_s"] / conc["wall_s"]
    rss_ratio = conc["peak_rss_mb"] / seq["peak_rss_mb"]
    return {
        "wall_time_ratio": round(wall_ratio, 3),
        "peak_rss_ratio": round(rss_ratio, 4),
        **targets_and_met(
            wall_time_ratio=(wall_ratio, ">=", TARGET_WALL_TIME_RATIO),
            peak_rss_ratio=(rss_ratio, "<=", TARGET_PEAK_RSS_RATIO),
        ),
    }


def print_kafka_line(args: argparse.Namespace, phases: dict) -> None:
    seq, conc = phases["sequential"], phases["concurrent"]
    print(
        json.dumps(
            {
                "benchmark": "multi_policy_training",
                "smoke": args.smoke,
                "policies": POLICIES,
                "rounds_per_policy": args.iterations,
                "model": args.model or "random-weight llama (test), the demo's tiny model",
                "rollouts": "vLLM engine worker through Kafka (rollout.requests -> rollout.results)",
                "samples": f"{len(PROMPTS)} prompts x {args.samples}, {args.tokens} tokens",
                "sequential_wall_s": round(seq["wall_s"], 2),
                "concurrent_wall_s": round(conc["wall_s"], 2),
                "sequential_peak_pss_mb": round(seq["peak_rss_mb"], 1),
                "concurrent_peak_pss_mb": round(conc["peak_rss_mb"], 1),
                "memory": "sum of PSS of every worker process (trainer, engine, projector, controller)",
                **_versus(seq, conc),
            }
        )
    )


if __name__ == "__main__":
    main()
