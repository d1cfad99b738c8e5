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
        ("gateway", "WRITE", "serving.commands"),
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

    assert PRINCIPAL_OF["gateway"] == "gateway" and ROLES["gateway"] == ("SELECT",)
    assert _allowed(acls, "gateway", "WRITE", "TOPIC", "t1.infer.requests")
    assert _allowed(acls, "gateway", "READ", "TOPIC", "t1.infer.results")
    assert not any(_allowed(acls, "gateway", "READ", "GROUP", f"t1-{g}")
                   for g in ("serving", "downstream", "gateway", "operator"))  # fmt: skip
