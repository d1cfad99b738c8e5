"""MintClient's HTTP mode (mint/sdk/remote.py) against the real gateway app with a fake catalog,
fake engines and fake serving commands (Starlette's TestClient as its HTTP client): the verbs,
and the gateway's errors as the SDK's exceptions."""

from __future__ import annotations

import httpx
import pytest
from fastapi.testclient import TestClient

from gateway import GatewayConfig, create_app
from gateway.service import Gateway
from mint.sdk import CommandRefused, MintClient, MintError, RemoteError, RemoteMintClient
from mint.sdk.exceptions import WaitTimeout
from schemas.exceptions import EventValidationError
from tests.unit.test_gateway_app import FakeCatalog, FakeEngines
from tests.unit.test_gateway_feedback import CanaryCommands
from tests.unit.test_gateway_lifecycle import FakeRepo


@pytest.fixture
def world():
    catalog, commands, engines = FakeCatalog(), CanaryCommands(), FakeEngines()
    catalog.catalog = FakeRepo()
    gw = Gateway(GatewayConfig(instance_id="gw-test"), catalog, engines)
    gw.lifecycle_commands = commands
    with TestClient(create_app(gw)) as http:
        yield catalog, commands, engines, http


def remote(catalog, http, tenant: str = "acme") -> RemoteMintClient:
    return MintClient.remote("http://testserver", catalog.add_key(tenant), http=http)


def test_reads_and_moves_through_the_gateway(world) -> None:
    catalog, commands, _, http = world
    mint = remote(catalog, http)
    assert [p.policy for p in mint.policies()] == ["code", "math"]
    assert [r.revision for r in mint.revisions("math")] == [2, 1]
    assert mint.latest_revision("math") == 2 and mint.latest_revision("code") is None
    assert [(a.alias, a.revision) for a in mint.aliases("math")] == [("prod", 1)]
    moved = mint.promote("math", 2, expected_revision=1, reason="better")
    assert (moved.alias, moved.from_revision, moved.to_revision) == ("prod", 1, 2)
    assert moved.payload.cause == "promote"  # reads like the direct client's envelope
    back = mint.rollback("math", to_revision=1)
    assert back.to_revision == 1 and back.cause == "rollback"
    assert [e.payload.alias for e in commands.sent] == ["prod", "prod"]
    assert commands.sent[0].payload.expected_revision == 1
    assert commands.sent[1].payload.to_revision == 1
    event_id = mint.configure("math", suite="toy-even", thresholds={"reward": {"min": 0.6}})
    cfg = commands.sent[2]
    assert str(cfg.event_id) == event_id and cfg.payload.suite == "toy-even"
    assert cfg.payload.base_model == "tiny" and cfg.payload.thresholds["reward"].min == 0.6


def test_a_canary_and_its_feedback_through_the_gateway(world) -> None:
    catalog, commands, engines, http = world
    mint = remote(catalog, http)
    started = mint.promote("math", 2, canary=0.1, reason="try it")
    assert (started.revision, started.incumbent_revision, started.share) == (2, 1, 0.1)
    assert started.canary_id == str(commands.sent[0].event_id) and started.outcome is None
    sent = commands.sent[0]
    assert sent.type == "serving.canary" and (sent.payload.share, sent.payload.reason) == (
        0.1,
        "try it",
    )
    answer = mint.infer("math", "2+2=")
    event_id = mint.feedback("math", answer.id, 0.9, comment="right")
    scored = commands.sent[-1]
    assert str(scored.event_id) == event_id and scored.type == "feedback.submitted"
    assert (scored.payload.request_id, scored.payload.score) == (
        engines.seen[0].payload.request_id,
        0.9,
    )
    sent = len(commands.sent)
    with pytest.raises(EventValidationError, match="score"):  # checked here: nothing sent
        mint.feedback("math", answer.id, 1.5)
    assert len(commands.sent) == sent
    ended = mint.rollback("math")  # a running canary ends; prod stays
    assert ended.outcome == "rolled_back" and ended.canary_id  # (the fake's own id)


def test_tags_through_the_gateway(world) -> None:
    catalog, commands, _, http = world
    mint = remote(catalog, http)
    assert mint.tag("math", 2, add=["candidate", "reviewed"]) == ["candidate", "reviewed"]
    sent = commands.sent[-1]
    assert sent.type == "revision.tag" and sent.payload.revision == 2
    assert sent.payload.requested_by.startswith("key/")
    for bad in ({"add": []}, {"add": ["x"], "remove": ["x"]}, {"add": ["no spaces"]}):
        r = http.post(
            "/mint/v1/policies/math/revisions/2/tags", json=bad, headers=mint.http.headers
        )
        assert r.status_code == 400, (bad, r.text)
    with pytest.raises(EventValidationError, match="revision"):
        mint.tag("math", 0, add=["x"])
    commands.refuse = "revision 9 of acme/math does not exist"
    with pytest.raises(CommandRefused, match="revision.tag of math@9 refused"):
        mint.tag("math", 9, add=["x"])
    assert len([c for c in commands.sent if c.type == "revision.tag"]) == 2  # no bad one sent


