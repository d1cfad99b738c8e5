"""The SDK's verbs are written once over a transport (mint/sdk/verbs.py, mint/sdk/transport.py):
with a fake transport, each verb's request (validated before anything is sent) and its answer;
then what the HTTP transport makes of a request (the gateway's route and body) and of an answer."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from catalog.exceptions import NotFound
from mint.sdk import InvalidSampling, MintClient, RemoteMintClient
from mint.sdk.remote import _route
from mint.sdk.remote_types import CanaryInfo, Moved, Retirement, Tagged, controller_answer
from mint.sdk.transport import DirectTransport
from mint.sdk.verbs import Verbs
from schemas.exceptions import EventValidationError


class FakeTransport:
    """Records what the verbs hand over; answers with a payload-like namespace."""

    name = "fake"

    def __init__(self, answer: Any = None) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.answer = answer
        self.rows: list[Any] = []
        self.view: Any = None

    def command(self, policy, cmd, answers, where, *, timeout_s=None):
        self.calls.append(("command", (policy, cmd, answers, where, timeout_s)))
        return self.answer

    def publish(self, policy, payload):
        self.calls.append(("publish", (policy, payload)))
        return "event-id"

    def infer(self, policy, request):
        self.calls.append(("infer", (policy, request)))
        return "answer"

    def policies(self):
        return ["p"]

    def revisions(self, policy, limit):
        self.calls.append(("revisions", (policy, limit)))
        if policy == "missing":
            raise NotFound(policy)
        return self.rows[: limit or None]

    def aliases(self, policy):
        return ["a"]

    def canary_view(self, policy):
        return self.view


class Client(Verbs):
    def __init__(self, transport: FakeTransport) -> None:
        self.transport = transport


def sent(t: FakeTransport) -> tuple:
    kind, args = t.calls[-1]
    assert kind == "command"
    return args


def test_both_clients_share_one_set_of_verbs() -> None:
    for verb in ("promote", "rollback", "canary_status", "tag", "retire", "feedback", "infer"):
        assert getattr(RemoteMintClient, verb) is getattr(Verbs, verb), verb
    for verb in ("policies", "revisions", "aliases", "latest_revision", "promote", "infer"):
        assert getattr(MintClient, verb) is getattr(Verbs, verb), verb
    assert MintClient.retire is not Verbs.retire  # direct: waits for the catalog's record


def test_promote_canary_and_rollback_build_their_commands_once() -> None:
    t = FakeTransport(answer="moved")
    mint = Client(t)
    assert mint.promote("math", 2, expected_revision=1, reason="better") == "moved"
    policy, cmd, answers, where, _ = sent(t)
    assert (policy, cmd.event_type, answers, where) == (
        "math",
        "serving.promote",
        ("alias.moved",),
        "@prod",
    )
    assert (cmd.revision, cmd.expected_revision, cmd.requested_by) == (2, 1, "fake")
    mint.promote("math", 3, alias="beta", canary=0.25)
    _, cmd, answers, where, _ = sent(t)
    assert (cmd.event_type, cmd.share, answers, where) == (
        "serving.canary",
        0.25,
        ("canary.started",),
        "@beta",
    )
    mint.rollback("math", to_revision=1)
    _, cmd, answers, _, _ = sent(t)
    assert (cmd.event_type, cmd.reason, cmd.to_revision) == ("serving.rollback", "rollback", 1)
    assert answers == ("alias.moved", "canary.ended")


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.promote("math", 0),
        lambda m: m.promote("math", 1, alias="not an alias"),
        lambda m: m.promote("math", 1, canary=1.5),
        lambda m: m.rollback("math", to_revision=0),
        lambda m: m.tag("math", 1),
        lambda m: m.tag("math", 1, add=["x"], remove=["x"]),
        lambda m: m.tag("math", 1, add=["no spaces"]),
        lambda m: m.feedback("math", "req-1", 1.5),
        lambda m: m.infer("math", ""),
    ],
)
def test_a_bad_request_is_refused_before_the_transport_sees_it(call) -> None:
    t = FakeTransport()
    with pytest.raises(EventValidationError):
        call(Client(t))
    assert t.calls == []


def test_tag_retire_and_feedback_shape_their_answers_once() -> None:
    t = FakeTransport(answer=SimpleNamespace(payload=SimpleNamespace(tags=["z", "a"])))
    mint = Client(t)
    assert mint.tag("math", 4, add=["z", "a", "z"], timeout_s=2.0) == ["a", "z"]
    _, cmd, answers, where, timeout_s = sent(t)
    assert (cmd.add, cmd.remove, answers, where, timeout_s) == (
        ["z", "a"],
        [],
        ("revision.tagged",),
        "@4",
        2.0,
    )
    t.answer = "retired"
    assert mint.retire("math", reason="old", undo=True) == "retired"
    _, cmd, answers, where, _ = sent(t)
    assert (cmd.event_type, cmd.retired, cmd.reason, where) == ("policy.retire", False, "old", "")
    assert mint.feedback("math", "req-1", 0.5, comment="ok") == "event-id"
    kind, (_, payload) = t.calls[-1]
    assert kind == "publish" and (payload.score, payload.submitted_by) == (0.5, "fake")


def test_infer_builds_one_request_for_either_transport() -> None:
    t = FakeTransport()
    mint = Client(t)
    assert mint.infer("math", "2+2=", revision=3, top_logprobs=2, stop=["\n"]) == "answer"
    kind, (policy, req) = t.calls[-1]
    assert kind == "infer" and policy == "math" and req.request_id
    assert (req.revision, req.stop, req.logprobs) == (3, ["\n"], True)  # top_logprobs implies it
    assert req.sampling.top_logprobs == 2
    with pytest.raises(InvalidSampling):
        mint.infer("math", "x", top_n=3)  # type: ignore[call-arg]
    assert len(t.calls) == 1


def test_reads_latest_revision_and_canary_status() -> None:
    t = FakeTransport()
    mint = Client(t)
    t.rows = [SimpleNamespace(revision=5), SimpleNamespace(revision=4)]
    assert mint.latest_revision("math") == 5 and t.calls[-1] == ("revisions", ("math", 1))
    assert mint.latest_revision("missing") is None
    t.rows = []
    assert mint.latest_revision("math") is None
    assert mint.policies() == ["p"] and mint.aliases("math") == ["a"]
    assert mint.canary_status("math") is None
    t.view = SimpleNamespace(alias="prod")
    assert mint.canary_status("math") is t.view and mint.canary_status("math", None) is t.view
    assert mint.canary_status("math", alias="beta") is None


def test_the_direct_transport_names_a_refusal_and_reads_through_the_catalog() -> None:
    from mint.sdk import CommandRefused
    from schemas import make_event
    from schemas.events import ServingRefused

    class Plumbing:
        tenant, name = "acme", "ops"

        def __init__(self) -> None:
            self.catalog = SimpleNamespace(
                list_revisions=lambda tenant, policy, page_size: ([1, 2, 3][:page_size], None),
                iter_revisions=lambda tenant, policy: iter([3, 2, 1]),
            )

        def send(self, policy, payload):
            self.cmd = make_event(payload, tenant=self.tenant, policy=policy, producer="ops")
            return self.cmd

        def wait_for(self, predicate, **kw):
            refused = ServingRefused(
                command_id=self.cmd.event_id,
                command_type=self.cmd.type,
                alias="prod",
                reason="stale",
                current_revision=2,
            )
            env = make_event(
                refused, tenant="acme", policy="math", producer="ctl", caused_by=self.cmd
            )
            assert predicate(env)
            return env

    direct = DirectTransport(Plumbing())
    mint = Client(direct)  # type: ignore[arg-type]
    with pytest.raises(
        CommandRefused, match="serving.promote of acme/math@prod refused: stale"
    ) as e:
        mint.promote("math", 3, expected_revision=1)
    assert e.value.current_revision == 2
    assert direct.revisions("math", 2) == [1, 2] and direct.revisions("math", None) == [3, 2, 1]


def test_the_http_transport_routes_each_command_as_the_gateway_reads_it() -> None:
    t = FakeTransport()
    mint = Client(t)
    mint.promote("math", 2, expected_revision=1)
    mint.promote("math", 2, canary=0.1, reason="try")
    mint.rollback("math")
    t.answer = SimpleNamespace(payload=SimpleNamespace(tags=[]))
    mint.tag("math", 7, add=["a"], remove=["b"])
    mint.retire("math", undo=True)
    routes = [_route("math", args[1]) for kind, args in t.calls]
    base = "/mint/v1/policies/math"
    assert routes == [
        (f"{base}/promote", {"alias": "prod", "revision": 2, "expected_revision": 1, "reason": ""}),
        (f"{base}/promote", {"alias": "prod", "revision": 2, "reason": "try", "canary": 0.1}),
        (f"{base}/rollback", {"alias": "prod", "reason": "rollback"}),
        (f"{base}/revisions/7/tags", {"add": ["a"], "remove": ["b"]}),
        (f"{base}/retire", {"reason": "", "undo": True}),
    ]


def test_the_gateways_answers_read_like_the_direct_transports_events() -> None:
    moved = controller_answer(
        {
            "policy": "m",
            "alias": "prod",
            "from_revision": 1,
            "to_revision": 2,
            "cause": "promote",
            "event_id": "e",
        }
    )
    assert isinstance(moved, Moved) and moved.payload.to_revision == 2
    started = controller_answer(
        {
            "policy": "m",
            "alias": "prod",
            "revision": 2,
            "incumbent_revision": 1,
            "share": 0.1,
            "canary_id": "c",
            "event_id": "e",
        }
    )
    assert isinstance(started, CanaryInfo) and started.payload.share == 0.1
    tagged = controller_answer({"policy": "m", "revision": 2, "tags": ["a"], "event_id": "e"})
    assert isinstance(tagged, Tagged) and tagged.payload.tags == ["a"]
    retired = controller_answer({"policy": "m", "retired": True, "reason": "", "event_id": "e"})
    assert isinstance(retired, Retirement) and retired.retired
