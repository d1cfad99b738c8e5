"""The request bodies of ``/v1/chat/completions`` and ``/v1/completions`` as ``vllm serve`` 0.32
reads them (``vllm/entrypoints/openai/{chat_completion,completion}/protocol.py``): the same
field names, types and defaults, for text models.

These are our own pydantic models, not vLLM's: importing vLLM's request models costs the
gateway about 15 s and 450 MB more (they import torch and the engine's config), for a process
that otherwise starts in 3 s without torch (gateway/README.md, "Request models"). The parity
test against a real ``vllm serve`` keeps the two in step.

Like vLLM's, the bodies allow fields they do not know (``vllm serve`` ignores them and so does
the gateway; it names them in the ``x-mint-ignored-fields`` header). Fields vLLM honours and
MinT cannot are in :data:`NOT_HONOURED` (gateway.api refuses them when set to anything but
vLLM's default).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

INT64 = (-(2**63), 2**63 - 1)
Int64 = Annotated[int, Field(ge=INT64[0], le=INT64[1])]
# vLLM: `top_logprobs` is nullable in the OpenAI spec; null means the same as omitted.
TopLogprobs = Annotated[int, BeforeValidator(lambda v: 0 if v is None else v)]


class _Open(BaseModel):
    """vLLM's ``OpenAIBaseModel``: extra fields are allowed (and ignored)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


class StreamOptions(_Open):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class ContentPart(_Open):
    """A part of a message's content; only ``text`` parts mean anything to a text model."""

    type: str = "text"
    text: str | None = None


class FunctionCallParam(_Open):
    name: str
    arguments: str | dict[str, Any] | None = None


class ToolCallParam(_Open):
    """An earlier assistant turn's tool call (rendered by the chat template)."""

    id: str | None = None
    type: str = "function"
    function: FunctionCallParam


class Message(_Open):
    """One chat turn. vLLM takes any role (its custom message type): the chat template decides
    what a role means."""

    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallParam] | None = None
    tool_call_id: str | None = None
    reasoning: str | None = None

    def text(self) -> str:
        """The content as the chat template sees it: text parts joined by newlines (vLLM's
        "string" content format)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(p.text or "" for p in self.content if p.type == "text")


class FunctionDefinition(_Open):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Open):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Open):
    name: str


class NamedToolChoice(_Open):
    function: NamedFunction
    type: Literal["function"] = "function"


class JsonSchemaFormat(_Open):
    name: str
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Open):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(_Open):
    """vLLM's ``StructuredOutputsParams`` (the request's ``structured_outputs``)."""

    json_: str | dict[str, Any] | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None


class _Sampling(_Open):
    """The fields both endpoints share, with vLLM's defaults."""

    model: str = Field(max_length=300)
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    n: int | None = 1
    seed: Int64 | None = None
    stop: str | list[str] | None = Field(default_factory=list)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    # vLLM's sampling parameters
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = Field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    truncate_prompt_tokens: Annotated[int, Field(ge=-1, le=INT64[1])] | None = None
    allowed_token_ids: list[int] | None = None
    prompt_logprobs: int | None = None
    bad_words: list[str] = Field(default_factory=list)
    # vLLM's extra parameters
    request_id: str | None = Field(None, max_length=256)
    return_tokens_as_token_ids: bool | None = None
    return_token_ids: bool | None = None
    # accepted, no effect here (as on vLLM's generation endpoints, or routing hints only)
    session_id: str | None = None
    cache_salt: str | None = Field(None, min_length=1, max_length=1024)
    stream_interval: Annotated[int, Field(ge=1)] | None = None
    return_token_offsets: bool | None = False
    mm_payload: Literal["tensors", "none"] = "tensors"
    return_mm_kwargs: bool | None = None
    routed_experts_prompt_start: int = Field(0, ge=0)

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    logprobs: bool | None = False
    top_logprobs: TopLogprobs = 0
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = "none"
    parallel_tool_calls: bool | None = True
    include_reasoning: bool = True
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    documents: list[dict[str, str]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_prompt_text: bool | None = None

    def max_output(self) -> int | None:
        """vLLM: ``max_completion_tokens`` wins over the deprecated ``max_tokens``."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    def max_output_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"


class CompletionRequest(_Sampling):
    # text, texts, token ids, or lists of token ids (vLLM's four forms)
    prompt: (
        list[Annotated[int, Field(ge=0)]]
        | list[list[Annotated[int, Field(ge=0)]]]
        | str
        | list[str]
        | None
    ) = None
    echo: bool | None = False
    logprobs: int | None = None
    max_tokens: int | None = 16
    suffix: str | None = None
    add_special_tokens: bool = True

    def prompts(self) -> list[str | list[int]]:
        """Each prompt: a text, or token ids."""
        p = self.prompt
        if p is None:
            return []
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(t, int) for t in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


# Fields vLLM honours that MinT's engines do not (yet): accepted at vLLM's default only, else
# a 400 naming the field (gateway.api). Field -> (its default(s), why).
NOT_HONOURED: dict[str, tuple[tuple[Any, ...], str]] = {
    "use_beam_search": ((False, None), "beam search is not run by MinT's engines"),
    "length_penalty": ((1.0, None), "it only applies to beam search, which MinT does not run"),
    "watermarking": ((None, False), "watermarking is not run by MinT's engines"),
    "spaces_between_special_tokens": (
        (True, None),
        "MinT's engines always detokenize with vLLM's default (true)",
    ),
    "truncation_side": (
        (None, "left"),
        "MinT's engines keep the end of a truncated prompt (left), vLLM's default for it",
    ),
    "logprob_token_ids": ((None, []), "MinT's answers carry the top logprobs, not chosen ids"),
    "reasoning_effort": ((None,), "no reasoning parser runs in MinT"),
    "thinking_token_budget": ((None, -1), "no reasoning parser runs in MinT"),
    "media_io_kwargs": ((None, {}), "MinT serves text models"),
    "mm_processor_kwargs": ((None, {}), "MinT serves text models"),
    "prompt_embeds": ((None, []), "MinT's engines take text or token ids"),
    "priority": ((0, None), "MinT's engines do not schedule by priority"),
    "kv_transfer_params": ((None, {}), "MinT's engines do not transfer KV caches"),
    "ec_transfer_params": ((None, {}), "MinT's engines do not transfer encoder caches"),
    "vllm_xargs": ((None, {}), "MinT's engines run no custom extensions"),
    "repetition_detection": ((None,), "MinT's engines do not pass it to vLLM"),
    "return_prompt_text": ((None, False), "the engines render and do not return the prompt"),
}
