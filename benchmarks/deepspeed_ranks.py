"""DeepSpeed ZeRO-2 on N data-parallel ranks versus one rank: optimizer memory and equality.

Runs the same training twice, each in its own child process: one rank (the plain one-process
DeepSpeed trainer, what ``--ranks 1`` runs) and N ranks (``workers.trainer.ranks.start``: rank 0
here, ranks 1..N-1 started by it, gloo on CPU). Both build one policy (LoRA r=8 on q/k/v/o,
seed 0) and take the same steps on the same data: SFT steps, then GRPO (PPO-clip) steps on
rollouts in groups of 4. Prints ONE JSON line with the bytes of optimizer state each rank holds
(its ZeRO-2 partition of the fp32 master weights and AdamW's two moments) against the one-rank
total — target 1/N each — the largest difference of any adapter weight between the two runs
(target <= 1e-5) and the median step seconds of both.

    python benchmarks/deepspeed_ranks.py                  # tiny Llama, 2 ranks, 6+6 steps
    python benchmarks/deepspeed_ranks.py --ranks 4 --size small --rows 32
    python benchmarks/deepspeed_ranks.py --smoke          # what the test suite runs
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._harness import parser  # noqa: E402

POLICY = "bench/ranks"
WEIGHT_TOLERANCE = 1e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(args: argparse.Namespace) -> dict:
    """Train on ``args.child`` ranks (this process is rank 0); write the adapter to ``args.out``."""
    from workers.trainer import LoraShape, MultiPolicyTrainer, Rollout, SftExample, TrainerConfig
    from workers.trainer.ranks import start

    config = TrainerConfig(
        base_model=args.model,
        backend="deepspeed",
        deepspeed_port=_free_port(),
        torch_threads=args.threads,
    )
    ranks = args.child
    trainer = MultiPolicyTrainer(config) if ranks == 1 else start(config, ranks)
    try:
        lora = LoraShape(rank=8, alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        trainer.add_policy(POLICY, lora, seed=0)
        order = list(range(args.rows))[:: -1 if args.reverse else 1]  # the same rows, reordered
        sft = trainer.collate(
            [
                SftExample(prompt=f"question: {i} plus {i} equals? answer:", completion=f" {2 * i}")
                for i in order
            ]
        )
        rl = trainer.collate(
            [
                Rollout(
                    prompt=f"count to {i // 4}:",
                    completion=" 1 2 3"[: 2 + 2 * (i % 4)],
                    reward=float(i % 4 == i // 4 % 4),
                    group=i // 4,
                )
                for i in order
            ],
            add_eos=False,
        )
        losses, seconds = [], []
        plan = [(sft, trainer.sft_step)] * args.steps + [(rl, trainer.rl_step)] * args.steps
        for batch, step in plan:
            result = step(POLICY, batch, lr=args.lr)
            losses.append(result.loss)
            seconds.append(result.seconds)
        if ranks == 1:
            held = [trainer.policy(POLICY).backend.partition_bytes()]
        else:
            held = trainer.optimizer_bytes(POLICY)
        trainer.write_adapter(POLICY, Path(args.out))
        return {
            "ranks": ranks,
            "optimizer_bytes": held,
            "losses": losses,
            "step_s_median": statistics.median(seconds[1:] or seconds),
            "torch_threads": trainer.config.torch_threads,
        }
    finally:
        trainer.close()


def _run_children(args: argparse.Namespace, runs: list[tuple[int, Path, bool]]) -> list[dict]:
    """Each (ranks, out, reversed rows) run in its own child: one after the other, or side by
    side with --smoke (whose step seconds then share the cores and say little)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MINT_LOG_LEVEL": "WARNING"}
    # Rank 0 starts its followers itself, on a port of its own: nothing of a process group
    # this process (a test session) may have joined may leak into the children.
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)

    def launch(ranks: int, out: Path, reverse: bool) -> subprocess.Popen:
        cmd = [
            sys.executable,
            __file__,
            "--child",
            str(ranks),
            "--out",
            str(out),
            "--model",
            args.model,
            "--rows",
            str(args.rows),
            "--steps",
            str(args.steps),
            "--lr",
            repr(args.lr),
        ] + (["--reverse"] if reverse else [])
        if args.threads is not None:
            cmd += ["--threads", str(args.threads)]
        return subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
        )

    if args.smoke:
        procs = [(ranks, launch(ranks, out, rev)) for ranks, out, rev in runs]
        finished = [(ranks, proc, *proc.communicate()) for ranks, proc in procs]
    else:
        finished = []
        for ranks, out, rev in runs:
            proc = launch(ranks, out, rev)
            finished.append((ranks, proc, *proc.communicate()))
    results = []
    for ranks, proc, stdout, stderr in finished:
        if proc.returncode != 0:
            raise SystemExit(f"{ranks}-rank run failed:\n{stderr[-4000:]}")
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    return results


