"""A tenant's lifecycle with its API key alone (MintClient.remote) on real Kafka and Cassandra: a
gateway in this process (gateway.main.ThreadedServer), a real controller worker. The operator
makes the tenants and keys and the catalog holds a policy with two revisions; the tenant lists
them, promotes, and rolls back through the gateway (serving commands the controller carries
out), runs a canary, scores an answer, ends the canary, tags a revision, retires and restores
the policy, configures its lifecycle, and another tenant's key gets the same 404 as for a
missing policy."""

from __future__ import annotations

import pytest

from catalog.access import AccessRepository
from catalog.repository import CatalogRepository
from catalog.state import StateTable
from gateway.config import GatewayConfig
from gateway.main import ThreadedServer, build
from mint.sdk import CommandRefused, MintClient, RemoteError
from tests.integration.lifecycle._helpers import wait_until
from workers.controller.logic import CONFIGS_STATE

pytestmark = pytest.mark.integration


def test_tenant_lists_promotes_and_rolls_back_with_a_key_alone(
    settings, live, procs, monkeypatch
) -> None:
    import gateway.lifecycle

    # the first command may wait for the controller to start on a busy CPU (it stays queued)
    monkeypatch.setattr(gateway.lifecycle, "MOVE_TIMEOUT_S", 120.0)
    repo, access = (
        CatalogRepository(live, settings.keyspace),
        AccessRepository(live, settings.keyspace),
    )
    repo.create_policy("acme", "math", "tiny", by="test")
    for n in (1, 2):
        repo.register_revision(
            "acme",
            "math",
            digest="sha256:" + f"{n:02x}" * 32,
            store_uri=f"file:///store/acme/math/adapters/{n}",
            by="test",
        )
    keys = {}
    for tenant in ("acme", "globex"):
        access.create_tenant(tenant, by="test")
        keys[tenant] = access.create_key(tenant, name="remote", by="test")[0].text
    controller = procs(settings, "controller", "controller")
    config = GatewayConfig(port=0, instance_id="gw-remote", key_ttl_s=1.0, catalog_ttl_s=1.0)
    server = ThreadedServer(build(settings, config)).start()
    try:
        with MintClient.remote(server.url, keys["acme"], timeout_s=150) as mint:
            assert [p.policy for p in mint.policies()] == ["math"]
            assert [r.revision for r in mint.revisions("math")] == [2, 1]
            assert mint.aliases("math") == []
            first = mint.promote("math", 1, reason="first")
            assert (first.from_revision, first.to_revision) == (None, 1), controller.tail()
            moved = mint.promote("math", 2, expected_revision=1)
            assert (moved.from_revision, moved.to_revision, moved.cause) == (1, 2, "promote")
            assert [(a.alias, a.revision) for a in mint.aliases("math")] == [("prod", 2)]
            with pytest.raises(CommandRefused) as stale:
                mint.promote("math", 1, expected_revision=1)
            assert stale.value.current_revision == 2
            back = mint.rollback("math")
            assert (back.from_revision, back.to_revision, back.cause) == (2, 1, "rollback")
            assert [(a.alias, a.revision) for a in mint.aliases("math")] == [("prod", 1)]
            history = repo.alias_history("acme", "math", "prod", limit=10)
            assert history[0].moved_by.startswith("key/")  # the tenant's key, in the history
            canary = mint.promote("math", 2, canary=0.5, reason="half")
            assert (canary.revision, canary.incumbent_revision, canary.share) == (2, 1, 0.5)
            route = repo.get_canary("acme", "math", "prod")
            assert route is not None and str(route.canary_id) == canary.canary_id
            running = mint.canary_status("math")  # the controller's view, as it wrote it
            assert running is not None and str(running.canary_id) == canary.canary_id
            assert running.decision is None and (running.revision, running.share) == (2, 0.5)
            assert mint.feedback("math", "req-unknown", 0.9)  # accepted; joined to nothing
            ended = mint.rollback("math")  # ends the canary; prod stays on revision 1
            assert (ended.canary_id, ended.outcome) == (canary.canary_id, "rolled_back")
            decided = mint.canary_status("math")
            assert decided is not None and decided.decision.outcome == "rolled_back"
            assert mint.tag("math", 2, add=["candidate", "reviewed"]) == ["candidate", "reviewed"]
            assert mint.tag("math", 2, remove=["candidate"]) == ["reviewed"]
            with pytest.raises(CommandRefused):
                mint.tag("math", 9, add=["x"])  # no such revision: the controller says so
            retired = mint.retire("math", reason="superseded")  # the controller's policy.retired
            assert (retired.retired, retired.reason) == (True, "superseded")
            assert mint.retire("math", undo=True).retired is False
            assert repo.get_canary("acme", "math", "prod") is None
            assert [(a.alias, a.revision) for a in mint.aliases("math")] == [("prod", 1)]
            mint.configure("math", suite="toy-even", thresholds={"reward": {"min": 0.6}})
            configs = StateTable(live, settings.keyspace, CONFIGS_STATE)
            cfg = wait_until(
                lambda: configs.get("acme/math"), 60, "the controller to apply it", controller
            )
            assert cfg["suite"] == "toy-even" and cfg["base_model"] == "tiny"
        with MintClient.remote(server.url, keys["globex"]) as other:
            assert other.policies() == []
            errors = []
            for call in (
                lambda: other.revisions("math"),
                lambda: other.revisions("nothing"),
                lambda: other.promote("math", 2),
                lambda: other.rollback("math"),
                lambda: other.retire("math"),
            ):
                with pytest.raises(RemoteError) as e:
                    call()
                errors.append(e.value)
            assert {(e.status, e.code) for e in errors} == {(404, "policy_not_found")}
            assert str(errors[1]).replace("nothing", "math") == str(errors[0])  # no oracle
        assert repo.get_alias("acme", "math", "prod").revision == 1  # globex moved nothing
    finally:
        server.stop()
