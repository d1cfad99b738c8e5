"""Tinker's sampling options on MinT (gateway/tinker/sampling.py): stop token ids, top_k, prompt
logprobs, top-k prompt and sample logprobs mapped onto ``infer.requested`` (vLLM's settings), the
answers encoded as the SDK decodes them (its own protobuf reader), bad values as 400s naming the
field, and a sample run again by another instance asking the same."""

from __future__ import annotations

import math
from types import MethodType

import httpx
import pytest
import tinker
from tinker import types
from tinker.proto.response_conv import deserialize_sample_response

from gateway import GatewayConfig
from gateway.errors import BadRequest
from gateway.tinker import sampling, wire
from gateway.tinker.bodies import SampleRequest
from schemas import make_event
from schemas.events import InferCompleted
from schemas.events.sampling import TokenLogprob, TopLogprob
from tests.unit.test_tinker_api import BASE, FakeEngines, _auth, sdk, world  # noqa: F401

CONFIG = GatewayConfig(instance_id="gw-tk", port=0)
PROMPT = [11, 12, 13, 14]


def body(**fields) -> SampleRequest:
    params = fields.pop("sampling_params", {})
    return SampleRequest.model_validate(
        {
            "prompt": fields.pop("prompt", {"chunks": [{"tokens": PROMPT}]}),
            "sampling_params": {"max_tokens": 8, "seed": 3, **params},
            **fields,
        }
    )


def asked(**fields):
    return sampling.infer_requests(body(**fields), 1, "gw-tk.r1", CONFIG)


# ---------------------------------------------------------------------------- mapping


def test_plain_samples_ask_nothing_new() -> None:
    got = asked(num_samples=2, sampling_params={"stop": ["\n"], "top_k": -1})
    assert [p.sampling for p in got] == [None, None]
    assert [p.stop for p in got] == [["\n"], ["\n"]]
    assert asked(sampling_params={"top_k": 0})[0].sampling is None


def test_stop_token_ids_and_top_k_map_onto_vllms_settings() -> None:
    got = asked(num_samples=2, sampling_params={"stop": [2, 50], "top_k": 5})
    for p in got:
        assert p.stop == [] and p.sampling is not None
        assert (p.sampling.stop_token_ids, p.sampling.top_k) == ([2, 50], 5)
        assert p.sampling.ignore_eos is None and p.sampling.prompt_logprobs is None
    # Tinker: stop=[] disables every stop, EOS too; stop=None keeps EOS
    empty = asked(sampling_params={"stop": []})[0]
    assert empty.stop == [] and empty.sampling is not None and empty.sampling.ignore_eos
    assert asked(sampling_params={"stop": None})[0].sampling is None


def test_logprob_options_map_onto_vllms_and_the_prompt_is_scored_once() -> None:
    got = asked(num_samples=3, prompt_logprobs=True, topk_sample_logprobs=4)
    assert [p.sampling.prompt_logprobs for p in got] == [0, None, None]  # type: ignore[union-attr]
    assert [p.sampling.top_logprobs for p in got] == [4, 4, 4]  # type: ignore[union-attr]
    assert all(p.logprobs for p in got)
    topk = asked(topk_prompt_logprobs=3)[0].sampling
    assert topk is not None and topk.prompt_logprobs == 3 and topk.top_logprobs is None


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        ({"sampling_params": {"top_k": -2}}, "sampling_params.top_k", "-1 \\(no limit\\)"),
        ({"sampling_params": {"stop": [-1]}}, "sampling_params.stop", "not a token id"),
        ({"sampling_params": {"stop": list(range(257))}}, "sampling_params.stop", "at most 256"),
        ({"topk_prompt_logprobs": -1}, "topk_prompt_logprobs", "negative"),
        ({"topk_prompt_logprobs": 21}, "topk_prompt_logprobs", "limit of 20"),
        ({"topk_sample_logprobs": -3}, "topk_sample_logprobs", "negative"),
        ({"topk_sample_logprobs": 99}, "topk_sample_logprobs", "limit of 20"),
        ({"prompt_alt_tokens_k": 2}, "prompt_alt_tokens_k", "draws no tokens"),
        ({"prompt_alt_tokens_k": -2}, "prompt_alt_tokens_k", "negative"),
        ({"target_prompt_logprobs": {"data": [1]}}, "target_prompt_logprobs", "not supported"),
        ({"prompt_logprobs_last_n": 2}, "prompt_logprobs_last_n", "set prompt_logprobs"),
        (
            {"prompt_logprobs": True, "prompt_logprobs_last_n": 4},
            "prompt_logprobs_last_n",
            "between 1 and len\\(prompt\\) - 1 = 3",
        ),
        (
            {"topk_sample_logprobs": 20, "sampling_params": {"max_tokens": 4000}},
            "topk_sample_logprobs",
            "84000 logprob entries, over this gateway's limit of 6144",
        ),
        (
            {"prompt_logprobs": True, "prompt": {"chunks": [{"tokens": [1] * 3073}]}},
            "prompt_logprobs",
            "3073 prompt positions with 0 alternatives",
        ),
        ({"num_samples": 9}, "num_samples", "limit of 8"),
    ],
)
def test_bad_values_are_400s_naming_the_field(fields, param, message) -> None:
    with pytest.raises(BadRequest, match=message) as e:
        asked(**fields)
    assert e.value.param == param and e.value.status == 400


