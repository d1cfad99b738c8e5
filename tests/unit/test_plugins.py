"""Rewards and suites from outside MinT (workers.plugins): built-ins first, then ``mint.rewards`` /
``mint.suites`` entry points of an installed distribution, then ``module:function`` only under
the operator's allowed prefixes; a broken plugin fails its request like an unknown name.

The plugin is a real distribution written into tmp_path (a package plus its ``.dist-info`` with
``entry_points.txt``) and put on sys.path, so the real importlib.metadata lookup finds it."""

from __future__ import annotations

import sys
import textwrap
import threading
from pathlib import Path

import pytest
from kafka.consumer.fetcher import ConsumerRecord
from pydantic import ValidationError

from catalog.models import Resolved
from schemas import encode_event, make_event
from schemas.events import DeadLetter, EvalRequested, RolloutRequested
from schemas.settings import MintSettings
from streams import RetryPolicy
from streams.exceptions import Refused, is_refusal
from streams.records import RecordLoop, is_transient
from workers import plugins
from workers.evaluator import EvaluatorCore, UnknownSuite, suites
from workers.evaluator.suites import get_suite
from workers.serving import rewards
from workers.serving.engine import GenResult, GenSample
from workers.serving.exceptions import UnknownReward
from workers.serving.rewards import get_reward
from workers.serving.rollout import RolloutCore

DIGEST = "sha256:" + "ab" * 32

MODULES = {
    "acme_tasks/__init__.py": "",
    "acme_tasks/rewards.py": """
        def exact_answer(prompt, completion, token_ids):
            return 1.0 if completion.strip() == "4" else 0.0

        def wrong_signature(completion):
            return 0.0

        NOT_CALLABLE = 3
        """,
    "acme_tasks/suites.py": """
        from workers.evaluator.suites import Suite

        def heldout():
            return Suite("acme-heldout", ("2 + 2 =",), "exact_answer", max_tokens=4)

        plain = Suite("acme-plain", ("2 + 2 =",), "exact_answer")

        def by_module():
            return Suite("acme-by-module", ("2 + 2 =",), "acme_tasks.rewards:exact_answer")

        def not_a_suite():
            return "acme-heldout"
        """,
    "acme_tasks/broken.py": "raise RuntimeError('acme_tasks.broken needs ACME_TOKEN')\n",
    "acme_tasks/exits.py": "import sys\nsys.exit(3)\n",
    "acme_tasks-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: acme-tasks\nVersion: 1.0\n",
    "acme_tasks-1.0.dist-info/entry_points.txt": """
        [mint.rewards]
        exact_answer = acme_tasks.rewards:exact_answer
        length = acme_tasks.rewards:exact_answer
        wrong_signature = acme_tasks.rewards:wrong_signature
        not_callable = acme_tasks.rewards:NOT_CALLABLE
        import_fails = acme_tasks.broken:anything
        exits = acme_tasks.exits:anything
        missing_attr = acme_tasks.rewards:nope

        [mint.suites]
        acme-heldout = acme_tasks.suites:heldout
        acme-plain = acme_tasks.suites:plain
        not_a_suite = acme_tasks.suites:not_a_suite
        """,
}


@pytest.fixture(autouse=True)
def acme_tasks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The acme-tasks distribution installed on sys.path; registries' caches fresh per test."""
    for rel, text in MODULES.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(textwrap.dedent(text).lstrip())
    monkeypatch.syspath_prepend(str(tmp_path))
    for registry in (rewards._REGISTRY, suites._REGISTRY):
        registry.forget()  # entry points are read once per process: read this test's
    monkeypatch.setattr(plugins, "get_settings", lambda: MintSettings(plugin_modules=()))
    yield
    for registry in (rewards._REGISTRY, suites._REGISTRY):
        registry.forget()  # nothing of acme-tasks outlives its tmp_path
    for name in [m for m in sys.modules if m == "acme_tasks" or m.startswith("acme_tasks.")]:
        del sys.modules[name]


def test_builtins_are_found_first() -> None:
    # acme-tasks also declares a "length" reward: the built-in one wins.
    assert get_reward("length") is rewards.length
    assert get_suite("toy-even").reward == "even_tokens"


def test_entry_points_are_found_loaded_once_and_checked() -> None:
    reward = get_reward("exact_answer")
    assert reward("2 + 2 =", " 4", [19]) == 1.0 and reward("2 + 2 =", "5", [20]) == 0.0
    assert get_reward("exact_answer") is reward  # cached
    suite = get_suite("acme-heldout")  # a factory; its reward is the entry point above
    assert (suite.name, suite.prompts, suite.reward) == (
        "acme-heldout",
        ("2 + 2 =",),
        "exact_answer",
    )
    assert get_suite("acme-heldout") is suite
    assert get_suite("acme-plain").name == "acme-plain"  # a Suite object, not a factory


def test_unknown_names_list_the_entry_points_too() -> None:
    with pytest.raises(
        UnknownReward,
        match=r"'nope' is not registered; known: .*'length'.*"
        r"entry points \(mint.rewards\): .*'exact_answer'",
    ):
        get_reward("nope")
    with pytest.raises(UnknownSuite, match=r"entry points \(mint.suites\): .*'acme-heldout'"):
        get_suite("nope")


