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

from gateway.errors import EngineFailed, ModelNotFound, Unavailable
from gateway.refs import ModelRef
from schemas.envelope import Envelope
from schemas.events import InferCompleted, InferFailed


def check_answers(answers: list[Envelope[Any]], model: str, retry_after_s: int) -> list[Any]:
    """The InferCompleted payloads, or the error of the first failed answer."""
    for env in answers:
        p = env.payload
        if not isinstance(p, InferFailed):
            continue
        if p.stage == "resolve":  # the same answer as a model of another tenant: no oracle
            raise ModelNotFound(model)
        if p.stage == "load":
            if p.retryable:
                raise Unavailable("the model's adapter could not be loaded yet; retry shortly",
                                  headers={"Retry-After": str(retry_after_s)})  # fmt: skip
            raise EngineFailed(f"the adapter of model '{model}' could not be loaded by the "
                               "engine; tell the operators (they have its error)")  # fmt: skip
        if p.stage == "expired":  # the engines were too busy to reach it within the timeout
            raise Unavailable("no engine answered in time; the engines may be overloaded: retry "
                              "later", headers={"Retry-After": str(retry_after_s)})  # fmt: skip
        raise EngineFailed(f"the engine failed to generate: {p.error[:500]}")
    return [env.payload for env in answers]


def fingerprint(done: list[InferCompleted]) -> str:
    return ",".join(dict.fromkeys(p.adapter_digest for p in done))


def revision_headers(done: list[InferCompleted], ref: ModelRef) -> dict[str, str]:
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
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}  # fmt: skip


def _token(t: int) -> str:
    return f"token_id:{t}"


def _chat_logprobs(p: InferCompleted) -> dict[str, Any] | None:
    if p.logprobs is None:
        return None
    return {"content": [{"token": _token(t), "logprob": lp, "bytes": None, "top_logprobs": []}
                        for t, lp in zip(p.token_ids, p.logprobs, strict=False)]}  # fmt: skip


def _completion_logprobs(p: InferCompleted) -> dict[str, Any] | None:
    if p.logprobs is None:
        return None
    return {"tokens": [_token(t) for t in p.token_ids], "token_logprobs": list(p.logprobs),
            "top_logprobs": None, "text_offset": None}  # fmt: skip


def _finish(p: InferCompleted) -> str:
    return "stop" if p.finish_reason == "stop" else "length"


def chat_completion(rid: str, created: int, model: str, done: list[InferCompleted],
                    per_prompt: int) -> dict[str, Any]:  # fmt: skip
    return {
        "id": rid, "object": "chat.completion", "created": created, "model": model,
        "system_fingerprint": fingerprint(done),
        "choices": [{"index": i, "message": {"role": "assistant", "content": p.text},
                     "logprobs": _chat_logprobs(p), "finish_reason": _finish(p)}
                    for i, p in enumerate(done)],
        "usage": usage(done, per_prompt),
    }  # fmt: skip


def completion(rid: str, created: int, model: str, done: list[InferCompleted],
               per_prompt: int) -> dict[str, Any]:  # fmt: skip
    return {
        "id": rid, "object": "text_completion", "created": created, "model": model,
        "system_fingerprint": fingerprint(done),
        "choices": [{"index": i, "text": p.text, "logprobs": _completion_logprobs(p),
                     "finish_reason": _finish(p)} for i, p in enumerate(done)],
        "usage": usage(done, per_prompt),
    }  # fmt: skip


def chat_chunks(rid: str, created: int, model: str, done: list[InferCompleted], per_prompt: int,
                include_usage: bool) -> list[dict[str, Any]]:  # fmt: skip
    head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "system_fingerprint": fingerprint(done)}  # fmt: skip
    out = []
    for i, p in enumerate(done):
        out.append({**head, "choices": [{"index": i, "delta": {"role": "assistant",
                                                                "content": p.text},
                                         "logprobs": _chat_logprobs(p), "finish_reason": None}]})  # fmt: skip
        out.append({**head, "choices": [{"index": i, "delta": {}, "logprobs": None,
                                         "finish_reason": _finish(p)}]})  # fmt: skip
    if include_usage:
        out.append({**head, "choices": [], "usage": usage(done, per_prompt)})
    return out


def completion_chunks(rid: str, created: int, model: str, done: list[InferCompleted],
                      per_prompt: int, include_usage: bool) -> list[dict[str, Any]]:  # fmt: skip
    head = {"id": rid, "object": "text_completion", "created": created, "model": model,
            "system_fingerprint": fingerprint(done)}  # fmt: skip
    out = []
    for i, p in enumerate(done):
        out.append({**head, "choices": [{"index": i, "text": p.text,
                                         "logprobs": _completion_logprobs(p),
                                         "finish_reason": None}]})  # fmt: skip
        out.append({**head, "choices": [{"index": i, "text": "", "logprobs": None,
                                         "finish_reason": _finish(p)}]})  # fmt: skip
    if include_usage:
        out.append({**head, "choices": [], "usage": usage(done, per_prompt)})
    return out
