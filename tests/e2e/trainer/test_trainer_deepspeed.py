"""The DeepSpeed ZeRO-2 backend (CPU accelerator, gloo, torch AdamW) follows the torch backend.

Stated tolerance: with a fixed seed, every step's loss of both policies agrees within 1e-4
absolute (fp32; the optimizers are the same AdamW, only the reduction path differs).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.trainer import LoraShape, MultiPolicyTrainer, Rollout, SftExample, TrainerConfig

TOLERANCE = 1e-4
EXAMPLES = [
    SftExample(prompt=f"question: {i} plus {i} equals? answer:", completion=f" {2 * i}")
    for i in range(8)
]


def trajectory(base: Path, backend: str) -> list[float]:
    trainer = MultiPolicyTrainer(TrainerConfig(base_model=str(base), backend=backend))
    trainer.add_policy("acme/a", LoraShape(rank=8, alpha=16), seed=0)
    trainer.add_policy(
        "acme/b", LoraShape(rank=4, alpha=8, target_modules=["q_proj", "o_proj"]), seed=1
    )
    batch = trainer.collate(EXAMPLES)
    losses = []
    for _ in range(8):
        losses.append(trainer.sft_step("acme/a", batch, lr=1e-2).loss)
        losses.append(trainer.sft_step("acme/b", batch, lr=1e-2).loss)
    rollouts = [
        Rollout(prompt=e.prompt, completion=e.completion, reward=float(i % 3), group=i // 4)
        for i, e in enumerate(EXAMPLES)
    ]
    rl = trainer.collate(rollouts, add_eos=False)
    for _ in range(2):
        losses.append(trainer.rl_step("acme/a", rl, lr=1e-2).loss)
    return losses


def test_deepspeed_zero2_matches_torch_loss_trajectory(tiny_llama: Path) -> None:
    torch_losses = trajectory(tiny_llama, "torch")
    ds_losses = trajectory(tiny_llama, "deepspeed")
    assert torch_losses[-4] < torch_losses[0]  # it trained at all
    assert ds_losses == pytest.approx(torch_losses, abs=TOLERANCE)