def main() -> None:
    ap = parser(__doc__, "tiny and short (the test suite)")
    ap.add_argument("--ranks", type=int, default=2, help="data-parallel ranks to compare with 1")
    ap.add_argument("--model", help="base model folder (default: build a tiny Llama)")
    ap.add_argument("--size", choices=["test", "small"], default="test")
    ap.add_argument("--rows", type=int, default=16, help="rows per batch (GRPO: groups of 4)")
    ap.add_argument("--steps", type=int, default=6, help="SFT steps, then as many GRPO steps")
    ap.add_argument("--lr", type=float, default=1e-2, help="learning rate (AdamW)")
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads per rank (default: all cores / ranks)",
    )
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--reverse", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        with contextlib.redirect_stdout(sys.stderr):
            result = _child(args)
        print(json.dumps(result))
        return
    if args.smoke:
        args.size, args.rows, args.steps = "test", 8, 2
    with tempfile.TemporaryDirectory(prefix="mint-bench-") as tmp:
        built = args.model is None
        if built:
            # Importing transformers' integrations may print to stdout (DeepSpeed's banner).
            with contextlib.redirect_stdout(sys.stderr):
                from workers.models import TinySpec, build_tiny

                args.model = str(build_tiny(TinySpec("llama", args.size), Path(tmp) / "base"))
        runs = [(1, Path(tmp) / "one", False), (args.ranks, Path(tmp) / "many", False)]
        if not args.smoke:  # the noise floor: one rank again, the same rows in reverse order
            runs.append((1, Path(tmp) / "reordered", True))
        one, many, *_ = _run_children(args, runs)
        from safetensors.torch import load_file

        def adapter(name: str) -> dict:
            return load_file(str(Path(tmp) / name / "adapter_model.safetensors"))

        def max_diff(a: dict, b: dict) -> float:
            assert a.keys() == b.keys(), (sorted(a), sorted(b))
            return max(float((a[k] - b[k]).abs().max()) for k in a)

        a = adapter("one")
        diff = max_diff(a, adapter("many"))
        floor = None if args.smoke else max_diff(a, adapter("reordered"))
        moved = max(float(a[k].abs().max()) for k in a if "lora_B" in k)  # B starts at zero
    losses = one["losses"], many["losses"]
    total = one["optimizer_bytes"][0]
    ratios = [held / total for held in many["optimizer_bytes"]]
    target = 1 / args.ranks
    met_memory = all(abs(r - target) <= 0.1 * target for r in ratios)
    print(
        json.dumps(
            {
                "benchmark": "deepspeed_ranks",
                "smoke": args.smoke,
                "ranks": args.ranks,
                "model": f"random-weight llama ({args.size})" if built else args.model,
                "training": f"LoRA r=8 q/k/v/o; {args.steps} SFT + {args.steps} GRPO ppo_clip steps, "
                f"{args.rows} rows (GRPO groups of 4), lr {args.lr:g}, fp32, ZeRO-2, gloo",
                "optimizer_bytes_one_rank": total,
                "optimizer_bytes_per_rank": many["optimizer_bytes"],
                "ratio_per_rank": [round(r, 4) for r in ratios],
                "target_ratio": round(target, 4),
                "max_weight_diff": diff,
                "weight_tolerance": WEIGHT_TOLERANCE,
                # One rank against itself with the rows reordered: what fp32 summation order alone
                # makes of the same steps (AdamW divides by sqrt(v), so tiny gradients amplify it).
                "max_weight_diff_one_rank_reordered": floor,
                "max_lora_b": moved,
                "max_loss_diff": max(abs(x - y) for x, y in zip(*losses, strict=True)),
                "first_loss": one["losses"][0],
                "last_sft_loss": one["losses"][args.steps - 1],
                "step_s_median_one_rank": round(one["step_s_median"], 4),
                "step_s_median_n_ranks": round(many["step_s_median"], 4),
                "torch_threads_per_rank": {"one": one["torch_threads"], "n": many["torch_threads"]},
                "cpu_cores": os.cpu_count(),
                "met": met_memory and diff <= WEIGHT_TOLERANCE,
            }
        )
    )


if __name__ == "__main__":
    main()
