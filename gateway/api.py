"""Reading a request body: JSON (bounded), ``vllm serve``'s own request checks (its
``model_validator(mode="before")`` rules, with its messages), the body models
(gateway.bodies), the fields MinT cannot honour, and this gateway's bounds. Every refusal is a
400 that names the field (``param``), what was given and what is expected.

What passes here is what ``vllm serve`` 0.32 would accept for a text model; values that only
vLLM's ``SamplingParams`` checks (a top_k of -5, a regex that does not compile) go on to the
engine, which answers them with vLLM's own message (gateway.responses.failure_error). The
checks that the event contract needs before a request can be published are in
gateway.sampling.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gateway.bodies import NOT_HONOURED, ChatRequest, CompletionRequest, _Sampling
from gateway.config import GatewayConfig
from gateway.errors import BadRequest

# OpenAI bodies nest five levels (body, messages, a message, its content parts, a part); tool
# schemas go deeper. Far beyond this is abuse, not a request.
MAX_DEPTH = 32
MAX_COMPLETION_PROMPTS = 1024  # vLLM's VLLM_MAX_COMPLETION_PROMPTS default
MAX_CACHE_SALT = 128
TOOL_USAGE = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'

T = TypeVar("T", bound=_Sampling)
B = TypeVar("B", bound=BaseModel)


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; BadRequest (``invalid_json``) for anything the parser refuses:
    not UTF-8, not JSON, nested deeper than :data:`MAX_DEPTH`, an integer past Python's digit
    limit. Never another exception: bad input is the caller's 400, not our 500."""
    try:
        body = json.loads(raw)
    except RecursionError:  # the C parser gives up near 1,000 levels
        raise _too_deep() from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an int of > 4,300 digits
        raise BadRequest(
            f"the body is not valid JSON ({str(e)[:200]}); send a JSON object", code="invalid_json"
        ) from e
    if not isinstance(body, dict):
        raise BadRequest(
            f"the body must be a JSON object, not {type(body).__name__}", code="invalid_json"
        )
    if _depth(body) > MAX_DEPTH:
        raise _too_deep()
    return body


def _too_deep() -> BadRequest:
    return BadRequest(
        f"the body nests JSON more than {MAX_DEPTH} levels deep; send a JSON "
        "object shaped like OpenAI's requests",
        code="invalid_json",
    )


def _depth(value: Any) -> int:
    """How deep containers nest in ``value`` (a scalar: 0; counting stops past MAX_DEPTH),
    without recursion: checked before pydantic, logging or an encoder walk it recursively."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        children = v.values() if isinstance(v, dict) else v if isinstance(v, list) else None
        if children is None:
            continue
        deepest = max(deepest, d)
        if d > MAX_DEPTH:
            break
        todo.extend((c, d + 1) for c in children)
    return deepest


def validate(model: type[T], body: dict[str, Any], config: GatewayConfig) -> T:
    """``body`` as ``model``: vLLM's request checks, then the model, then the fields MinT does
    not honour and this gateway's bounds; BadRequest names the first offending field."""
    chat = model is ChatRequest
    body = dict(body)
    vllm_checks(body, chat=chat)
    req = validate_body(model, body)
    _not_honoured(req, body)
    _check_bounds(req, config)
    return req


