"""Sampling for the Tinker SDK on MinT's engines: a ``SampleRequest`` as ``infer.requested``
commands (token prompts, gateway.service.Gateway.run), their answers as a ``SampleResponse``.

Tinker's options map onto vLLM's (``InferRequested.sampling``): ``sampling_params.top_k`` is
vLLM's top_k, integer ``stop`` entries are its stop_token_ids (``stop=[]`` turns EOS off, as
Tinker documents), ``topk_sample_logprobs`` is its logprobs=k and ``prompt_logprobs`` /
``topk_prompt_logprobs`` its prompt_logprobs (asked of the first sample's request only: the
prompt is the same for all). What to hand back (:class:`Answer`) travels in the future's row
with the requests, so another instance that runs the sample again answers the same shape.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from gateway.config import GatewayConfig
from gateway.tinker import steps
from gateway.tinker.bodies import SampleRequest
from gateway.tinker.wire import TopK, WireSequence, encode_sample_response
from schemas.events import InferCompleted, InferRequested
from schemas.events.sampling import SamplingOptions, TokenLogprob

DEFAULT_SAMPLE_TOKENS = 64
MAX_TOPK = 20  # vLLM's max_logprobs (the engines run its default): alternatives per position
MAX_STOP_TOKEN_IDS = 256  # InferRequested.sampling.stop_token_ids
INT32 = 2**31
# Logprob entries one engine answer may carry: each is about 100 bytes of JSON (id, string,
# UTF-8 bytes, logprob; up to 120 for CJK tokens), and an answer must fit Kafka's 1 MiB record.
# vLLM's answer holds a prompt position's own token and its k alternatives plus the token again
# (k + 2 entries), and a sampled position's token and its k alternatives (k + 1).
MAX_LOGPROB_ENTRIES = 6144


@dataclass(frozen=True)
class Answer:
    """What the caller asked to get back beyond tokens and their logprobs."""

    prompt_logprobs: bool = False
    topk_prompt: int = 0
    topk_sample: int = 0
    last_n: int | None = None  # prompt_logprobs_last_n

    @property
    def prompt_k(self) -> int | None:
        """vLLM's prompt_logprobs for this answer (None: none asked)."""
        return self.topk_prompt if self.prompt_logprobs or self.topk_prompt else None


def _k(value: int, name: str) -> int:
    if value < 0:
        raise steps.bad(
            f"{name} {value} is negative: pass 0 (none) or a k of 1 to {MAX_TOPK}", name
        )
    if value > MAX_TOPK:
        raise steps.bad(
            f"{name} {value} is over this deployment's limit of {MAX_TOPK} (vLLM's max_logprobs)",
            name,
            "limit_exceeded",
        )
    return value


def answer_of(req: SampleRequest, prompt_len: int, max_tokens: int) -> Answer:
    """The logprobs ``req`` asks for, checked (BadRequest naming the field otherwise)."""
    if req.target_prompt_logprobs is not None:
        raise steps.bad(
            "target_prompt_logprobs: not supported by MinT's sampler; ask "
            f"topk_prompt_logprobs (up to {MAX_TOPK} alternatives per prompt position) instead",
            "target_prompt_logprobs",
            "unsupported_parameter",
        )
    if req.prompt_alt_tokens_k < 0:
        raise steps.bad(
            f"prompt_alt_tokens_k {req.prompt_alt_tokens_k} is negative", "prompt_alt_tokens_k"
        )
    if req.prompt_alt_tokens_k > 0:
        raise steps.bad(
            "prompt_alt_tokens_k: not supported by MinT's sampler: vLLM scores prompt "
            "positions (prompt_logprobs, topk_prompt_logprobs) but draws no tokens at them",
            "prompt_alt_tokens_k",
            "unsupported_parameter",
        )
    answer = Answer(
        prompt_logprobs=bool(req.prompt_logprobs),
        topk_prompt=_k(req.topk_prompt_logprobs, "topk_prompt_logprobs"),
        topk_sample=_k(req.topk_sample_logprobs, "topk_sample_logprobs"),
        last_n=req.prompt_logprobs_last_n,
    )
    if answer.last_n is not None:
        if not answer.prompt_logprobs:
            raise steps.bad(
                "prompt_logprobs_last_n applies to prompt logprobs: set prompt_logprobs "
                "(include_prompt_logprobs=True)",
                "prompt_logprobs_last_n",
            )
        if not 1 <= answer.last_n <= prompt_len - 1:
            raise steps.bad(
                f"prompt_logprobs_last_n {answer.last_n} is not between 1 and "
                f"len(prompt) - 1 = {prompt_len - 1}",
                "prompt_logprobs_last_n",
            )
    in_prompt = prompt_len * (answer.topk_prompt + 2) if answer.prompt_k is not None else 0
    sampled = max_tokens * (answer.topk_sample + 1) if answer.topk_sample else 0
    if in_prompt + sampled > MAX_LOGPROB_ENTRIES:
        if in_prompt < sampled:
            field = "topk_sample_logprobs"
        else:
            field = "topk_prompt_logprobs" if answer.topk_prompt else "prompt_logprobs"
        raise steps.bad(
            f"{field}: {prompt_len} prompt positions with {answer.topk_prompt} alternatives "
            f"and {max_tokens} sampled with {answer.topk_sample} are {in_prompt + sampled} "
            f"logprob entries, over this gateway's limit of {MAX_LOGPROB_ENTRIES} per sample "
            "(an answer must fit one Kafka record): ask a smaller k, fewer max_tokens or a "
            "shorter prompt",
            field,
            "limit_exceeded",
        )
    return answer


