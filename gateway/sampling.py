"""A request's sampling settings as ``infer.requested`` carries them: ``temperature``,
``top_p``, ``seed``, ``stop``, ``n``, ``max_tokens``, ``logprobs`` on the event itself, the rest
in ``InferRequested.sampling`` (schemas.events.sampling.SamplingOptions), as ``vllm serve``'s
``to_sampling_params`` builds them (``vllm/entrypoints/openai/*/protocol.py``).

The engine hands these to vLLM's ``SamplingParams`` and answers a value vLLM refuses with
vLLM's message. Only what the event contract bounds tighter than vLLM (or cannot carry) is
checked here, with vLLM's message where vLLM refuses the same value.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import ValidationError

from gateway.bodies import ChatRequest, CompletionRequest
from gateway.errors import BadRequest
from gateway.tools import ToolOptions, structural_tag
from schemas.events.inference import MAX_PROMPT_CHARS
from schemas.events.sampling import SamplingOptions, StructuredOutput

OPENAI_TEMPERATURE = 1.0  # vLLM's default when neither the request nor the model's config sets one
MAX_STOPS, MAX_STOP_CHARS = 4, 256  # InferRequested.stop
MAX_N = 16  # InferRequested.n
INT32 = 2**31
MAX_LIST = {"stop_token_ids": 256, "bad_words": 256, "allowed_token_ids": 262_144}
MAX_WORD_CHARS = 1024
MAX_LOGIT_BIAS = 1024


def event_fields(req: ChatRequest | CompletionRequest, tools: ToolOptions) -> dict[str, Any]:
    """The ``InferRequested`` fields of a request besides its prompt, ``max_tokens`` and
    routing: temperature, top_p, seed, stop, n, logprobs and sampling."""
    n = 1 if req.n is None else req.n
    if n < 1:
        raise BadRequest(f"n must be at least 1, got {n}.", param="n")
    if n > MAX_N:
        raise _mint_rule("n", f"n={n} is over MinT's limit of {MAX_N} choices per prompt")
    temperature = OPENAI_TEMPERATURE if req.temperature is None else req.temperature
    if not math.isfinite(temperature):
        raise BadRequest(
            f"temperature must be a finite number, got {temperature}.", param="temperature"
        )
    if temperature < 0.0:
        raise BadRequest(
            f"temperature must be non-negative, got {temperature}.", param="temperature"
        )
    if temperature > 2.0:
        raise BadRequest(f"temperature must be in [0, 2], got {temperature}.", param="temperature")
    top_p = 1.0 if req.top_p is None else req.top_p
    if not 0.0 < top_p <= 1.0:
        raise BadRequest(f"top_p must be in (0, 1], got {top_p}.", param="top_p")
    return {
        "temperature": temperature,
        "top_p": top_p,
        "seed": req.seed,
        "stop": _stops(req.stops()),
        "n": n,
        "logprobs": bool(req.logprobs)
        if isinstance(req, ChatRequest)
        else req.logprobs is not None,
        "sampling": options(req, tools),
    }


def max_tokens_of(req: ChatRequest | CompletionRequest, default: int) -> int:
    """The ``max_tokens`` to ask for (chat: ``default`` when the request names none, a MinT
    rule: vLLM fills the context). Completions echo with 0 asks for 1 and shows none, as vLLM
    does."""
    if isinstance(req, ChatRequest):
        value, param = req.max_output(), req.max_output_param()
        value = default if value is None else value
    else:
        value, param = req.max_tokens, "max_tokens"
        value = 16 if value is None else value
        if value == 0 and req.echo:
            return 1
    if value < 1:
        raise BadRequest(f"max_tokens must be at least 1, got {value}.", param=param)
    return value


def _stops(stops: list[str]) -> list[str]:
    if len(stops) > MAX_STOPS:
        raise BadRequest(
            f"stop: List should have at most {MAX_STOPS} items after validation, not {len(stops)}",
            param="stop",
        )
    if any(not s for s in stops):
        raise BadRequest("stop cannot contain an empty string.", param="stop")
    long = next((s for s in stops if len(s) > MAX_STOP_CHARS), None)
    if long is not None:
        raise _mint_rule(
            "stop", f"a stop string of {len(long)} characters; at most {MAX_STOP_CHARS}"
        )
    return stops


def _mint_rule(param: str, what: str) -> BadRequest:
    """A bound of MinT's event contract that vLLM does not have (documented)."""
    return BadRequest(f"{param}: {what} (a MinT limit)", param=param, code="limit_exceeded")


