"""Engine answers → ``vllm serve``'s response bodies (streams: gateway.streaming, from these
parts).

One ``infer.completed`` answers one prompt with its ``n`` choices (``choices``; with n = 1 the
top-level fields are the one choice); the response lists prompt k's choice j at index
``k * n + j``, as vLLM does. ``system_fingerprint`` is the adapter digest that answered (the
revision's identity), so a caller sees an alias move take effect; the ``x-mint-*`` headers say
the same in words. Bodies carry vLLM's own extra fields (``stop_reason``, ``token_ids`` with
``return_token_ids``, ``prompt_logprobs``, ``prompt_token_ids``).
"""

from __future__ import annotations

from typing import Any

from catalog.refs import Ref
from gateway.asks import Ask
from gateway.bodies import ChatRequest, CompletionRequest
from gateway.errors import ApiError, BadRequest, EngineFailed, ModelNotFound, Unavailable
from gateway.logprobs import (
    TokenText,
    chat_content,
    completion_logprobs,
    prompt_logprobs_body,
    sampled,
)
from gateway.tools import named, read_answer
from schemas.envelope import Envelope
from schemas.events import InferChoice, InferCompleted, InferFailed


def check_answers(
    answers: list[Envelope[Any]], model: str, retry_after_s: int, prompt_param: str | None = None
) -> list[Any]:
    """The InferCompleted payloads, or the error of the first failed answer (``prompt_param``:
    the body field that held the prompt, ``messages`` or ``prompt``)."""
    for env in answers:
        if isinstance(env.payload, InferFailed):
            raise failed_error(env.payload, model, retry_after_s, prompt_param)
    return [env.payload for env in answers]


def choices_of(p: InferCompleted) -> list[InferChoice]:
    """The answer's choices in order (an answer of one choice carries it in its own fields)."""
    if p.choices:
        return sorted(p.choices, key=lambda c: c.index)
    return [
        InferChoice(
            index=0,
            text=p.text,
            finish_reason=p.finish_reason,
            token_ids=p.token_ids,
            logprobs=p.logprobs,
            token_logprobs=p.token_logprobs,
            stop_reason=p.stop_reason,
        )
    ]


def check_choices(p: InferCompleted, n: int) -> list[InferChoice]:
    """The ``n`` choices of an answer to a request of ``n``; EngineFailed when the engine sent
    another number (an engine older than ``InferRequested.n`` answers one): never a response
    that silently lacks choices."""
    got = choices_of(p)
    if [c.index for c in got] != list(range(n)):
        raise EngineFailed(
            f"the engine answered choices {[c.index for c in got]} to a request for n={n}; "
            "the engines may be older than this gateway (upgrade them): tell the operators"
        )
    return got


def not_queued(timeout_s: float, retry_after_s: int) -> Unavailable:
    """The 503 of an ask Kafka did not confirm within the answer timeout: no engine saw it."""
    return Unavailable(
        f"Kafka did not confirm the request within {timeout_s:g} s, so no engine has it; "
        "the brokers may be away: retry later",
        headers={"Retry-After": str(retry_after_s)},
    )


def no_answer(timeout_s: float, retry_after_s: int) -> Unavailable:
    """The 503 of an ask no engine answered within the gateway's answer timeout."""
    return Unavailable(
        f"no engine answered within {timeout_s:g} s; the engines may be starting, "
        "overloaded or down: retry later",
        headers={"Retry-After": str(retry_after_s)},
    )


def failure_error(
    stage: str,
    error: str,
    *,
    model: str,
    retryable: bool = False,
    code: str | None = None,
    retry_after_s: int = 5,
    prompt_param: str | None = None,
) -> ApiError:
    """The HTTP error of an engine's ``infer.failed`` answer (its stage, error text and code).
    A refusal at stage ``validate`` is vLLM's own 400 (the engine passes vLLM's message)."""
    if stage == "resolve":  # the same answer as a model of another tenant: no oracle
        return ModelNotFound(model)
    if stage == "validate":  # the engine cannot run this request (prompt too long, a bad value)
        param = prompt_param if code == "context_length_exceeded" else None
        return BadRequest(error[:1000], param=param, code=code or "invalid_value")
    if stage == "load":
        if retryable:
            return Unavailable(
                "the model's adapter could not be loaded yet; retry shortly",
                headers={"Retry-After": str(retry_after_s)},
            )
        return EngineFailed(
            f"the adapter of model '{model}' could not be loaded by the "
            "engine; tell the operators (they have its error)"
        )
    if stage == "expired":  # the engines were too busy to reach it within the timeout
        return Unavailable(
            "no engine answered in time; the engines may be overloaded: retry later",
            headers={"Retry-After": str(retry_after_s)},
        )
    return EngineFailed(f"the engine failed to generate: {error[:500]}")


def failed_error(
    p: InferFailed, model: str, retry_after_s: int, prompt_param: str | None = None
) -> ApiError:
    """:func:`failure_error` of one ``infer.failed`` answer (whole or streamed)."""
    return failure_error(
        p.stage,
        p.error,
        model=model,
        retryable=p.retryable,
        code=p.code,
        retry_after_s=retry_after_s,
        prompt_param=prompt_param,
    )


def fingerprint(done: list[InferCompleted]) -> str:
    return ",".join(dict.fromkeys(p.adapter_digest for p in done))


