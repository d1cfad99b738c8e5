"""`policy.retired` without Kafka or Cassandra: the contract, its projection (fake repository),
`mint policies retire|show` (fake client and repository), the SDK's policy.retire command
answered by the controller's registry logic, and the trainer's refusal of an update of a
retired policy."""

from __future__ import annotations

import json
import uuid
from contextlib import contextmanager
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

import mint.commands.policy_status as policy_status
import mint.commands.revisions as revisions_cli
from catalog.exceptions import PolicyNotFound, PolicyRetired
from catalog.models import Alias, Policy, Revision
from catalog.projection import PROJECTED_TYPES, Outcome, apply_event, apply_events
from mint.cli import main
from mint.sdk.client import MintClient
from mint.sdk.exceptions import CommandRefused, WaitTimeout
from schemas import decode_event, encode_event, make_event
from schemas.events import PolicyRetirement
from schemas.exceptions import EventValidationError
from streams.exceptions import KafkaUnavailable, Refused, is_refusal
from workers.controller.registry import carry_out
from workers.trainer.exporting import RevisionExporter, derived_id

AT = datetime(2026, 12, 6, 21, 0, 0, 123000, tzinfo=UTC)
CREATED = datetime(2026, 12, 1, tzinfo=UTC)


def _retirement(retired: bool = True, requested_by: str = "alice", **kw: Any):
    return make_event(
        PolicyRetirement(retired=retired, reason="superseded", requested_by=requested_by),
        tenant="acme",
        policy="math-rl",
        producer="cli",
        occurred_at=AT,
        **kw,
    )


def _policy(retired_at: datetime | None = None, by: str | None = None) -> Policy:
    return Policy("acme", "math-rl", "tiny-llama", CREATED, "trainer/a", retired_at, by)


# ---------------------------------------------------------------------- contract


def test_the_event_round_trips_on_serving_events_and_is_projected() -> None:
    env = _retirement()
    assert env.type == "policy.retired" and PolicyRetirement.topic == "serving.events"
    back = decode_event(encode_event(env))
    assert back.payload == env.payload and back.occurred_at == AT
    assert "policy.retired" in PROJECTED_TYPES
    assert PolicyRetirement().retired is True  # retiring is the default; False restores


@pytest.mark.parametrize(
    ("field", "value"), [("reason", "x" * 1025), ("requested_by", "x" * 257), ("retired", "maybe")]
)
def test_bad_fields_are_refused_naming_the_field(field: str, value: Any) -> None:
    obj = json.loads(encode_event(_retirement()))
    obj["payload"][field] = value
    with pytest.raises(EventValidationError, match=field):
        decode_event(json.dumps(obj).encode())


# ---------------------------------------------------------------------- projection


class FakeRepo:
    def __init__(self, exists: bool = True) -> None:
        self.exists, self.retired, self.recorded = exists, [], []

    def is_applied(self, event_id) -> bool:
        return False

    def applied_among(self, ids) -> set:
        return set()

    def set_retired(self, tenant, policy, *, retired, at, by=""):
        if not self.exists:
            raise PolicyNotFound(f"policy {tenant}/{policy} does not exist")
        self.retired.append((tenant, policy, retired, at, by))

    def record_applied(self, event_id, type_, tenant, policy, *, revision, at) -> None:
        self.recorded.append((event_id, type_, revision, at))

    def record_applied_many(self, rows) -> None:
        self.recorded += [(r[0], r[1], r[4], r[6]) for r in rows]


def test_a_retirement_is_recorded_with_the_events_time_and_requester() -> None:
    repo, env = FakeRepo(), _retirement()
    assert apply_event(repo, env) is Outcome.APPLIED
    assert repo.retired == [("acme", "math-rl", True, AT, "alice")]
    assert repo.recorded == [(env.event_id, "policy.retired", None, AT)]


