"""Canary releases from the CLI and the SDK, without services: `mint promote --canary` sends the
right serving.canary and prints canary.started, `mint rollback` prints the canary.ended that
ends one, `mint canary status` shows the controller's view (table or JSON), `mint feedback`
refuses a score outside [0, 1], `mint policies configure --canary-…` fills CanaryRule."""

from __future__ import annotations

import json
import uuid
from contextlib import contextmanager
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

import mint.commands.canary as canary_cli
import mint.commands.lifecycle as lifecycle
import mint.commands.policy_status as policy_status
import mint.commands.revisions as revisions_cli
from mint.cli import main
from mint.sdk.client import MintClient
from mint.sdk.exceptions import WaitTimeout
from mint.sdk.transport import DirectTransport
from mint.sdk.verbs import Verbs
from schemas import make_event
from schemas.envelope import make_reply
from schemas.events import (
    AliasMoved,
    CanaryEnded,
    CanaryRule,
    CanarySide,
    CanaryStarted,
    PolicyConfigured,
    ServingRefused,
)
from schemas.exceptions import EventValidationError
from workers.controller.canary_view import CanaryDecision, CanaryView

AT = datetime(2026, 12, 6, 21, 0, tzinfo=UTC)
DIGEST = "sha256:" + "c" * 64
URI = "s3://mint-store/acme/math-rl/revisions/7"
RULE = CanaryRule(min_answers=500, min_scores=20, max_failure_increase=0.02, max_score_drop=0.05)


def view(decision: CanaryDecision | None = None, **kw: Any) -> CanaryView:
    return CanaryView(
        canary_id=uuid.uuid4(),
        alias="prod",
        revision=7,
        incumbent_revision=5,
        share=0.1,
        started_at=AT,
        started_by="alice",
        rule=RULE,
        canary=CanarySide(
            revision=7, answers=30, failures=1, latency_ms_sum=600.0, scores=4, score_sum=3.2
        ),
        incumbent=CanarySide(revision=5, answers=270, failures=3, latency_ms_sum=5400.0),
        offsets={"infer.results:0": 41},
        early_scores={"r9": 0.5},
        decision=decision,
        **kw,
    )


# ---------------------------------------------------------------------- a fake client


class FakeClient(Verbs):
    """The SDK's verbs over the direct transport, with the client's plumbing faked: ``send``
    records the event and ``reply`` (command → answers) fills the watcher that ``wait_for``
    searches with the real predicate."""

    def __init__(self, reply=lambda cmd: [], view: CanaryView | None = None) -> None:
        self.tenant, self.name, self.reply, self.view = "acme", "cli", reply, view
        self.sent: list[Any] = []
        self.seen: list[Any] = []
        self.transport = DirectTransport(self)

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def send(self, policy: str, payload: Any, caused_by_env: Any = None) -> Any:
        env = make_event(payload, tenant=self.tenant, policy=policy, producer=self.name)
        self.sent.append(env)
        self.seen.extend(self.reply(env))
        return env

    def wait_for(self, predicate, *, timeout_s=None, what="event", request=None) -> Any:
        for e in self.seen:
            if predicate(e):
                return e
        raise WaitTimeout(f"no {what} within 1 s")

    def canary_status(self, policy: str, alias: str = "prod") -> CanaryView | None:
        return self.view


def started(cmd: Any) -> Any:
    p = cmd.payload
    return make_reply(
        CanaryStarted(
            alias=p.alias,
            canary_id=cmd.event_id,
            incumbent_revision=5,
            revision=p.revision,
            adapter_digest=DIGEST,
            store_uri=URI,
            share=p.share,
        ),
        cmd,
        producer="controller",
    )


@pytest.fixture
def client(monkeypatch):
    def use(fake: FakeClient) -> FakeClient:
        monkeypatch.setattr(lifecycle, "cli_client", lambda tenant, timeout_s, producer="cli": fake)
        return fake

    return use


