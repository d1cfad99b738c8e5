"""Engine answers → OpenAI response bodies (streams: gateway.streaming, from these parts).

One ``infer.completed`` answers one prompt with its ``n`` choices (``choices``; with n = 1 the
top-level fields are the one choice); the response lists prompt k's choice j at index
``k * n + j``, as OpenAI does. ``system_fingerprint`` is the adapter digest that answered (the
revision's identity), so a caller sees an alias move take effect; the ``x-mint-*`` headers say
the same in words. Token strings are not returned by the engine: logprobs name tokens as
``token_id:<id>`` (vLLM's ``return_tokens_as_token_ids`` form).
"""

from __future__ import annotations

from typing import Any

from catalog.refs import Ref
from gateway.errors import ApiError, BadRequest, EngineFailed, ModelNotFound, Unavailable
from schemas.envelope import Envelope
from schemas.events import InferChoice, InferCompleted, InferFailed


def check_answers(
    answers: list[Envelope[Any]], model: str, retry_after_s: int, prompt_param: str | None = None
) -> list[Any]:
    """The InferCompleted payloads, or the error of the first failed answer (``prompt_param``:
    the body field that held the prompt, ``messages`` or ``prompt``)."""
    for env in answers:
        p = env.payload
        if isinstance(p, InferFailed):
            raise failure_error(
                p.stage,
                p.error,
                model=model,
                retryable=p.retryable,
                code=p.code,
                retry_after_s=retry_after_s,
                prompt_param=prompt_param,
            )
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
    """The HTTP error of an engine's ``infer.failed`` answer (its stage, error text and code)."""
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


def usage(done: list[InferCompleted]) -> dict[str, int]:
    """One answer per prompt: its prompt tokens counted once (its choices share the prefill),
    its completion tokens summed over its choices (the engine's ``completion_tokens``)."""
    prompt = sum(p.prompt_tokens for p in done)
    completion = sum(p.completion_tokens for p in done)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _token(t: int) -> str:
    return f"token_id:{t}"


def chat_logprobs(p: InferChoice) -> dict[str, Any] | None:
    if p.logprobs is None:
        return None
    return {
        "content": [
            {"token": _token(t), "logprob": lp, "bytes": None, "top_logprobs": []}
            for t, lp in zip(p.token_ids, p.logprobs, strict=False)
        ]
    }


def completion_logprobs(p: InferChoice) -> dict[str, Any] | None:
    if p.logprobs is None:
        return None
    return {
        "tokens": [_token(t) for t in p.token_ids],
        "token_logprobs": list(p.logprobs),
        "top_logprobs": None,
        "text_offset": None,
    }


def finish(p: InferChoice) -> str:
    return "stop" if p.finish_reason == "stop" else "length"


def _choice(chat: bool, i: int, c: InferChoice) -> dict[str, Any]:
    if chat:
        body = {"message": {"role": "assistant", "content": c.text}, "logprobs": chat_logprobs(c)}
    else:
        body = {"text": c.text, "logprobs": completion_logprobs(c)}
    return {"index": i, **body, "finish_reason": finish(c)}


def response(
    chat: bool, rid: str, created: int, model: str, done: list[InferCompleted], n: int
) -> dict[str, Any]:
    """The whole answer: a ``chat.completion`` or a ``text_completion`` (``done``: one answer
    per prompt, ``n`` choices each)."""
    choices = [c for p in done for c in check_choices(p, n)]
    return {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint(done),
        "choices": [_choice(chat, i, c) for i, c in enumerate(choices)],
        "usage": usage(done),
    }
