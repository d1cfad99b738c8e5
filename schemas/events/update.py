"""Update: one training step (or a few) of LoRA on a policy, from rollouts or SFT data."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.envelope import Command, Payload
from schemas.names import MetricName, ModuleName, StoreUri


class LoraSpec(BaseModel):
    """LoRA shape for a policy's first revision (later revisions keep their parent's)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int = Field(8, ge=1, le=1024)
    alpha: float = Field(16.0, gt=0)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[ModuleName] = Field(default_factory=lambda: ["q_proj", "v_proj"])
    target_parameters: list[ModuleName] = Field(
        default_factory=list, description="MoE expert parameters (PEFT target_parameters)"
    )


class UpdateRequested(Command):
    """Command: train the policy's LoRA adapter for some steps on the given data."""

    event_type = "update.requested"
    topic = "update.requests"

    base_model: str = Field(min_length=1, max_length=512)
    parent_revision: int | None = Field(None, ge=1, description="None: start a fresh adapter")
    objective: Literal["sft", "rl"] = "sft"
    data_uri: StoreUri = Field(description="claim check: JSONL training examples or rollouts")
    steps: int = Field(1, ge=1, le=100_000)
    batch_size: int = Field(8, ge=1, le=65_536)
    learning_rate: float = Field(1e-4, gt=0, lt=1)
    lora: LoraSpec = Field(default_factory=LoraSpec)
    export: bool = Field(True, description="export a revision when done")
    seed: int | None = None


class UpdateCompleted(Payload):
    """A training update finished (an export.completed follows when exported)."""

    event_type = "update.completed"
    topic = "update.results"

    parent_revision: int | None = Field(None, ge=1)
    steps: int = Field(ge=0)
    loss: float | None = None
    metrics: dict[MetricName, float] = Field(default_factory=dict)
    duration_s: float = Field(ge=0.0)
    exported: bool = Field(description="an export.completed event follows")
