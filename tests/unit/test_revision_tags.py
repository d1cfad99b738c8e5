"""A revision's tags without Kafka or Cassandra: the SDK's ``tag`` answered by the controller's
own registry logic over a faked catalog, `mint revision tag` (fake client and repository), and
the tags in `mint revisions` (table and ``-o json``) and `mint revision show`."""

from __future__ import annotations

import json
from contextlib import contextmanager
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from rich.console import Console

import mint.commands.lifecycle as lifecycle
import mint.commands.revisions as revisions_cli
from catalog.exceptions import PolicyNotFound, RevisionNotFound
from catalog.models import Alias, Resolved, Revision
from mint.cli import main
from mint.sdk.client import MintClient
from mint.sdk.exceptions import CommandRefused, WaitTimeout
from schemas import decode_event, encode_event
from schemas.exceptions import EventValidationError
from streams.exceptions import KafkaUnavailable
from workers.controller.registry import carry_out

AT = datetime(2026, 12, 6, 17, 0, tzinfo=UTC)
DIGEST = "sha256:" + "ab" * 32
BAD_TAGS = ["-leading-dash", "has space", "x" * 65, "semi;colon", ""]

# ---------------------------------------------------------------------- SDK


class Catalog:
    """The catalog the controller writes and the SDK reads, faked: revision -> tags."""

    def __init__(self, tags: dict[int, list[str]] | None = None) -> None:
        self.tags = tags if tags is not None else {1: ["candidate"]}
        self.writes: list[tuple[int, list[str]]] = []
        self.applied: set = set()

    def get_policy(self, tenant, policy):
        if policy != "math":
            raise PolicyNotFound(f"policy {tenant}/{policy} does not exist")
        return SimpleNamespace(policy=policy)

    def get_revision(self, tenant, policy, n):
        self.get_policy(tenant, policy)
        if n not in self.tags:
            raise RevisionNotFound(f"revision {n} of {tenant}/{policy} does not exist")
        return SimpleNamespace(revision=n, tags=list(self.tags[n]))

    def set_tags(self, tenant, policy, n, tags, *, at) -> None:
        self.get_revision(tenant, policy, n)
        self.tags[n] = list(tags)
        self.writes.append((n, list(tags)))


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
    the decoded command), or not at all when ``running`` is False."""

    def __init__(self, catalog: Catalog, sent: list, running: bool = True) -> None:
        self.catalog, self.sent, self.running, self.replies = catalog, sent, running, []
        self.state: dict = {}  # the controller's worker_state (controller.tags)

    def wait_for(self, predicate, timeout_s, what, request_id=None):
        if self.running and self.sent:
            cmd = decode_event(encode_event(self.sent[-1]))  # as the controller reads it
            self.replies = carry_out(self.catalog, self.state, cmd, producer="controller/test")
            project(self.catalog, self.replies)  # as the projector records each fact
        for env in self.replies:
            if predicate(env):
                return env
        raise WaitTimeout(f"no {what} within {timeout_s:.0f} s")


def _sdk(catalog: Catalog, running: bool = True) -> tuple[MintClient, list]:
    client = object.__new__(MintClient)  # no Kafka, no Cassandra: the parts tag uses
    sent: list = []
    client.tenant, client.name, client.timeout_s = "acme", "sdk", 5.0
    client._catalog = catalog
    client.producer = SimpleNamespace(publish=sent.append)
    client.watcher = ControllerWatcher(catalog, sent, running)
    return client, sent


def test_tag_sends_the_command_and_returns_the_whole_resulting_set() -> None:
    catalog = Catalog()
    client, sent = _sdk(catalog)
    assert client.tag("math", 1, add=["reviewed", "release-2026-12", "reviewed"]) == [
        "candidate",
        "release-2026-12",
        "reviewed",
    ]
    (cmd,) = sent
    assert cmd.type == "revision.tag" and type(cmd.payload).topic == "serving.commands"
    p = cmd.payload
    assert (p.revision, p.add, p.remove, p.requested_by) == (
        1,
        ["reviewed", "release-2026-12"],  # each tag once
        [],
        "sdk",
    )
    (fact,) = client.watcher.replies
    assert fact.type == "revision.tagged" and fact.causation_id == cmd.event_id
    assert client.tag("math", 1, add=["final"], remove=["candidate"]) == [
        "final",
        "release-2026-12",
        "reviewed",
    ]
    assert client.tag("math", 1, remove=["nope"]) == ["final", "release-2026-12", "reviewed"]
    assert catalog.tags[1] == ["final", "release-2026-12", "reviewed"]


def test_a_tag_of_a_missing_revision_is_refused_with_the_controllers_reason() -> None:
    catalog = Catalog()
    client, sent = _sdk(catalog)
    with pytest.raises(CommandRefused, match=r"revision.tag of acme/math@9 refused: .*does not"):
        client.tag("math", 9, add=["candidate"])
    assert len(sent) == 1 and catalog.writes == []
    client, _ = _sdk(catalog)
    with pytest.raises(CommandRefused, match="policy acme/nope does not exist"):
        client.tag("nope", 1, add=["candidate"])


@pytest.mark.parametrize("bad", BAD_TAGS)
def test_a_bad_tag_is_refused_naming_the_field_before_anything_is_sent(bad: str) -> None:
    client, sent = _sdk(Catalog())
    with pytest.raises(EventValidationError, match="add"):
        client.tag("math", 1, add=[bad])
    with pytest.raises(EventValidationError, match="remove"):
        client.tag("math", 1, remove=["ok", bad])
    assert sent == []


def test_nothing_to_do_or_a_tag_both_added_and_removed_sends_nothing() -> None:
    client, sent = _sdk(Catalog())
    with pytest.raises(EventValidationError, match="give a tag"):
        client.tag("math", 1)
    with pytest.raises(EventValidationError, match="x both added and removed"):
        client.tag("math", 1, add=["x", "y"], remove=["x"])
    with pytest.raises(EventValidationError, match="revision"):
        client.tag("math", 0, add=["x"])
    assert sent == []


def test_without_a_controller_the_wait_times_out_naming_it() -> None:
    client, sent = _sdk(Catalog(), running=False)
    with pytest.raises(WaitTimeout, match="mint worker controller"):
        client.tag("math", 1, add=["x"], timeout_s=0.01)
    assert len(sent) == 1


# ---------------------------------------------------------------------- `mint revision tag`


class FakeClient:
    def __init__(self, now: list[str] | None = None, fail: Exception | None = None) -> None:
        self.now, self.fail, self.calls = now or [], fail, []

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def tag(self, policy, revision, add=(), remove=()):
        self.calls.append((policy, revision, list(add), list(remove)))
        if self.fail is not None:
            raise self.fail
        return self.now


class Repo:
    def __init__(self) -> None:
        self.resolved: list[str] = []

    def resolve(self, ref):
        self.resolved.append(str(ref))
        if ref.alias == "staging":
            raise RevisionNotFound(f"alias {ref} points nowhere")
        return Resolved(ref.tenant, ref.policy, 4, DIGEST, "file:///x", ref.alias)


@pytest.fixture
def cli(monkeypatch):
    repo, clients = Repo(), []

    @contextmanager
    def catalog_repo():
        yield repo

    def use(client: FakeClient):
        clients.append(client)
        return client

    def run(*args: str, client: FakeClient | None = None):
        client = client or FakeClient()
        monkeypatch.setattr(revisions_cli, "cli_client", lambda tenant, timeout_s: use(client))
        return CliRunner().invoke(main, ["revision", "tag", *args]), client

    monkeypatch.setattr(revisions_cli, "catalog_repo", catalog_repo)
    run.repo, run.clients = repo, clients  # type: ignore[attr-defined]
    return run


def test_tag_prints_the_revisions_tags_afterwards(cli) -> None:
    res, client = cli(
        "acme/math@3", "reviewed", "candidate", "--remove", "old", client=FakeClient(["a", "b"])
    )
    assert res.exit_code == 0, res.output
    assert client.calls == [("math", 3, ["reviewed", "candidate"], ["old"])]
    assert res.stdout.strip() == "acme/math@3: a, b"
    assert cli.repo.resolved == []  # a number needs no catalog read
    res, _ = cli("acme/math@3", "--remove", "a")
    assert res.exit_code == 0 and res.stdout.strip() == "acme/math@3: no tags"


@pytest.mark.parametrize("ref", ["acme/math@prod", "acme/math@" + DIGEST])
def test_an_alias_or_a_digest_is_resolved_to_its_revision_first(cli, ref: str) -> None:
    res, client = cli(ref, "release-2026-12")
    assert res.exit_code == 0, res.output
    assert client.calls == [("math", 4, ["release-2026-12"], [])]
    assert cli.repo.resolved == [ref] and "acme/math@4" in res.stdout


@pytest.mark.parametrize("where", ["add", "remove"])
@pytest.mark.parametrize("bad", BAD_TAGS)
def test_a_bad_tag_is_a_usage_error_naming_it_and_the_rule(cli, bad: str, where: str) -> None:
    # (after "--" a tag that starts with a dash is a tag, not an option)
    args = ["ok", "--", bad] if where == "add" else ["ok", "--remove", bad]
    res, _ = cli("acme/math@3", *args)
    assert res.exit_code == 2, res.output
    assert repr(bad) in res.output and "is not a tag" in res.output
    assert "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$" in res.output
    assert cli.clients == []  # nothing sent


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["acme/math@3"], "give a tag to add or one to remove: give TAG arguments"),
        (["acme/math@3", "x", "--remove", "x"], "x both added and removed"),
        (["acme/math", "x"], "names no revision"),
        (["acme@3", "x"], "tenant/policy"),
        (["acme/math@Bad Alias", "x"], "alias"),
    ],
)
def test_what_cannot_be_sent_is_a_usage_error(cli, args, expected: str) -> None:
    res, _ = cli(*args)
    assert res.exit_code == 2 and expected in res.output, res.output
    assert cli.clients == []


@pytest.mark.parametrize(
    ("fail", "expected"),
    [
        (
            CommandRefused("revision.tag of acme/math@9 refused: RevisionNotFound: revision 9"),
            "refused: RevisionNotFound: revision 9",
        ),
        (KafkaUnavailable("no broker"), "nothing was sent, acme/math@9 was not tagged"),
        (WaitTimeout("no answer within 60 s."), "mint worker controller"),
    ],
)
def test_failures_are_one_line_that_says_what_happened(cli, fail, expected: str) -> None:
    res, _ = cli("acme/math@9", "x", client=FakeClient(fail=fail))
    assert res.exit_code == 1 and "error:" in res.output and expected in res.output, res.output
    assert "Traceback" not in res.output


def test_an_alias_that_points_nowhere_is_an_error_before_anything_is_sent(cli) -> None:
    res, _ = cli("acme/math@staging", "x")
    assert res.exit_code == 1 and "points nowhere" in res.output and cli.clients == []


def test_help_has_an_example_and_tag_sits_beside_show() -> None:
    runner = CliRunner()
    helped = runner.invoke(main, ["revision", "tag", "--help"]).output
    assert "mint revision tag acme/math-rl@7 candidate reviewed" in helped
    assert "--remove" in helped and "mint worker controller" in helped
    group = runner.invoke(main, ["revision", "--help"]).output
    assert "  show " in group and "  tag " in group


# ---------------------------------------------------------------------- listings and show


def _revision(n: int, tags: list[str]) -> Revision:
    return Revision(
        "acme",
        "math",
        n,
        DIGEST,
        f"file:///store/acme/math/{n}",
        "tiny",
        n - 1 or None,
        AT,
        "trainer/test",
        None,
        {},
        {},
        tags,
    )


REVISIONS = [_revision(2, []), _revision(1, ["candidate", "reviewed"])]
ALIASES = [Alias("acme", "math", "prod", 1, DIGEST, "file:///x", 1, AT, "cli", None)]


class ListingClient:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def revisions(self, policy):
        return REVISIONS

    def aliases(self, policy):
        return ALIASES

    def evaluations_by_revision(self, policy):
        return {}


class ShowRepo:
    def get_revision(self, tenant, policy, n):
        return next(r for r in REVISIONS if r.revision == n)

    def list_aliases(self, tenant, policy):
        return ALIASES

    def evaluations(self, tenant, policy, revision=None):
        return []

    def resolve(self, ref):
        return Resolved("acme", "math", ref.revision or 1, DIGEST, "file:///x", ref.alias)


@pytest.fixture
def listing(monkeypatch):
    @contextmanager
    def repo():
        yield ShowRepo()

    monkeypatch.setattr(revisions_cli, "catalog_repo", repo)
    monkeypatch.setattr(revisions_cli, "out", Console(width=200))
    monkeypatch.setattr(lifecycle, "cli_client", lambda tenant, *a, **k: ListingClient())

    def run(*args: str) -> str:
        result = CliRunner().invoke(main, list(args), catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.stdout

    return run


def test_revisions_json_and_table_carry_the_tags(listing) -> None:
    rows = [
        json.loads(line) for line in listing("revisions", "acme/math", "-o", "json").splitlines()
    ]
    assert [(r["revision"], r["tags"]) for r in rows] == [(2, []), (1, ["candidate", "reviewed"])]
    table = listing("revisions", "acme/math")
    assert "tags" in table.splitlines()[1]
    line_1 = next(line for line in table.splitlines() if "candidate, reviewed" in line)
    assert "prod" in line_1


def test_revision_show_prints_the_tags(listing) -> None:
    shown = listing("revision", "show", "acme/math@1")
    assert any(
        line.split()[:1] == ["tags"] and "candidate, reviewed" in line
        for line in shown.splitlines()
    )
    assert json.loads(listing("revision", "show", "acme/math@2", "-o", "json"))["tags"] == []
    assert "tags" in listing("revision", "show", "acme/math@2") and "-" in shown


def test_a_row_of_an_older_revision_object_without_tags_reads_as_none() -> None:
    rev: Any = SimpleNamespace(**{k: v for k, v in vars(REVISIONS[1]).items() if k != "tags"})
    assert revisions_cli.revision_row(rev, [], [])["tags"] == []
