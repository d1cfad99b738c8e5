"""Feedback and canaries on the gateway with a fake catalog, fake engines and fake serving
commands: ``POST /v1/feedback`` (a response id maps back to its request; bad bodies name the
field; the policy is the caller's), the sticky routing key on every ``infer.requested``, a
canary started through ``/mint/v1/.../promote`` and ended by a rollback, and the Kafka path's
answer matching and outage."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from fastapi.testclient import TestClient

from catalog.apikeys import parse_key
from gateway import GatewayConfig, create_app
from gateway.commands import KafkaCommands
from gateway.errors import Unavailable
from gateway.ids import sticky_caller
from gateway.service import Gateway
from schemas import make_event
from schemas.events import CanaryEnded, CanaryStarted, FeedbackSubmitted, PromoteCommand
from schemas.registry import encode_event
from schemas.settings import MintSettings
from tests.unit.test_gateway_app import FakeCatalog, FakeEngines
from tests.unit.test_gateway_lifecycle import FakeCommands, FakeRepo, digest


class CanaryCommands(FakeCommands):
    """FakeCommands that also start canaries and, while one runs, end it on a rollback."""

    def __init__(self) -> None:
        super().__init__()
        self.canary_running = False
        self.down = False

    async def publish(self, env):
        if self.down:  # as KafkaCommands answers a broker that does not take it
            raise Unavailable(
                "not queued", code="commands_unavailable", headers={"Retry-After": "5"}
            )
        await super().publish(env)

    async def send(self, env, timeout_s):
        p = env.payload
        if self.refuse or env.type not in ("serving.canary", "serving.rollback"):
            return await super().send(env, timeout_s)
        if env.type == "serving.rollback" and not self.canary_running:
            return await super().send(env, timeout_s)
        self.sent.append(env)
        if env.type == "serving.canary":
            self.canary_running = True
            answer = CanaryStarted(
                alias=p.alias,
                canary_id=env.event_id,
                incumbent_revision=1,
                revision=p.revision,
                adapter_digest=digest(p.revision),
                store_uri=f"file:///s/acme/math/{p.revision}",
                share=p.share,
                requested_by=p.requested_by,
            )
        else:
            self.canary_running = False
            answer = CanaryEnded(
                alias=p.alias,
                canary_id=uuid.UUID(int=7),
                revision=2,
                incumbent_revision=1,
                outcome="rolled_back",
                reason=p.reason,
            )
        return make_event(
            answer, tenant=env.tenant, policy=env.policy, producer="controller", caused_by=env
        )


@pytest.fixture
def world():
    catalog, engines, commands = FakeCatalog(), FakeEngines(), CanaryCommands()
    catalog.catalog = FakeRepo()
    gw = Gateway(GatewayConfig(instance_id="gw-test"), catalog, engines)
    gw.lifecycle_commands = commands
    with TestClient(create_app(gw)) as http:
        yield catalog, engines, commands, http


def keyed(catalog, tenant: str = "acme") -> tuple[dict[str, str], str]:
    text = catalog.add_key(tenant)
    return {"Authorization": f"Bearer {text}"}, parse_key(text)[0]


def chat(http, h, **more) -> tuple[dict, dict]:
    body = {"model": "math@prod", "messages": [{"role": "user", "content": "hi"}], **more}
    r = http.post("/v1/chat/completions", json=body, headers=h)
    assert r.status_code == 200, r.text
    return r.json(), dict(r.headers)


# ---------------------------------------------------------------------- POST /v1/feedback


def test_feedback_of_a_response_id_is_published_for_its_request(world) -> None:
    catalog, engines, commands, http = world
    h, key_id = keyed(catalog)
    answer, headers = chat(http, h)
    asked = engines.seen[0].payload.request_id
    assert answer["id"].startswith("chatcmpl-") and headers["x-mint-request-id"] == asked
    body = {"model": "math@prod", "id": answer["id"], "score": 0.75, "comment": "good"}
    r = http.post("/v1/feedback", json=body, headers=h)
    assert r.status_code == 202, r.text
    (env,) = commands.sent
    assert r.json() == {
        "object": "feedback",
        "id": str(env.event_id),
        "request_id": asked,
        "score": 0.75,
    }
    assert isinstance(env.payload, FeedbackSubmitted) and env.type == "feedback.submitted"
    assert (env.tenant, env.policy, env.key) == ("acme", "math", b"acme/math")
    assert env.producer == "gateway/gw-test"
    p = env.payload
    assert (p.request_id, p.score, p.comment, p.submitted_by) == (
        asked,
        0.75,
        "good",
        f"key/{key_id}",
    )


def test_feedback_takes_completion_ids_engine_ids_and_every_model_form(world) -> None:
    catalog, engines, commands, http = world
    h, _ = keyed(catalog)
    r = http.post("/v1/completions", json={"model": "math@prod", "prompt": ["a", "b"]}, headers=h)
    assert r.status_code == 200, r.text
    first, second = (e.payload.request_id for e in engines.seen)
    for model, given, expected in (
        ("math", r.json()["id"], first),  # cmpl-…: its first prompt's request
        ("acme/math@prod", second, second),  # an engine request id as is
        ("math@3", "serving-cli.42", "serving-cli.42"),  # any producer's request id
        ("math@canary", first, first),
    ):
        body = {"model": model, "id": given, "score": 1}
        got = http.post("/v1/feedback", json=body, headers=h)
        assert got.status_code == 202, got.text
        assert got.json()["request_id"] == expected and got.json()["score"] == 1
    assert [e.payload.request_id for e in commands.sent] == [first, second, "serving-cli.42", first]
    assert {e.payload.comment for e in commands.sent} == {""}


@pytest.mark.parametrize(
    ("body", "param", "said"),
    [
        ({"score": -1}, "score", "-1"),
        ({"score": 2}, "score", "2"),
        ({"score": "x"}, "score", "'x'"),
        ({"score": "0.5"}, "score", "'0.5'"),  # a number, not a string of one
        ({"score": True}, "score", "True"),
        ({"score": None}, "score", "None"),
        ({"id": None}, "id", "None"),
        ({"id": ""}, "id", "''"),
        ({"id": "chatcmpl-mine"}, "id", "chatcmpl-mine"),  # named by the caller: unmappable
        ({"id": "has spaces"}, "id", "has spaces"),
        ({"model": ""}, "model", "''"),
        ({"model": "Bad Name"}, "model", "Bad Name"),
        ({"model": "math@"}, "model", "math@"),
        ({"comment": "x" * 1025}, "comment", "xxx"),
        ({"extra": 1}, "extra", "1"),
    ],
)
def test_bad_feedback_is_a_400_naming_the_field_and_what_was_given(world, body, param, said):
    catalog, _, commands, http = world
    h, _ = keyed(catalog)
    full = {"model": "math@prod", "id": "gw-test.abc.0", "score": 0.5, **body}
    r = http.post("/v1/feedback", json=full, headers=h)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and said in err["message"], err
    assert commands.sent == []


@pytest.mark.parametrize("missing", ["id", "score", "model"])
def test_feedback_without_a_required_field_names_it(world, missing) -> None:
    catalog, _, commands, http = world
    h, _ = keyed(catalog)
    full = {"model": "math@prod", "id": "gw-test.abc.0", "score": 0.5}
    del full[missing]
    r = http.post("/v1/feedback", json=full, headers=h)
    assert r.status_code == 400 and r.json()["error"]["param"] == missing, r.text
    assert "required" in r.json()["error"]["message"].lower() and commands.sent == []


def test_feedback_on_a_missing_or_other_tenants_policy_is_the_openai_404(world) -> None:
    catalog, _, commands, http = world
    h, _ = keyed(catalog)
    for model in ("nope@prod", "nope", "globex/math@prod", "globex/math"):
        r = http.post("/v1/feedback", json={"model": model, "id": "a.0", "score": 1}, headers=h)
        assert r.status_code == 404, r.text
        err = r.json()["error"]
        assert err["code"] == "model_not_found" and err["param"] == "model"
        assert f"'{model}'" in err["message"]
    anonymous = http.post("/v1/feedback", json={"model": "math", "id": "a.0", "score": 1})
    assert anonymous.status_code == 401
    bad_json = http.post("/v1/feedback", content=b"{nope", headers=h)
    assert bad_json.status_code == 400 and bad_json.json()["error"]["code"] == "invalid_json"
    assert commands.sent == []


def test_kafka_outage_is_a_503_with_retry_after(world) -> None:
    catalog, _, commands, http = world
    h, _ = keyed(catalog)
    commands.down = True
    r = http.post("/v1/feedback", json={"model": "math", "id": "a.0", "score": 0}, headers=h)
    assert r.status_code == 503 and r.headers["retry-after"] == "5"
    assert r.json()["error"]["code"] == "commands_unavailable" and commands.sent == []


def test_a_gateway_without_kafka_says_it_takes_no_feedback() -> None:
    catalog = FakeCatalog()
    gw = Gateway(GatewayConfig(instance_id="gw-test"), catalog, FakeEngines())
    with TestClient(create_app(gw)) as http:
        h = {"Authorization": f"Bearer {catalog.add_key('acme')}"}
        r = http.post("/v1/feedback", json={"model": "math", "id": "a.0", "score": 1}, headers=h)
    assert r.status_code == 503 and r.json()["error"]["code"] == "not_served"


# ---------------------------------------------------------------------- the sticky caller


def test_caller_is_the_user_when_given_else_the_key(world) -> None:
    catalog, engines, _, http = world
    h, key_id = keyed(catalog)
    chat(http, h, user="alice")
    chat(http, h)
    chat(http, h, user="")  # no user: the key
    chat(http, h, user="x" * 300, stream=False)  # past the contract's bound: a stable digest
    r = http.post(
        "/v1/completions",
        json={"model": "math@prod", "prompt": ["a", "b"], "user": "bob"},
        headers=h,
    )
    assert r.status_code == 200
    with http.stream(
        "POST",
        "/v1/chat/completions",
        json={"model": "math@prod", "messages": [{"role": "user", "content": "s"}], "stream": True},
        headers=h,
    ) as s:
        assert s.status_code == 200 and s.headers["x-mint-request-id"].startswith("gw-test.")
        s.read()
    callers = [e.payload.caller for e in engines.seen]
    digest_of_long = sticky_caller("x" * 300, key_id)
    assert digest_of_long.startswith("sha256:") and len(digest_of_long) == 71
    assert callers == [
        "alice",
        f"key/{key_id}",
        f"key/{key_id}",
        digest_of_long,
        "bob",
        "bob",
        f"key/{key_id}",
    ]


# ---------------------------------------------------------------------- canaries


def test_promote_with_a_canary_share_sends_a_canary_command(world) -> None:
    catalog, _, commands, http = world
    h, key_id = keyed(catalog)
    body = {"revision": 2, "canary": 0.1, "expected_revision": 1, "reason": "try it"}
    r = http.post("/mint/v1/policies/math/promote", json=body, headers=h)
    assert r.status_code == 200, r.text
    (env,) = commands.sent
    p = env.payload
    assert (env.type, env.tenant, env.policy) == ("serving.canary", "acme", "math")
    assert (p.alias, p.revision, p.share, p.expected_revision) == ("prod", 2, 0.1, 1)
    assert p.reason == "try it" and p.requested_by == f"key/{key_id}"
    assert r.json() == {
        "policy": "math",
        "alias": "prod",
        "revision": 2,
        "incumbent_revision": 1,
        "share": 0.1,
        "canary_id": str(env.event_id),
        "event_id": r.json()["event_id"],
    }
    # a rollback while it runs ends it (the alias stays)
    r = http.post("/mint/v1/policies/math/rollback", json={"reason": "no"}, headers=h)
    assert r.status_code == 200, r.text
    assert r.json() == {
        "policy": "math",
        "alias": "prod",
        "canary_id": str(uuid.UUID(int=7)),
        "outcome": "rolled_back",
        "reason": "no",
        "event_id": r.json()["event_id"],
    }
    assert commands.sent[-1].type == "serving.rollback"
    # without a canary: a move, as before
    r = http.post("/mint/v1/policies/math/promote", json={"revision": 2}, headers=h)
    assert r.status_code == 200 and r.json()["to_revision"] == 2
    assert commands.sent[-1].type == "serving.promote"


def test_a_refused_canary_is_the_409_of_moves(world) -> None:
    catalog, _, commands, http = world
    h, _ = keyed(catalog)
    commands.refuse = "alias prod points to revision 2, not the expected 1"
    body = {"revision": 2, "canary": 0.5, "expected_revision": 1}
    r = http.post("/mint/v1/policies/math/promote", json=body, headers=h)
    assert r.status_code == 409 and r.json()["error"]["code"] == "move_refused"
    assert "serving.canary" in r.json()["error"]["message"]
    assert r.json()["error"]["current_revision"] == 2


@pytest.mark.parametrize("share", [0, 1, -0.1, 1.5, "0.1", True])
def test_a_bad_canary_share_is_a_400(world, share) -> None:
    catalog, _, commands, http = world
    h, _ = keyed(catalog)
    body = {"revision": 2, "canary": share}
    r = http.post("/mint/v1/policies/math/promote", json=body, headers=h)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "canary" and repr(share) in err["message"] and commands.sent == []


# ---------------------------------------------------------------------- the Kafka path


class RecordOf:
    def __init__(self, env) -> None:
        self.value = encode_event(env)


def test_kafka_commands_match_canary_answers_by_causation_id() -> None:
    commands = KafkaCommands(MintSettings(), "gw-test")
    promote = make_event(
        PromoteCommand(revision=2), tenant="acme", policy="math", producer="gateway/gw-test"
    )
    started = CanaryStarted(
        alias="prod",
        canary_id=promote.event_id,
        incumbent_revision=1,
        revision=2,
        adapter_digest=digest(2),
        store_uri="file:///s/acme/math/2",
        share=0.2,
    )
    ended = CanaryEnded(
        alias="prod",
        canary_id=promote.event_id,
        revision=2,
        incumbent_revision=1,
        outcome="rolled_back",
    )

    async def answered(payload):
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        commands._pending[promote.event_id] = (loop, fut)
        other = make_event(payload, tenant="acme", policy="math", producer="controller")
        commands._route(RecordOf(other))  # another command's answer: not this one's
        answer = make_event(
            payload, tenant="acme", policy="math", producer="controller", caused_by=promote
        )
        commands._route(RecordOf(answer))
        got = await asyncio.wait_for(fut, 1)
        assert got.event_id == answer.event_id and got.type == answer.type

    for payload in (started, ended):
        asyncio.run(answered(payload))
