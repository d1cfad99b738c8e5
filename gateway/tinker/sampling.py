"""Sampling for the Tinker SDK on MinT's engines: a ``SampleRequest`` as ``infer.requested``
commands (token prompts, gateway.service.Gateway.run), their answers as a ``SampleResponse``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gateway.config import GatewayConfig
from gateway.tinker import steps
from gateway.tinker.bodies import SampleRequest
from gateway.tinker.wire import WireSequence, encode_sample_response
from schemas.events import InferCompleted, InferRequested

DEFAULT_SAMPLE_TOKENS = 64


def infer_requests(
    req: SampleRequest, revision: int, request_id: str, config: GatewayConfig
) -> list[InferRequested]:
    """One ``infer.requested`` per sample: the prompt as token ids, the revision pinned, the
    sampled tokens' logprobs asked for; what MinT's engines cannot do is a BadRequest. The
    OpenAI routes' limits hold here too (``num_samples`` counts as ``n``), and each request
    expires when the gateway stops waiting for it, so engines skip what nobody will read."""
    max_tokens = config.max_tokens
    if req.num_samples > config.max_choices:
        raise steps.bad(
            f"num_samples {req.num_samples} is over this gateway's limit of "
            f"{config.max_choices} samples per call: split it over several calls",
            "num_samples",
            "limit_exceeded",
        )
    unsupported = [
        name
        for name, on in (
            ("prompt_logprobs", bool(req.prompt_logprobs)),
            ("topk_prompt_logprobs", req.topk_prompt_logprobs > 0),
            ("topk_sample_logprobs", req.topk_sample_logprobs > 0),
            ("prompt_alt_tokens_k", req.prompt_alt_tokens_k > 0),
            ("sampling_params.top_k", req.sampling_params.top_k not in (-1, 0)),
        )
        if on
    ]
    if unsupported:
        raise steps.bad(
            f"{', '.join(unsupported)}: not supported by MinT's sampler",
            unsupported[0],
            "unsupported_parameter",
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
    stop = [sp.stop] if isinstance(sp.stop, str) else list(sp.stop or [])
    if any(isinstance(s, int) for s in stop):
        raise steps.bad(
            "sampling_params.stop: stop token ids are not supported by MinT; pass strings",
            "sampling_params.stop",
            "unsupported_parameter",
        )
    expires_at = datetime.now(UTC) + timedelta(seconds=config.answer_timeout_s)
    payloads = []
    for i in range(req.num_samples):
        payloads.append(
            steps.checked(
                InferRequested,
                request_id=f"{request_id}.{i}",
                revision=revision,
                prompt=f"<{len(tokens)} tokens>",
                prompt_token_ids=tokens,
                max_tokens=sp.max_tokens or min(DEFAULT_SAMPLE_TOKENS, max_tokens),
                temperature=sp.temperature,
                top_p=sp.top_p,
                seed=None if sp.seed is None else sp.seed + i,
                stop=stop,
                logprobs=True,
                expires_at=expires_at,
            )
        )
    return payloads


def sample_response(done: list[InferCompleted]) -> bytes:
    """The engines' answers as the SDK's protobuf ``SampleResponse`` (one sequence each)."""
    return encode_sample_response(
        [
            WireSequence(
                "length" if p.finish_reason == "length" else "stop", p.token_ids, p.logprobs
            )
            for p in done
        ]
    )


def sample_context(payloads: list[InferRequested], policy: str, revision: int) -> dict:
    """What another instance needs to run this sample again (kept in its future's row): the
    first request (the others differ only in id and seed) and the seeds."""
    return {
        "policy": policy,
        "revision": revision,
        "payload": payloads[0].model_dump(mode="json"),
        "seeds": [p.seed for p in payloads],
    }


def payloads_from(context: dict, request_id: str, answer_timeout_s: float) -> list[InferRequested]:
    """The sample of ``sample_context`` again, under this instance's ``request_id`` (engines
    answer to the instance whose id the requests carry) and a fresh expiry."""
    first = InferRequested.model_validate(context["payload"])
    expires_at = datetime.now(UTC) + timedelta(seconds=answer_timeout_s)
    return [
        first.model_copy(
            update={"request_id": f"{request_id}.{i}", "seed": seed, "expires_at": expires_at}
        )
        for i, seed in enumerate(context["seeds"])
    ]
