"""vLLM's sampling and structured-output settings as the SDK's keyword arguments.

Both clients' ``infer`` take them the same way, either as keywords::

    mint.infer("math-rl", "2+2=", top_k=20, min_p=0.05, repetition_penalty=1.1,
               stop_token_ids=[2], top_logprobs=3)
    mint.infer("extract", "Alice is 31.", chat=True,
               json_schema={"type": "object", "properties": {"name": {"type": "string"},
                            "age": {"type": "integer"}}, "required": ["name", "age"]})
    mint.infer("triage", "Is this spam? ...", choice=["yes", "no"])

or as one ``sampling=SamplingOptions(...)`` (schemas.events.sampling; keywords given beside it
override its fields). ``json_schema`` takes a dict, JSON text or a pydantic model class; at most
one of ``json_schema``, ``json_object``, ``regex``, ``choice``, ``grammar`` constrains an answer.
The values go to vLLM as they are (``SamplingParams``, ``StructuredOutputsParams``): one vLLM
refuses comes back as the request's failure (``RequestFailed`` / ``RemoteError``, vLLM's message).
"""

from __future__ import annotations

import json
from typing import Any, TypedDict

from pydantic import BaseModel, ValidationError

from mint.sdk.exceptions import InvalidSampling
from schemas.events.sampling import SamplingOptions, StructuredOutput

STRUCTURED = ("json_schema", "json_object", "regex", "choice", "grammar")
SAMPLING_FIELDS = tuple(f for f in SamplingOptions.model_fields if f != "structured")


class SamplingFields(TypedDict, total=False):
    """The keywords ``infer`` takes beyond max_tokens, temperature, top_p, seed and stop."""

    top_k: int
    min_p: float
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    logit_bias: dict[int, float]
    min_tokens: int
    ignore_eos: bool
    stop_token_ids: list[int]
    include_stop_str_in_output: bool
    skip_special_tokens: bool
    bad_words: list[str]
    allowed_token_ids: list[int]
    top_logprobs: int
    prompt_logprobs: int
    truncate_prompt_tokens: int
    return_prompt_token_ids: bool
    json_schema: dict[str, Any] | str | type[BaseModel]
    json_object: bool
    regex: str
    choice: list[str]
    grammar: str


def _schema(value: Any) -> dict[str, Any]:
    if isinstance(value, type) and issubclass(value, BaseModel):
        return value.model_json_schema()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise InvalidSampling(
                f"json_schema: not JSON ({e.msg} at character {e.pos}); pass a dict, JSON text "
                "or a pydantic model class"
            ) from None
    if not isinstance(value, dict):
        raise InvalidSampling(
            f"json_schema: expected a JSON object (a dict), got {type(value).__name__}; pass a "
            'schema such as {"type": "object", "properties": {...}}'
        )
    return value


def _one_line(e: ValidationError, prefix: str) -> str:
    parts = []
    for err in e.errors():
        where = ".".join(str(p) for p in err["loc"]) or "value"
        parts.append(f"{prefix}{where}: {err['msg']} (got {err.get('input')!r:.80})")
    return "; ".join(parts)


def sampling_options(
    sampling: SamplingOptions | dict[str, Any] | None = None, **fields: Any
) -> SamplingOptions | None:
    """One ``SamplingOptions`` from ``sampling`` and the keywords (which override it); None when
    nothing is set, so a request without these settings stays what old engines read. Raises
    ``InvalidSampling`` (a ValueError) naming the field for an unknown keyword or a bad value."""
    unknown = sorted(set(fields) - set(SAMPLING_FIELDS) - set(STRUCTURED))
    if unknown:
        raise InvalidSampling(
            f"unknown sampling setting {', '.join(map(repr, unknown))}; the settings are "
            f"{', '.join(SAMPLING_FIELDS + STRUCTURED)}"
        )
    if isinstance(sampling, dict):
        try:
            sampling = SamplingOptions.model_validate(sampling)
        except ValidationError as e:
            raise InvalidSampling(_one_line(e, "sampling.")) from None
    base = sampling.model_dump(exclude_none=True) if sampling is not None else {}
    base.update({k: v for k, v in fields.items() if k in SAMPLING_FIELDS and v is not None})
    structured = {k: v for k, v in fields.items() if k in STRUCTURED and v not in (None, False)}
    if "json_schema" in structured:
        structured["json_schema"] = _schema(structured["json_schema"])
    if structured:
        try:
            base["structured"] = StructuredOutput(**structured)
        except ValidationError as e:
            raise InvalidSampling(_one_line(e, "")) from None
    if not base:
        return None
    try:
        return SamplingOptions.model_validate(base)
    except ValidationError as e:
        raise InvalidSampling(_one_line(e, "")) from None


def openai_fields(options: SamplingOptions | None, *, chat: bool, logprobs: bool) -> dict:
    """The body fields ``vllm serve`` (and the gateway) read for ``options``: its extra sampling
    fields, ``structured_outputs``, and OpenAI's logprobs (completions: ``logprobs: k``; chat:
    ``logprobs: true, top_logprobs: k``)."""
    body: dict[str, Any] = {}
    if options is not None:
        body = options.model_dump(exclude_none=True, exclude={"structured", "top_logprobs"})
        if options.structured is not None:
            s = options.structured.model_dump(exclude_none=True, exclude_defaults=True)
            if "json_schema" in s:
                s["json"] = s.pop("json_schema")
            body["structured_outputs"] = s
    top = options.top_logprobs if options is not None else None
    if logprobs or top is not None:
        if chat:
            body["logprobs"] = True
            body["top_logprobs"] = top or 0
        else:
            body["logprobs"] = top or 0
    return body
