"""The evaluator core with a fake engine (no vLLM): metrics, verdict, derived ids, refusals."""

from __future__ import annotations

import pytest

from catalog.models import Resolved
from catalog.refs import Ref
from schemas import make_event
from schemas.events import EvalRequested, Threshold
from workers.evaluator import EvaluatorCore, UnknownSuite, result_id
from workers.evaluator.core import EvaluatorError
from workers.evaluator.suites import TOY_PROMPTS, Suite, get_suite
from workers.serving.engine import GenResult, GenSample

DIGEST = "sha256:" + "ab" * 32


class FakeEngine:
    def __init__(self, ids: list[int]) -> None:
        self.ids, self.calls = ids, []

    def generate(self, reqs):
        self.calls.append(reqs)
        return [GenResult([1], [GenSample("x", list(self.ids), [], "length")] * r.n) for r in reqs]


class FakeSet:
    def ensure(self, ref):
        self.ref = ref
        return "handle"

    def used_in_batch(self, digests):
        pass


class FakeResolver:
    def __init__(self, digest: str = DIGEST) -> None:
        self.digest = digest

    def resolve(self, ref: Ref) -> Resolved:
        ref = str(ref)  # the fake reads the rendered form
        tenant, rest = ref.split("/")
        policy, rev = rest.split("@")
        return Resolved(tenant, policy, int(rev), self.digest, "file:///s/acme/math/1")


def request(thresholds=None, suite="toy-even"):
    return make_event(
        EvalRequested(revision=1, adapter_digest=DIGEST, suite=suite, thresholds=thresholds or {}),
        tenant="acme",
        policy="math",
        producer="test",
    )


@pytest.mark.parametrize(("ids", "passed"), [([2, 4, 6, 8], True), ([1, 2, 3, 5], False)])
def test_metrics_and_verdict(ids, passed) -> None:
    engine = FakeEngine(ids)
    core = EvaluatorCore(engine, FakeSet(), FakeResolver(), engine_id="e0")
    req = request({"reward": Threshold(min=0.9)})
    out = core.run(req)
    p = out.payload
    assert p.metrics["reward"] == p.metrics["even_tokens"] == sum(i % 2 == 0 for i in ids) / 4
    assert p.passed is passed and p.failures == ([] if passed else ["reward"])
    assert out.causation_id == req.event_id and out.event_id == result_id(req)
    assert len(engine.calls[0]) == len(TOY_PROMPTS)
    assert all(r.lora == "handle" and r.temperature == 0.0 for r in engine.calls[0])


def test_refuses_an_unknown_suite_and_a_wrong_digest() -> None:
    core = EvaluatorCore(FakeEngine([2]), FakeSet(), FakeResolver(), engine_id="e0")
    with pytest.raises(UnknownSuite, match="'nope' is not registered; known: .*toy-even"):
        core.run(request(suite="nope"))
    other = EvaluatorCore(
        FakeEngine([2]), FakeSet(), FakeResolver("sha256:" + "cd" * 32), engine_id="e0"
    )
    with pytest.raises(EvaluatorError, match="the catalog has sha256:cdcd"):
        other.run(request())


def test_suite_validation() -> None:
    assert get_suite("toy-even").reward == "even_tokens"
    with pytest.raises(ValueError, match="has no prompts"):
        Suite("empty", (), "even_tokens")
    with pytest.raises(LookupError, match="reward 'nope' is not registered"):
        Suite("bad", ("x",), "nope")
