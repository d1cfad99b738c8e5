"""Token-id prompts on infer.requested (the Tinker API's SamplingClient.sample): bounded ids,
raw prompts only, backward compatible on the wire and in the JSON contract."""

from __future__ import annotations

import json

import jsonschema
import pytest
from pydantic import ValidationError

from schemas import EventValidationError, decode_event, encode_event, make_event
from schemas.contracts import CONTRACTS_DIR
from schemas.events import InferRequested
from schemas.events.inference import MAX_PROMPT_TOKEN_IDS


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
