"""Trainer configuration (pydantic, validated when built)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class LossConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # "importance_sampling": -ratio·A (ratio = π/π_rollout, unclipped); "ppo_clip": PPO's
    # clipped surrogate. Both use group-relative advantages (reward - group mean) / group std.
    rl_loss: Literal["importance_sampling", "ppo_clip"] = "ppo_clip"
    clip_eps: float = Field(0.2, gt=0, lt=1)
    normalize_std: bool = Field(True, description="divide advantages by the group's std")


class TrainerConfig(BaseModel):
    """One trainer process: one resident base model, many policies' adapters."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_model: str = Field(min_length=1, description="path of a transformers model folder")
    backend: Literal["torch", "deepspeed"] = "torch"
    dtype: Literal["float32", "bfloat16"] = "float32"
    max_policies: int = Field(64, ge=1, description="adapters held at once (LRU beyond)")
    # Step-level calls (steps.py): gradients waiting for an optim_step pin their policy.
    max_pinned_per_tenant: int = Field(
        4, ge=1, description="policies of one tenant with gradients waiting for an optim_step"
    )
    pinned_idle_s: float = Field(
        900.0, gt=0, description="waiting gradients without a call this long are dropped"
    )
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    grad_clip: float = Field(1.0, ge=0, description="max grad norm; 0 turns clipping off")
    max_seq_len: int = Field(512, ge=8)
    micro_batch_rows: int | None = Field(
        16,
        ge=1,
        description="rows per forward/backward; a step adds up their gradients. "
        "Bounds peak memory (a 128-row GRPO batch on SmolLM2-135M: see README). None: all",
    )
    torch_threads: int | None = Field(None, ge=1, description="torch.set_num_threads; None: keep")
    loss: LossConfig = Field(default_factory=LossConfig)
    deepspeed_port: int = Field(29511, ge=1024, le=65535, description="MASTER_PORT for gloo")
