"""Inference: downstream requests against ``tenant/policy@alias`` and their results."""

from __future__ import annotations

from typing import Annotated, Literal
from uuid import UUID

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)

from schemas.envelope import Command, Payload
from schemas.events.sampling import SamplingOptions, TokenLogprob
from schemas.names import AliasName, Digest

REQUEST_ID_RE = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
MAX_PROMPT_CHARS = 200_000
StopText = Annotated[str, StringConstraints(min_length=1, max_length=256)]
MAX_PROMPT_TOKEN_IDS = 32768
TokenId = Annotated[int, Field(ge=0)]
STREAM_KEY_RE = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"


class ChatTurn(BaseModel):
    """One turn of a conversation, rendered by the base model's chat template on the engine."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=MAX_PROMPT_CHARS)


class InferRequested(Command):
    """Command: answer a prompt with tenant/policy@alias (or a pinned revision)."""

    event_type = "infer.requested"
    topic = "infer.requests"

    request_id: str = Field(pattern=REQUEST_ID_RE, description="caller's id, echoed back")
    alias: AliasName = "prod"
    revision: int | None = Field(None, ge=1, description="pin a revision instead of the alias")
    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    max_tokens: int = Field(
        64,
        ge=1,
        le=32768,
        description="at most the engine's max_model_len (else infer.failed, stage validate); "
        "clamped to the context the prompt leaves, as vLLM serve does",
    )
    # The bound of the released contract; engines run 0 to 2 (vLLM's range) and answer a higher
    # temperature with infer.failed (stage validate, code invalid_value): a tighter schema bound
    # would make such a request a dead letter that its caller never hears about.
    temperature: float = Field(
        0.0, ge=0.0, le=10.0, description="engines run 0 to 2; above: infer.failed, validate"
    )
    seed: int | None = None
    # Added (optional, backward compatible): instruct models answer a user turn, not raw text.
    chat: bool = Field(False, description="render prompt as one user turn of the chat template")
    # Added (optional, backward compatible) for the OpenAI-compatible gateway. An engine built
    # before these fields refuses a request that carries them (commands forbid unknown fields):
    # upgrade the engines before the producers.
    messages: list[ChatTurn] | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="with chat: the whole conversation for the chat template (prompt is then "
        "its last user turn, kept for readers and logs)",
    )
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling: probability mass")
    stop: list[StopText] = Field(
        default_factory=list, max_length=4, description="stop before any of these strings"
    )
    logprobs: bool = Field(False, description="return the log-probability of each sampled token")
    # Added (optional, backward compatible): when the caller stops waiting (the gateway sets its
    # answer timeout). A request still queued or waiting for its adapter then is answered with
    # infer.failed, stage "expired", instead of taking an engine slot nobody waits for. Only a
    # producer that sets this field can get that stage back.
    expires_at: AwareDatetime | None = Field(
        None, description="the caller stops waiting then: not run after it (stage expired)"
    )

    # Added (optional, backward compatible) for the Tinker API's SamplingClient.sample, which
    # sends token ids: the engine runs these ids as they are (no tokenizer, no template), and
    # ``prompt`` becomes a label for readers and logs only. Producers put the decoded text there
    # when they can (cut to MAX_PROMPT_CHARS), else "<N tokens>". Upgrade the engines before the
    # producers (see messages).
    prompt_token_ids: list[TokenId] | None = Field(
        None,
        min_length=1,
        max_length=MAX_PROMPT_TOKEN_IDS,
        description="run these token ids as the prompt (chat false, no messages); prompt is "
        "then only a label: the decoded text, or '<N tokens>'. An id outside the model's "
        "vocabulary: infer.failed, validate, invalid_value",
    )

    # Added (optional, backward compatible) for serving on vLLM's asynchronous engine: ``n``
    # choices in one request (vLLM's n: the prompt is prefilled once), and tokens as events.
    n: int = Field(
        1, ge=1, le=16, description="choices sampled for this prompt (one prefill, vLLM's n)"
    )
    # Added (optional, backward compatible): vLLM's other sampling and structured-output
    # settings (schemas.events.sampling). Upgrade the engines before the producers.
    sampling: SamplingOptions | None = Field(
        None, description="vLLM's sampling and structured-output settings beyond the above"
    )
    stream_to: str | None = Field(
        None,
        pattern=STREAM_KEY_RE,
        description="publish infer.delta events on infer.deltas keyed by this (the reader's "
        "id: a gateway instance reads only its own partition) while the answer is generated; "
        "infer.completed still follows with the whole answer",
    )

    # Added (optional, backward compatible): who asks, for a canary's sticky routing (the same
    # caller always gets the same side). The gateway sets the OpenAI ``user`` or the API key.
    caller: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="the caller's identity for sticky canary routing (None: the request_id)",
    )

    @model_validator(mode="after")
    def _token_prompt_is_raw(self) -> InferRequested:
        # Token ids are already what the template would produce: rendering them again is a
        # caller's mistake, not a request an engine can guess the meaning of.
        if self.prompt_token_ids is not None:
            if self.messages is not None:
                raise ValueError(
                    "prompt_token_ids and messages are exclusive; send one prompt: token ids "
                    "(with chat=false) or messages (with chat=true)"
                )
            if self.chat:
                raise ValueError(
                    "prompt_token_ids need chat=false (token ids are not rendered by the chat "
                    "template); send chat=false, or send text in prompt/messages instead"
                )
        return self

    @model_validator(mode="after")
    def _messages_need_chat(self) -> InferRequested:
        if self.messages is not None:
            if not self.chat:
                raise ValueError("messages need chat=true (they are rendered by the template)")
            total = sum(len(m.content) for m in self.messages)
            if total > MAX_PROMPT_CHARS:
                raise ValueError(
                    f"messages hold {total} characters; at most {MAX_PROMPT_CHARS} together"
                )
        return self


class InferChoice(BaseModel):
    """One of the ``n`` choices of an answer (``InferCompleted.choices``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int = Field(ge=0, lt=16)
    text: str
    finish_reason: Literal["stop", "length", "error"]
    token_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] | None = None
    token_logprobs: list[TokenLogprob] | None = None
    stop_reason: str | int | None = None


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
    logprobs: list[float] | None = Field(
        None, description="log-probability of each completion token (when the request asked)"
    )
    # Added (optional, backward compatible): with n > 1, every choice in order. The fields above
    # then hold choice 0 (what a reader of one choice expects) and completion_tokens the sum.
    choices: list[InferChoice] | None = Field(
        None, max_length=16, description="with n > 1: all n choices (choice 0 also above)"
    )
    # Added (optional, backward compatible), when the request asked (sampling.top_logprobs,
    # sampling.prompt_logprobs): tokens with their strings, bytes and alternatives, as vLLM
    # returns them; and what stopped the answer (the stop string or token id matched).
    token_logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = Field(
        None, description="per prompt token (the first has none)"
    )
    prompt_token_ids: list[int] | None = Field(
        None, description="with prompt_logprobs: the prompt's token ids"
    )
    stop_reason: str | int | None = Field(
        None, description="the stop string or token id that ended the answer, if one did"
    )


