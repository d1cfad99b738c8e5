"""Engine answers → OpenAI response bodies and stream chunks.

The engine answers whole completions, so a stream is made after generation: per choice one chunk
with the role and the whole text, then one with its finish reason, then (with
``stream_options.include_usage``) a usage chunk, then ``[DONE]``. ``system_fingerprint`` is the
adapter digest that answered (the revision's identity), so a caller sees an alias move take
effect; the ``x-mint-*`` headers say the same in words. Token strings are not returned by the
engine: logprobs name tokens as ``token_id:<id>`` (vLLM's ``return_tokens_as_token_ids`` form).
"""

from __future__ import annotations

from typing import Any

from catalog.refs import Ref
from gateway.errors import ApiError, BadRequest, EngineFailed, ModelNotFound, Unavailable
from schemas.envelope import Envelope
from schemas.events import InferCompleted, InferFailed


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


def usage(done: list[InferCompleted], per_prompt: int) -> dict[str, int]:
    """Prompt tokens once per prompt (its ``per_prompt`` choices share it), completions summed."""
    prompt = sum(p.prompt_tokens for p in done[::per_prompt])
    completion = sum(p.completion_tokens for p in done)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _token(t: int) -> str:
    return f"token_id:{t}"


def _chat_logprobs(p: InferCompleted) -> dict[str, Any] | None:
    if p.logprobs is None:
        return None
    return {
        "content": [
            {"token": _token(t), "logprob": lp, "bytes": None, "top_logprobs": []}
            for t, lp in zip(p.token_ids, p.logprobs, strict=False)
        ]
    }


def _completion_logprobs(p: InferCompleted) -> dict[str, Any] | None:
    if p.logprobs is None:
        return None
    return {
        "tokens": [_token(t) for t in p.token_ids],
        "token_logprobs": list(p.logprobs),
        "top_logprobs": None,
        "text_offset": None,
    }


def _finish(p: InferCompleted) -> str:
    return "stop" if p.finish_reason == "stop" else "length"


def _choice(chat: bool, i: int, p: InferCompleted) -> dict[str, Any]:
    if chat:
        body = {"message": {"role": "assistant", "content": p.text}, "logprobs": _chat_logprobs(p)}
    else:
        body = {"text": p.text, "logprobs": _completion_logprobs(p)}
    return {"index": i, **body, "finish_reason": _finish(p)}


def response(
    chat: bool, rid: str, created: int, model: str, done: list[InferCompleted], per_prompt: int
) -> dict[str, Any]:
    """The whole answer: a ``chat.completion`` or a ``text_completion``."""
    return {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint(done),
        "choices": [_choice(chat, i, p) for i, p in enumerate(done)],
        "usage": usage(done, per_prompt),
    }


def stream_chunks(
    chat: bool,
    rid: str,
    created: int,
    model: str,
    done: list[InferCompleted],
    per_prompt: int,
    include_usage: bool,
) -> list[dict[str, Any]]:
    """The chunks of a chat (``chat``) or completion stream: per choice one with its text, then
    one with its finish reason. The two streams differ only in the object name and in how a
    choice's text is put (``delta`` or ``text``), so one function makes both."""
    head = {
        "id": rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint(done),
    }
    out = []
    for i, p in enumerate(done):
        if chat:
            body = {
                "delta": {"role": "assistant", "content": p.text},
                "logprobs": _chat_logprobs(p),
            }
            end: dict[str, Any] = {"delta": {}}
        else:
            body = {"text": p.text, "logprobs": _completion_logprobs(p)}
            end = {"text": ""}
        out.append({**head, "choices": [{"index": i, **body, "finish_reason": None}]})
        out.append(
            {
                **head,
                "choices": [{"index": i, **end, "logprobs": None, "finish_reason": _finish(p)}],
            }
        )
    if include_usage:
        out.append({**head, "choices": [], "usage": usage(done, per_prompt)})
    return out