def test_a_sample_run_again_asks_the_same() -> None:
    req = body(
        num_samples=2,
        prompt_logprobs=True,
        topk_prompt_logprobs=2,
        topk_sample_logprobs=3,
        prompt_logprobs_last_n=2,
        sampling_params={"stop": [7], "top_k": 4},
    )
    first, context = sampling.plan(req, "tk0-0", 1, "gw-a.r1", CONFIG)
    again = sampling.payloads_from(context, "gw-b.r9", 60.0)
    assert [p.request_id for p in again] == ["gw-b.r9.0", "gw-b.r9.1"]
    assert [p.sampling for p in again] == [p.sampling for p in first]
    assert [p.seed for p in again] == [3, 4]
    assert sampling.answer_from(context) == sampling.Answer(True, 2, 3, 2)
    # a row written before answers had a shape: a plain one
    assert sampling.answer_from({"payload": {}, "seeds": []}) == sampling.Answer()


# ---------------------------------------------------------------------------- answers


def _lp(token: int, logprob: float, top: list[tuple[int, float]]) -> TokenLogprob:
    alts = [TopLogprob(token_id=t, token=f"t{t}", logprob=v) for t, v in top]
    return TokenLogprob(token_id=token, token=f"t{token}", logprob=logprob, top=alts)


def completed(i: int, **extra) -> InferCompleted:
    return InferCompleted(
        request_id=f"gw-tk.r1.{i}",
        revision=1,
        adapter_digest="sha256:" + "1" * 64,
        engine_id="e0",
        text="",
        finish_reason="stop",
        prompt_tokens=len(PROMPT),
        completion_tokens=2,
        latency_ms=1.0,
        token_ids=[7, 8],
        logprobs=[-0.5, -0.25],
        **extra,
    )


# vLLM's prompt logprobs: none for the first token; each position has the prompt token and
# the top k (the prompt token among them, or one more entry, ranked after them)
PROMPT_LPS = [
    None,
    _lp(12, -1.5, [(3, -0.5), (12, -1.5)]),
    _lp(13, -4.0, [(5, -0.25), (6, -1.0), (13, -4.0)]),
    _lp(14, -0.125, [(14, -0.125), (9, -3.0)]),
]
TOKEN_LPS = [_lp(7, -0.5, [(7, -0.5), (1, -2.0), (2, -3.0)]), _lp(8, -0.25, [(8, -0.25)])]


def test_answers_read_back_through_the_sdks_decoder() -> None:
    done = [
        completed(
            0,
            prompt_logprobs=PROMPT_LPS,
            prompt_token_ids=PROMPT,
            token_logprobs=TOKEN_LPS,
            stop_reason=8,
        ),
        completed(1, token_logprobs=TOKEN_LPS),
    ]
    answer = sampling.Answer(prompt_logprobs=True, topk_prompt=2, topk_sample=2)
    got = deserialize_sample_response(sampling.sample_response(done, answer))
    assert got.prompt_logprobs == [None, -1.5, -4.0, -0.125]
    assert got.topk_prompt_logprobs == [
        None,
        [(3, -0.5), (12, -1.5)],
        [(5, -0.25), (6, -1.0)],  # the prompt token, ranked third, is not in the top 2
        [(14, -0.125), (9, -3.0)],
    ]
    for seq in got.sequences:
        assert seq.stop_reason == "stop" and seq.tokens == [7, 8]
        assert seq.logprobs == [-0.5, -0.25]
        # a position with fewer than k alternatives: the SDK drops the mask cells
        assert seq.topk_logprobs == [[(7, -0.5), (1, -2.0)], [(8, -0.25)]]

    # only what was asked: top-k rows without the prompt's own logprobs, the last n positions
    last = sampling.Answer(topk_prompt=1, last_n=2)
    got = deserialize_sample_response(sampling.sample_response(done, last))
    assert got.prompt_logprobs is None and got.sequences[0].topk_logprobs is None
    assert got.topk_prompt_logprobs == [None, None, [(5, -0.25)], [(14, -0.125)]]
    only = deserialize_sample_response(
        sampling.sample_response(done, sampling.Answer(prompt_logprobs=True, last_n=1))
    )
    assert only.prompt_logprobs == [None, None, None, -0.125] and only.topk_prompt_logprobs is None
    plain = deserialize_sample_response(sampling.sample_response(done))
    assert plain.prompt_logprobs is None and plain.topk_prompt_logprobs is None