def test_retire_and_restore_through_the_gateway(world) -> None:
    catalog, commands, _, http = world
    mint = remote(catalog, http)
    out = mint.retire("math", reason="superseded by math-v2")
    assert (out.policy, out.retired, out.reason) == ("math", True, "superseded by math-v2")
    sent = commands.sent[-1]
    assert sent.type == "policy.retire" and sent.payload.retired is True
    assert str(sent.event_id) != out.event_id and sent.payload.requested_by.startswith("key/")
    assert mint.retire("math", undo=True).retired is False
    assert commands.sent[-1].payload.retired is False
    for bad in ({"undo": "yes"}, {"reason": "x" * 1025}, {"retired": False}):
        r = http.post("/mint/v1/policies/math/retire", json=bad, headers=mint.http.headers)
        assert r.status_code == 400, (bad, r.text)
    with pytest.raises(RemoteError) as missing:
        mint.retire("secret")  # globex's: the same 404 as a missing policy, nothing sent
    assert missing.value.status == 404
    commands.refuse = "PolicyNotFound: acme/math"
    with pytest.raises(CommandRefused, match="policy.retire of math refused"):
        mint.retire("math")
    assert len([c for c in commands.sent if c.type == "policy.retire"]) == 3


def test_gateway_errors_become_the_sdks_exceptions(world) -> None:
    catalog, commands, _, http = world
    mint = remote(catalog, http)
    with pytest.raises(RemoteError) as missing:
        mint.revisions("secret")  # globex's: the same 404 as a missing policy
    assert missing.value.status == 404 and missing.value.code == "policy_not_found"
    commands.refuse = "alias prod is at revision 2, not the expected 1"
    with pytest.raises(CommandRefused) as refused:
        mint.promote("math", 1, expected_revision=1)
    assert refused.value.current_revision == 2 and "not the expected 1" in str(refused.value)
    commands.refuse, commands.silent = None, True
    with pytest.raises(WaitTimeout):
        mint.rollback("math")
    with pytest.raises(EventValidationError, match="alias"):
        mint.promote("math", 1, alias="not an alias")
    stranger = RemoteMintClient("http://testserver", "mint_nobody_secret", http=http)
    with pytest.raises(RemoteError) as who:
        stranger.policies()
    assert who.value.status == 401


def test_infer_goes_through_the_openai_endpoints(world) -> None:
    catalog, _, engines, http = world
    mint = remote(catalog, http)
    done = mint.infer("math", "2+2=", max_tokens=4)
    assert done.text == "re:2+2=" and done.revision == 1 and done.completion_tokens == 2
    chat = mint.infer("math", "hello", revision=2, chat=True)
    assert chat.text == "re:hello" and chat.revision == 2
    first, second = (e.payload for e in engines.seen)
    assert (first.alias, first.max_tokens, first.temperature, first.chat) == ("prod", 4, 0.0, False)
    assert second.revision == 2 and second.chat
    assert {e.tenant for e in engines.seen} == {"acme"}


def test_bad_keys_and_unreachable_gateways_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="api_key"):
        MintClient.remote("http://gw", "")

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    http = httpx.Client(base_url="http://gw", transport=httpx.MockTransport(down))
    mint = RemoteMintClient("http://gw", "mint_k_s", http=http)
    with pytest.raises(MintError, match="ConnectError"):
        mint.policies()


def test_canary_status_reads_the_controllers_view_through_the_gateway(world, monkeypatch) -> None:
    import uuid
    from datetime import UTC, datetime

    from schemas.events import CanarySide
    from workers.controller import canary_view
    from workers.controller.canary_view import CanaryView

    catalog, _, _, http = world
    view = CanaryView(
        canary_id=uuid.uuid4(),
        alias="prod",
        revision=2,
        incumbent_revision=1,
        share=0.1,
        started_at=datetime(2026, 12, 1, tzinfo=UTC),
        canary=CanarySide(revision=2, answers=7, failures=1),
        incumbent=CanarySide(revision=1, answers=60),
        offsets={"mint.infer.results:0": 99},  # the controller's bookkeeping: never served
    )
    views = {("acme", "math"): view}
    catalog.catalog.session, catalog.catalog.keyspace = None, "ks"  # the fake reader's
    monkeypatch.setattr(canary_view, "read_canary_view", lambda _s, _k, t, p: views.get((t, p)))
    mint = remote(catalog, http)
    got = mint.canary_status("math")
    assert got is not None and (got.revision, got.share, got.canary.answers) == (2, 0.1, 7)
    assert got.canary_id == view.canary_id and got.offsets == {}
    assert mint.canary_status("math", alias="staging") is None
    assert mint.canary_status("code") is None  # never had one
    raw = http.get("/mint/v1/policies/math/canary", headers=mint.http.headers).json()
    assert raw["object"] == "canary" and "offsets" not in raw["view"]
    with pytest.raises(RemoteError) as other:
        remote(catalog, http, tenant="globex").canary_status("math")
    assert other.value.status == 404