def revision_headers(done: list[InferCompleted], ref: Ref) -> dict[str, str]:
    headers = {
        "x-mint-revision": ",".join(dict.fromkeys(str(p.revision) for p in done)),
        "x-mint-adapter-digest": fingerprint(done),
        "x-mint-policy": f"{ref.tenant}/{ref.policy}",
    }
    # the engine's own time (received → answered: queue, cold load, generation): the rest of
    # a request's time is the gateway and Kafka
    headers["x-mint-engine-ms"] = f"{max(p.latency_ms for p in done):.1f}"
    aliases = [p.alias for p in done if p.alias]
    if aliases:
        headers["x-mint-alias"] = aliases[0]
    return headers


def usage(done: list[InferCompleted]) -> dict[str, Any]:
    """One answer per prompt: its prompt tokens counted once (its choices share the prefill),
    its completion tokens summed over its choices (the engine's ``completion_tokens``)."""
    prompt = sum(p.prompt_tokens for p in done)
    completion = sum(p.completion_tokens for p in done)
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
    }


def finish(c: InferChoice) -> str:
    return "stop" if c.finish_reason == "stop" else "length"


def token_text(ask: Ask) -> TokenText:
    return TokenText(bool(ask.req.return_tokens_as_token_ids), ask.tokenizer)


# ---------------------------------------------------------------------- chat


def chat_logprobs(ask: Ask, c: InferChoice) -> dict[str, Any] | None:
    if ask.top is None:
        return None
    return {"content": chat_content(sampled(c), ask.top, token_text(ask))}


def chat_message(ask: Ask, c: InferChoice, streamed: bool = False) -> tuple[dict[str, Any], str]:
    """(the message, its finish_reason) of a chat choice, tool calls read as vLLM reads them
    (``streamed``: as its streaming path assembles them)."""
    assert isinstance(ask.req, ChatRequest)
    answer = read_answer(ask.req, c.text, ask.tools, streamed)
    content = answer.content
    if ask.echo_prefix:
        content = ask.echo_prefix + (content or "")
    message: dict[str, Any] = {
        "role": ask.role,
        "content": content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": None,
    }
    if answer.tool_calls:
        message["tool_calls"] = answer.tool_calls
    # vLLM: "tool_calls" for auto calls made, and for required when the answer stopped; a
    # stream: for calls made under any choice but a named one, when the answer stopped
    choice = ask.req.tool_choice
    if streamed:
        called = bool(answer.tool_calls) and c.finish_reason == "stop" and not named(ask.req)
    elif choice == "required":
        called = c.finish_reason == "stop"
    else:
        called = choice in ("auto", None) and bool(answer.tool_calls)
    return message, "tool_calls" if called else finish(c)


def _chat_choice(ask: Ask, i: int, c: InferChoice) -> dict[str, Any]:
    message, reason = chat_message(ask, c)
    return {
        "index": i,
        "message": message,
        "logprobs": chat_logprobs(ask, c),
        "finish_reason": reason,
        "stop_reason": c.stop_reason,
        "token_ids": list(c.token_ids) if ask.req.return_token_ids else None,
    }


# ---------------------------------------------------------------------- completions


def completion_choice_logprobs(
    ask: Ask, k: int, p: InferCompleted, c: InferChoice
) -> dict[str, Any] | None:
    """A completion choice's logprobs; with echo, the prompt's first (vLLM lists the prompt's
    tokens before the answer's, the first without a logprob)."""
    if ask.req.logprobs is None:
        return None
    text = token_text(ask)
    tokens: list[Any] = sampled(c)
    ids = list(c.token_ids)
    if ask.req.echo:
        prompt_ids = list(p.prompt_token_ids or [])
        prompt = list(p.prompt_logprobs or [None] * len(prompt_ids))
        if ask.echo_only:
            tokens, ids = prompt, prompt_ids
        else:
            tokens, ids = [*prompt, *tokens], [*prompt_ids, *ids]
    return completion_logprobs(tokens, ids, ask.req.logprobs, text)


def completion_text(ask: Ask, k: int, c: InferChoice) -> str:
    if not ask.req.echo:
        return c.text
    prompt = ask.prompt_texts[k] if k < len(ask.prompt_texts) else ""
    return prompt if ask.echo_only else prompt + c.text


def _completion_choice(
    ask: Ask, k: int, i: int, p: InferCompleted, c: InferChoice
) -> dict[str, Any]:
    assert isinstance(ask.req, CompletionRequest)
    return {
        "index": i,
        "text": completion_text(ask, k, c),
        "logprobs": completion_choice_logprobs(ask, k, p, c),
        "finish_reason": finish(c),
        "stop_reason": c.stop_reason,
        "token_ids": list(c.token_ids) if ask.req.return_token_ids else None,
        "prompt_logprobs": prompt_logprobs_body(p.prompt_logprobs),
        "prompt_token_ids": p.prompt_token_ids if ask.req.return_token_ids else None,
    }


def response(ask: Ask, rid: str, created: int, model: str, done: list[InferCompleted]) -> dict:
    """The whole answer: a ``chat.completion`` or a ``text_completion`` (``done``: one answer
    per prompt, ``n`` choices each)."""
    body: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion" if ask.chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [],
        "service_tier": None,
        "system_fingerprint": fingerprint(done),
        "usage": usage(done),
    }
    i = 0
    for k, p in enumerate(done):
        for c in check_choices(p, ask.n):
            if ask.chat:
                body["choices"].append(_chat_choice(ask, i, c))
            else:
                body["choices"].append(_completion_choice(ask, k, i, p, c))
            i += 1
    if ask.chat:
        p = done[0]
        body["prompt_logprobs"] = prompt_logprobs_body(p.prompt_logprobs)
        body["prompt_token_ids"] = p.prompt_token_ids if ask.req.return_token_ids else None
    return body
