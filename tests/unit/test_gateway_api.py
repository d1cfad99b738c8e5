"""Parsing and validation of the gateway's requests: the model reference, the OpenAI bodies and
their bounds, the token bucket."""

from __future__ import annotations

import pytest

from catalog.refs import Ref
from gateway.api import ChatRequest, CompletionRequest, parse_json, validate
from gateway.config import GatewayConfig
from gateway.errors import BadRequest, ModelNotFound
from gateway.ratelimit import RateLimiter, retry_after
from gateway.refs import parse_model

DIGEST = "sha256:" + "ab" * 32
CONFIG = GatewayConfig(max_prompt_chars=100, max_tokens=64, max_choices=4, max_messages=3)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("math@prod", Ref("acme", "math", alias="prod")),
        ("acme/math@prod", Ref("acme", "math", alias="prod")),
        ("math@3", Ref("acme", "math", revision=3)),
        ("acme/math-rl.v2@canary", Ref("acme", "math-rl.v2", alias="canary")),
        (f"math@{DIGEST}", Ref("acme", "math", digest=DIGEST)),
        (f"acme/math@{DIGEST}", Ref("acme", "math", digest=DIGEST)),
    ],
)
def test_model_forms(text: str, expected: Ref) -> None:
    assert parse_model(text, "acme") == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("math", "is not one of"),
        ("gpt-4o", "is not one of"),
        ("", "is not one of"),
        ("math@", "alias '' is not valid"),
        ("math@0", "revision 0 is not valid"),
        ("Math@prod", "policy 'Math' is not a valid name"),
        ("a/b/math@prod", "tenant 'a/b' is not a valid name"),
        ("math@sha256:abc", "digest 'sha256:abc' is malformed"),
        ("math@Prod", "alias 'Prod' is not valid"),
        ("x" * 301 + "@prod", "is not one of"),
    ],
)
def test_malformed_models_are_400_naming_model(text: str, fragment: str) -> None:
    with pytest.raises(BadRequest, match=fragment) as e:
        parse_model(text, "acme")
    assert e.value.param == "model" and e.value.status == 400


@pytest.mark.parametrize("text", ["other/math@prod", "other/nosuch@1", f"globex/m@{DIGEST}"])
def test_another_tenants_model_is_404_like_a_missing_one(text: str) -> None:
    with pytest.raises(ModelNotFound) as e:
        parse_model(text, "acme")
    missing = ModelNotFound(text)
    assert e.value.status == 404 and e.value.body() == missing.body()
    assert "does not exist or you do not have access" in e.value.message


def chat(**kw) -> dict:
    return {"model": "m@prod", "messages": [{"role": "user", "content": "hi"}], **kw}


def test_a_valid_chat_and_completion() -> None:
    req = validate(
        ChatRequest,
        chat(
            max_tokens=8,
            temperature=0,
            stop="\n",
            n=2,
            seed=1,
            logprobs=True,
            top_logprobs=0,
            user="u",
            stream_options={"include_usage": True},
        ),
        CONFIG,
    )
    assert req.stops() == ["\n"] and req.limit(CONFIG) == 8 and req.logprobs
    req = validate(
        ChatRequest,
        chat(
            max_completion_tokens=5,
            messages=[
                {"role": "developer", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
        ),
        CONFIG,
    )
    assert req.limit(CONFIG) == 5 and req.messages[1].text() == "ab"
    assert validate(ChatRequest, chat(), CONFIG).limit(CONFIG) == CONFIG.default_max_tokens
    comp = validate(
        CompletionRequest, {"model": "m@1", "prompt": ["a", "b"], "n": 2, "logprobs": 0}, CONFIG
    )
    assert comp.prompts() == ["a", "b"] and comp.limit(CONFIG) == 16


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        (chat(max_tokens=65), "max_tokens", "over this gateway's limit of 64"),
        (chat(max_completion_tokens=65), "max_completion_tokens", "limit of 64"),
        (chat(max_tokens=0), "max_tokens", "greater than or equal to 1"),
        (chat(n=5), "n", "limit of 4"),
        (chat(temperature=3), "temperature", "less than or equal to 2"),
        (chat(top_p=0), "top_p", "greater than 0"),
        (chat(stop=["a", "b", "c", "d", "e"]), "stop", "at most 4"),
        (chat(messages=[]), "messages", "at least 1 item"),
        (chat(messages=[{"role": "user", "content": "x" * 101}]), "messages", "limit of 100"),
        (chat(messages=[{"role": "user", "content": "a"}] * 4), "messages", "limit of 3"),
        (chat(messages=[{"role": "system", "content": "a"}]), "messages", "user message"),
        (chat(messages=[{"role": "tool", "content": "a"}]), "messages.0.role", "Input should be"),
        (
            chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
            "messages.0.content.str",
            "valid string",
        ),
        (chat(top_logprobs=2), "top_logprobs", "sampled tokens' logprobs"),
        (chat(tools=[{"type": "function"}]), "tools", "not supported"),
        (chat(response_format={"type": "json_object"}), "response_format", "only {'type'"),
        (chat(presence_penalty=0.5), "presence_penalty", "not supported"),
        (chat(logit_bias={"1": 2.0}), "logit_bias", "not supported"),
        (chat(frobnicate=1), "frobnicate", "Unrecognized request argument"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "model", "Field required"),
        ({"model": "m@1", "prompt": "a", "logprobs": 2}, "logprobs", "logprobs=0"),
        ({"model": "m@1", "prompt": "a", "echo": True}, "echo", "not supported"),
        ({"model": "m@1", "prompt": "a", "best_of": 3}, "best_of", "not supported"),
        ({"model": "m@1", "prompt": "a", "suffix": "z"}, "suffix", "not supported"),
        ({"model": "m@1", "prompt": ""}, "prompt", "empty"),
        ({"model": "m@1", "prompt": ["a"] * 5}, "n", "limit of 4"),
        ({"model": "m@1", "prompt": "x" * 101}, "prompt", "limit of 100"),
        ({"model": "m@1", "prompt": [1, 2, 3]}, "prompt.str", "valid string"),
    ],
)
def test_bad_bodies_are_400_naming_the_field(body: dict, param: str, fragment: str) -> None:
    model = ChatRequest if "messages" in body else CompletionRequest
    with pytest.raises(BadRequest, match=fragment) as e:
        validate(model, body, CONFIG)
    assert e.value.param == param and e.value.status == 400
    assert e.value.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("raw", [b"{", b"[1, 2]", b"\xff\xfe", b'"text"'])
def test_bodies_that_are_not_a_json_object(raw: bytes) -> None:
    with pytest.raises(BadRequest) as e:
        parse_json(raw)
    assert e.value.code == "invalid_json"


def test_token_bucket_allows_the_burst_then_the_rate() -> None:
    now = [0.0]
    limiter = RateLimiter(clock=lambda: now[0])
    assert [limiter.take("a", 2.0, 3) for _ in range(3)] == [None] * 3
    wait = limiter.take("a", 2.0, 3)
    assert wait == pytest.approx(0.5) and retry_after(wait) == "1"
    assert limiter.take("b", 2.0, 3) is None  # tenants have their own buckets
    now[0] += 0.5
    assert limiter.take("a", 2.0, 3) is None
    assert limiter.take("a", 2.0, 3) is not None
    now[0] += 100  # refills up to the burst, not beyond
    assert [limiter.take("a", 2.0, 3) is None for _ in range(4)] == [True, True, True, False]
