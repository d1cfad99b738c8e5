"""Rollout: sample completions from a policy revision (the data for the next update)."""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator

from schemas.envelope import Command, Payload
from schemas.names import AliasName, RewardName, StoreUri


class RolloutRequested(Command):
    """Command: sample completions from a revision (or the alias) of the policy."""

    event_type = "rollout.requested"
    topic = "rollout.requests"

    base_model: str = Field(min_length=1, max_length=512, description="base model id or path")
    revision: int | None = Field(None, ge=1, description="revision to sample; None: the alias")
    alias: AliasName = Field("prod", description="alias resolved when revision is None")
    prompts: list[str] = Field(default_factory=list, max_length=1024, description="inline prompts")
    prompts_uri: StoreUri | None = Field(None, description="claim check for large prompt sets")
    samples_per_prompt: int = Field(1, ge=1, le=256)
    max_tokens: int = Field(128, ge=1, le=32768)
    temperature: float = Field(1.0, ge=0.0, le=10.0)
    seed: int | None = None
    # Added (optional, backward compatible): a reward function from the rollout worker's registry,
    # an installed ``mint.rewards`` entry point, or an operator-allowed ``module:function``.
    reward: RewardName = Field(
        "length", description="reward by name, or module:function (workers.plugins)"
    )
    # Added (optional, backward compatible): instruct models answer a user turn, not raw text.
    chat: bool = Field(False, description="render prompts as one user turn of the chat template")

    @model_validator(mode="after")
    def _has_prompts(self) -> Self:
        if not self.prompts and self.prompts_uri is None:
            raise ValueError("give prompts (inline) or prompts_uri (claim check), not neither")
        return self


class RolloutCompleted(Payload):
    """Rollouts were written to the store (claim check) for the next update."""

    event_type = "rollout.completed"
    topic = "rollout.results"

    revision: int | None = Field(None, ge=1, description="revision sampled; None: base model")
    adapter_digest: str | None = Field(None, pattern=r"^sha256:[0-9a-f]{64}$")
    rollouts_uri: StoreUri = Field(description="claim check: JSONL of prompt/completion/reward")
    num_rollouts: int = Field(ge=0)
    mean_reward: float | None = None
    duration_s: float = Field(ge=0.0)
