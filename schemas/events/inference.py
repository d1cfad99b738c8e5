"""Inference: downstream requests against ``tenant/policy@alias`` and their results."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.envelope import Command, Payload
from schemas.names import AliasName, Digest

REQUEST_ID_RE = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"


class InferRequested(Command):
    """Command: answer a prompt with tenant/policy@alias (or a pinned revision)."""

    event_type = "infer.requested"
    topic = "infer.requests"

    request_id: str = Field(pattern=REQUEST_ID_RE, description="caller's id, echoed back")
    alias: AliasName = "prod"
    revision: int | None = Field(None, ge=1, description="pin a revision instead of the alias")
    prompt: str = Field(min_length=1, max_length=200_000)
    max_tokens: int = Field(64, ge=1, le=32768)
    temperature: float = Field(0.0, ge=0.0, le=10.0)
    seed: int | None = None
    # Added (optional, backward compatible): instruct models answer a user turn, not raw text.
    chat: bool = Field(False, description="render prompt as one user turn of the chat template")


class InferCompleted(Payload):
    """The downstream result of an inference request."""

    event_type = "infer.completed"
    topic = "infer.results"

    request_id: str = Field(pattern=REQUEST_ID_RE)
    revision: int = Field(ge=1, description="the revision that answered")
    adapter_digest: Digest
    engine_id: str = Field(max_length=128)
    text: str
    finish_reason: Literal["stop", "length", "error"]
    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    latency_ms: float = Field(ge=0.0)
    cold_load: bool = Field(False, description="the adapter was cold-loaded for this request")
    # Added (optional, backward compatible): what a caller needs to audit and profile a result.
    alias: str | None = Field(None, max_length=32, description="alias resolved, if one was")
    token_ids: list[int] = Field(default_factory=list, description="completion token ids")
    queued_ms: float = Field(0.0, ge=0.0, description="waiting for an engine slot")
    loading_ms: float = Field(0.0, ge=0.0, description="waiting for the adapter's cold load")
    generating_ms: float = Field(0.0, ge=0.0, description="inside the engine's generate")


class InferFailed(Payload):
    """The error result of an inference request: every request gets a result, never silence."""

    event_type = "infer.failed"
    topic = "infer.results"

    request_id: str = Field(pattern=REQUEST_ID_RE)
    ref: str = Field(max_length=512, description="what was asked, e.g. acme/math@prod")
    stage: Literal["resolve", "load", "generate"] = Field(description="where it failed")
    error: str = Field(max_length=4096, description="what failed and what to do")
    revision: int | None = Field(None, ge=1, description="None: the reference did not resolve")
    adapter_digest: str | None = Field(None, pattern=r"^sha256:[0-9a-f]{64}$")
    engine_id: str = Field(max_length=128)
    retryable: bool = False
    latency_ms: float = Field(0.0, ge=0.0)