def test_a_restore_clears_it_and_the_producer_stands_in_for_an_empty_requester() -> None:
    repo = FakeRepo()
    retire, restore = _retirement(requested_by=""), _retirement(retired=False)
    assert apply_events(repo, [retire, restore]) == [Outcome.APPLIED, Outcome.APPLIED]
    assert [(r[2], r[4]) for r in repo.retired] == [(True, "cli"), (False, "alice")]
    assert [r[0] for r in repo.recorded] == [retire.event_id, restore.event_id]


def test_a_retirement_of_an_unknown_policy_is_refused_and_not_recorded() -> None:
    repo = FakeRepo(exists=False)
    with pytest.raises(PolicyNotFound):
        apply_event(repo, _retirement())
    assert repo.recorded == []


# ---------------------------------------------------------------------- SDK


class SdkCatalog:
    """The catalog the projector writes (set_retired) and the SDK reads, faked."""

    def __init__(self, policy: Policy | None) -> None:
        self.policy, self.writes, self.applied = policy, [], set()

    def is_applied(self, event_id) -> bool:
        return event_id in self.applied

    def get_policy(self, tenant, policy) -> Policy:
        if self.policy is None:
            raise PolicyNotFound(f"policy {tenant}/{policy} does not exist")
        return self.policy

    def set_retired(self, tenant, policy, *, retired, at, by=""):
        self.get_policy(tenant, policy)
        self.writes.append((retired, by))
        self.policy = _policy(AT, by) if retired else _policy()
        return self.policy


def project(catalog, facts) -> None:
    """What the projector does with the controller's facts (catalog.projection)."""
    for env in facts:
        p = env.payload
        if env.type == "revision.tagged":
            catalog.set_tags(env.tenant, env.policy, p.revision, p.tags, at=env.occurred_at)
        elif env.type == "policy.retired":
            catalog.set_retired(
                env.tenant, env.policy, retired=p.retired, at=env.occurred_at, by=p.requested_by
            )
        catalog.applied.add(env.event_id)


class ControllerWatcher:
    """Answers the last command sent as the controller does (workers.controller.registry on
    the decoded command); ``gone`` deletes the policy first, None: no controller runs."""

    def __init__(self, catalog: SdkCatalog, sent: list, mode: str | None = "live") -> None:
        self.catalog, self.sent, self.mode, self.replies = catalog, sent, mode, []
        self.state: dict = {}  # the controller's worker_state

    def wait_for(self, predicate, timeout_s, what, request_id=None):
        if self.mode is not None:
            if self.mode == "gone":
                self.catalog.policy = None
            cmd = decode_event(encode_event(self.sent[-1]))
            self.replies = carry_out(self.catalog, self.state, cmd, producer="controller/test")
            project(self.catalog, self.replies)  # as the projector records each fact
        for env in self.replies:
            if predicate(env):
                return env
        raise WaitTimeout(f"no {what} within {timeout_s:.0f} s")


def _sdk(catalog: SdkCatalog, mode: str | None = "live") -> tuple[MintClient, list]:
    client = object.__new__(MintClient)  # no Kafka, no Cassandra: the parts retire uses
    sent: list = []
    client.tenant, client.name, client.timeout_s = "acme", "sdk", 5.0
    client._catalog = catalog
    client.producer = SimpleNamespace(publish=sent.append)
    client.watcher = ControllerWatcher(catalog, sent, mode)
    return client, sent


def test_sdk_retire_sends_the_command_and_returns_the_policy_once_recorded() -> None:
    catalog = SdkCatalog(_policy())
    client, sent = _sdk(catalog)
    assert client.retire("math-rl", reason="old").retired_by == "sdk"
    (cmd,) = sent
    assert cmd.type == "policy.retire" and type(cmd.payload).topic == "serving.commands"
    assert (cmd.payload.retired, cmd.payload.reason, cmd.payload.requested_by) == (
        True,
        "old",
        "sdk",
    )
    (fact,) = client.watcher.replies  # the fact answers the command
    assert fact.type == "policy.retired" and fact.causation_id == cmd.event_id
    assert client.retire("math-rl", undo=True).retired_at is None
    assert sent[1].payload.retired is False and catalog.writes == [(True, "sdk"), (False, "sdk")]


