"""Canary routing (sticky per caller, the share asked) and the rule that decides a canary."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from catalog.models import CanaryRoute, Resolved
from schemas import make_event
from schemas.events import CanaryEnded, CanaryRule, CanarySide, CanaryStarted
from workers.controller.canary_view import CanaryView, verdict
from workers.serving.resolution import ResolutionCache, canary_bucket, route

D1, D2 = "sha256:" + "11" * 32, "sha256:" + "22" * 32
CID = uuid.UUID("6f1c2a4e-0b8d-4c3e-9a7f-1d2e3f405163")


def _prod(share: float) -> Resolved:
    c = CanaryRoute(CID, 2, D2, "file:///s/acme/math/2", share, 1, datetime.now(UTC))
    return Resolved("acme", "math", 1, D1, "file:///s/acme/math/1", "prod", c)


def test_a_caller_always_gets_the_same_side_and_the_share_is_the_one_asked():
    res = _prod(0.1)
    sides = [route(res, f"user-{i}").revision for i in range(20_000)]
    assert sides == [route(res, f"user-{i}").revision for i in range(20_000)]  # sticky
    assert abs(sides.count(2) / len(sides) - 0.1) < 0.01
    # answers carry one revision and no canary; the alias is kept for the answer's record
    one = route(res, "user-1")
    assert one.canary is None and one.alias == "prod" and one.digest in (D1, D2)


def test_each_canary_draws_its_callers_afresh():
    other = uuid.uuid4()
    first = {i for i in range(2000) if canary_bucket(CID, f"u{i}") < 0.5}
    second = {i for i in range(2000) if canary_bucket(other, f"u{i}") < 0.5}
    assert 0.35 < len(first & second) / len(first) < 0.65


def test_an_alias_without_a_canary_routes_to_itself():
    res = Resolved("acme", "math", 1, D1, "file:///s/acme/math/1", "prod")
    assert route(res, "anyone") is res


def test_a_canary_fact_drops_the_cached_alias_so_the_next_request_reads_the_catalog():
    reads = []

    def resolve(ref):
        reads.append(ref)
        return Resolved("acme", "math", 1, D1, "file:///s/acme/math/1", "prod")

    cache = ResolutionCache(resolve, ttl_s=60)
    cache.resolve("acme/math@prod")
    cache.resolve("acme/math@prod")
    assert len(reads) == 1
    started = CanaryStarted(
        alias="prod",
        canary_id=CID,
        incumbent_revision=1,
        revision=2,
        adapter_digest=D2,
        store_uri="file:///s/acme/math/2",
        share=0.1,
    )
    for fact in (
        started,
        CanaryEnded(
            alias="prod", canary_id=CID, revision=2, incumbent_revision=1, outcome="promoted"
        ),
    ):
        cache.apply(make_event(fact, tenant="acme", policy="math", producer="controller"))
        cache.resolve("acme/math@prod")
    assert len(reads) == 3


def _view(rule: CanaryRule, canary: dict, incumbent: dict) -> CanaryView:
    return CanaryView(
        canary_id=CID,
        alias="prod",
        revision=2,
        incumbent_revision=1,
        share=0.1,
        started_at=datetime.now(UTC),
        rule=rule,
        canary=CanarySide(revision=2, **canary),
        incumbent=CanarySide(revision=1, **incumbent),
    )


RULE = CanaryRule(min_answers=200, min_scores=100)


@pytest.mark.parametrize(
    ("canary", "incumbent", "expected"),
    [
        # not enough answers, or not enough scores yet: no decision
        ({"answers": 199, "scores": 150, "score_sum": 120}, {"answers": 2000}, None),
        ({"answers": 250, "scores": 99, "score_sum": 90}, {"answers": 2000}, None),
        # better feedback, same failures: promoted
        (
            {"answers": 200, "scores": 100, "score_sum": 85},
            {"answers": 1800, "scores": 900, "score_sum": 630},
            "promoted",
        ),
        # feedback 0.02 below is still within the tolerance
        (
            {"answers": 200, "scores": 100, "score_sum": 68.5},
            {"answers": 1800, "scores": 1000, "score_sum": 700},
            "promoted",
        ),
        # feedback lower than the incumbent's - 0.02: rolled back
        (
            {"answers": 200, "scores": 100, "score_sum": 50},
            {"answers": 1800, "scores": 1000, "score_sum": 700},
            "rolled_back",
        ),
        # failure rate above the incumbent's + 1 %: rolled back whatever the scores
        (
            {"answers": 200, "failures": 10, "scores": 100, "score_sum": 99},
            {"answers": 1800, "failures": 18, "scores": 1000, "score_sum": 700},
            "rolled_back",
        ),
    ],
)
def test_the_rule_decides_on_failures_and_feedback(canary, incumbent, expected):
    got = verdict(_view(RULE, canary, incumbent))
    assert (got and got[0]) == expected
    if got:
        assert "r2: " in got[1] and "r1: " in got[1]  # the figures that decided it


def test_without_scores_the_rule_judges_failures_alone():
    rule = CanaryRule(min_answers=10)
    assert verdict(_view(rule, {"answers": 10}, {"answers": 100}))[0] == "promoted"
    lost = verdict(_view(rule, {"answers": 10, "failures": 2}, {"answers": 100}))
    assert lost[0] == "rolled_back" and "failure rate" in lost[1]


def test_an_alias_with_a_running_canary_is_read_from_the_catalog_on_every_request():
    reads = []

    def resolve(ref):
        reads.append(ref)
        return _prod(0.1)

    cache = ResolutionCache(resolve, ttl_s=60)
    for _ in range(3):
        assert cache.resolve("acme/math@prod").canary is not None
    assert len(reads) == 3
