"""Bad input is the caller's 400 in OpenAI's error shape, never our 500 (issue 25, defect 12d),
and an engine's refusal of a request it cannot run is a 400 too (defect 2b)."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import GatewayConfig, create_app
from gateway.api import MAX_DEPTH
from gateway.errors import BadRequest, EngineFailed, ModelNotFound, Unavailable
from gateway.responses import failure_error
from gateway.service import Gateway
from tests.unit.test_gateway_app import FakeCatalog, FakeEngines

USER = '"messages":[{"role":"user","content":"hi"}]'


@pytest.fixture(scope="module")
def http():
    catalog = FakeCatalog()
    key = catalog.add_key("acme")
    gw = Gateway(GatewayConfig(instance_id="gw-test"), catalog, FakeEngines())
    with TestClient(create_app(gw), raise_server_exceptions=False) as client:
        client.headers["Authorization"] = f"Bearer {key}"
        yield client


def assert_openai_error(r, status: int) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json"), r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"[" * 100_000, "levels deep"),  # the parser's own recursion limit
        (
            b'{"model":"math@prod",' + USER.encode() + b',"x":' + b"[" * 5000 + b"]" * 5000 + b"}",
            "levels deep",
        ),
        (
            b'{"model":"math@prod","tool_choice":'
            + b'{"a":' * (MAX_DEPTH + 5)
            + b"1"
            + b"}" * (MAX_DEPTH + 6),
            "levels deep",
        ),
        (b'{"model":"math@prod","seed":' + b"9" * 5000 + b"," + USER.encode() + b"}", "not valid"),
        (b'{"model":"math@prod",' + USER.encode() + b',"n":1e999999}', "n"),
        (b"\xff\xfe{}", "not valid JSON"),
        (b'{"model": "math@prod", "messages": [}', "not valid JSON"),
        (b'"just a string"', "JSON object"),
        (b"", "not valid JSON"),
    ],
)
def test_bodies_the_parser_refuses_are_400_naming_the_problem(http, body, says) -> None:
    r = http.post("/v1/chat/completions", content=body)
    err = assert_openai_error(r, 400)
    assert err["type"] == "invalid_request_error" and says in err["message"]


def test_an_ordinary_nesting_depth_is_still_taken(http) -> None:
    parts = [{"type": "text", "text": "hi"}]
    r = http.post(
        "/v1/chat/completions",
        json={"model": "math@prod", "messages": [{"role": "user", "content": parts}]},
    )
    assert r.status_code == 200, r.text


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
FIELDS = st.sampled_from(
    [
        "model",
        "messages",
        "prompt",
        "n",
        "temperature",
        "max_tokens",
        "stop",
        "seed",
        "stream",
        "logprobs",
        "tool_choice",
        "user",
        # vLLM's fields (issue 33): every one must be a 200 or a 4xx, never a 500
        "tools",
        "top_logprobs",
        "prompt_logprobs",
        "echo",
        "response_format",
        "structured_outputs",
        "logit_bias",
        "top_k",
        "min_p",
        "min_tokens",
        "stop_token_ids",
        "bad_words",
        "allowed_token_ids",
        "truncate_prompt_tokens",
        "add_special_tokens",
        "add_generation_prompt",
        "continue_final_message",
        "chat_template_kwargs",
        "stream_options",
        "return_token_ids",
        "suffix",
    ]
)


# Deep nesting and long integers inside an otherwise good request: what a parser may refuse.
NESTED = st.tuples(st.integers(1, 3000), st.sampled_from([("[", "]"), ('{"a":', "}")])).map(
    lambda t: t[1][0] * t[0] + "1" + t[1][1] * t[0]
)
LONG_INT = st.integers(1, 6000).map(lambda n: "9" * n)
ODD = st.tuples(FIELDS, st.one_of(NESTED, LONG_INT)).map(
    lambda t: ('{"model":"math@prod",' + USER + f',"{t[0]}":{t[1]}}}').encode()
)


@settings(max_examples=150, deadline=None)
@given(
    route=st.sampled_from(["/v1/chat/completions", "/v1/completions"]),
    body=st.one_of(
        st.binary(max_size=64),
        JSON.map(lambda v: json.dumps(v).encode()),
        st.dictionaries(FIELDS, JSON, max_size=6).map(
            lambda d: json.dumps({"model": "math@prod", **d}).encode()
        ),
        ODD,
    ),
)
def test_no_body_ever_gets_a_500_or_a_plain_text_error(http, route, body) -> None:
    r = http.post(route, content=body)
    if r.status_code != 200:
        err = assert_openai_error(r, r.status_code)
        assert r.status_code < 500, err


def test_an_unexpected_failure_is_still_openais_shape() -> None:
    catalog = FakeCatalog()
    key = catalog.add_key("acme")

    def broken(tenant):
        raise RuntimeError("a bug")

    catalog.models = broken
    gw = Gateway(GatewayConfig(instance_id="gw-test"), catalog, FakeEngines())
    with TestClient(create_app(gw), raise_server_exceptions=False) as http:
        r = http.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
    err = assert_openai_error(r, 500)
    assert err["type"] == "server_error" and "a bug" not in err["message"]


# ---------------------------------------------------------------------- engine refusals (2b)


@pytest.mark.parametrize(
    ("code", "prompt_param", "want_param"),
    [
        ("context_length_exceeded", "messages", "messages"),
        ("context_length_exceeded", "prompt", "prompt"),
        ("invalid_value", "messages", None),
        (None, "prompt", None),
    ],
)
def test_a_request_the_engine_cannot_run_is_a_400_with_its_code(
    code, prompt_param, want_param
) -> None:
    text = (
        "this model's maximum context length is 256 tokens; the prompt has 20000: shorten "
        "the messages"
    )
    e = failure_error("validate", text, model="math@prod", code=code, prompt_param=prompt_param)
    assert isinstance(e, BadRequest) and e.status == 400
    assert e.body() == {
        "error": {
            "message": text,
            "type": "invalid_request_error",
            "param": want_param,
            "code": code or "invalid_value",
        }
    }


def test_the_other_stages_keep_their_statuses() -> None:
    def err(stage: str, **kw):
        return failure_error(stage, "boom", model="math@prod", **kw)

    assert isinstance(err("resolve"), ModelNotFound)
    assert isinstance(err("load", retryable=True), Unavailable)
    assert isinstance(err("load"), EngineFailed) and isinstance(err("generate"), EngineFailed)
    assert err("expired").status == 503 and err("expired").headers["Retry-After"] == "5"


class RefusingEngines(FakeEngines):
    """Engines that refuse every request as too long for the model's context."""

    async def submit(self, envs, timeout_s):
        from schemas import make_event
        from schemas.events import InferFailed

        self.seen.extend(envs)
        return [
            make_event(
                InferFailed(
                    request_id=env.payload.request_id,
                    ref="acme/math@prod",
                    stage="validate",
                    code="context_length_exceeded",
                    engine_id="e0",
                    error="this model's maximum context length is 256 tokens, the prompt has 20000",
                ),
                tenant=env.tenant,
                policy=env.policy,
                producer="serving/e0",
                caused_by=env,
            )
            for env in envs
        ]


def test_an_over_long_prompt_is_openais_400_context_length_exceeded() -> None:
    import openai

    catalog = FakeCatalog()
    key = catalog.add_key("acme")
    gw = Gateway(GatewayConfig(instance_id="gw-test"), catalog, RefusingEngines())
    with TestClient(create_app(gw)) as http:
        oa = openai.OpenAI(
            base_url="http://testserver/v1", api_key=key, http_client=http, max_retries=0
        )
        with pytest.raises(openai.BadRequestError) as chat:
            oa.chat.completions.create(
                model="math@prod", messages=[{"role": "user", "content": "x " * 9000}]
            )
        with pytest.raises(openai.BadRequestError) as completion:
            oa.completions.create(model="math@prod", prompt="x " * 9000)
    for e, param in ((chat.value, "messages"), (completion.value, "prompt")):
        assert e.status_code == 400 and e.code == "context_length_exceeded" and e.param == param
        assert e.body["type"] == "invalid_request_error" and "256 tokens" in e.message