def test_sdk_retire_refused_before_sending_by_the_controller_or_timed_out() -> None:
    client, sent = _sdk(SdkCatalog(None))
    with pytest.raises(PolicyNotFound):
        client.retire("math-rl")
    assert sent == []
    client, sent = _sdk(SdkCatalog(_policy()), mode="gone")  # deleted after the check
    with pytest.raises(CommandRefused, match="policy.retire of acme/math-rl refused: .*exist"):
        client.retire("math-rl")
    client, sent = _sdk(SdkCatalog(_policy()), mode=None)
    with pytest.raises(WaitTimeout, match="mint worker controller"):
        client.retire("math-rl", undo=True, timeout_s=0.05)
    assert sent[0].payload.retired is False


# ---------------------------------------------------------------------- CLI


class FakeClient:
    def __init__(self, policy: Policy | Exception, fail: Exception | None = None) -> None:
        self.state, self.fail, self.calls = policy, fail, []

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def policy(self, name: str) -> Policy:
        if isinstance(self.state, Exception):
            raise self.state
        return self.state

    def retire(self, name: str, *, reason: str, undo: bool, timeout_s: float) -> Policy:
        self.calls.append((name, reason, undo, timeout_s))
        if self.fail is not None:
            raise self.fail
        return _policy() if undo else _policy(AT, "cli")


@pytest.fixture
def cli(monkeypatch):
    def use(client: FakeClient):
        monkeypatch.setattr(policy_status, "cli_client", lambda tenant, timeout_s: client)
        return client

    return use


def test_retire_prints_when_and_by_whom(cli) -> None:
    client = cli(FakeClient(_policy()))
    res = CliRunner().invoke(main, ["policies", "retire", "acme/math-rl", "--reason", "old"])
    assert res.exit_code == 0, res.output
    assert client.calls == [("math-rl", "old", False, 30.0)]
    assert "retired at 2026-12-06 21:00:00 by cli" in res.output
    assert "--undo" in res.output


def test_undo_restores_and_a_repeat_sends_nothing(cli) -> None:
    client = cli(FakeClient(_policy(AT, "cli")))
    res = CliRunner().invoke(main, ["policies", "retire", "acme/math-rl", "--undo"])
    assert res.exit_code == 0 and "restored" in res.output
    assert client.calls == [("math-rl", "", True, 30.0)]
    again = cli(FakeClient(_policy(AT, "cli")))
    res = CliRunner().invoke(main, ["policies", "retire", "acme/math-rl"])
    assert res.exit_code == 0 and "nothing to do" in res.output and again.calls == []


@pytest.mark.parametrize(
    ("state", "fail", "expected"),
    [
        (PolicyNotFound("policy acme/math-rl does not exist"), None, "does not exist"),
        (_policy(), KafkaUnavailable("no broker"), "nothing was sent"),
        (_policy(), WaitTimeout("no answer in time."), "mint worker controller"),
        (_policy(), CommandRefused("policy.retire of acme/math-rl refused: gone"), "gone"),
    ],
)
def test_failures_are_one_line_that_says_what_happened(cli, state, fail, expected) -> None:
    client = cli(FakeClient(state, fail))
    res = CliRunner().invoke(main, ["policies", "retire", "acme/math-rl"])
    assert res.exit_code == 1 and "error:" in res.output and expected in res.output
    assert "Traceback" not in res.output
    if isinstance(state, Exception):
        assert client.calls == []  # refused before anything was sent


def test_a_bad_policy_name_is_a_usage_error() -> None:
    res = CliRunner().invoke(main, ["policies", "retire", "acme"])
    assert res.exit_code == 2