def options(req: ChatRequest | CompletionRequest, tools: ToolOptions) -> SamplingOptions | None:
    """``InferRequested.sampling``: what the request sets beyond vLLM's defaults (None when
    nothing, so the records of plain requests stay as they were)."""
    chat = isinstance(req, ChatRequest)
    values: dict[str, Any] = {
        "top_k": req.top_k,
        "min_p": req.min_p,
        "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty,
        "repetition_penalty": req.repetition_penalty,
        "logit_bias": _logit_bias(req.logit_bias),
        "min_tokens": req.min_tokens or None,
        "ignore_eos": req.ignore_eos or None,
        "stop_token_ids": _ids("stop_token_ids", req.stop_token_ids),
        "include_stop_str_in_output": req.include_stop_str_in_output or None,
        "skip_special_tokens": None if req.skip_special_tokens else False,
        "bad_words": _words(req.bad_words),
        "allowed_token_ids": _ids("allowed_token_ids", req.allowed_token_ids, allow_empty=True),
        "truncate_prompt_tokens": req.truncate_prompt_tokens,
        "structured": structured(req, tools),
        "return_prompt_token_ids": req.return_token_ids or None,
    }
    if chat:
        assert isinstance(req, ChatRequest)
        top = req.top_logprobs if req.logprobs else None
        prompt_logprobs = req.prompt_logprobs
        if prompt_logprobs is None and req.echo:
            prompt_logprobs = req.top_logprobs  # vLLM's chat echo asks prompt logprobs so
        if tools.parser is not None and req.tools and req.tool_choice != "none":
            values["skip_special_tokens"] = False  # the hermes parser reads special tokens
    else:
        assert isinstance(req, CompletionRequest)
        top = req.logprobs
        prompt_logprobs = req.prompt_logprobs
        if prompt_logprobs is None and req.echo:
            prompt_logprobs = req.logprobs
    values["top_logprobs"] = top
    values["prompt_logprobs"] = prompt_logprobs
    for field in ("top_k", "min_tokens", "top_logprobs", "prompt_logprobs"):
        v = values[field]
        if v is not None and not -INT32 <= v < INT32:
            raise _mint_rule(field, f"{v} does not fit in 32 bits")
    if req.truncate_prompt_tokens is not None and req.truncate_prompt_tokens >= INT32:
        raise _mint_rule("truncate_prompt_tokens", "it does not fit in 32 bits")
    set_ = {k: v for k, v in values.items() if v is not None}
    if not set_:
        return None
    try:
        return SamplingOptions(**set_)
    except ValidationError as e:  # a bound of the contract: name the field
        err = e.errors()[0]
        param = str(err["loc"][0]) if err["loc"] else None
        raise _mint_rule(param or "sampling", err["msg"]) from e


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    """vLLM's conversion: keys to token ids (its message for one that is not), biases clamped
    to [-100, 100]."""
    if not bias:
        return None
    bad = []
    out: dict[int, float] = {}
    for key, value in bias.items():
        try:
            out[int(key)] = min(100.0, max(-100.0, value))
        except ValueError:
            bad.append(key)
    if bad:
        raise BadRequest(
            f"logit_bias contains key(s) that cannot be converted to integer token IDs: {bad!r}",
            param="logit_bias",
        )
    if len(out) > MAX_LOGIT_BIAS:
        raise _mint_rule("logit_bias", f"{len(out)} entries; at most {MAX_LOGIT_BIAS}")
    if any(not -INT32 <= t < INT32 for t in out):
        raise _mint_rule("logit_bias", "a token id that does not fit in 32 bits")
    return out


def _ids(param: str, ids: list[int] | None, allow_empty: bool = False) -> list[int] | None:
    if ids is None or (not ids and not allow_empty):
        return None
    if len(ids) > MAX_LIST[param]:
        raise _mint_rule(param, f"{len(ids)} token ids; at most {MAX_LIST[param]}")
    bad = next((t for t in ids if not 0 <= t < INT32), None)
    if bad is not None:
        if param == "allowed_token_ids":
            raise BadRequest("allowed_token_ids contains out-of-vocab token id!", param=param)
        raise _mint_rule(param, f"token id {bad} is not a token id (0 to {INT32 - 1})")
    return ids