# ---------------------------------------------------------------------- promote --canary


def test_promote_canary_sends_serving_canary_and_prints_the_start(client, monkeypatch) -> None:
    """No controller view yet: the line names the policy's configured canary rule."""
    fake = client(FakeClient(lambda cmd: [started(cmd)]))
    fake.catalog = SimpleNamespace()
    monkeypatch.setattr(
        policy_status, "policy_configuration", lambda repo, t, p: {"canary": RULE.model_dump()}
    )
    res = CliRunner().invoke(
        main,
        ["promote", "acme/math-rl@7", "--canary", "0.1", "--expected", "5", "--reason", "try"],
    )
    assert res.exit_code == 0, res.output
    (cmd,) = fake.sent
    assert cmd.type == "serving.canary" and cmd.policy_id == "acme/math-rl"
    p = cmd.payload
    assert (p.alias, p.revision, p.share, p.expected_revision) == ("prod", 7, 0.1, 5)
    assert (p.reason, p.requested_by) == ("try", "cli")
    shown = " ".join(res.output.split())
    assert "canary: 10% of acme/math-rl@prod's callers -> revision 7" in shown
    assert "the rest stay on 5" in shown and "after 500 answers and 20 scores" in shown


def test_promote_canary_prints_the_rule_of_the_controllers_view(client) -> None:
    def reply(cmd):
        fake.view = view().model_copy(update={"canary_id": cmd.event_id})
        return [started(cmd)]

    fake = client(FakeClient(reply))
    res = CliRunner().invoke(main, ["promote", "acme/math-rl@7", "--canary", "0.25"])
    assert res.exit_code == 0, res.output
    shown = " ".join(res.output.split())
    assert "25% of acme/math-rl@prod's callers" in shown
    assert "after 500 answers and 20 scores" in shown
    assert fake.sent[0].payload.expected_revision is None


def test_a_refused_canary_prints_the_reason_and_exits_1(client) -> None:
    def refuse(cmd):
        return [
            make_reply(
                ServingRefused(
                    command_id=cmd.event_id,
                    command_type="serving.canary",
                    alias="prod",
                    reason="a canary of revision 6 runs already: end it with `mint rollback`",
                    current_revision=5,
                ),
                cmd,
                producer="controller",
            )
        ]

    client(FakeClient(refuse))
    res = CliRunner().invoke(main, ["promote", "acme/math-rl@7", "--canary", "0.1"])
    assert res.exit_code == 1 and "error:" in res.output
    assert "serving.canary of acme/math-rl@prod refused: a canary of revision 6" in res.output


@pytest.mark.parametrize("share", ["0", "1", "1.5", "-0.1", "nan"])
def test_a_share_outside_0_1_is_a_usage_error(client, share) -> None:
    fake = client(FakeClient())
    res = CliRunner().invoke(main, ["promote", "acme/math-rl@7", "--canary", share])
    assert res.exit_code == 2 and "0 < SHARE < 1" in res.output and fake.sent == []


def test_plain_promote_takes_the_alias_moved_down_its_chain(client) -> None:
    """A promote that ends a canary as promoted: canary.ended, then the alias.moved it caused."""

    def reply(cmd):
        ended = make_reply(_ended(cmd, "promoted"), cmd, producer="controller")
        moved = AliasMoved(
            alias="prod",
            from_revision=5,
            to_revision=7,
            adapter_digest=DIGEST,
            store_uri=URI,
            cause="promote",
        )
        return [ended, make_reply(moved, ended, producer="controller")]

    fake = client(FakeClient(reply))
    res = CliRunner().invoke(main, ["promote", "acme/math-rl@7"])
    assert res.exit_code == 0, res.output
    assert fake.sent[0].type == "serving.promote" and "acme/math-rl@prod: 5 → 7" in res.output


