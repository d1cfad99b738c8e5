"""A request's sampling settings as vLLM takes them (``SamplingParams`` with
``StructuredOutputsParams``).

Built once at admission, so that a value vLLM refuses is that request's refusal (stage
``validate``, vLLM's own message) before it is submitted, and again when it runs. Compiled
grammars (JSON schema, regex, choice, EBNF) are reused across requests by vLLM's xgrammar
backend (its compiler cache is on), so a schema sent again is not compiled again.
"""

from __future__ import annotations

from typing import Any

from schemas.events.sampling import SamplingOptions
from workers.serving.exceptions import RequestRefused
from workers.serving.generation import GenRequest

INVALID_VALUE = "invalid_value"


def sampling_params(r: GenRequest, *, delta: bool = True):
    """vLLM's SamplingParams for ``r``; RequestRefused (``invalid_value``) with vLLM's message
    for what it refuses."""
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    o = r.options or SamplingOptions()
    extra: dict[str, Any] = {
        k: v
        for k, v in {
            "top_k": o.top_k,
            "min_p": o.min_p,
            "presence_penalty": o.presence_penalty,
            "frequency_penalty": o.frequency_penalty,
            "repetition_penalty": o.repetition_penalty,
            "logit_bias": o.logit_bias,
            "min_tokens": o.min_tokens,
            "ignore_eos": o.ignore_eos,
            "stop_token_ids": o.stop_token_ids,
            "include_stop_str_in_output": o.include_stop_str_in_output,
            "skip_special_tokens": o.skip_special_tokens,
            "bad_words": o.bad_words,
            "allowed_token_ids": o.allowed_token_ids,
            "prompt_logprobs": o.prompt_logprobs,
        }.items()
        if v is not None
    }
    if o.structured is not None:
        s = o.structured
        extra["structured_outputs"] = StructuredOutputsParams(
            json=s.json_schema,
            json_object=s.json_object or None,
            regex=s.regex,
            choice=list(s.choice) if s.choice else None,
            grammar=s.grammar,
            structural_tag=s.structural_tag,
            disable_any_whitespace=s.disable_any_whitespace,
        )
    # logprobs: 0 is the sampled token's own; k adds k alternatives (vLLM's max_logprobs: 20)
    logprobs = (o.top_logprobs or 0) if r.logprobs or o.top_logprobs else None
    try:
        if o.structured is not None and o.structured.structural_tag is not None:
            # vllm serve checks a tag before the engine, where a bad one fails the generation
            from vllm.entrypoints.generate.base.protocol import validate_structural_tag_payload

            validate_structural_tag_payload(
                o.structured.structural_tag, parameter="structured_outputs"
            )
        return SamplingParams(
            n=r.n,
            temperature=r.temperature,
            top_p=r.top_p,
            max_tokens=r.max_tokens,
            seed=r.seed,
            stop=list(r.stop) or None,
            logprobs=logprobs,
            output_kind=RequestOutputKind.DELTA if delta else RequestOutputKind.FINAL_ONLY,
            **extra,
        )
    except (ValueError, TypeError, VLLMValidationError) as e:  # vLLM's own validation
        raise RequestRefused(str(e), code=INVALID_VALUE) from e


def wants_token_logprobs(r: GenRequest) -> bool:
    """Does the answer carry tokens with strings and alternatives (``token_logprobs``)?"""
    return r.options is not None and r.options.top_logprobs is not None
