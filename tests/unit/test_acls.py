"""The ACL model covers what each worker really reads, writes and joins, and no more."""

from __future__ import annotations

import pytest

from catalog.roles import ROLES
from schemas.settings import MintSettings
from streams.acls import ALL_PRINCIPALS, PRINCIPALS, REQUESTS, bindings
from streams.topics import TOPICS


def _allowed(acls, principal: str, op: str, rtype: str, name: str) -> bool:
    for a in acls:
        pat = a.resource_pattern
        if a.principal != f"User:{principal}" or a.operation.name != op:
            continue
        if pat.resource_type.name != rtype:
            continue
        if pat.pattern_type.name == "LITERAL" and pat.resource_name == name:
            return True
        if pat.pattern_type.name == "PREFIXED" and name.startswith(pat.resource_name):
            return True
    return False


@pytest.fixture(scope="module")
def acls():
    return bindings(MintSettings(topic_prefix="t1"))


def test_every_worker_group_and_source_topic_is_granted(acls) -> None:
    from workers.controller.worker import CONTROLLER_GROUP, SOURCE_TOPICS
    from workers.projector.main import PROJECTOR_GROUP, PROJECTOR_TOPICS
    from workers.trainer.worker import TRAINER_GROUP, TRAINER_TOPICS

    for principal, group, topics in [
        ("projector", PROJECTOR_GROUP, PROJECTOR_TOPICS),
        ("controller", CONTROLLER_GROUP, SOURCE_TOPICS),
        ("trainer", TRAINER_GROUP, TRAINER_TOPICS),
        ("engine", "serving", ("infer.requests", "load.requests", "infer.results")),
        ("engine", "rollout", ("rollout.requests", "rollout.results")),
        ("engine", "evaluator", ("eval.requests", "eval.results")),
    ]:
        assert _allowed(acls, principal, "READ", "GROUP", f"t1-{group}"), (principal, group)
        for topic in topics:
            assert _allowed(acls, principal, "READ", "TOPIC", f"t1.{topic}"), (principal, topic)
    for topic in ("serving.events", "policy.state"):  # followed without a group
        assert _allowed(acls, "engine", "READ", "TOPIC", f"t1.{topic}"), topic


@pytest.mark.parametrize(
    ("principal", "op", "topic"),
    [
        ("upstream", "WRITE", "serving.commands"),  # cannot promote
        ("upstream", "READ", "infer.results"),
        ("downstream", "READ", "infer.requests"),
        ("downstream", "WRITE", "infer.results"),
        ("engine", "WRITE", "export.events"),  # the trainer's
        ("engine", "WRITE", "serving.events"),  # the controller's: alias moves
        ("trainer", "WRITE", "serving.events"),
        ("trainer", "READ", "serving.commands"),
        ("operator", "WRITE", "export.events"),  # revisions come from the trainer only
        ("operator", "WRITE", "serving.events"),
        ("gateway", "WRITE", "infer.results"),  # answers come from the engines only
        ("gateway", "READ", "infer.requests"),
        ("gateway", "WRITE", "serving.events"),  # only the controller answers commands
        ("gateway", "WRITE", "export.events"),
        ("gateway", "WRITE", "rollout.requests"),
    ],
)
def test_refused(acls, principal: str, op: str, topic: str) -> None:
    assert not _allowed(acls, principal, op, "TOPIC", f"t1.{topic}")


def test_upstream_writes_requests_downstream_reads_results(acls) -> None:
    for topic in REQUESTS:
        assert _allowed(acls, "upstream", "WRITE", "TOPIC", f"t1.{topic}")
    assert _allowed(acls, "downstream", "READ", "TOPIC", "t1.infer.results")
    assert not _allowed(acls, "downstream", "READ", "GROUP", "t1-serving")


def test_grants_stay_inside_the_deployment_prefix(acls) -> None:
    for a in acls:
        name = a.resource_pattern.resource_name
        assert name.startswith(("t1.", "t1-", "replay.")), name
    other = bindings(MintSettings(topic_prefix="t2"))
    assert not any(_allowed(acls, "engine", "READ", "TOPIC", f"t2.{t}") for t in TOPICS)
    assert other