def _ended(cmd: Any, outcome: str) -> CanaryEnded:
    return CanaryEnded(
        alias="prod",
        canary_id=uuid.uuid4(),
        revision=7,
        incumbent_revision=5,
        outcome=outcome,
        reason="ended by hand" if outcome == "rolled_back" else "won",
    )


# ---------------------------------------------------------------------- rollback


def test_rollback_of_a_running_canary_prints_its_end(client) -> None:
    fake = client(
        FakeClient(lambda cmd: [make_reply(_ended(cmd, "rolled_back"), cmd, producer="ctl")])
    )
    res = CliRunner().invoke(main, ["rollback", "acme/math-rl"])
    assert res.exit_code == 0, res.output
    assert fake.sent[0].type == "serving.rollback"
    assert (
        "canary of revision 7 ended (rolled back): ended by hand; acme/math-rl@prod stays on 5"
        in res.output.replace("\n", " ")
    )


def test_an_unrelated_canary_end_is_not_the_answer(client) -> None:
    """Another command's canary.ended (another chain) is not this rollback's answer."""
    other = make_event(
        _ended(None, "rolled_back"), tenant="acme", policy="math-rl", producer="controller"
    )
    client(FakeClient(lambda cmd: [other]))
    res = CliRunner().invoke(main, ["rollback", "acme/math-rl", "--timeout", "1"])
    assert res.exit_code == 1 and "mint worker controller" in res.output


# ---------------------------------------------------------------------- canary status


@pytest.fixture
def views(monkeypatch):
    shown: dict[str, CanaryView] = {}  # policy id -> its latest canary
    monkeypatch.setattr(canary_cli, "load_view", lambda t, p: shown.get(f"{t}/{p}"))
    return shown


def test_status_table_shows_both_sides_progress_and_rule(views) -> None:
    views["acme/math-rl"] = view()
    res = CliRunner().invoke(main, ["canary", "status", "acme/math-rl"])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "canary of acme/math-rl@prod" in out
    canary_row = next(line for line in out.splitlines() if "│ canary" in line)
    for cell in ("7", "30", "1", "3.23%", "20.0 ms", "4", "0.800"):
        assert cell in canary_row, canary_row
    incumbent_row = next(line for line in out.splitlines() if "incumbent" in line)
    assert "270" in incumbent_row and "1.10%" in incumbent_row and "-" in incumbent_row
    assert "share asked  10%" in out and "share got    10%" in out
    assert "answers 30/500, scores 4/20" in out
    assert "none yet: the canary is live" in out
    assert "2026-12-06 21:00:00 by alice" in out


def test_status_shows_the_decision_once_there_is_one(views) -> None:
    decision = CanaryDecision(
        outcome="rolled_back",
        reason="failure rate 9% > 1% + 1% [load]",
        decided_at=AT,
        deciding_event_id=uuid.uuid4(),
        done=True,
    )
    views["acme/math-rl"] = view(decision).model_copy(update={"alias": "beta"})
    res = CliRunner().invoke(main, ["canary", "status", "acme/math-rl@beta"])
    assert res.exit_code == 0, res.output
    shown = " ".join(res.output.split())
    assert "rolled back at 2026-12-06 21:00:00: failure rate 9% > 1% + 1% [load]" in shown
    assert "acme/math-rl@beta stays on 5" in shown


def test_status_json_is_the_view_as_one_object(views) -> None:
    v = view()
    views["acme/math-rl"] = v
    res = CliRunner().invoke(main, ["canary", "status", "acme/math-rl", "-o", "json"])
    assert res.exit_code == 0, res.output
    row = json.loads(res.output)
    assert row["policy_id"] == "acme/math-rl" and row["canary_id"] == str(v.canary_id)
    assert row["rule"] == RULE.model_dump() and row["decision"] is None
    assert row["canary"]["answers"] == 30 and row["canary"]["mean_score"] == pytest.approx(0.8)
    assert row["incumbent"]["mean_score"] is None
    assert row["share_got"] == pytest.approx(0.1) and row["started_at"].startswith("2026-12-06")
    assert "offsets" not in row and row["early_scores"] == 1


