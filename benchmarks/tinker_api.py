"""What the Tinker front door costs: supervised LoRA steps through the official ``tinker`` SDK →
HTTP (`mint gateway`, its own process) → Kafka ``train.steps`` → the trainer worker (its own
process; it checkpoints the policy after each optim_step) → ``train.step.results`` → the SDK,
against the same trainer code called in-process (``forward_datums`` + ``optim_step``).

Both paths run the same batch (SmolLM2-135M-Instruct, 8 sequences of 128 tokens, LoRA rank 8 on
attention and MLP, AdamW lr 1e-4) with the same torch thread count; their steps alternate, so
machine load falls on both alike. A step is ``forward_backward`` + ``optim_step``: the SDK sends
both at once and waits for both, as Tinker code does. Prints ONE JSON line: overhead ratio
(median SDK step / median in-process step; target ≤ 1.25×), calls/s through the API, p50/p99 per
call.

With ``--gateways N`` the SDK reaches N gateway processes through a round-robin balancer (no
affinity); with ``--kill`` one of them is SIGKILLed every ``--kill-every`` seconds and started
again. The line then also counts ``lost`` (calls never answered), ``futures_404`` and
``applied_twice`` (steps whose loss differs from the in-process trainer's on the same batches:
a call applied twice, or lost, shows there). Targets: all three 0.

    python benchmarks/tinker_api.py            # SmolLM2-135M-Instruct, 8 × 128 tokens, 10 steps
    python benchmarks/tinker_api.py --smoke    # tiny Llama, 2 × 32 tokens, 3 steps (CI)
    python benchmarks/tinker_api.py --gateways 2 --kill   # gateways killed every 20 s
    python benchmarks/tinker_api.py --gateways 2 --kill trainer   # the trainer worker
    python benchmarks/tinker_api.py --gateways 2 --kill kafka     # the broker, down 3 s
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._gateway_pool import Faults, GatewayPool, kill_kafka, kill_trainer  # noqa: E402
from benchmarks._harness import emit, parser, pct, targets_and_met, trainer_run  # noqa: E402

TARGET_OVERHEAD = 1.25
ATTN_MLP = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def sequences(tokenizer, count: int, length: int) -> list[list[int]]:
    """``count`` sequences of ``length + 1`` real tokens (arithmetic sums written out)."""
    text = " ".join(f"{a} plus {b} is {a + b}." for a in range(10) for b in range(10))
    ids = tokenizer(text)["input_ids"]
    return [ids[i * 7 : i * 7 + length + 1] for i in range(count)]


def main() -> int:
    ap = parser(__doc__, "tiny Llama, 2 × 32 tokens, 3 steps")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per path (default 10)")
    ap.size("--sequences", 2, 8, "sequences per step")
    ap.size("--tokens", 32, 128, "tokens per sequence")
    ap.size("--kill-every", 3.0, 20.0, "with --kill: seconds between kills")
    ap.size("--min-kills", 2, 4, "with --kill: step on until this many kills")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2, help="torch threads of both paths")
    ap.add_argument("--gateways", type=int, default=1, help="gateway processes, round-robin")
    ap.add_argument(
        "--kill",
        nargs="?",
        const="gateway",
        choices=["gateway", "trainer", "kafka"],
        help="every --kill-every s: SIGKILL a gateway (the default) or the trainer worker and "
        "start it again, or kill Kafka for 3 s (mint dev's broker: do not run beside tests)",
    )
    args = ap.parse_args()
    if args.kill == "gateway" and args.gateways < 2:
        ap.error("--kill needs --gateways 2 or more: one instance must stay up while one restarts")
    steps = args.steps or ((24 if args.kill else 3) if args.smoke else 10)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from schemas.logs import configure_logging

    configure_logging("WARNING", "console")
    with trainer_run("tk", args.smoke, args.threads) as run:
        return measure(args, run, steps)


def measure(args, run, steps: int) -> int:
    """The SDK's steps beside the in-process trainer's, on ``run`` (the trainer worker up)."""
    import tinker
    import torch
    from tinker import types
    from transformers import AutoTokenizer

    from catalog.store import AdapterStore
    from schemas.events.steps import StepDatum
    from workers.trainer.config import TrainerConfig
    from workers.trainer.engine import MultiPolicyTrainer
    from workers.trainer.policies import LoraShape

    model, work = run.model, run.work
    trainer = pool = faults_thread = None
    try:
        if args.gateways > 1:
            pool = GatewayPool(run.settings, work / "logs", model, args.gateways)
            url = pool.url
        else:
            url = run.gateway()

        tokenizer = AutoTokenizer.from_pretrained(model)
        seqs = sequences(tokenizer, args.sequences, args.tokens)
        batch = [
            types.Datum(
                model_input=types.ModelInput.from_ints(s[:-1]),
                loss_fn_inputs={"target_tokens": s[1:], "weights": [1.0] * (len(s) - 1)},
            )
            for s in seqs
        ]
        datums = [
            StepDatum(tokens=s[:-1], target_tokens=s[1:], weights=[1.0] * (len(s) - 1))
            for s in seqs
        ]
        adam = types.AdamParams(learning_rate=1e-4)
        adam_fields = {"learning_rate": 1e-4, "beta1": adam.beta1, "beta2": adam.beta2}
        adam_fields |= {"eps": adam.eps, "weight_decay": 0.0, "grad_clip_norm": 0.0}

        service = tinker.ServiceClient(base_url=url, api_key=run.api_key)
        tc = service.create_lora_training_client(str(model), rank=args.rank, seed=0).result(
            timeout=900
        )

        torch.set_num_threads(args.threads)
        trainer = MultiPolicyTrainer(
            TrainerConfig(base_model=str(model), torch_threads=args.threads),
            AdapterStore(work / "inproc-store"),
        )
        shape = LoraShape(rank=args.rank, alpha=2.0 * args.rank, target_modules=ATTN_MLP)
        trainer.add_policy("bench/inproc", shape, seed=0)

        call_ms: dict[str, list[float]] = {"forward_backward": [], "optim_step": []}

        faults = {"lost": 0, "futures_404": 0}

        def sdk_step() -> tuple[float, float]:
            t0 = time.perf_counter()
            try:
                fb = tc.forward_backward(batch, "cross_entropy")
                opt = tc.optim_step(adam)
                out = fb.result(timeout=900)
                call_ms["forward_backward"].append((time.perf_counter() - t0) * 1000)
                opt.result(timeout=900)
                call_ms["optim_step"].append((time.perf_counter() - t0) * 1000)
            except tinker.NotFoundError as e:
                faults["futures_404"] += 1
                print(f"404: {e}", file=sys.stderr)
                return time.perf_counter() - t0, math.nan
            except Exception as e:  # never answered (the SDK gave up on it)
                faults["lost"] += 1
                print(f"lost: {type(e).__name__}: {e}", file=sys.stderr)
                return time.perf_counter() - t0, math.nan
            return time.perf_counter() - t0, out.metrics["loss:sum"]

        def inproc_step() -> tuple[float, float]:
            t0 = time.perf_counter()
            loss, _, _ = trainer.forward_datums("bench/inproc", datums, "cross_entropy", {}, True)
            trainer.optim_step("bench/inproc", adam_fields)
            return time.perf_counter() - t0, loss

        sdk_step(), inproc_step()  # warm both (the worker loads its base on the first call)
        if args.kill:
            harm = {
                "gateway": lambda: pool.kill_next,
                "trainer": lambda: kill_trainer(run.workers),
                "kafka": lambda: kill_kafka(run.base),  # (the dev broker: its state folder)
            }[args.kill]()
            faults_thread = Faults(harm, args.kill_every)
        for name in call_ms:
            call_ms[name].clear()
        sdk_s, inproc_s, sdk_loss, inproc_loss = [], [], [], []
        started = time.perf_counter()
        sdk_total = 0.0
        i = 0
        # With --kill: at least ``steps`` steps, and on until ``min_kills`` kills happened.
        while i < steps or (
            args.kill
            and faults_thread.count < args.min_kills
            and faults_thread.error is None
            and i < 50 * steps
        ):
            i += 1
            s, loss = sdk_step()
            sdk_s.append(s)
            sdk_total += s
            sdk_loss.append(loss)
            s, loss = inproc_step()
            inproc_s.append(s)
            inproc_loss.append(loss)
            print(
                f"step {i}/{steps}: sdk {sdk_s[-1]:.2f} s (loss {sdk_loss[-1]:.3f}), "
                f"in-process {inproc_s[-1]:.2f} s (loss {inproc_loss[-1]:.3f})",
                file=sys.stderr,
            )
        ratio = statistics.median(sdk_s) / statistics.median(inproc_s)
        # Same seed, same batches: a step applied twice (or lost) changes every loss after it.
        differ = sum(
            not math.isclose(a, b, rel_tol=1e-3) for a, b in zip(sdk_loss, inproc_loss, strict=True)
        )
        if args.kill:
            figures = {
                "lost": (faults["lost"], "<=", 0),
                "applied_twice": (differ, "<=", 0),
                "futures_404": (faults["futures_404"], "<=", 0),
            }
        else:
            figures = {"overhead_ratio": (ratio, "<=", TARGET_OVERHEAD)}
        out = {
            "benchmark": "tinker_api",
            "smoke": args.smoke,
            "model": run.model_name,
            "batch": {"sequences": args.sequences, "tokens": args.tokens, "rank": args.rank},
            "steps": len(sdk_s),
            "threads": args.threads,
            "overhead_ratio": round(ratio, 3),
            "step_s": {
                "sdk_median": round(statistics.median(sdk_s), 3),
                "inprocess_median": round(statistics.median(inproc_s), 3),
            },
            "calls_per_s": round(2 * steps / sdk_total, 3),
            "call_ms": {
                name: {"p50": round(pct(v, 0.5), 1), "p99": round(pct(v, 0.99), 1)}
                for name, v in call_ms.items()
            },
            "loss": {
                "sdk_first": round(sdk_loss[0], 4),
                "sdk_last": round(sdk_loss[-1], 4),
                "inprocess_first": round(inproc_loss[0], 4),
                "inprocess_last": round(inproc_loss[-1], 4),
            },
            "gateways": args.gateways,
            "killed": args.kill,
            "kills": faults_thread.count if faults_thread is not None else 0,
            "fault_error": faults_thread.error if faults_thread is not None else None,
            "kill_every_s": args.kill_every if args.kill else None,
            "lost": faults["lost"],
            "futures_404": faults["futures_404"],
            "applied_twice": differ,
            "requests_per_gateway": list(pool.balancer.counts.values()) if pool else None,
            "wall_s": round(time.perf_counter() - started, 1),
            **targets_and_met(**figures),
        }
        service.close("success").result(timeout=60)
        return emit(out)
    finally:
        if faults_thread is not None:
            faults_thread.close()
        if trainer is not None:
            trainer.close()
        if pool is not None:
            pool.close()


if __name__ == "__main__":
    raise SystemExit(main())
