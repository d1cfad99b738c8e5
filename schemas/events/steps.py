"""Step-level training: the Tinker API's calls, one command each on one policy, one answer each.

The gateway's Tinker API turns each training call into a ``train.step.requested`` command on
``train.steps`` (keyed by policy, so one policy's calls arrive in order). The trainer runs them
over its resident base and answers ``train.step.completed`` or ``train.step.failed`` on
``train.step.results``, carrying the call's ``request_id`` (the future the API handed out).
Gradients of ``forward_backward`` calls accumulate on the policy until its ``optim_step``.

Datums follow Tinker: ``tokens`` is the model input, ``target_tokens[i]`` the token scored after
``tokens[: i + 1]``; ``weights`` (cross_entropy), ``logprobs`` (the sampler's) and
``advantages`` (importance_sampling, ppo, cispo, dro, gspo) and ``sequence_ratio_mask`` (gspo,
optional) are per position. Losses are sums over positions, as Tinker's built-in losses are.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, model_validator

from schemas.envelope import Command, Payload
from schemas.events.update import LoraSpec
from schemas.names import MetricName, StoreUri

StepOp = Literal[
    "create",  # a fresh LoRA adapter and optimizer for the policy (lora, seed)
    "forward",  # per-datum logprobs and loss, no gradients
    "forward_backward",  # the same, gradients added to the policy's accumulated ones
    "optim_step",  # one optimizer step with the accumulated gradients, then zero them
    "save_for_sampler",  # export a revision (store + export.completed): servable by the engines
    "save_state",  # adapter and optimizer state to the store, under ``name``
    "load_state",  # adapter (and optimizer, if saved) from ``source_uri``
]
LossFn = Literal["cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo"]
LOSS_INPUTS: dict[str, tuple[str, ...]] = {
    "cross_entropy": ("weights",),
    "importance_sampling": ("logprobs", "advantages"),
    "ppo": ("logprobs", "advantages"),
    "cispo": ("logprobs", "advantages"),
    "dro": ("logprobs", "advantages"),
    "gspo": ("logprobs", "advantages"),  # and sequence_ratio_mask, optional (all positions)
}
# Each loss's loss_fn_config keys and defaults (Thinking Machines' loss docs,
# tinker-docs.thinkingmachines.ai/tinker/losses and tinker-cookbook docs/losses.mdx).
# ppo's thresholds are the docs' 0.8/1.2 (clip 0.2); cispo and gspo clip the same ratio with the
# same two keys, and their pages give no other defaults. dro's beta has no documented default:
# 0.05 is the docs' own example value.
CLIP_DEFAULTS = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
LOSS_CONFIG: dict[str, dict[str, float]] = {
    "cross_entropy": {},
    "importance_sampling": {},
    "ppo": CLIP_DEFAULTS,
    "cispo": CLIP_DEFAULTS,
    "dro": {"beta": 0.05},
    "gspo": CLIP_DEFAULTS,
}


def loss_config(loss_fn: str, given: dict[str, float]) -> dict[str, float]:
    """``loss_fn``'s config: its defaults overridden by ``given``. A ValueError naming the key
    (and the keys the loss takes) for anything it cannot use, and for a loss that is not one of
    these."""
    if loss_fn not in LOSS_CONFIG:
        raise ValueError(
            f"loss_fn={loss_fn!r} is not a built-in loss; use one of {sorted(LOSS_CONFIG)}"
        )
    defaults = LOSS_CONFIG[loss_fn]
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ValueError(
            f"loss_fn_config has {unknown}, which loss_fn {loss_fn!r} does not take; it takes "
            f"{sorted(defaults) or 'nothing'}"
        )
    config = {**defaults, **{k: float(v) for k, v in given.items()}}
    bad = [k for k, v in config.items() if not math.isfinite(v)]
    if bad:
        raise ValueError(f"loss_fn_config.{bad[0]} is {config[bad[0]]}: it must be a finite number")
    if "clip_low_threshold" in config:
        low, high = config["clip_low_threshold"], config["clip_high_threshold"]
        if not 0 <= low <= 1 <= high:
            key = "clip_low_threshold" if not 0 <= low <= 1 else "clip_high_threshold"
            raise ValueError(
                f"loss_fn_config.{key}: {loss_fn} needs 0 <= clip_low_threshold <= 1 <= "
                f"clip_high_threshold (the ratio's range around 1), got {low} and {high}"
            )
    if config.get("beta", 0.0) < 0:
        raise ValueError(
            f"loss_fn_config.beta is {config['beta']}: dro's quadratic penalty needs beta >= 0"
        )
    return config


# Bounds of one call (a request that needs more splits its batch): a record stays well under
# Kafka's 1 MB default message size (about 40 bytes per position in the worst case).
MAX_STEP_TOKENS = 16_384
MAX_STEP_DATUMS = 1_024
MAX_SEQUENCE_TOKENS = 8_192
CHECKPOINT_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


class StepDatum(BaseModel):
    """One sequence of a training call (Tinker's ``Datum``, flattened to token lists)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tokens: list[int] = Field(min_length=1, max_length=MAX_SEQUENCE_TOKENS)
    target_tokens: list[int] = Field(min_length=1, max_length=MAX_SEQUENCE_TOKENS)
    # Finite only: JSON has no NaN (pydantic writes it as null, which no reader decodes back).
    weights: list[FiniteFloat] | None = None
    logprobs: list[FiniteFloat] | None = None
    advantages: list[FiniteFloat] | None = None
    sequence_ratio_mask: list[FiniteFloat] | None = None  # gspo: the positions of its ratio

    @model_validator(mode="after")
    def _same_lengths(self) -> StepDatum:
        n = len(self.tokens)
        for name in ("target_tokens", "weights", "logprobs", "advantages", "sequence_ratio_mask"):
            values = getattr(self, name)
            if values is not None and len(values) != n:
                raise ValueError(
                    f"{name} has {len(values)} positions, tokens has {n}: "
                    "every loss input is per position of the model input"
                )
        if min(self.tokens + self.target_tokens) < 0:
            raise ValueError("token ids are >= 0")
        return self


class AdamSpec(BaseModel):
    """Tinker's ``AdamParams``: the optimizer step's hyperparameters."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    learning_rate: float = Field(1e-4, gt=0, le=1)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    eps: float = Field(1e-12, gt=0, le=1)
    weight_decay: float = Field(0.0, ge=0, le=10)
    grad_clip_norm: float = Field(0.0, ge=0, description="0: no clipping")


class TrainStepRequested(Command):
    """Command: one Tinker training call on the envelope's policy."""

    event_type = "train.step.requested"
    topic = "train.steps"

    request_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
    op: StepOp
    base_model: str = Field(min_length=1, max_length=512)
    lora: LoraSpec | None = Field(None, description="create: the adapter's shape")
    seed: int | None = None
    datums: list[StepDatum] = Field(default_factory=list, max_length=MAX_STEP_DATUMS)
    loss_fn: LossFn = "cross_entropy"
    loss_fn_config: dict[MetricName, FiniteFloat] = Field(default_factory=dict, max_length=16)
    adam: AdamSpec | None = Field(None, description="optim_step: its hyperparameters")
    name: str | None = Field(None, pattern=CHECKPOINT_NAME_RE, description="save_*: its name")
    source_uri: StoreUri | None = Field(None, description="load_state: a saved state")

    @model_validator(mode="after")
    def _fits_its_op(self) -> TrainStepRequested:
        if self.op in ("forward", "forward_backward"):
            if not self.datums:
                raise ValueError(f"{self.op} needs at least one datum")
            tokens = sum(len(d.tokens) for d in self.datums)
            if tokens > MAX_STEP_TOKENS:
                raise ValueError(
                    f"{self.op} carries {tokens} tokens; one call carries at most "
                    f"{MAX_STEP_TOKENS}: split the batch over several calls"
                )
            for i, d in enumerate(self.datums):
                missing = [k for k in LOSS_INPUTS[self.loss_fn] if getattr(d, k) is None]
                if missing:
                    raise ValueError(
                        f"datums[{i}] lacks {', '.join(missing)}, which loss_fn "
                        f"{self.loss_fn!r} needs"
                    )
        elif self.datums:
            raise ValueError(f"{self.op} takes no datums")
        if self.op == "optim_step" and self.adam is None:
            raise ValueError("optim_step needs adam (AdamParams)")
        if self.op in ("save_for_sampler", "save_state") and self.name is None:
            raise ValueError(f"{self.op} needs a name")
        if self.op == "load_state" and self.source_uri is None:
            raise ValueError("load_state needs source_uri")
        return self


class TrainStepCompleted(Payload):
    """A training call ran: its outputs (what the Tinker future resolves to)."""

    event_type = "train.step.completed"
    topic = "train.step.results"

    request_id: str = Field(max_length=128)
    op: StepOp
    # Finite only (the trainer answers failed instead): a NaN would be written as null.
    loss: FiniteFloat | None = None
    logprobs: list[list[FiniteFloat]] = Field(
        default_factory=list, description="forward(_backward): per datum, per position"
    )
    metrics: dict[MetricName, FiniteFloat] = Field(default_factory=dict)
    revision: int | None = Field(None, ge=1, description="save_for_sampler: the new revision")
    state_uri: StoreUri | None = Field(None, description="save_state: where it lies")
    duration_s: float = Field(0.0, ge=0.0)


class TrainStepFailed(Payload):
    """A training call was refused or failed: the reason is the caller's error message."""

    event_type = "train.step.failed"
    topic = "train.step.results"

    request_id: str = Field(max_length=128)
    op: StepOp
    stage: Literal["validate", "policy", "compute", "store"] = "compute"
    reason: str = Field(max_length=2_000)
    retryable: bool = False
