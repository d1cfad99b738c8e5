"""The OpenAI request bodies the gateway takes, validated with pydantic, and their bounds.

What the engines support is accepted (``max_tokens``/``max_completion_tokens``, ``temperature``,
``top_p``, ``seed``, ``stop``, ``n``, ``logprobs`` of the sampled tokens, ``stream``,
``stream_options.include_usage``, ``user``); a parameter they cannot honour is a 400 that names
it (:data:`UNSUPPORTED`); an unknown parameter is a 400 too, as OpenAI answers it. Every error
names the field (``param``), what was given and what is expected.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from gateway.config import GatewayConfig
from gateway.errors import BadRequest

Stop = Annotated[str, StringConstraints(min_length=1, max_length=256)]
# OpenAI bodies nest five levels (body, messages, a message, its content parts, a part); tool
# schemas, which the engines do not take, go deeper. Far beyond this is abuse, not a request.
MAX_DEPTH = 32


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StreamOptions(_Body):
    include_usage: bool = False


class TextPart(_Body):
    type: Literal["text"]
    text: str


class Message(_Body):
    # "developer" is OpenAI's newer name for "system"; "tool" turns need tools (unsupported).
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = Field(None, max_length=64)

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class _Sampling(_Body):
    model: str = Field(max_length=300)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    # One request per prompt carries its n choices: InferRequested.n's bound (16).
    n: int = Field(1, ge=1, le=16)
    seed: int | None = Field(None, ge=-(2**63), lt=2**63)
    stop: Stop | list[Stop] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=256)
    # OpenAI parameters the engines cannot honour: accepted only at their neutral values.
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    # Not supported (no tool use, no structured output in the engines).
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None

    def limit(self, config: GatewayConfig) -> int:
        return self.max_completion_tokens or self.max_tokens or config.default_max_tokens


class CompletionRequest(_Sampling):
    prompt: str | list[str]
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for completions
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    def limit(self, config: GatewayConfig) -> int:
        return self.max_tokens or 16


T = TypeVar("T", bound=_Sampling)


def _unsupported(req: _Sampling) -> tuple[str, str] | None:
    """(param, why) of the first parameter set to something the engines cannot do."""
    checks: list[tuple[str, bool, str]] = [
        ("presence_penalty", bool(req.presence_penalty), "penalties are not supported"),
        ("frequency_penalty", bool(req.frequency_penalty), "penalties are not supported"),
        ("logit_bias", bool(req.logit_bias), "logit_bias is not supported"),
    ]
    if isinstance(req, ChatRequest):
        checks += [
            (
                "top_logprobs",
                bool(req.top_logprobs),
                "only the sampled tokens' logprobs are returned (logprobs: true, top_logprobs: 0)",
            ),
            ("tools", bool(req.tools), "tool calls are not supported"),
            ("tool_choice", req.tool_choice not in (None, "none"), "tool calls are not supported"),
            ("functions", bool(req.functions), "function calls are not supported"),
            (
                "function_call",
                req.function_call not in (None, "none"),
                "function calls are not supported",
            ),
            ("parallel_tool_calls", bool(req.parallel_tool_calls), "tool calls are not supported"),
            (
                "response_format",
                (req.response_format or {"type": "text"}) != {"type": "text"},
                "only {'type': 'text'} is supported (no JSON mode or schemas)",
            ),
        ]
    else:
        assert isinstance(req, CompletionRequest)
        checks += [
            (
                "logprobs",
                bool(req.logprobs),
                "only the sampled tokens' logprobs are returned: send logprobs=0",
            ),
            ("echo", bool(req.echo), "echo is not supported"),
            ("best_of", req.best_of not in (None, 1, req.n), "best_of is not supported"),
            ("suffix", bool(req.suffix), "suffix (insertion) is not supported"),
        ]
    for param, bad, why in checks:
        if bad:
            return param, why
    return None


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
    """Validate ``body`` as ``model`` and check the gateway's bounds; BadRequest names the
    first offending field."""
    try:
        req = model.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        if err["type"] == "extra_forbidden":
            raise BadRequest(
                f"Unrecognized request argument supplied: {param}",
                param=param,
                code="unknown_parameter",
            ) from e
        given = repr(err.get("input"))[:80] if err.get("input") is not body else "{…}"
        raise BadRequest(f"{param}: {err['msg']} (got {given})", param=param) from e
    bad = _unsupported(req)
    if bad is not None:
        raise BadRequest(f"{bad[0]}: {bad[1]}", param=bad[0], code="unsupported_parameter")
    _check_bounds(req, config)
    return req


def _check_bounds(req: _Sampling, config: GatewayConfig) -> None:
    def too_big(param: str, what: str, value: int, limit: int) -> BadRequest:
        return BadRequest(
            f"{param}: {what} {value} is over this gateway's limit of {limit}",
            param=param,
            code="limit_exceeded",
        )

    if len(req.stops()) > 4:
        raise BadRequest(f"stop: at most 4 sequences, got {len(req.stops())}", param="stop")
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
        if not any(m.role == "user" and m.text() for m in req.messages):
            raise BadRequest(
                "messages: at least one user message with content is needed", param="messages"
            )
        choices = req.n
    else:
        assert isinstance(req, CompletionRequest)
        if req.max_tokens is not None and req.max_tokens > config.max_tokens:
            raise too_big("max_tokens", "max tokens", req.max_tokens, config.max_tokens)
        prompts = req.prompts()
        if not prompts:
            raise BadRequest("prompt: the list is empty; send at least one prompt", param="prompt")
        for i, p in enumerate(prompts):
            if not p:
                raise BadRequest(f"prompt[{i}] is empty: send some text", param="prompt")
            if len(p) > config.max_prompt_chars:
                raise too_big("prompt", "characters", len(p), config.max_prompt_chars)
        choices = req.n * len(prompts)
    if choices > config.max_choices:
        raise too_big("n", "choices (n × prompts)", choices, config.max_choices)