def test_no_canary_is_a_clear_message_and_exit_0(views) -> None:
    res = CliRunner().invoke(main, ["canary", "status", "acme/math-rl", "--alias", "prod"])
    assert res.exit_code == 0
    assert "no canary of acme/math-rl@prod" in res.output
    assert "mint promote acme/math-rl@N --canary 0.1" in res.output
    res = CliRunner().invoke(main, ["canary", "status", "acme/math-rl", "-o", "json"])
    assert res.exit_code == 0 and res.stdout.strip() == "null"


def test_a_canary_on_another_alias_is_named(views) -> None:
    views["acme/math-rl"] = view().model_copy(update={"alias": "beta"})
    res = CliRunner().invoke(main, ["canary", "status", "acme/math-rl"])
    assert res.exit_code == 0 and "no canary of acme/math-rl@prod" in res.output
    assert "`mint canary status acme/math-rl@beta`" in res.output


def test_status_reads_the_controllers_worker_state(monkeypatch) -> None:
    """The CLI and the SDK read the document at canary_key in worker_state controller.canary."""
    docs = {("controller.canary", "acme/math-rl"): view().model_dump(mode="json")}

    class Table:
        def __init__(self, session, keyspace, name):
            self.name = name

        def get(self, key, default=None):
            return docs.get((self.name, key), default)

    @contextmanager
    def repo():
        yield SimpleNamespace(session=None, keyspace="mint")

    monkeypatch.setattr("catalog.state.StateTable", Table)
    monkeypatch.setattr(revisions_cli, "catalog_repo", repo)
    assert canary_cli.load_view("acme", "math-rl").rule == RULE
    assert canary_cli.load_view("acme", "other") is None
    direct = SimpleNamespace(tenant="acme", catalog=SimpleNamespace(session=None, keyspace="mint"))
    sdk = SimpleNamespace(transport=DirectTransport(direct))
    assert MintClient.canary_status(sdk, "math-rl").revision == 7  # prod's
    assert MintClient.canary_status(sdk, "math-rl", alias="beta") is None  # not beta's
    assert MintClient.canary_status(sdk, "math-rl", alias=None).alias == "prod"


# ---------------------------------------------------------------------- feedback


@pytest.fixture
def feedback_client(monkeypatch):
    fake = FakeClient()
    monkeypatch.setattr(canary_cli, "cli_client", lambda tenant, timeout_s: fake)
    return fake


def test_feedback_publishes_feedback_submitted(feedback_client) -> None:
    res = CliRunner().invoke(
        main, ["feedback", "acme/math-rl", "req-1", "0.75", "--comment", "short"]
    )
    assert res.exit_code == 0, res.output
    (env,) = feedback_client.sent
    assert env.type == "feedback.submitted" and env.policy_id == "acme/math-rl"
    p = env.payload
    assert (p.request_id, p.score, p.comment, p.submitted_by) == ("req-1", 0.75, "short", "cli")
    assert "feedback on request req-1 of acme/math-rl: 0.75" in res.output


@pytest.mark.parametrize("score", ["1.5", "-0.1", "nan"])
def test_a_score_outside_0_1_is_a_usage_error(feedback_client, score) -> None:
    res = CliRunner().invoke(main, ["feedback", "acme/math-rl", "req-1", "--", score])
    assert res.exit_code == 2 and "outside [0, 1]" in res.output
    assert feedback_client.sent == []


def test_a_bad_request_id_is_a_usage_error(feedback_client) -> None:
    res = CliRunner().invoke(main, ["feedback", "acme/math-rl", "no spaces", "0.5"])
    assert res.exit_code == 2 and "is not a request id" in res.output
    assert feedback_client.sent == []


