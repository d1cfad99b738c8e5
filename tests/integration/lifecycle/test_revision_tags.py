"""`mint revision tag` against a real controller and projector on real Kafka and Cassandra: the
CLI (a real process) publishes revision.tag, the controller carries it out (writes the catalog,
answers revision.tagged with the whole set) so the catalog reads it as soon as the CLI returns;
an alias is resolved to its revision first; a removal leaves the rest; `mint revisions -o json`
and `mint revision show` carry the tags; a tag of a missing revision is refused with the
controller's reason; and the catalog equals a replay of the log."""

from __future__ import annotations

import json

import pytest

from catalog.repository import CatalogRepository
from mint.sdk import MintClient
from streams.producer import EventProducer
from tests.integration.lifecycle._helpers import wait_until
from tests.integration.lifecycle._replay import assert_catalog_equals_replay
from tests.integration.lifecycle.test_controller import export
from tests.integration.lifecycle.test_operator_commands import mint
from workers.projector import read_log

# slow: over 9 s a module here (worker processes, own services, waits); `-m "not slow"` skips it
pytestmark = pytest.mark.slow


def _tag(settings, *args: str) -> str:
    p = mint(settings, "revision", "tag", *args, "--timeout", "180")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    return p.stdout.strip()


def test_tags_through_the_cli_the_controller_and_the_log(settings, live, procs) -> None:
    session = live
    repo = CatalogRepository(session, settings.keyspace)
    tenant, policy = "acme", "math"
    pid = f"{tenant}/{policy}"
    projector = procs(settings, "projector", "projector")
    controller = procs(settings, "controller", "controller")
    client = MintClient(settings, tenant, producer="test", timeout_s=180)
    producer = EventProducer(settings)
    try:
        client.create_policy(policy, base_model="tiny", suite="toy", auto_evaluate=False)
        producer.publish_many([export(repo, tenant, policy, n) for n in (1, 2)])
        client.promote(policy, 1)  # prod -> 1 (and the controller is up by now)

        assert (
            _tag(settings, f"{pid}@2", "candidate", "reviewed") == f"{pid}@2: candidate, reviewed"
        )
        assert repo.get_revision(tenant, policy, 2).tags == ["candidate", "reviewed"]  # at once
        assert _tag(settings, f"{pid}@prod", "release-1") == f"{pid}@1: release-1"
        assert _tag(settings, f"{pid}@2", "--remove", "candidate") == f"{pid}@2: reviewed"
        assert repo.get_revision(tenant, policy, 2).tags == ["reviewed"]
        assert client.tag(policy, 2, add=["final"]) == ["final", "reviewed"]  # the SDK's own

        listed = mint(settings, "revisions", pid, "-o", "json")
        assert listed.returncode == 0, listed.stderr
        rows = {r["revision"]: r for r in map(json.loads, listed.stdout.splitlines())}
        assert {n: r["tags"] for n, r in rows.items()} == {
            2: ["final", "reviewed"],
            1: ["release-1"],
        }
        assert rows[1]["aliases"] == ["prod"]
        table = mint(settings, "revisions", pid).stdout
        assert "tags" in table and "final, reviewed" in table, table
        shown = mint(settings, "revision", "show", f"{pid}@prod").stdout
        assert any(ln.split()[:2] == ["tags", "release-1"] for ln in shown.splitlines()), shown

        missing = mint(settings, "revision", "tag", f"{pid}@9", "x", "--timeout", "180")
        assert missing.returncode == 1 and "Traceback" not in missing.stderr, missing.stderr
        last = missing.stderr.strip().splitlines()[-1]
        assert last.startswith(f"error: revision.tag of {pid}@9 refused: RevisionNotFound"), last
        assert "revision 9 of acme/math does not exist" in last, last
        bad = mint(settings, "revision", "tag", f"{pid}@2", "no good")
        assert bad.returncode == 2 and "'no good' is not a tag" in bad.stderr, bad.stderr

        # Each fact answers its command; the projector records them again from the log.
        log = list(read_log(settings, topics=("serving.commands", "serving.events")))
        asked = {e.event_id for e in log if e.type == "revision.tag" and e.policy_id == pid}
        facts = [e for e in log if e.type == "revision.tagged" and e.policy_id == pid]
        refused = [e for e in log if e.type == "serving.refused" and e.causation_id in asked]
        assert len(asked) == 5 and len(facts) == 4 and len(refused) == 1
        assert {f.causation_id for f in facts} | {refused[0].causation_id} == asked
        assert refused[0].payload.command_type == "revision.tag"
        wait_until(
            lambda: all(repo.is_applied(f.event_id) for f in facts),
            120,
            "the projector to apply the revision.tagged facts",
            projector,
        )
        assert repo.get_revision(tenant, policy, 2).tags == ["final", "reviewed"]
        assert_catalog_equals_replay(settings, session)
    except AssertionError:
        print(controller.tail())
        raise
    finally:
        client.close()
        producer.close()