def test_wire_topk_matrices_are_the_sdks_layout() -> None:
    raw = wire.encode_sample_response(
        [wire.WireSequence("length", [1], [-1.0], wire.TopK(3, [[(4, -0.5)]]))],
        [None, -2.0],
        wire.TopK(2, [None, [(1, -0.75), (2, -1.0)]]),
    )
    got = deserialize_sample_response(raw)
    np_rows = got.topk_prompt_logprobs_np
    assert np_rows is not None and np_rows.token_ids.shape == (2, 2)
    assert np_rows.token_ids.tolist() == [[0, 0], [1, 2]]
    assert np_rows.logprobs[0].tolist() == [wire.MASK_LOGPROB] * 2
    assert math.isnan(got.prompt_logprobs_np[0]) and got.prompt_logprobs == [None, -2.0]
    assert got.sequences[0].topk_logprobs == [[(4, -0.5)]]


# ---------------------------------------------------------------------------- the SDK


class ScoringEngines(FakeEngines):
    """Engines that answer what a request's sampling options ask, as vLLM does."""

    async def submit(self, envs, timeout_s):
        self.seen.extend(envs)
        out = []
        for env in envs:
            p, o = env.payload, env.payload.sampling
            extra: dict = {}
            if o is not None and o.prompt_logprobs is not None:
                extra["prompt_logprobs"] = PROMPT_LPS
                extra["prompt_token_ids"] = p.prompt_token_ids
            if o is not None and o.top_logprobs:
                extra["token_logprobs"] = TOKEN_LPS
            answer = completed(0, **extra).model_copy(update={"request_id": p.request_id})
            out.append(
                make_event(
                    answer,
                    tenant=env.tenant,
                    policy=env.policy,
                    producer="serving/e0",
                    caused_by=env,
                )
            )
        return out


def test_the_sdk_samples_with_every_option(world) -> None:  # noqa: F811
    catalog, engines, _, url = world
    engines.submit = MethodType(ScoringEngines.submit, engines)
    service = sdk(url, catalog.add_key("acme"))
    tc = service.create_lora_training_client(BASE, rank=8, train_unembed=False).result()
    sampler = tc.save_weights_and_get_sampling_client().result()
    got = sampler.sample(
        types.ModelInput.from_ints(PROMPT),
        num_samples=2,
        sampling_params=types.SamplingParams(max_tokens=6, stop=[8], top_k=3, temperature=0.5),
        include_prompt_logprobs=True,
        topk_prompt_logprobs=2,
        topk_sample_logprobs=1,
    ).result()
    first, second = (e.payload for e in engines.seen)
    assert first.sampling is not None and second.sampling is not None
    assert (first.sampling.stop_token_ids, first.sampling.top_k) == ([8], 3)
    assert (first.sampling.prompt_logprobs, second.sampling.prompt_logprobs) == (2, None)
    assert first.sampling.top_logprobs == second.sampling.top_logprobs == 1
    assert got.prompt_logprobs == [None, -1.5, -4.0, -0.125]
    assert got.topk_prompt_logprobs is not None and got.topk_prompt_logprobs[1] == [
        (3, -0.5),
        (12, -1.5),
    ]
    assert [s.topk_logprobs for s in got.sequences] == [[[(7, -0.5)], [(8, -0.25)]]] * 2
    assert [s.stop_reason for s in got.sequences] == ["stop", "stop"]
    # the SDK's compute_logprobs is this call (max_tokens 1, the prompt's logprobs)
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(PROMPT), prompt_logprobs_last_n=2)
    assert scored.result() == [None, None, -4.0, -0.125]
    last = engines.seen[-1].payload
    assert last.max_tokens == 1 and last.sampling.prompt_logprobs == 0

    # refused by the gateway (the SDK checks none of these itself): 400s naming the field
    with pytest.raises(tinker.BadRequestError, match="topk_sample_logprobs -1 is negative"):
        sampler.sample(
            types.ModelInput.from_ints(PROMPT), 1, types.SamplingParams(), topk_sample_logprobs=-1
        ).result()
    with httpx.Client(base_url=url) as raw:
        sent = raw.post(
            "/api/v1/asample",
            headers=_auth(catalog, "acme"),
            json={
                "sampling_session_id": "x@1",
                "prompt": {"chunks": [{"type": "encoded_text", "tokens": PROMPT}]},
                "sampling_params": {"stop": ["a", 3]},
            },
        )
    assert sent.status_code == 400 and "sampling_params.stop" in sent.text