def validate_body(model: type[B], body: dict[str, Any]) -> B:
    """``body`` as ``model`` (a body without vLLM's request checks: /tokenize, /detokenize)."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        param = ".".join(str(p) for p in err["loc"] if not _internal(p)) or None
        given = repr(err.get("input"))[:80] if err.get("input") is not body else "{…}"
        raise BadRequest(f"{param}: {err['msg']} (got {given})", param=param) from e


# pydantic's schema kinds in an error's location (union members, wrappers), not field names
INTERNAL_LOC = {"str", "int", "float", "bool", "list", "dict", "none", "nullable", "union"}


def _internal(segment: object) -> bool:
    return isinstance(segment, str) and (
        segment in INTERNAL_LOC or any(c in segment for c in "[](){}")
    )


def ignored_fields(req: _Sampling) -> list[str]:
    """The body's fields neither vLLM nor MinT knows: ignored, as ``vllm serve`` ignores them
    (named in a header: printable ASCII, anything else as ``?``)."""
    names = sorted((req.model_extra or {}).keys() - NOT_HONOURED.keys())
    return ["".join(c if " " < c < "\x7f" and c != "," else "?" for c in n[:64]) for n in names]


# ---------------------------------------------------------------------- vLLM's request checks


def vllm_checks(data: dict[str, Any], *, chat: bool) -> None:
    """vLLM 0.32's ``mode="before"`` validators of ChatCompletionRequest / CompletionRequest,
    with their messages and parameters. Mutates ``data`` as vLLM does (``tool_choice``
    defaults to ``auto`` when tools are given; a null completions ``max_tokens`` is 16)."""
    _check_cache_salt(data.get("cache_salt"))
    if data.get("stream_options") and not data.get("stream"):
        raise BadRequest(
            "Stream options can only be defined when `stream=True`.", param="stream_options"
        )
    _check_logprobs(data, chat)
    _check_response_format(data.get("response_format"))
    _check_structured_outputs(data, chat)
    if chat:
        _check_tool_usage(data)
        if data.get("continue_final_message") and data.get("add_generation_prompt", True):
            raise BadRequest(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
            )
    else:
        if data.get("max_tokens") is None:
            data["max_tokens"] = 16
        prompt = data.get("prompt")
        if prompt is None or prompt == "":
            raise BadRequest(
                "Either prompt or prompt_embeds must be provided and non-empty.", param="prompt"
            )
        if (
            isinstance(prompt, list)
            and prompt
            and not all(isinstance(t, int) for t in prompt)
            and len(prompt) > MAX_COMPLETION_PROMPTS
        ):
            raise BadRequest(
                f"prompt list length {len(prompt)} exceeds the maximum allowed count of "
                f"{MAX_COMPLETION_PROMPTS}. To increase this limit, set the "
                "VLLM_MAX_COMPLETION_PROMPTS environment variable.",
                param="prompt",
            )


def _check_cache_salt(salt: object) -> None:
    if salt is None:
        return
    if not isinstance(salt, str) or not salt:
        raise BadRequest(
            "Parameter 'cache_salt' must be a non-empty string if provided.", param="cache_salt"
        )
    if len(salt) > MAX_CACHE_SALT or any(c in "@/\\\x00" for c in salt):
        raise BadRequest(
            "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', "
            "'/', '\\\\', or NUL.",
            param="cache_salt",
        )


def _check_logprobs(data: dict[str, Any], chat: bool) -> None:
    k_field = "top_logprobs" if chat else "logprobs"
    for field in ("prompt_logprobs", k_field):
        value = data.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise BadRequest(f"`{field}` must be an integer.", param=field)
    prompt_logprobs = data.get("prompt_logprobs")
    if prompt_logprobs is not None:
        if data.get("stream") and (prompt_logprobs > 0 or prompt_logprobs == -1):
            raise BadRequest(
                "`prompt_logprobs` are not available when `stream=True`.",
                param="prompt_logprobs",
            )
        if prompt_logprobs < 0 and prompt_logprobs != -1:
            raise BadRequest(
                "`prompt_logprobs` must be a positive value or -1.", param="prompt_logprobs"
            )
    k = data.get(k_field)
    if k is not None:
        if k < 0 and k != -1:
            raise BadRequest(f"`{k_field}` must be a positive value or -1.", param=k_field)
        if chat and (k == -1 or k > 0) and not data.get("logprobs"):
            raise BadRequest(
                "when using `top_logprobs`, `logprobs` must be set to true.",
                param="top_logprobs",
            )


def _check_response_format(rf: object) -> None:
    if isinstance(rf, dict) and rf.get("type") == "json_schema" and rf.get("json_schema") is None:
        raise BadRequest(
            "When response_format type is 'json_schema', the 'json_schema' field must be provided.",
            param="response_format",
        )


def _check_structured_outputs(data: dict[str, Any], chat: bool) -> None:
    so = data.get("structured_outputs")
    if not isinstance(so, dict):
        return
    if sum(so.get(k) is not None for k in ("json", "regex", "choice")) > 1:
        raise BadRequest(
            "You can only use one kind of constraints for structured outputs ('json', "
            "'regex' or 'choice').",
            param="structured_outputs",
        )
    constrained = any(so.get(k) is not None for k in ("json", "regex", "choice"))
    if chat and constrained and data.get("tool_choice", "none") not in ("none", "auto", "required"):
        raise BadRequest(
            "You can only either use constraints for structured outputs or tools, not both."
        )


def _check_tool_usage(data: dict[str, Any]) -> None:
    tools = data.get("tools")
    if tools == []:
        raise BadRequest(
            "`tools` must not be an empty array. Either provide at least one tool or omit the "
            "field entirely.",
            param="tools",
        )
    if "tool_choice" not in data and tools:
        data["tool_choice"] = "auto"
    choice = data.get("tool_choice")
    if choice is None or choice == "none":
        return
    if tools is None:
        raise BadRequest("When using `tool_choice`, `tools` must be set.", param="tool_choice")
    if choice not in ("auto", "required") and not isinstance(choice, dict):
        raise BadRequest(
            f'Invalid value for `tool_choice`: {choice}! Only named tools, "none", "auto" '
            'or "required" are supported.',
            param="tool_choice",
        )
    if not isinstance(choice, dict):
        return
    function = choice.get("function")
    if not isinstance(function, dict):
        raise BadRequest(
            f"Invalid value for `function`: `{function}` in `tool_choice`! {TOOL_USAGE}",
            param="tool_choice.function",
        )
    if "name" not in function:
        raise BadRequest(
            f"Expected field `name` in `function` in `tool_choice`! {TOOL_USAGE}",
            param="tool_choice.function.name",
        )
    name = function["name"]
    if not isinstance(name, str) or not name:
        raise BadRequest(
            f"Invalid `name` in `function`: `{name}` in `tool_choice`! {TOOL_USAGE}",
            param="tool_choice.function.name",
        )
    names = [
        t.get("function", {}).get("name")
        for t in tools
        if isinstance(t, dict) and isinstance(t.get("function"), dict)
    ]
    if name not in names:
        raise BadRequest(
            "The tool specified in `tool_choice` does not match any of the specified `tools`",
            param="tool_choice",
        )


# ---------------------------------------------------------------------- MinT's own rules


def _not_honoured(req: _Sampling, body: dict[str, Any]) -> None:
    """A field vLLM honours that MinT's engines do not: a 400 unless it holds vLLM's default
    (silently ignoring it would answer something else than was asked)."""
    for field, (defaults, why) in NOT_HONOURED.items():
        if field in body and body[field] not in defaults:
            raise BadRequest(
                f"{field}={str(body[field])[:80]} is not supported by MinT: {why}; leave it out",
                param=field,
                code="unsupported_parameter",
            )
    if isinstance(req, CompletionRequest) and req.suffix is not None:
        if req.echo:
            raise BadRequest("Echo is unsupported with suffix.", param="suffix")
        raise BadRequest(
            "suffix is only supported for models with FIM completion rendering", param="suffix"
        )
    if isinstance(req, ChatRequest):
        for i, m in enumerate(req.messages):
            for j, part in enumerate(m.content if isinstance(m.content, list) else []):
                if part.type != "text":
                    raise BadRequest(
                        f"messages[{i}].content[{j}] is a {part.type!r} part; the models MinT "
                        "serves are text models: send text parts",
                        param=f"messages.{i}.content.{j}.type",
                    )
        kwargs = req.chat_template_kwargs or {}
        if req.chat_template is not None or kwargs.get("chat_template") is not None:
            raise BadRequest(
                "Chat template is passed with request, but --trust-request-chat-template is "
                "not set. Refused request with untrusted chat template."
            )


def _check_bounds(req: _Sampling, config: GatewayConfig) -> None:
    """This gateway's limits (documented MinT rules: what one request may make the engines
    do), each a 400 ``limit_exceeded`` naming the field and the limit."""

    def too_big(param: str, what: str, value: int, limit: int) -> BadRequest:
        return BadRequest(
            f"{param}: {what} {value} is over this gateway's limit of {limit}",
            param=param,
            code="limit_exceeded",
        )

    n = req.n if req.n is not None else 1
    if isinstance(req, ChatRequest):
        for param in ("max_tokens", "max_completion_tokens"):
            value = getattr(req, param)
            if value is not None and value > config.max_tokens:
                raise too_big(param, "max tokens", value, config.max_tokens)
        if len(req.messages) > config.max_messages:
            raise too_big("messages", "messages", len(req.messages), config.max_messages)
        chars = sum(len(m.text()) for m in req.messages)
        if chars > config.max_prompt_chars:
            raise too_big("messages", "characters", chars, config.max_prompt_chars)
        choices = n
    else:
        assert isinstance(req, CompletionRequest)
        if req.max_tokens is not None and req.max_tokens > config.max_tokens:
            raise too_big("max_tokens", "max tokens", req.max_tokens, config.max_tokens)
        prompts = req.prompts()
        for p in prompts:
            if isinstance(p, str) and len(p) > config.max_prompt_chars:
                raise too_big("prompt", "characters", len(p), config.max_prompt_chars)
        choices = n * max(1, len(prompts))
    if n >= 1 and choices > config.max_choices:
        raise too_big("n", "choices (n × prompts)", choices, config.max_choices)