def _words(words: list[str]) -> list[str] | None:
    if not words:
        return None
    if any(not w for w in words):
        raise BadRequest(
            f"bad_words cannot contain an empty string. Got bad_words={words[:10]}",
            param="bad_words",
        )
    if len(words) > MAX_LIST["bad_words"]:
        raise _mint_rule("bad_words", f"{len(words)} words; at most {MAX_LIST['bad_words']}")
    if any(len(w) > MAX_WORD_CHARS for w in words):
        raise _mint_rule("bad_words", f"a word over {MAX_WORD_CHARS} characters")
    return words


def structured(req: ChatRequest | CompletionRequest, tools: ToolOptions) -> StructuredOutput | None:
    """vLLM's ``structured_outputs_from_response_format``: ``structured_outputs`` with
    ``response_format`` on top; the tool parser's structural tag replaces both where it puts one
    (vLLM's ``Parser.adjust_request``)."""
    so, rf = req.structured_outputs, req.response_format
    if isinstance(req, ChatRequest) and tools.parser is not None:
        given = so is not None or (rf is not None and rf.type != "text")
        tag = structural_tag(req, has_structured_output=given)
        if tag is not None:
            try:
                return StructuredOutput(structural_tag=tag)
            except ValidationError as e:  # the tools' schemas together, over the record's bound
                raise _mint_rule("tools", e.errors()[0]["msg"]) from e
    if so is None and (rf is None or rf.type == "text"):
        return None
    fields: dict[str, Any] = {}
    if so is not None:
        for flag, default in (
            ("disable_additional_properties", False),
            ("whitespace_pattern", None),
        ):
            if getattr(so, flag) != default:
                raise BadRequest(
                    f"structured_outputs.{flag} is not supported by MinT: the engines compile "
                    "with vLLM's default; leave it out",
                    param=f"structured_outputs.{flag}",
                    code="unsupported_parameter",
                )
        fields = {
            "json": so.json_,
            "regex": so.regex,
            "choice": so.choice,
            "grammar": so.grammar,
            "json_object": so.json_object,
            "structural_tag": so.structural_tag,
        }
    if rf is not None and rf.type != "text":
        if rf.type == "json_object":
            fields["json_object"] = True
        elif rf.type == "json_schema":
            fields["json"] = rf.json_schema.json_schema if rf.json_schema else None
        else:  # vLLM sends the tag's JSON (its fields beside "type"); the engine checks it
            fields["structural_tag"] = json.dumps({"type": rf.type, **(rf.model_extra or {})})
    kinds = [k for k, v in fields.items() if v is not None]
    if len(kinds) != 1:
        raise BadRequest(
            "You can only use one kind of structured outputs constraint but multiple are "
            f"specified: {kinds}"
            if kinds
            else "You must use one kind of structured outputs constraint but none are specified",
            param="structured_outputs" if so is not None else "response_format",
        )
    kind = kinds[0]
    value = fields[kind]
    compact = so is not None and so.disable_any_whitespace
    if kind == "json":
        param = "response_format" if rf is not None else "structured_outputs"
        return _schema(value, param, compact)
    try:
        if kind == "json_object":
            return StructuredOutput(json_object=True, disable_any_whitespace=compact)
        return StructuredOutput(**{kind: value}, disable_any_whitespace=compact)
    except ValidationError as e:
        raise _mint_rule(f"structured_outputs.{kind}", e.errors()[0]["msg"]) from e


def _schema(value: str | dict[str, Any], param: str, compact: bool) -> StructuredOutput:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise BadRequest(
                f"{param}: the JSON schema is not valid JSON ({e})", param=param
            ) from e
    if not isinstance(value, dict):
        raise BadRequest(
            f"{param}: a JSON schema must be a JSON object, not {type(value).__name__}", param=param
        )
    try:
        return StructuredOutput(json_schema=value, disable_any_whitespace=compact)
    except ValidationError as e:
        raise _mint_rule(param, e.errors()[0]["msg"]) from e


def prompt_label(text: str) -> str:
    """``InferRequested.prompt`` when the prompt travels otherwise (token ids, a rendered
    conversation): a label for readers and logs."""
    return text[:MAX_PROMPT_CHARS] if text else "(empty)"