def test_every_principal_has_a_known_role_or_none() -> None:
    assert set(PRINCIPALS) <= set(ALL_PRINCIPALS)
    assert set(ROLES) <= set(ALL_PRINCIPALS)
    assert ROLES["engine"] == ("SELECT",)  # engines never write the catalog


def test_gateway_asks_engines_and_follows_answers_without_a_group(acls) -> None:
    from mint.security import PRINCIPAL_OF

    assert PRINCIPAL_OF["gateway"] == "gateway" and ROLES["gateway"] == ("SELECT", "MODIFY")
    assert _allowed(acls, "gateway", "WRITE", "TOPIC", "t1.infer.requests")
    assert _allowed(acls, "gateway", "READ", "TOPIC", "t1.infer.results")
    # a tenant's promote/rollback (gateway/lifecycle): the command out, the controller's answer in
    assert _allowed(acls, "gateway", "WRITE", "TOPIC", "t1.serving.commands")
    assert _allowed(acls, "gateway", "READ", "TOPIC", "t1.serving.events")
    assert _allowed(acls, "gateway", "WRITE", "TOPIC", "t1.policy.config")
    assert not any(
        _allowed(acls, "gateway", "READ", "GROUP", f"t1-{g}")
        for g in ("serving", "downstream", "gateway", "operator")
    )


# ---------------------------------------------------------------------- Cassandra, table by table


def test_every_migrated_table_has_a_place_in_the_rights() -> None:
    import re

    from catalog.migrate import load_migrations
    from catalog.roles import TABLES

    made = {
        m.group(1)
        for mig in load_migrations()
        for stmt in mig.statements
        for m in [re.search(r"CREATE TABLE IF NOT EXISTS \{keyspace\}\.(\w+)", stmt)]
        if m
    }
    assert made | {"schema_migrations"} == set(TABLES), "give new tables a role in catalog/roles.py"


def test_only_key_management_modifies_api_keys_and_nobody_modifies_all_keyspaces() -> None:
    from catalog.roles import ACCESS, RIGHTS, grants

    for role, rights in RIGHTS.items():
        touches = set(rights.modifies) & set(ACCESS)
        assert touches == (set(ACCESS) if role == "operator" else set()), role
    plan = grants("ks")
    for role, want in plan.items():
        broad = {(perm, res) for perm, res in want if not res.startswith("<table ks.")}
        assert broad == ({("CREATE", "<all keyspaces>")} if role == "projector" else set()), role
    assert ("MODIFY", "<table ks.api_keys>") not in plan["trainer"] | plan["controller"]
    assert ("SELECT", "<table ks.api_keys>") not in plan["trainer"] | plan["engine"]


def test_the_gateway_reads_keys_rates_and_models_and_writes_only_its_tinker_rows() -> None:
    from catalog.roles import RIGHTS, TINKER

    gw = RIGHTS["gateway"]
    # the Tinker API's models, futures, calls and states, shared by its instances; nothing else
    assert set(gw.modifies) == set(TINKER) and not gw.schema
    assert set(gw.reads) == {
        "api_keys",
        "tenant_access",
        "policies",
        "revisions",
        "revisions_by_digest",
        "aliases",
        *TINKER,
    }


def test_applying_grants_first_then_revokes_what_an_older_version_granted() -> None:
    from catalog.roles import grants, statements

    want = grants("ks")["trainer"]
    have = {
        ("MODIFY", "<all keyspaces>"),
        ("SELECT", "<all keyspaces>"),
        ("SELECT", "<table ks.tenants>"),
        ("MODIFY", "<table other.api_keys>"),
    }
    stmts = statements("trainer", want, have, "ks")
    revokes = [s for s in stmts if s.startswith("REVOKE")]
    assert revokes == [
        "REVOKE MODIFY ON ALL KEYSPACES FROM trainer",
        "REVOKE SELECT ON ALL KEYSPACES FROM trainer",
    ]
    assert stmts[-2:] == revokes  # a running worker never loses a right it keeps
    assert "GRANT MODIFY ON TABLE ks.revisions TO trainer" in stmts
    assert "GRANT SELECT ON TABLE ks.tenants TO trainer" not in stmts  # held already
    assert not any("other." in s for s in stmts)  # another deployment's grants are left alone
    assert statements("trainer", want, want, "ks") == []  # idempotent


