"""JSON bodies of the Tinker API calls (SDK 0.38.0's request types, read leniently: a field the
SDK adds later is ignored, a field this API needs is checked and named when wrong)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from schemas.events.steps import CHECKPOINT_NAME_RE

SESSION_RE = r"^tk[0-9a-f]{8,32}$"
MODEL_ID = re.compile(r"^(?P<session>tk[0-9a-f]{8,32}):train:(?P<seq>\d{1,9})$")
MAX_LORA_RANK = 64  # the API's bound (LoraSpec allows more; a Tinker run never needs it)


class Body(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class ClientConfigRequest(Body):
    sdk_version: str = ""


class CreateSessionRequest(Body):
    tags: list[str] = Field(default_factory=list, max_length=64)
    user_metadata: dict[str, Any] | None = None
    sdk_version: str = ""


class SessionHeartbeatRequest(Body):
    session_id: str = Field(max_length=128)


class LoraConfig(Body):
    rank: int = Field(ge=1, le=MAX_LORA_RANK)
    seed: int | None = None
    train_unembed: bool = True
    train_mlp: bool = True
    train_attn: bool = True


class OptimizerConfig(Body):
    type: str = "adamw"


class CreateModelRequest(Body):
    session_id: str = Field(pattern=SESSION_RE)
    model_seq_id: int = Field(ge=0, le=999_999_999)
    base_model: str = Field(min_length=1, max_length=512)
    lora_config: LoraConfig | None = None
    optimizer_config: OptimizerConfig = OptimizerConfig()


class ModelRequest(Body):
    model_id: str = Field(max_length=128)
    seq_id: int | None = None


class AdamParams(Body):
    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


class OptimStepRequest(ModelRequest):
    adam_params: AdamParams | None = None
    optimizer_params: dict[str, Any] | None = None


class SaveWeightsForSamplerRequest(ModelRequest):
    path: str | None = Field(None, pattern=CHECKPOINT_NAME_RE)
    sampling_session_seq_id: int | None = None


class SaveWeightsRequest(ModelRequest):
    path: str | None = Field(None, pattern=CHECKPOINT_NAME_RE)


class LoadWeightsRequest(ModelRequest):
    model_id: str | None = Field(None, max_length=128)  # type: ignore[assignment]
    session_id: str | None = None
    path: str = Field(max_length=600)
    optimizer: bool = False


class CreateSamplingSessionRequest(Body):
    session_id: str = Field(max_length=128)
    sampling_session_seq_id: int = 0
    base_model: str | None = None
    model_path: str | None = Field(None, max_length=600)


class JoinSamplingSessionRequest(Body):
    sampling_session_id: str = Field(max_length=300)


class Chunk(Body):
    type: str = "encoded_text"
    tokens: list[int] | None = None


class ModelInput(Body):
    chunks: list[Chunk] = Field(min_length=1, max_length=1024)


class SamplingParams(Body):
    max_tokens: int | None = Field(None, ge=1, le=32768)
    seed: int | None = None
    stop: str | list[str] | list[int] | None = None
    temperature: float = Field(1.0, ge=0.0, le=10.0)
    top_k: int = -1
    top_p: float = Field(1.0, gt=0.0, le=1.0)


class SampleRequest(Body):
    num_samples: int = Field(1, ge=1, le=64)
    prompt: ModelInput
    sampling_params: SamplingParams
    sampling_session_id: str | None = Field(None, max_length=300)
    model_path: str | None = Field(None, max_length=600)
    base_model: str | None = None
    seq_id: int | None = None
    prompt_logprobs: bool | None = None
    topk_prompt_logprobs: int = 0
    topk_sample_logprobs: int = 0
    prompt_alt_tokens_k: int = 0
    prompt_logprobs_last_n: int | None = None
    target_prompt_logprobs: dict[str, Any] | None = None  # (a TensorData: refused, named)


class FutureRetrieveRequest(Body):
    request_id: str = Field(max_length=200)
    allow_metadata_only: bool = False
