"""Handoff latency: "optimizer step done" → "the engine serves the new weights", adapter-only
versus a merged full checkpoint, side by side on ONE vLLM engine (generation excluded).

Each iteration runs a real RL step: rollouts from vLLM with the current revision (n samples per
prompt, logprobs), one GRPO optimizer step in the trainer (workers.trainer), then both handoffs:

- adapter-only (MinT): export the LoRA revision to the store (digest, manifest), fetch it into
  the engine's disk cache, verify it, add it to vLLM under its digest-derived id;
- merged: merge the LoRA into the base weights, save the full checkpoint (safetensors), reload
  the engine's weights in place (vLLM's ``reload_weights(weights_path=…)``); afterwards the base
  weights are restored (untimed) so the next rollout runs on the real base.

Prints ONE JSON line: median handoff seconds of each path and their ratio (target >= 20; the
byte ratio is the limit; ``targets`` / ``met``), and the whole RL step's ratio (rollout +
update + handoff).

    python benchmarks/handoff_latency.py                 # the `small` (~0.5B) Llama, rank 8
    python benchmarks/handoff_latency.py --smoke         # the `test` Llama (what CI runs)
    python benchmarks/handoff_latency.py --pretrained smollm2-135m-instruct --rank 1
                                                         # the real model, its arithmetic task
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._harness import parser, targets_and_met  # noqa: E402

ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPTS = ["question: 1 plus 2", "hello world", "the model", "red green blue"]
TARGET_HANDOFF_RATIO = 20  # merged / adapter-only handoff seconds, at least


def dir_bytes(path: Path, pattern: str = "*.safetensors") -> int:
    return sum(p.stat().st_size for p in Path(path).glob(pattern))


def merged_checkpoint(trainer, out: Path) -> None:
    """Merge the active LoRA into the base, save the full weights, unmerge (trainer stays as is)."""
    from safetensors.torch import save_file

    def snapshot():
        trainer.model.merge_adapter()
        try:
            sd = {}
            for k, v in trainer.model.get_base_model().state_dict().items():
                if "lora_" in k:
                    continue
                sd[k.replace(".base_layer.", ".")] = v.detach().contiguous().clone()
            return sd
        finally:
            trainer.model.unmerge_adapter()

    save_file(trainer.on_compute(snapshot), str(out / "model.safetensors"))


def main() -> None:
    ap = parser(__doc__, "test-size model, 2 iterations")
    ap.size("--iterations", 2, 3, "RL steps, each timing both handoffs")
    ap.add_argument("--size", choices=["test", "small"], default=None)
    ap.add_argument("--model", type=Path, default=None, help="reuse a built model folder")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument(
        "--pretrained",
        choices=["smollm2-135m-instruct"],
        default=None,
        help="a real model (mint models fetch) and its task's chat prompts",
    )
    args = ap.parse_args()
    size = args.pretrained or args.size or ("test" if args.smoke else "small")
    iterations = args.iterations

    import os

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from catalog.models import Resolved
    from catalog.store import AdapterStore
    from schemas.logs import configure_logging
    from workers.models import TinySpec, build_tiny
    from workers.serving.engine import EngineConfig, GenRequest, VllmEngine
    from workers.serving.rewards import get_reward
    from workers.serving.working_set import WorkingSet
    from workers.trainer import LoraShape, MultiPolicyTrainer, Rollout, TrainerConfig

    configure_logging("WARNING", "console")
    work = Path(tempfile.mkdtemp(prefix="mint-handoff-"))
    try:
        prompts, chat, reward_name = PROMPTS, False, "distinct"
        if args.pretrained:
            from schemas.settings import get_settings
            from workers.models.pretrained import fetch
            from workers.serving.arithmetic import training_prompts

            model = fetch(args.pretrained, get_settings().models_dir)
            prompts, chat, reward_name = training_prompts(4, seed=0), True, "arith_shaped"
        else:
            model = args.model or build_tiny(TinySpec("llama", size), work / "model")
        dtype = "bfloat16" if size == "small" else "float32"
        store = AdapterStore(work / "store")
        trainer = MultiPolicyTrainer(
            TrainerConfig(base_model=str(model), dtype=dtype, max_seq_len=128), store
        )
        trainer.add_policy(
            "bench",
            LoraShape(rank=args.rank, alpha=2.0 * args.rank, target_modules=ALL_LINEAR),
            seed=0,
        )
        engine = VllmEngine(
            EngineConfig(
                model=str(model),
                max_loras=2,
                max_cpu_loras=4,
                max_lora_rank=max(8, args.rank),
                max_model_len=128,
                max_num_seqs=16,
                dtype=dtype,
            )
        )
        ws = WorkingSet(
            engine,
            store,
            work / "cache",
            base_model_fingerprint=trainer.fingerprint,
            max_loras=2,
            max_cpu_loras=4,
            max_disk_loras=8,
            max_lora_rank=max(8, args.rank),
        )
        merged_dir = work / "merged"
        merged_dir.mkdir()
        for name in ("config.json", "generation_config.json"):
            if (Path(model) / name).exists():
                shutil.copy(Path(model) / name, merged_dir / name)
        reward = get_reward(reward_name)

        def adapter_handoff(rev: int):
            t0 = time.perf_counter()
            stored = trainer.export("bench", "bench", "policy")
            handle = ws.ensure(Resolved("bench", "policy", rev, stored.digest, stored.uri))
            return time.perf_counter() - t0, handle, stored

        _, handle, stored = adapter_handoff(1)  # the initial revision the first rollout uses
        rows, same = [], []
        try:
            for it in range(iterations):
                t0 = time.perf_counter()
                outs = engine.generate(
                    [
                        GenRequest(p, 16, 1.0, seed=it, n=4, logprobs=True, lora=handle, chat=chat)
                        for p in prompts
                    ]
                )
                rollout_s = time.perf_counter() - t0
                batch = [
                    Rollout(
                        prompt_ids=o.prompt_token_ids,
                        completion_ids=s.token_ids,
                        logprobs=s.logprobs,
                        reward=reward(q, s.text, s.token_ids),
                        group=g,
                    )
                    for g, (q, o) in enumerate(zip(prompts, outs, strict=True))
                    for s in o.samples
                    if s.token_ids
                ]
                t0 = time.perf_counter()
                trainer.rl_step("bench", trainer.collate(batch, add_eos=False), lr=1e-4)
                update_s = time.perf_counter() - t0
                # --- optimizer step done: the two handoffs, measured back to back.
                adapter_s, handle, stored = adapter_handoff(it + 2)
                t0 = time.perf_counter()
                merged_checkpoint(trainer, merged_dir)
                save_s = time.perf_counter() - t0
                engine.reload_weights(merged_dir)
                merged_s = time.perf_counter() - t0
                # The merged path must really serve the new weights: base output now equals the
                # adapter's output (greedy; checked, not timed).
                probe = [GenRequest(p, 8, 0.0, chat=chat) for p in prompts]
                merged_tokens = [o.samples[0].token_ids for o in engine.generate(probe)]
                engine.reload_weights(model)  # restore the base (untimed)
                lora_probe = [GenRequest(p, 8, 0.0, lora=handle, chat=chat) for p in prompts]
                adapter_tokens = [o.samples[0].token_ids for o in engine.generate(lora_probe)]
                same.append(
                    sum(a == b for a, b in zip(adapter_tokens, merged_tokens, strict=True))
                    / len(prompts)
                )
                rows.append(
                    dict(
                        rollout_s=rollout_s,
                        update_s=update_s,
                        adapter_s=adapter_s,
                        merged_s=merged_s,
                        merged_save_s=save_s,
                        merged_reload_s=merged_s - save_s,
                    )
                )
        finally:
            engine.close()
            trainer.close()

        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        adapter_bytes = dir_bytes(stored.path)
        ckpt_bytes = dir_bytes(merged_dir)
        step_adapter = med["rollout_s"] + med["update_s"] + med["adapter_s"]
        step_merged = med["rollout_s"] + med["update_s"] + med["merged_s"]
        ratio = med["merged_s"] / med["adapter_s"]
        print(
            json.dumps(
                {
                    "benchmark": "handoff_latency",
                    "smoke": args.smoke,
                    "size": size,
                    "dtype": dtype,
                    "model": args.pretrained or f"tiny-llama-{size}",
                    "rank": args.rank,
                    "iterations": iterations,
                    "adapter_bytes": adapter_bytes,
                    "checkpoint_bytes": ckpt_bytes,
                    "byte_ratio": round(ckpt_bytes / adapter_bytes, 1),
                    "adapter_handoff_s": round(med["adapter_s"], 4),
                    "merged_handoff_s": round(med["merged_s"], 4),
                    "merged_save_s": round(med["merged_save_s"], 4),
                    "merged_reload_s": round(med["merged_reload_s"], 4),
                    "handoff_ratio": round(ratio, 2),
                    "rollout_s": round(med["rollout_s"], 4),
                    "update_s": round(med["update_s"], 4),
                    "rl_step_adapter_s": round(step_adapter, 4),
                    "rl_step_merged_s": round(step_merged, 4),
                    "rl_step_ratio": round(step_merged / step_adapter, 3),
                    "merged_matches_adapter_share": round(statistics.mean(same), 3),
                    **targets_and_met(handoff_ratio=(ratio, ">=", TARGET_HANDOFF_RATIO)),
                }
            )
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