@pytest.mark.parametrize(
    ("name", "why"),
    [
        (
            "wrong_signature",
            r"expected a function \(prompt: str, completion: str, token_ids: "
            r"list\[int\]\) -> float, got one with signature \(completion\)",
        ),
        ("not_callable", r"expected a function .* got int"),
        ("import_fails", r"could not be loaded: RuntimeError: acme_tasks.broken needs ACME_TOKEN"),
        ("exits", r"could not be loaded: SystemExit: 3"),
        ("missing_attr", r"could not be loaded: AttributeError: .*'nope'"),
    ],
)
def test_a_broken_reward_entry_point_names_itself_its_distribution_and_what_was_expected(
    name: str, why: str
) -> None:
    with pytest.raises(
        UnknownReward,
        match=rf"reward '{name}' \(entry point {name} = "
        rf"'acme_tasks\.[a-z]+:\w+' of acme-tasks\).*{why}",
    ):
        get_reward(name)


def test_two_distributions_declaring_one_name_is_an_error(tmp_path: Path) -> None:
    other = tmp_path / "acme_more-1.0.dist-info"
    other.mkdir()
    (other / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-more\nVersion: 1.0\n")
    (other / "entry_points.txt").write_text(
        "[mint.rewards]\nexact_answer = acme_tasks.rewards:wrong_signature\n"
    )
    with pytest.raises(
        UnknownReward,
        match=r"declared by several 'mint.rewards' entry points "
        r"\(exact_answer = .* of acme-(tasks|more), exact_answer = .* of "
        r"acme-(tasks|more)\): uninstall or rename all but one",
    ):
        get_reward("exact_answer")


def test_a_broken_suite_entry_point_names_what_was_expected() -> None:
    with pytest.raises(
        UnknownSuite,
        match=r"evaluation suite 'not_a_suite' \(entry point "
        r"not_a_suite = 'acme_tasks.suites:not_a_suite' of acme-tasks\) is not a "
        r"usable evaluation suite: expected a workers.evaluator.suites.Suite or a "
        r"function of no arguments that returns one, got str",
    ):
        get_suite("not_a_suite")


def test_module_function_is_imported_only_under_an_allowed_prefix() -> None:
    ref = "acme_tasks.rewards:exact_answer"
    assert get_reward(ref, allowed_modules=("acme_tasks",))("q", "4", [1]) == 1.0
    assert get_reward(ref, allowed_modules=("lab", "acme_tasks.rewards")) is not None
    # Cached once allowed, but the allowance is still asked every time.
    for allowed in [(), ("acme",), ("acme_tasks.suites",)]:
        with pytest.raises(UnknownReward, match="not under the allowed plugin modules"):
            get_reward(ref, allowed_modules=allowed)


def test_a_refused_module_is_never_imported_and_the_error_says_how_to_allow_it() -> None:
    with pytest.raises(
        UnknownSuite,
        match=r"evaluation suite 'acme_tasks.broken:x' imports module 'acme_tasks.broken', which "
        r"is not under the allowed plugin modules \[\]: a module named in an event runs its "
        r"code, so the operator must allow it by setting MINT_PLUGIN_MODULES \(comma-separated "
        r"module prefixes, e.g. acme_tasks\) on the workers, or install it as a 'mint.suites' "
        r"entry point and use its name",
    ):
        get_suite("acme_tasks.broken:x")
    assert "acme_tasks.broken" not in sys.modules and "acme_tasks" not in sys.modules


def test_the_allowance_comes_from_mint_plugin_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINT_PLUGIN_MODULES", "lab.rl, acme_tasks")
    monkeypatch.setattr(plugins, "get_settings", MintSettings)
    assert MintSettings().plugin_modules == ("lab.rl", "acme_tasks")
    suite = get_suite("acme_tasks.suites:by_module")  # its reward is a module:function too
    assert suite.reward_metric == "acme_tasks.rewards.exact_answer"
    with pytest.raises(ValidationError, match="entry 'acme tasks' is not a dotted module path"):
        MintSettings(plugin_modules="acme tasks")


def test_a_broken_plugin_fails_the_request_the_way_an_unknown_name_does() -> None:
    errors = []
    for name in ("nope", "import_fails", "acme_tasks.rewards:exact_answer"):
        with pytest.raises(UnknownReward) as e:
            # The reward is looked up before anything else: no engine, resolver or store used.
            RolloutCore(None, None, None, None, engine_id="e0").run(rollout(name))
        errors.append(e.value)
    # Same kind, and a refusal: the same request fails the same way until the operator installs
    # or fixes the plugin (and restarts the worker), so no retry can help.
    assert all(isinstance(e, UnknownReward) and isinstance(e, Refused) for e in errors)
    assert all(is_refusal(e) and not is_transient(e) for e in errors)
    with pytest.raises(UnknownSuite) as suite_error:
        get_suite("nope")
    assert is_refusal(suite_error.value) and not is_transient(suite_error.value)


def test_the_message_is_shown_as_written_not_quoted_like_a_key_error() -> None:
    with pytest.raises(UnknownReward) as e:
        get_reward("nope")
    assert str(e.value).startswith("reward 'nope' is not registered")  # no KeyError quotes
    assert str(e.value).endswith("restart the worker after installing a plugin)")


class _RecordingProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None, list]] = []

    def send_raw(self, topic, value, key=None, headers=None, timeout_s=30.0):
        self.sent.append((topic, value, key, headers))

    def close(self) -> None:
        pass