def test_show_prints_the_policy_with_its_retirement(monkeypatch) -> None:
    class Repo:
        def get_policy(self, tenant, policy):
            return _policy(AT, "alice")

        def list_aliases(self, tenant, policy):
            return [
                Alias(
                    "acme", "math-rl", "prod", 2, "sha256:" + "a" * 64, "s3://x", 3, AT, "cli", None
                )
            ]

        def list_revisions(self, tenant, policy, page_size):
            rev = Revision("acme", "math-rl", 3, "d", "u", "m", 2, AT, "t", uuid.uuid4())
            return [rev], None

    @contextmanager
    def repo():
        yield Repo()

    config = {
        "suite": "toy-even",
        "thresholds": {"reward": {"min": 0.6}, "loss": {"max": 2.0}},
        "promote_to": "prod",
        "auto_evaluate": True,
        "auto_promote": True,
        "rollback_metric": "reward",
        "rollback_tolerance": 0.05,
    }
    configs = {"acme/math-rl": config}
    monkeypatch.setattr(revisions_cli, "catalog_repo", repo)
    monkeypatch.setattr(
        policy_status, "policy_configuration", lambda r, t, p: configs.get(f"{t}/{p}")
    )
    res = CliRunner().invoke(main, ["policies", "show", "acme/math-rl", "-o", "json"])
    assert res.exit_code == 0, res.output
    row = json.loads(res.output)
    assert row["retired"] is True and row["retired_by"] == "alice"
    assert row["retired_at"].startswith("2026-12-06T21:00:00")
    assert row["aliases"] == {"prod": 2} and row["latest_revision"] == 3
    assert row["configuration"] == config
    res = CliRunner().invoke(main, ["policies", "show", "acme/math-rl"])
    assert "2026-12-06 21:00:00 by alice" in res.output and "prod→2" in res.output
    assert "loss<=2, reward>=0.6" in res.output and "reward falls > 0.05" in res.output
    configs.clear()
    res = CliRunner().invoke(main, ["policies", "show", "acme/math-rl"])
    assert res.exit_code == 0 and "mint policies configure" in res.output


# ---------------------------------------------------------------------- trainer


class Exporter(RevisionExporter):
    """The service's parts export_revision uses, faked."""

    def __init__(self, policy: Policy | None, applied: set | None = None) -> None:
        self.name, self.pol, self.applied = "trainer/t", policy, applied or set()
        stored = SimpleNamespace(
            digest="sha256:" + "b" * 64,
            uri="s3://mint-store/acme/math-rl/revisions/x",
            size_bytes=1,
            manifest=SimpleNamespace(
                rank=8,
                lora_alpha=16.0,
                target_modules=["q_proj"],
                target_parameters=[],
                base_model_fingerprint="f",
            ),
        )
        self.trainer = SimpleNamespace(
            policy=lambda pid: SimpleNamespace(parent_revision=None),
            config=SimpleNamespace(base_model="tiny-llama"),
            export=lambda *a, **kw: stored,
        )
        self.repo = self  # the catalog, faked by the same object

    def get_policy(self, tenant, policy):
        if self.pol is None:
            raise PolicyNotFound("no such policy")
        return self.pol

    def is_applied(self, event_id) -> bool:
        return event_id in self.applied

    def register_revision(self, tenant, policy, **kw):
        raise PolicyRetired(f"policy {tenant}/{policy} was retired at {AT.isoformat()}")


def _update():
    from schemas.examples import example_payload

    return make_event(
        example_payload("update.requested"), tenant="acme", policy="math-rl", producer="sdk"
    )


def test_an_update_of_a_retired_policy_is_refused_before_training() -> None:
    env = _update()
    with pytest.raises(Refused, match="retired") as e:
        Exporter(_policy(AT, "alice")).refuse_retired(env)
    assert is_refusal(e.value) and "--undo" in str(e.value)  # dead-lettered at once
    Exporter(_policy()).refuse_retired(env)  # live: trains
    Exporter(None).refuse_retired(env)  # new: its first export creates it
    # registered before a crash: re-run to announce it
    Exporter(_policy(AT), {derived_id(env.event_id, "export")}).refuse_retired(env)


def test_a_policy_retired_while_training_fails_that_request_not_the_loop() -> None:
    with pytest.raises(Refused, match="was retired") as e:
        Exporter(_policy()).export_revision(_update(), {"objective": "sft"})
    assert is_refusal(e.value)
