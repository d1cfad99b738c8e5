"""What the HTTP transport (mint.sdk.remote) answers with: the gateway's JSON read into pydantic
models, one per answer. Their fields are the event payloads' names, and ``payload`` is the model
itself, so ``answer.payload.to_revision`` reads the same whichever transport answered."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Answer(BaseModel):
    # The gateway may add fields (a newer server): reading them must not fail an older SDK.
    model_config = ConfigDict(frozen=True, extra="ignore")

    @property
    def payload(self) -> Any:  # reads like the direct transport's Envelope
        return self


class PolicyInfo(Answer):
    policy: str
    base_model: str
    created_at: datetime | None = None
    retired_at: datetime | None = None


class RevisionInfo(Answer):
    revision: int
    digest: str
    parent_revision: int | None = None
    base_model: str
    created_at: datetime | None = None
    created_by: str = ""
    training: dict[str, float] = Field(default_factory=dict)
    tags: list[str] = Field(default_factory=list)
    evaluations: list[dict[str, Any]] = Field(default_factory=list)


class AliasInfo(Answer):
    alias: str
    revision: int | None = None
    seq: int = 0
    moved_at: datetime | None = None


class Moved(Answer):
    """An alias move the controller carried out (its ``alias.moved``)."""

    policy: str
    alias: str
    from_revision: int | None = None
    to_revision: int
    cause: str
    event_id: str


class CanaryInfo(Answer):
    """A canary the controller started (``canary.started``: revision, incumbent and share) or
    ended (``canary.ended``: outcome ``promoted`` or ``rolled_back``, and why)."""

    policy: str
    alias: str
    canary_id: str
    event_id: str
    revision: int | None = None
    incumbent_revision: int | None = None
    share: float | None = None
    outcome: str | None = None
    reason: str = ""


class Tagged(Answer):
    """The controller's ``revision.tagged``: the revision's whole set of tags now."""

    policy: str
    revision: int
    tags: list[str]
    event_id: str


class Retirement(Answer):
    """The controller's ``policy.retired``: the policy is retired now (``retired``) or restored."""

    policy: str
    retired: bool
    reason: str = ""
    event_id: str


def controller_answer(d: dict[str, Any]) -> Moved | CanaryInfo | Tagged | Retirement:
    """The gateway's body for a serving command (gateway/lifecycle_bodies.py answer_body): which
    fact it is shows in its keys."""
    if "tags" in d:
        return Tagged.model_validate(d)
    if "retired" in d:
        return Retirement.model_validate(d)
    if "canary_id" in d:  # a canary started, or ended by a rollback
        return CanaryInfo.model_validate(d)
    return Moved.model_validate(d)


class Completion(Answer):
    """One answer of ``infer``: the text and the revision that wrote it; with ``logprobs`` or
    ``top_logprobs`` each sampled token (``tokens``), its log-probability (``logprobs``) and its
    alternatives (``top_logprobs``: token -> logprob); ``raw`` is the gateway's whole answer
    (vLLM's extra fields such as ``prompt_logprobs`` included)."""

    text: str
    revision: int | None
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    engine_ms: float | None
    stop_reason: str | int | None = None
    tokens: list[str] | None = None
    logprobs: list[float | None] | None = None
    top_logprobs: list[dict[str, float]] | None = None
    raw: dict[str, Any] | None = Field(default=None, repr=False)

    @property
    def id(self) -> str | None:
        """The response id (``cmpl-…``/``chatcmpl-…``): what ``feedback`` scores."""
        return (self.raw or {}).get("id")


def choice_logprobs(choice: dict[str, Any], chat: bool):
    """(tokens, logprobs, alternatives) from an OpenAI choice's ``logprobs`` (chat: a list of
    ``content`` entries; completions: parallel lists), or Nones when it has none."""
    lp = choice.get("logprobs")
    if not lp:
        return None, None, None
    if chat:
        content = lp.get("content") or []
        return (
            [c["token"] for c in content],
            [c["logprob"] for c in content],
            [{t["token"]: t["logprob"] for t in c.get("top_logprobs") or []} for c in content],
        )
    tops = lp.get("top_logprobs") or []
    return lp.get("tokens"), lp.get("token_logprobs"), [dict(t or {}) for t in tops] or None
