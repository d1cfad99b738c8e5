"""A tenant's own policies over HTTP (gateway/lifecycle.py) with a fake catalog and fake serving
commands: the reads, the moves as serving commands of the caller's tenant, tenancy (another
tenant's policy is the same 404 as a missing one), bounded bodies, errors in the gateway's
shape."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient

from catalog.exceptions import PolicyNotFound
from catalog.models import Alias, Evaluation, Policy, Revision
from gateway import GatewayConfig, create_app
from gateway.commands import MoveTimeout
from gateway.service import Gateway
from schemas import make_event
from schemas.events import AliasMoved, PolicyRetirement, RevisionTagged, ServingRefused
from tests.unit.test_gateway_app import FakeCatalog, FakeEngines

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def digest(n: int) -> str:
    return "sha256:" + f"{n:02x}" * 32


class FakeRepo:
    """The CatalogRepository reads the routes use: policies, revisions, aliases."""

    def __init__(self) -> None:
        self.policies = {
            ("acme", "math"): Policy("acme", "math", "tiny", T0, "op"),
            ("acme", "code"): Policy("acme", "code", "tiny", T0, "op"),
            ("globex", "secret"): Policy("globex", "secret", "tiny", T0, "op"),
        }
        self.revs = {
            ("acme", "math"): [
                Revision(
                    "acme",
                    "math",
                    n,
                    digest(n),
                    f"file:///s/{n}",
                    "tiny",
                    n - 1 or None,
                    T0,
                    "trainer",
                    None,
                    training={"loss": 0.5 / n},
                    tags=["reviewed"] if n == 2 else [],
                )
                for n in (2, 1)
            ]
        }
        self.evals = {
            2: [
                Evaluation(
                    "acme",
                    "math",
                    2,
                    "arith",
                    digest(2),
                    {"accuracy": 0.8},
                    {},
                    True,
                    [],
                    None,
                    T0,
                    "evaluator",
                    None,
                )
            ]
        }
        self.aliases = {
            ("acme", "math"): [
                Alias("acme", "math", "prod", 1, digest(1), "file:///s/1", 1, T0, "op", None)
            ]
        }

    def get_policy(self, tenant, policy):
        try:
            return self.policies[(tenant, policy)]
        except KeyError:
            raise PolicyNotFound(f"policy {tenant}/{policy} does not exist") from None

    def list_policies(self, tenant):
        return [p for (t, _), p in sorted(self.policies.items()) if t == tenant]

    def list_revisions(self, tenant, policy, *, page_size=100, page_state=None):
        return self.revs.get((tenant, policy), [])[:page_size], None

    def evaluations_by_revision(self, tenant, policy):
        return self.evals if (tenant, policy) == ("acme", "math") else {}

    def list_aliases(self, tenant, policy):
        return self.aliases.get((tenant, policy), [])


class FakeCommands:
    """Answers each command as the controller would: a move, a refusal, or nothing."""

    def __init__(self) -> None:
        self.sent: list = []
        self.refuse: str | None = None
        self.silent = False
        self.started = self.closed = False

    def start(self) -> None:
        self.started = True

    def close(self) -> None:
        self.closed = True

    async def publish(self, env):
        self.sent.append(env)

    async def send(self, env, timeout_s):
        self.sent.append(env)
        p = env.payload
        if self.silent:
            raise MoveTimeout("the controller did not answer")
        if self.refuse:
            answer = ServingRefused(
                command_id=env.event_id,
                command_type=env.type,
                alias=getattr(p, "alias", "prod"),  # a tag names no alias
                reason=self.refuse,
                current_revision=2,
            )
        elif env.type == "policy.retire":
            answer = PolicyRetirement(
                retired=p.retired, reason=p.reason, requested_by=p.requested_by
            )
        elif env.type == "revision.tag":
            answer = RevisionTagged(
                revision=p.revision, tags=sorted(set(p.add)), requested_by=p.requested_by
            )
        else:
            to = p.revision if env.type == "serving.promote" else (p.to_revision or 1)
            answer = AliasMoved(
                alias=p.alias,
                from_revision=1,
                to_revision=to,
                adapter_digest=digest(to),
                store_uri=f"file:///s/acme/math/{to}",
                cause="promote" if env.type == "serving.promote" else "rollback",
                requested_by=p.requested_by,
            )
        return make_event(
            answer, tenant=env.tenant, policy=env.policy, producer="controller", caused_by=env
        )


@pytest.fixture
def world():
    catalog, commands = FakeCatalog(), FakeCommands()
    catalog.catalog = FakeRepo()
    gw = Gateway(GatewayConfig(instance_id="gw-test"), catalog, FakeEngines())
    gw.lifecycle_commands = commands
    with TestClient(create_app(gw)) as http:
        assert commands.started
        yield catalog, commands, http
    assert commands.closed


def auth(catalog, tenant: str = "acme") -> dict[str, str]:
    return {"Authorization": f"Bearer {catalog.add_key(tenant)}"}


def test_reads_list_only_the_callers_policies_revisions_and_aliases(world) -> None:
    catalog, _, http = world
    h = auth(catalog)
    r = http.get("/mint/v1/policies", headers=h)
    assert r.status_code == 200
    assert [p["policy"] for p in r.json()["data"]] == ["code", "math"]  # not globex's
    revs = http.get("/mint/v1/policies/math/revisions", headers=h).json()["data"]
    assert [(v["revision"], v["parent_revision"]) for v in revs] == [(2, 1), (1, None)]
    assert revs[0]["digest"] == digest(2) and revs[0]["created_at"].startswith("2026-01-01")
    # the figures the registry holds: training, tags, each suite's latest evaluation
    assert revs[0]["training"] == {"loss": 0.25} and revs[0]["tags"] == ["reviewed"]
    (ev,) = revs[0]["evaluations"]
    assert (ev["suite"], ev["metrics"], ev["passed"]) == ("arith", {"accuracy": 0.8}, True)
    assert revs[1]["evaluations"] == [] and revs[1]["tags"] == []
    one = http.get("/mint/v1/policies/math/revisions?limit=1", headers=h).json()["data"]
    assert [v["revision"] for v in one] == [2]
    aliases = http.get("/mint/v1/policies/math/aliases", headers=h).json()["data"]
    assert [(a["alias"], a["revision"]) for a in aliases] == [("prod", 1)]


def test_promote_and_rollback_are_serving_commands_of_the_callers_tenant(world) -> None:
    catalog, commands, http = world
    h = auth(catalog)
    r = http.post(
        "/mint/v1/policies/math/promote",
        json={"alias": "prod", "revision": 2, "expected_revision": 1, "reason": "better"},
        headers=h,
    )
    assert r.status_code == 200, r.text
    assert r.json()["to_revision"] == 2 and r.json()["cause"] == "promote"
    back = http.post("/mint/v1/policies/math/rollback", json={}, headers=h)
    assert back.status_code == 200 and back.json()["cause"] == "rollback"
    promote, rollback = commands.sent
    assert (promote.type, promote.tenant, promote.policy) == ("serving.promote", "acme", "math")
    assert promote.payload.expected_revision == 1 and promote.payload.reason == "better"
    assert promote.payload.requested_by.startswith("key/") and promote.producer == "gateway/gw-test"
    assert rollback.type == "serving.rollback" and rollback.payload.alias == "prod"
    assert rollback.payload.reason == "rollback"


def test_another_tenants_policy_is_the_same_404_as_a_missing_one(world) -> None:
    catalog, commands, http = world
    h = auth(catalog)
    answers = [
        http.get("/mint/v1/policies/secret/revisions", headers=h),
        http.get("/mint/v1/policies/nope/revisions", headers=h),
        http.get("/mint/v1/policies/secret/aliases", headers=h),
        http.post("/mint/v1/policies/secret/promote", json={"revision": 1}, headers=h),
        http.post("/mint/v1/policies/secret/rollback", json={}, headers=h),
    ]
    assert {a.status_code for a in answers} == {404}
    assert {a.json()["error"]["code"] for a in answers} == {"policy_not_found"}
    assert (
        answers[0].json()["error"]["message"].replace("secret", "nope")
        == (answers[1].json()["error"]["message"])
    )
    assert commands.sent == []  # nothing reached the controller


def test_refusal_is_409_with_the_current_revision_and_no_answer_is_504(world) -> None:
    catalog, commands, http = world
    h = auth(catalog)
    commands.refuse = "alias prod is at revision 2, not the expected 1"
    r = http.post(
        "/mint/v1/policies/math/promote", json={"revision": 1, "expected_revision": 1}, headers=h
    )
    assert r.status_code == 409
    err = r.json()["error"]
    assert err["code"] == "move_refused" and err["current_revision"] == 2
    assert "not the expected 1" in err["message"]
    commands.refuse, commands.silent = None, True
    r = http.post("/mint/v1/policies/math/rollback", json={}, headers=h)
    assert r.status_code == 504 and r.json()["error"]["code"] == "controller_timeout"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "revision"),
        ({"revision": 0}, "revision"),
        ({"revision": 1, "extra": 1}, "extra"),
        ({"revision": 1, "alias": "no spaces"}, "alias"),
        ({"revision": 1, "reason": "x" * 2000}, "reason"),
    ],
)
def test_bad_bodies_name_the_field(world, body, param) -> None:
    catalog, commands, http = world
    r = http.post("/mint/v1/policies/math/promote", json=body, headers=auth(catalog))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and commands.sent == []


def test_bounds_auth_and_malformed_input(world) -> None:
    catalog, commands, http = world
    h = auth(catalog)
    big = http.post(
        "/mint/v1/policies/math/promote",
        content=b'{"revision": 1, "reason": "' + b"x" * 20_000 + b'"}',
        headers={**h, "content-type": "application/json"},
    )
    assert big.status_code == 400 and big.json()["error"]["code"] == "request_too_large"
    bad_json = http.post("/mint/v1/policies/math/rollback", content=b"{nope", headers=h)
    assert bad_json.status_code == 400 and "error" in bad_json.json()
    limit = http.get("/mint/v1/policies/math/revisions?limit=abc", headers=h)
    assert limit.status_code == 400 and limit.json()["error"]["param"] == "limit"
    name = http.get("/mint/v1/policies/Bad..Name/revisions", headers=h)
    assert name.status_code == 400 and name.json()["error"]["param"] == "policy"
    anonymous = http.get("/mint/v1/policies")
    assert anonymous.status_code == 401 and anonymous.json()["error"]["code"] == "invalid_api_key"
    wrong = http.get("/mint/v1/policies", headers={"Authorization": "Bearer mint_x_y"})
    assert wrong.status_code == 401
    assert commands.sent == []


def test_configure_publishes_the_lifecycle_with_the_catalogs_base_model(world) -> None:
    catalog, commands, http = world
    h = auth(catalog)
    body = {
        "suite": "toy-even",
        "thresholds": {"reward": {"min": 0.6}},
        "auto_promote": False,
        "rollback_metric": "reward",
        "rollback_tolerance": 0.05,
    }
    r = http.put("/mint/v1/policies/math/lifecycle", json=body, headers=h)
    assert r.status_code == 202, r.text
    assert r.json()["suite"] == "toy-even" and r.json()["promote_to"] == "prod"
    (env,) = commands.sent
    assert (env.type, env.tenant, env.policy) == ("policy.configured", "acme", "math")
    p = env.payload
    assert p.base_model == "tiny" and p.thresholds["reward"].min == 0.6 and not p.auto_promote
    assert p.requested_by.startswith("key/") and str(env.event_id) == r.json()["event_id"]
    for bad, param in (
        ({**body, "base_model": "/etc"}, "base_model"),  # never the caller's
        ({"suite": ""}, "suite"),
        ({**body, "promote_to": "no spaces"}, "promote_to"),
    ):
        r = http.put("/mint/v1/policies/math/lifecycle", json=bad, headers=h)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    other = http.put("/mint/v1/policies/secret/lifecycle", json=body, headers=h)
    assert other.status_code == 404 and len(commands.sent) == 1