def test_sdk_feedback_refuses_a_bad_score_before_sending() -> None:
    fake = FakeClient()
    with pytest.raises(EventValidationError, match="score"):
        fake.feedback("math-rl", "req-1", 1.5)
    assert fake.sent == []


# ---------------------------------------------------------------------- configure, show


def test_configure_flags_fill_the_canary_rule(monkeypatch) -> None:
    sent: list[PolicyConfigured] = []
    fake = SimpleNamespace(
        name="cli",
        base_models={},
        send=lambda policy, payload: sent.append(payload) or SimpleNamespace(event_id="e1"),
    )

    class Client:  # the real create_policy on a fake client: the CLI's flags reach the payload
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def create_policy(self, policy, **kw):
            return MintClient.create_policy(fake, policy, **kw)

    monkeypatch.setattr(policy_status, "cli_client", lambda tenant, timeout_s: Client())
    args = ["policies", "configure", "acme/math-rl", "--base-model", "m", "--suite", "toy-even"]
    res = CliRunner().invoke(
        main,
        [
            *args,
            "--canary-min-answers=500",
            "--canary-min-scores=20",
            "--canary-max-failure-increase=0.02",
            "--canary-max-score-drop=0.05",
        ],
    )
    assert res.exit_code == 0, res.output
    assert sent[0].canary == RULE and "after 500 answers and 20 scores" in res.output
    assert CliRunner().invoke(main, args).exit_code == 0
    assert sent[1].canary == CanaryRule()  # the contract's defaults
    res = CliRunner().invoke(main, [*args, "--canary-max-score-drop=2"])
    assert res.exit_code == 2 and "--canary-max-score-drop" in res.output and len(sent) == 2


def test_show_prints_the_canary_rule_with_the_gate(monkeypatch) -> None:
    from catalog.models import Policy

    class Repo:
        def get_policy(self, tenant, policy):
            return Policy("acme", "math-rl", "m", AT, "alice", None, None)

        def list_aliases(self, tenant, policy):
            return []

        def list_revisions(self, tenant, policy, page_size):
            return [], None

    @contextmanager
    def repo():
        yield Repo()

    config = {
        "suite": "toy-even",
        "thresholds": {"reward": {"min": 0.6}},
        "promote_to": "prod",
        "auto_evaluate": True,
        "auto_promote": True,
        "rollback_metric": None,
        "rollback_tolerance": 0.0,
        "canary": RULE.model_dump(),
    }
    monkeypatch.setattr(revisions_cli, "catalog_repo", repo)
    monkeypatch.setattr(policy_status, "policy_configuration", lambda r, t, p: config)
    res = CliRunner().invoke(main, ["policies", "show", "acme/math-rl"], terminal_width=200)
    assert res.exit_code == 0, res.output
    assert "reward>=0.6" in res.output and "after 500 answers and 20 scores" in res.output
    res = CliRunner().invoke(main, ["policies", "show", "acme/math-rl", "-o", "json"])
    assert json.loads(res.output)["configuration"]["canary"] == RULE.model_dump()


# ---------------------------------------------------------------------- help


@pytest.mark.parametrize(
    ("command", "teaches"),
    [
        (["canary", "--help"], "mint promote acme/math-rl@7 --canary 0.1"),
        (["canary", "status", "--help"], "mint canary status acme/math-rl"),
        (["feedback", "--help"], "mint feedback acme/math-rl 3f9c2a7e 0.9"),
        (["promote", "--help"], "mint promote acme/math-rl@7 --canary 0.1"),
        (["rollback", "--help"], "ends the canary"),
        (["policies", "configure", "--help"], "--canary-min-answers 500"),
    ],
)
def test_help_teaches_with_an_example(command, teaches) -> None:
    res = CliRunner().invoke(main, command, terminal_width=200)
    assert res.exit_code == 0 and teaches in " ".join(res.output.split()), res.output