class InferFailed(Payload):
    """The error result of an inference request: every request gets a result, never silence."""

    event_type = "infer.failed"
    topic = "infer.results"

    request_id: str = Field(pattern=REQUEST_ID_RE)
    ref: str = Field(max_length=512, description="what was asked, e.g. acme/math@prod")
    stage: Literal["resolve", "validate", "load", "generate", "expired"] = Field(
        description="where it failed (validate: the engine cannot run the request as sent, see "
        "code; expired: its expires_at passed before it ran)"
    )
    error: str = Field(max_length=4096, description="what failed and what to do")
    # Added (optional, backward compatible): the OpenAI error code of a refusal, so a front door
    # can answer 400 with it.
    code: str | None = Field(
        None,
        max_length=64,
        description="with stage validate: context_length_exceeded (the prompt does not fit the "
        "model's context) or invalid_value (a sampling value the engine cannot run); with "
        "stage expired: cancelled when the caller cancelled it (infer.cancel)",
    )
    revision: int | None = Field(None, ge=1, description="None: the reference did not resolve")
    adapter_digest: str | None = Field(None, pattern=r"^sha256:[0-9a-f]{64}$")
    engine_id: str = Field(max_length=128)
    retryable: bool = False
    latency_ms: float = Field(0.0, ge=0.0)


class InferDelta(Payload):
    """Text an engine generated since the last delta of one choice, published while it generates
    (every ≤ 50 ms or 16 tokens per request) for a request that set ``stream_to``.

    Best effort and short-lived: deltas go to ``infer.deltas`` (one hour of retention, keyed by
    ``stream_to`` so each reader follows one partition), and ``infer.completed`` on
    ``infer.results`` still carries the whole answer. A reader that misses a delta, or reads the
    completion first (two topics are not ordered together), takes the rest from the completion:
    ``seq`` counts a choice's deltas from 0 and ``offset`` is where ``text`` starts in the
    choice's text, so a gap is seen and never doubled."""

    event_type = "infer.delta"
    topic = "infer.deltas"

    request_id: str = Field(pattern=REQUEST_ID_RE)
    engine_id: str = Field(max_length=128)
    index: int = Field(0, ge=0, lt=16, description="the choice")
    seq: int = Field(ge=0, description="this choice's deltas, counted from 0")
    offset: int = Field(ge=0, description="characters of the choice's text before this delta")
    text: str = Field(description="text added since the previous delta")
    tokens: int = Field(ge=0, description="tokens added since the previous delta")
    revision: int = Field(ge=1, description="the revision generating")


class InferCancel(Command):
    """Command: the caller stopped waiting (its client disconnected); the engine aborts the
    request (its slot is freed) and answers it with infer.failed, stage expired, code cancelled.
    Sent on ``infer.requests`` with the request's key, so it reaches the engine that holds the
    request, after the request. A cancel for a request already answered is ignored."""

    event_type = "infer.cancel"
    topic = "infer.requests"

    request_id: str = Field(pattern=REQUEST_ID_RE)
    request_event_id: UUID = Field(description="event_id of the infer.requested to cancel")
