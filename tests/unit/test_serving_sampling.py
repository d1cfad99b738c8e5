"""A request's vLLM settings (InferRequested.sampling) as the engine builds them: vLLM's own
SamplingParams and StructuredOutputsParams, its refusals as the request's own, the prompt cut
as vLLM serve cuts it, and logprobs with token strings and bytes (vLLM itself is not started:
these are its parameter classes; the e2e serving tests run the engine)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from schemas.events.sampling import SamplingOptions, StructuredOutput
from workers.serving.admission import truncate
from workers.serving.exceptions import RequestRefused
from workers.serving.generation import GenRequest, token_logprob
from workers.serving.sampling import sampling_params

pytestmark = pytest.mark.unit


def test_every_setting_reaches_vllms_sampling_params() -> None:
    opts = SamplingOptions(
        top_k=5,
        min_p=0.1,
        presence_penalty=0.5,
        frequency_penalty=0.25,
        repetition_penalty=1.2,
        logit_bias={"7": 2.0},
        min_tokens=3,
        ignore_eos=True,
        stop_token_ids=[2],
        include_stop_str_in_output=True,
        skip_special_tokens=False,
        bad_words=["bad"],
        allowed_token_ids=[1, 2, 3],
        top_logprobs=4,
        prompt_logprobs=1,
        structured=StructuredOutput(regex="[0-9]+"),
    )
    p = sampling_params(GenRequest("hi", 8, 0.7, seed=1, n=2, logprobs=True, options=opts))
    assert (p.top_k, p.min_p, p.min_tokens, p.ignore_eos) == (5, 0.1, 3, True)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.5, 0.25, 1.2)
    assert p.logit_bias == {7: 2.0} and p.stop_token_ids == [2] and p.bad_words == ["bad"]
    assert p.include_stop_str_in_output and not p.skip_special_tokens
    assert p.allowed_token_ids == [1, 2, 3]
    assert (p.logprobs, p.prompt_logprobs, p.n, p.seed) == (4, 1, 2, 1)
    assert p.structured_outputs.regex == "[0-9]+"


def test_without_options_the_request_runs_as_before() -> None:
    p = sampling_params(GenRequest("hi", 8, 0.0, logprobs=True))
    assert p.logprobs == 0 and p.structured_outputs is None and p.top_k in (0, -1)
    assert sampling_params(GenRequest("hi", 8)).logprobs is None


@pytest.mark.parametrize(
    ("opts", "words"),
    [
        (SamplingOptions(top_k=-5), "top_k"),
        (SamplingOptions(repetition_penalty=0.0), "repetition_penalty"),
        (SamplingOptions(min_p=1.5), "min_p"),
        (SamplingOptions(presence_penalty=5.0), "presence_penalty"),
        (
            SamplingOptions(structured=StructuredOutput(structural_tag='{"a": 1}')),
            "Invalid structured_outputs structural_tag specification",
        ),
    ],
)
def test_what_vllm_refuses_is_the_requests_refusal_with_vllms_words(opts, words) -> None:
    with pytest.raises(RequestRefused, match=words) as e:
        sampling_params(GenRequest("hi", 8, options=opts))
    assert e.value.code == "invalid_value"


def test_a_structural_tag_reaches_vllm_as_json_text() -> None:
    tag = '{"type": "structural_tag", "format": {"type": "const_string", "value": "Paris"}}'
    opts = SamplingOptions(structured=StructuredOutput(structural_tag=tag))
    assert (
        sampling_params(GenRequest("hi", 8, options=opts)).structured_outputs.structural_tag == tag
    )


def test_a_structured_output_names_exactly_one_kind() -> None:
    with pytest.raises(ValueError, match="exactly one of"):
        StructuredOutput(regex="a", choice=["a"])
    with pytest.raises(ValueError, match="exactly one of"):
        StructuredOutput()
    with pytest.raises(ValueError, match="bytes serialized"):
        StructuredOutput(json_schema={"enum": ["x" * 70_000]})


def test_prompts_are_cut_on_the_left_as_vllm_serve_cuts_them() -> None:
    ids = list(range(10))
    assert truncate(ids, None, 32) == ids
    assert truncate(ids, 3, 32) == [7, 8, 9]
    assert truncate(ids, -1, 4) == [6, 7, 8, 9]  # -1: the model's context
    assert truncate(ids, 20, 32) == ids
    with pytest.raises(RequestRefused, match="cannot be greater than max_model_len = 32"):
        truncate(ids, 33, 32)


def test_a_tokens_logprobs_carry_strings_bytes_and_ranked_alternatives() -> None:
    def lp(value: float, rank: int, text: str | None):
        return SimpleNamespace(logprob=value, rank=rank, decoded_token=text)

    got = token_logprob(
        5, {9: lp(-0.1, 1, "é"), 5: lp(-2.5, 2, "a"), 3: lp(float("-inf"), 3, None)}, 2
    )
    assert (got.token_id, got.token, got.logprob, got.bytes) == (5, "a", -2.5, [97])
    assert [t.token_id for t in got.top] == [9, 5] and got.top[0].bytes == [195, 169]
    worst = token_logprob(3, {3: lp(float("-inf"), 1, None)}, 1)
    assert worst.logprob == -9999.0 and worst.token == ""