def test_a_rollout_naming_an_unknown_reward_is_dead_lettered_at_once_as_refused() -> None:
    settings = MintSettings(topic_prefix="unit")
    producer, calls = _RecordingProducer(), []
    core = RolloutCore(None, None, None, None, engine_id="e0")

    def handler(env, record):
        calls.append(env.event_id)
        core.run(env)

    loop = RecordLoop(
        settings, "g", handler, RetryPolicy(5, 0.001, 0.001), producer, threading.Event()
    )  # type: ignore[arg-type]
    value = encode_event(rollout("no_such_reward"))
    loop.process(
        ConsumerRecord(
            "unit.rollout.requests", 0, -1, 3, 0, 0, b"acme/math", value, [], None, 6, len(value), 0
        )
    )
    assert len(calls) == 1  # not retried
    ((topic, sent, _, headers),) = producer.sent
    letter = DeadLetter.from_headers(headers)
    assert (topic, sent, letter.reason, letter.attempts) == ("unit.dlq", value, "refused", 1)
    assert letter.error.startswith("UnknownReward: reward 'no_such_reward' is not registered")
    assert "entry points (mint.rewards): [" in letter.error


def test_entry_points_are_read_once_for_known_and_unknown_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scans = []

    def counting(**kwargs):
        scans.append(kwargs)
        return plugins_entry_points(**kwargs)

    plugins_entry_points = plugins.entry_points
    monkeypatch.setattr(plugins, "entry_points", counting)
    for _ in range(3):
        for name in ("nope", "also_nope"):
            with pytest.raises(
                UnknownReward, match=r"entry points \(mint.rewards\): .*'exact_answer'"
            ):
                get_reward(name)
        assert get_reward("exact_answer")("q", "4", [1]) == 1.0
    with pytest.raises(UnknownSuite):
        get_suite("nope")
    assert get_suite("acme-heldout").name == "acme-heldout"
    assert scans == [{"group": "mint.rewards"}, {"group": "mint.suites"}]
    # forget() reads them again (what a worker restart does): a plugin installed since is seen.
    rewards._REGISTRY.forget()
    with pytest.raises(UnknownReward):
        get_reward("nope")
    assert scans[-1] == {"group": "mint.rewards"} and len(scans) == 3


def test_the_gate_scores_a_plugin_suite_and_reports_its_reward_metric(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Engine:
        def generate(self, reqs):
            return [GenResult([1], [GenSample("4", [7], [], "stop")]) for _ in reqs]

    class WorkingSet:
        def ensure(self, ref):
            return "handle"

        def used_in_batch(self, digests):
            pass

    class Resolver:
        def resolve(self, ref):
            return Resolved("acme", "math", 1, DIGEST, "file:///s/acme/math/1")

    core = EvaluatorCore(Engine(), WorkingSet(), Resolver(), engine_id="e0")
    req = make_event(
        EvalRequested(revision=1, adapter_digest=DIGEST, suite="acme_tasks.suites:by_module"),
        tenant="acme",
        policy="math",
        producer="test",
    )
    monkeypatch.setattr(
        plugins, "get_settings", lambda: MintSettings(plugin_modules=("acme_tasks",))
    )
    metrics = core.run(req).payload.metrics
    assert metrics["reward"] == metrics["acme_tasks.rewards.exact_answer"] == 1.0


def rollout(reward: str):
    return make_event(
        RolloutRequested(base_model="m", prompts=["2 + 2 ="], reward=reward),
        tenant="acme",
        policy="math",
        producer="test",
    )


@pytest.mark.parametrize(
    "reward", ["length", "exact_answer", "acme_tasks.rewards:exact_answer", "_m:_f", "a.b.c:D9"]
)
def test_rollout_requests_name_a_reward_or_a_module_function(reward: str) -> None:
    assert RolloutRequested(base_model="m", prompts=["x"], reward=reward).reward == reward


@pytest.mark.parametrize(
    "reward",
    [
        "os:system(1)",
        "a:b:c",
        "a.:b",
        ".a:b",
        "a..b:c",
        "a/b:c",
        "a b:c",
        "a:b.c",
        "a:",
        ":a",
        "9a:b",
        "Length",
        "a" * 125 + ".bb:c",
    ],
)
def test_rollout_requests_refuse_anything_else(reward: str) -> None:
    with pytest.raises(ValidationError, match="reward"):
        RolloutRequested(base_model="m", prompts=["x"], reward=reward)