# ---------------------------------------------------------------------- a tenant's own answers


def test_a_tenants_principal_reads_its_own_answers_and_no_one_elses() -> None:
    from streams.acls import tenant_bindings, tenant_principal
    from streams.topics import tenant_topic

    s = MintSettings(topic_prefix="t1")
    acls = [a for t in ("acme", "acme-x", "acme2", "globex") for a in tenant_bindings(s, t)]
    acme = tenant_principal("acme")
    own = tenant_topic(s, "acme")
    assert own == "t1.tenant.acme.infer.results"
    assert _allowed(acls, acme, "READ", "TOPIC", own)
    assert _allowed(acls, acme, "READ", "GROUP", "t1.tenant.acme.analytics")
    for other in ("acme-x", "acme2", "globex"):  # names that extend "acme" included
        assert not _allowed(acls, acme, "READ", "TOPIC", tenant_topic(s, other)), other
        assert not _allowed(acls, acme, "READ", "GROUP", f"t1.tenant.{other}.analytics"), other
        assert _allowed(acls, tenant_principal(other), "READ", "TOPIC", tenant_topic(s, other))
    for topic in ("t1.infer.results", "t1.infer.requests", "t2.tenant.acme.infer.results"):
        assert not _allowed(acls, acme, "READ", "TOPIC", topic), topic
    assert not any(_allowed(acls, acme, op, "TOPIC", own) for op in ("WRITE", "CREATE", "DELETE"))
    assert not _allowed(acls, acme, "READ", "GROUP", "t1-downstream")


@pytest.mark.parametrize("tenant", ["Acme", "acme.x", "", "a/b", "-acme"])
def test_a_tenant_principal_needs_a_tenant_name(tenant) -> None:
    from streams.acls import tenant_bindings
    from streams.exceptions import TopicError

    with pytest.raises(TopicError, match="not a tenant name"):
        tenant_bindings(MintSettings(topic_prefix="t1"), tenant)


def test_the_router_reads_answers_and_writes_only_tenants_topics(acls) -> None:
    from streams.topics import tenant_topic
    from workers.router import ROUTER_GROUP, ROUTER_TOPICS

    assert _allowed(acls, "router", "READ", "GROUP", f"t1-{ROUTER_GROUP}")
    for topic in ROUTER_TOPICS:
        assert _allowed(acls, "router", "READ", "TOPIC", f"t1.{topic}")
    s = MintSettings(topic_prefix="t1")
    assert _allowed(acls, "router", "WRITE", "TOPIC", tenant_topic(s, "acme"))
    assert _allowed(acls, "router", "CREATE", "TOPIC", tenant_topic(s, "acme"))
    for topic in ("infer.results", "infer.requests", "serving.commands", "export.events"):
        assert not _allowed(acls, "router", "WRITE", "TOPIC", f"t1.{topic}"), topic
    assert not _allowed(acls, "router", "READ", "TOPIC", "t1.infer.requests")
    assert not _allowed(acls, "router", "WRITE", "TOPIC", "t2.tenant.acme.infer.results")
    # nobody but the router writes a tenant's topic; the shared downstream cannot read them
    writers = {
        a.principal
        for a in acls
        if a.operation.name == "WRITE"
        and _allowed([a], a.principal[5:], "WRITE", "TOPIC", tenant_topic(s, "acme"))
    }
    assert writers == {"User:router"}
    assert not _allowed(acls, "downstream", "READ", "TOPIC", tenant_topic(s, "acme"))


def test_every_role_may_read_which_migrations_ran() -> None:
    from catalog.roles import grants

    for role, want in grants("ks").items():  # workers check the schema before they start
        assert ("SELECT", "<table ks.schema_migrations>") in want, role