def _stops(req: SampleRequest) -> tuple[list[str], list[int] | None, bool]:
    """``sampling_params.stop`` as (stop strings, stop token ids, ignore EOS)."""
    stop = req.sampling_params.stop
    items = [stop] if isinstance(stop, str) else list(stop or [])
    ids = [s for s in items if isinstance(s, int)]  # (the body takes one kind or the other)
    if not ids:
        return [str(s) for s in items], None, stop is not None and not items
    bad = [i for i in ids if not 0 <= i < INT32]
    if bad:
        raise steps.bad(
            f"sampling_params.stop: {bad[0]} is not a token id (0 or more)",
            "sampling_params.stop",
        )
    if len(ids) > MAX_STOP_TOKEN_IDS:
        raise steps.bad(
            f"sampling_params.stop has {len(ids)} token ids; at most {MAX_STOP_TOKEN_IDS}",
            "sampling_params.stop",
            "limit_exceeded",
        )
    return [], ids, False


def _top_k(value: int) -> int | None:
    if value in (-1, 0):
        return None
    if not 1 <= value < INT32:
        raise steps.bad(
            f"sampling_params.top_k {value}: pass -1 (no limit) or a k of 1 or more",
            "sampling_params.top_k",
        )
    return value


def plan(
    req: SampleRequest, policy: str, revision: int, request_id: str, config: GatewayConfig
) -> tuple[list[InferRequested], dict[str, Any]]:
    """The sample's requests (:func:`infer_requests`) and its context (:func:`sample_context`)."""
    payloads, answer = _requests(req, revision, request_id, config)
    return payloads, sample_context(payloads, policy, revision, answer)


def infer_requests(
    req: SampleRequest, revision: int, request_id: str, config: GatewayConfig
) -> list[InferRequested]:
    """One ``infer.requested`` per sample: the prompt as token ids, the revision pinned, the
    sampled tokens' logprobs asked for; what MinT's engines cannot do is a BadRequest. The
    OpenAI routes' limits hold here too (``num_samples`` counts as ``n``), and each request
    expires when the gateway stops waiting for it, so engines skip what nobody will read."""
    return _requests(req, revision, request_id, config)[0]


def _requests(
    req: SampleRequest, revision: int, request_id: str, config: GatewayConfig
) -> tuple[list[InferRequested], Answer]:
    max_tokens = config.max_tokens
    if req.num_samples > config.max_choices:
        raise steps.bad(
            f"num_samples {req.num_samples} is over this gateway's limit of "
            f"{config.max_choices} samples per call: split it over several calls",
            "num_samples",
            "limit_exceeded",
        )
    tokens: list[int] = []
    for i, chunk in enumerate(req.prompt.chunks):
        if chunk.type != "encoded_text" or chunk.tokens is None:
            raise steps.bad(
                f"prompt.chunks[{i}] is {chunk.type!r}: MinT samples text (token ids) only",
                "prompt",
            )
        tokens += chunk.tokens
    sp = req.sampling_params
    if sp.max_tokens is not None and sp.max_tokens > max_tokens:
        raise steps.bad(
            f"sampling_params.max_tokens {sp.max_tokens} is over this gateway's limit of "
            f"{max_tokens}",
            "sampling_params.max_tokens",
            "limit_exceeded",
        )
    sample_tokens = sp.max_tokens or min(DEFAULT_SAMPLE_TOKENS, max_tokens)
    answer = answer_of(req, len(tokens), sample_tokens)
    stop, stop_ids, ignore_eos = _stops(req)
    options = {
        "top_k": _top_k(sp.top_k),
        "stop_token_ids": stop_ids,
        "ignore_eos": ignore_eos or None,
        "top_logprobs": answer.topk_sample or None,
    }
    expires_at = datetime.now(UTC) + timedelta(seconds=config.answer_timeout_s)
    payloads = []
    for i in range(req.num_samples):
        prompt_k = answer.prompt_k if i == 0 else None
        asked = {k: v for k, v in {**options, "prompt_logprobs": prompt_k}.items() if v is not None}
        payloads.append(
            steps.checked(
                InferRequested,
                request_id=f"{request_id}.{i}",
                revision=revision,
                prompt=f"<{len(tokens)} tokens>",
                prompt_token_ids=tokens,
                max_tokens=sample_tokens,
                temperature=sp.temperature,
                top_p=sp.top_p,
                seed=None if sp.seed is None else sp.seed + i,
                stop=stop,
                logprobs=True,
                sampling=SamplingOptions(**asked) if asked else None,
                expires_at=expires_at,
            )
        )
    return payloads, answer


