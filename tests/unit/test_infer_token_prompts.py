"""Token-id prompts on infer.requested (the Tinker API's SamplingClient.sample): bounded ids,
raw prompts only, backward compatible on the wire and in the JSON contract; the serving side
runs the ids as sent, counts them against the context and refuses an id outside the vocabulary
on its own (vLLM faked here: tests/e2e/serving/test_token_prompts.py runs the real one)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from pydantic import ValidationError

from catalog.models import Resolved
from catalog.store import AdapterStore
from schemas import EventValidationError, decode_event, encode_event, make_event
from schemas.contracts import CONTRACTS_DIR
from schemas.events import InferCompleted, InferFailed, InferRequested, LoadRequested
from schemas.events.inference import MAX_PROMPT_TOKEN_IDS
from workers.serving.admission import admit
from workers.serving.core import ServingCore
from workers.serving.engine import EngineConfig, GenRequest, GenResult, GenSample, VllmEngine
from workers.serving.exceptions import RequestRefused
from workers.serving.resolution import ResolutionCache

from .test_serving import make_ws, put
from .test_serving_core import GenEngine

pytestmark = pytest.mark.unit
VOCAB = 100


def _request(**fields) -> InferRequested:
    return InferRequested(request_id="r-1", prompt="<3 tokens>", **fields)


def test_token_prompt_round_trips_through_the_wire() -> None:
    env = make_event(
        _request(prompt_token_ids=[1, 42, 7], logprobs=True),
        tenant="acme",
        policy="math",
        producer="test",
    )
    back = decode_event(encode_event(env))
    assert back.payload.prompt_token_ids == [1, 42, 7]
    assert back.payload.prompt == "<3 tokens>" and back.payload.logprobs


def test_absent_by_default_so_old_requests_still_decode() -> None:
    assert _request().prompt_token_ids is None
    old_wire = {"request_id": "r-1", "prompt": "2+2=", "max_tokens": 4}
    assert InferRequested.model_validate(old_wire).prompt_token_ids is None


@pytest.mark.parametrize(
    ("ids", "match"),
    [
        ([], "at least 1 item"),
        ([0] * (MAX_PROMPT_TOKEN_IDS + 1), f"at most {MAX_PROMPT_TOKEN_IDS} items"),
        ([5, -1], "prompt_token_ids.1\n.*greater than or equal to 0"),
        ([1.5], "prompt_token_ids.0\n.*integer"),
        (["a"], "prompt_token_ids.0\n.*integer"),
    ],
)
def test_ids_are_bounded(ids: list, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        _request(prompt_token_ids=ids)


def test_the_longest_allowed_prompt_is_accepted() -> None:
    assert len(_request(prompt_token_ids=[0] * MAX_PROMPT_TOKEN_IDS).prompt_token_ids) == (
        MAX_PROMPT_TOKEN_IDS
    )


def test_token_prompts_refuse_the_chat_template() -> None:
    with pytest.raises(ValidationError, match="prompt_token_ids need chat=false"):
        _request(prompt_token_ids=[1, 2], chat=True)


def test_token_prompts_refuse_messages() -> None:
    turns = [{"role": "user", "content": "hi"}]
    with pytest.raises(ValidationError, match="prompt_token_ids and messages are exclusive"):
        _request(prompt_token_ids=[1, 2], chat=True, messages=turns)


def test_prompt_stays_required_as_the_label() -> None:
    with pytest.raises(ValidationError, match="prompt"):
        InferRequested(request_id="r-1", prompt_token_ids=[1])
    with pytest.raises(ValidationError, match="prompt"):
        InferRequested(request_id="r-1", prompt="", prompt_token_ids=[1])


def test_a_bad_token_prompt_on_the_wire_names_the_field() -> None:
    wire = json.loads(
        encode_event(
            make_event(_request(prompt_token_ids=[1]), tenant="acme", policy="m", producer="t")
        )
    )
    wire["payload"]["prompt_token_ids"] = [3, -2]
    with pytest.raises(EventValidationError, match=r"payload\.prompt_token_ids\.1"):
        decode_event(json.dumps(wire))


def test_the_json_contract_agrees_for_foreign_producers() -> None:
    schema = json.loads((CONTRACTS_DIR / "infer.requested.v1.json").read_text())
    good = json.loads(
        encode_event(
            make_event(
                _request(prompt_token_ids=[1, 2, 3]), tenant="acme", policy="m", producer="t"
            )
        )
    )
    jsonschema.validate(good, schema)
    for bad in ([], [-1], ["x"]):
        wire = json.loads(json.dumps(good))
        wire["payload"]["prompt_token_ids"] = bad
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wire, schema)


# The serving side.


def test_admission_refuses_an_id_outside_the_vocabulary_by_position() -> None:
    for ids, where in (([1, VOCAB], r"prompt_token_ids\[1\]=100"), ([-3], r"\[0\]=-3")):
        with pytest.raises(
            RequestRefused, match=where + r".* vocabulary of 100 token ids \(0 to 99\)"
        ):
            admit(GenRequest(ids), prompt_tokens=len(ids), max_model_len=32, vocab_size=VOCAB)
    ok = GenRequest([0, VOCAB - 1], max_tokens=4)
    assert admit(ok, prompt_tokens=2, max_model_len=32, vocab_size=VOCAB) is ok


class _NoTokenizer:
    def encode(self, text: str) -> list[int]:
        raise AssertionError("token prompts are not tokenized again")


def _engine() -> VllmEngine:
    engine = VllmEngine.__new__(VllmEngine)  # no vLLM: only admission is under test
    engine.config = EngineConfig(model="m", max_model_len=32)
    engine.tokenizer = _NoTokenizer()
    engine.vocab_size = VOCAB
    return engine


def test_the_engine_counts_the_ids_as_sent_and_clamps_max_tokens() -> None:
    admitted = _engine().admit(GenRequest(list(range(20)), max_tokens=30, logprobs=True))
    assert admitted.prompt == list(range(20)) and admitted.max_tokens == 12


def test_a_token_prompt_past_the_context_is_refused_without_chat_words() -> None:
    with pytest.raises(RequestRefused) as refused:
        _engine().admit(GenRequest([1] * 32, max_tokens=4))
    assert refused.value.code == "context_length_exceeded"
    assert "prompt has 32 tokens, which leaves no room" in str(refused.value)
    assert "chat template" not in str(refused.value) and "messages" not in str(refused.value)


def test_an_out_of_vocabulary_id_is_invalid_value() -> None:
    with pytest.raises(RequestRefused, match=r"prompt_token_ids\[2\]=5000") as refused:
        _engine().admit(GenRequest([1, 2, 5000]))
    assert refused.value.code == "invalid_value"


class TokenEngine(GenEngine):
    """GenEngine that admits token prompts as VllmEngine does and echoes their ids."""

    def __init__(self) -> None:
        super().__init__()
        self.prompts: list = []

    def admit(self, r):
        if not isinstance(r.prompt, list):
            return super().admit(r)
        return admit(
            r, prompt_tokens=len(r.prompt), max_model_len=self.max_model_len, vocab_size=VOCAB
        )

    def generate(self, requests):
        self.prompts.append([r.prompt for r in requests])
        return [
            GenResult(list(r.prompt), [GenSample("ab", [7, 8], [-0.5, -1.5], "length")])
            for r in requests
        ]


def test_an_out_of_vocabulary_request_fails_alone_and_the_others_are_answered(tmp_path) -> None:
    store = AdapterStore(tmp_path / "store")
    ref = put(store, tmp_path, 0, policy="p0")
    engine = TokenEngine()
    ws = make_ws(store, tmp_path, engine, max_cpu_loras=2)

    def resolve(_ref) -> Resolved:
        return Resolved("acme", "p0", ref.revision, ref.digest, ref.store_uri, "prod")

    core = ServingCore(engine, ws, ResolutionCache(resolve), engine_id="e0", base_model="tiny")

    def token_request(rid: str, ids: list[int]):
        payload = InferRequested(
            request_id=rid,
            prompt=f"<{len(ids)} tokens>",
            prompt_token_ids=ids,
            max_tokens=4,
            logprobs=True,
        )
        return make_event(payload, tenant="acme", policy="p0", producer="test")

    out = core.on_infer(token_request("good", [3, 4, 5]))
    out += core.on_infer(token_request("bad", [3, VOCAB + 1]))
    out += core.on_infer(
        make_event(
            InferRequested(request_id="text", prompt="two words", max_tokens=4),
            tenant="acme",
            policy="p0",
            producer="test",
        )
    )
    results = core.on_load_requests([e for e in out if isinstance(e.payload, LoadRequested)])
    answers = {
        e.payload.request_id: e.payload
        for e in results
        if isinstance(e.payload, InferCompleted | InferFailed)
    }
    bad = answers["bad"]
    assert isinstance(bad, InferFailed) and (bad.stage, bad.code) == ("validate", "invalid_value")
    assert "prompt_token_ids[1]=101" in bad.error
    good = answers["good"]
    assert isinstance(good, InferCompleted) and good.prompt_tokens == 3
    assert good.token_ids == [7, 8] and good.logprobs == [-0.5, -1.5]
    assert isinstance(answers["text"], InferCompleted)
    assert engine.prompts == [[[3, 4, 5]], ["two words"]]  # each ran; the bad one never did
