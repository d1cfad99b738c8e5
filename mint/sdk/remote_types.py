"""What the HTTP client (mint.sdk.remote) returns: policies, revisions, aliases, moves,
canaries and answers, read from the gateway's JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


def iso_time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


@dataclass(frozen=True)
class PolicyInfo:
    policy: str
    base_model: str
    created_at: datetime | None
    retired_at: datetime | None = None


@dataclass(frozen=True)
class Retirement:
    """The controller's ``policy.retired``: the policy is retired now (``retired``) or restored."""

    policy: str
    retired: bool
    reason: str
    event_id: str


@dataclass(frozen=True)
class RevisionInfo:
    revision: int
    digest: str
    parent_revision: int | None
    base_model: str
    created_at: datetime | None
    created_by: str
    training: dict[str, float] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    evaluations: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class AliasInfo:
    alias: str
    revision: int | None
    seq: int
    moved_at: datetime | None


@dataclass(frozen=True)
class Moved:
    """An alias move the controller carried out (its ``alias.moved``)."""

    policy: str
    alias: str
    from_revision: int | None
    to_revision: int
    cause: str
    event_id: str

    @property
    def payload(self) -> Moved:  # reads like the direct client's Envelope[AliasMoved]
        return self


@dataclass(frozen=True)
class CanaryInfo:
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

    @property
    def payload(self) -> CanaryInfo:  # reads like the direct client's Envelope[CanaryStarted]
        return self


@dataclass(frozen=True)
class Completion:
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
    raw: dict[str, Any] | None = field(default=None, repr=False)

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