def _fit(values: list, length: int, last_n: int | None) -> list:
    """One entry per prompt (or sampled) position: None where vLLM gave none, and before the
    last ``last_n`` positions when only those were asked."""
    values = (values + [None] * length)[:length]
    if last_n is not None:
        values[: length - last_n] = [None] * (length - last_n)
    return values


def _top(p: TokenLogprob | None, k: int) -> list[tuple[int, float]] | None:
    """A position's ``k`` likeliest tokens (``top`` is in vLLM's rank order)."""
    return None if p is None else [(t.token_id, t.logprob) for t in p.top[:k]]


def sample_response(done: list[InferCompleted], answer: Answer | None = None) -> bytes:
    """The engines' answers as the SDK's protobuf ``SampleResponse`` (one sequence each), with
    the prompt's logprobs (None for the first token) and top-k rows when asked."""
    answer = answer or Answer()
    sequences = []
    for p in done:
        topk = None
        if answer.topk_sample:
            rows = [_top(t, answer.topk_sample) for t in p.token_logprobs or []]
            topk = TopK(answer.topk_sample, _fit(rows, len(p.token_ids), None))
        reason = "length" if p.finish_reason == "length" else "stop"
        sequences.append(WireSequence(reason, p.token_ids, p.logprobs, topk))
    prompt, topk_prompt = None, None
    if answer.prompt_k is not None and done:
        first = done[0]
        positions = list(first.prompt_logprobs or [])
        length = first.prompt_tokens
        if answer.prompt_logprobs:
            own = [None if t is None else t.logprob for t in positions]
            prompt = _fit(own, length, answer.last_n)
        if answer.topk_prompt:
            rows = [_top(t, answer.topk_prompt) for t in positions]
            topk_prompt = TopK(answer.topk_prompt, _fit(rows, length, answer.last_n))
    return encode_sample_response(sequences, prompt, topk_prompt)


def sample_context(
    payloads: list[InferRequested], policy: str, revision: int, answer: Answer | None = None
) -> dict:
    """What another instance needs to run this sample again (kept in its future's row): the
    first request (the others differ only in id and seed, and ask no prompt logprobs), the
    seeds and the answer's shape."""
    return {
        "policy": policy,
        "revision": revision,
        "payload": payloads[0].model_dump(mode="json"),
        "seeds": [p.seed for p in payloads],
        "answer": asdict(answer or Answer()),
    }


def answer_from(context: dict[str, Any]) -> Answer:
    """The answer's shape of ``sample_context`` (a row written before it had one: plain)."""
    return Answer(**context.get("answer", {}))


def payloads_from(context: dict, request_id: str, answer_timeout_s: float) -> list[InferRequested]:
    """The sample of ``sample_context`` again, under this instance's ``request_id`` (engines
    answer to the instance whose id the requests carry) and a fresh expiry."""
    first = InferRequested.model_validate(context["payload"])
    expires_at = datetime.now(UTC) + timedelta(seconds=answer_timeout_s)
    rest = first.sampling
    if rest is not None and rest.prompt_logprobs is not None:
        rest = rest.model_copy(update={"prompt_logprobs": None})
    return [
        first.model_copy(
            update={
                "request_id": f"{request_id}.{i}",
                "seed": seed,
                "expires_at": expires_at,
                "sampling": first.sampling if i == 0 else rest,
            }
        )
        for i, seed in enumerate(context["seeds"])
    ]
