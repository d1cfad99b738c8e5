"""vLLM's sampling and structured-output settings as ``infer.requested`` carries them
(``InferRequested.sampling``), and the per-token log-probabilities an answer carries back.

The bounds here only keep a record's size sane; what vLLM can run is vLLM's to decide: the
engine hands these to ``SamplingParams`` / ``StructuredOutputsParams`` and a value vLLM refuses
is that request's ``infer.failed`` (stage ``validate``, vLLM's own message), never a dead letter.
Added to the contract (optional, backward compatible): old producers send none of it, and old
readers of ``infer.completed`` ignore the new answer fields they do not know.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

MAX_SCHEMA_BYTES = 64 * 1024  # a JSON schema or a grammar, serialized
MAX_REGEX_CHARS = 4096
MAX_CHOICES = 256
Word = Annotated[str, StringConstraints(min_length=1, max_length=1024)]
TokenId = Annotated[int, Field(ge=0, lt=2**31)]


class StructuredOutput(BaseModel):
    """Constrain the answer's text (vLLM's ``StructuredOutputsParams``): exactly one of these."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    json_schema: dict[str, Any] | None = Field(
        None, description=f"the answer is JSON valid against this schema (≤ {MAX_SCHEMA_BYTES} B)"
    )
    json_object: bool = Field(False, description="the answer is a JSON object (any)")
    regex: str | None = Field(None, min_length=1, max_length=MAX_REGEX_CHARS)
    choice: list[Word] | None = Field(
        None, min_length=1, max_length=MAX_CHOICES, description="the answer is one of these"
    )
    grammar: str | None = Field(
        None, min_length=1, max_length=MAX_SCHEMA_BYTES, description="an EBNF grammar (vLLM's)"
    )
    structural_tag: str | None = Field(
        None,
        min_length=2,
        max_length=MAX_SCHEMA_BYTES,
        description="an xgrammar structural tag as JSON text (vLLM's); the gateway builds one "
        "for a tool choice as vllm serve does",
    )
    # A modifier, not a kind: JSON without whitespace between tokens (vLLM's option; a small or
    # undertrained model otherwise may spend its tokens on whitespace JSON allows).
    disable_any_whitespace: bool = Field(False, description="JSON without optional whitespace")

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutput:
        kinds = [
            k
            for k, on in (
                ("json_schema", self.json_schema is not None),
                ("json_object", self.json_object),
                ("regex", self.regex is not None),
                ("choice", self.choice is not None),
                ("grammar", self.grammar is not None),
                ("structural_tag", self.structural_tag is not None),
            )
            if on
        ]
        if len(kinds) != 1:
            raise ValueError(
                "set exactly one of json_schema, json_object, regex, choice, grammar, "
                f"structural_tag (got "
                f"{', '.join(kinds) or 'none'})"
            )
        if self.json_schema is not None:
            size = len(json.dumps(self.json_schema))
            if size > MAX_SCHEMA_BYTES:
                raise ValueError(
                    f"json_schema is {size} bytes serialized; at most {MAX_SCHEMA_BYTES}"
                )
        return self


class SamplingOptions(BaseModel):
    """What vLLM's ``SamplingParams`` takes beyond temperature, top_p, seed, stop, max_tokens and
    n (those stay on ``InferRequested``). None: vLLM's default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    top_k: int | None = Field(None, ge=-(2**31), lt=2**31, description="-1 or 0: off")
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[int, float] | None = Field(
        None, max_length=1024, description="token id -> bias added to its logit"
    )
    min_tokens: int | None = Field(None, ge=-(2**31), lt=2**31)
    ignore_eos: bool | None = None
    stop_token_ids: list[TokenId] | None = Field(None, max_length=256)
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    bad_words: list[Word] | None = Field(None, max_length=256)
    allowed_token_ids: list[TokenId] | None = Field(None, max_length=262_144)
    top_logprobs: int | None = Field(
        None,
        ge=-(2**31),
        lt=2**31,
        description="alternatives per sampled token (with logprobs: vLLM's logprobs=k)",
    )
    prompt_logprobs: int | None = Field(None, ge=-(2**31), lt=2**31)
    truncate_prompt_tokens: int | None = Field(None, ge=-(2**31), lt=2**31)
    structured: StructuredOutput | None = None
    return_prompt_token_ids: bool | None = Field(
        None, description="the answer carries the prompt's token ids (vLLM's return_token_ids)"
    )


class TopLogprob(BaseModel):
    """One candidate token at a position, as vLLM returns it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    token_id: int
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    """A sampled (or prompt) token with its log-probability and the ``top`` alternatives."""

    top: list[TopLogprob] = Field(default_factory=list)
