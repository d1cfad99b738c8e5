"""Evaluation suites by name: prompts, a reward from the serving/rollout reward registry, and
decoding settings. Greedy (temperature 0) by default so that an evaluation is reproducible: the
same revision on the same engine gets the same metrics.

Tasks from outside MinT bring theirs as a ``mint.suites`` entry point or an operator-allowed
``module:attribute`` (workers.plugins): a :class:`Suite`, or a function of no arguments that
returns one. In-process code may also call :func:`register_suite`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from workers.evaluator.exceptions import UnknownSuite
from workers.plugins import Registry
from workers.serving.arithmetic import held_out_prompts
from workers.serving.rewards import get_reward


@dataclass(frozen=True)
class Suite:
    name: str
    prompts: tuple[str, ...]
    reward: str  # a reward's name for workers.serving.rewards.get_reward
    max_tokens: int = 8
    samples: int = 1
    temperature: float = 0.0
    seed: int = 0
    chat: bool = False  # prompts are user turns of the model's chat template (instruct models)

    def __post_init__(self) -> None:
        if not self.prompts:
            raise ValueError(f"suite {self.name!r} has no prompts; give at least one")
        get_reward(self.reward)  # fail at registration, not at the first request

    @property
    def reward_metric(self) -> str:
        """The metric name the reward's mean is also reported under (a metric has no ':', a
        module:function reward has)."""
        return self.reward.replace(":", ".")


SUITES: dict[str, Suite] = {}


def register_suite(suite: Suite) -> Suite:
    SUITES[suite.name] = suite
    return suite


def _check_suite(obj: object) -> Suite:
    """A plugin's suite: a Suite, or a function of no arguments that returns one."""
    expected = (
        "expected a workers.evaluator.suites.Suite or a function of no arguments that returns one"
    )
    if callable(obj) and not isinstance(obj, Suite):
        try:
            inspect.signature(obj).bind()
        except TypeError as e:
            raise TypeError(f"{expected}; the function takes arguments ({e})") from e
        obj = obj()
    if not isinstance(obj, Suite):
        raise TypeError(f"{expected}, got {type(obj).__name__}")
    return obj


_REGISTRY = Registry(
    "evaluation suite",
    "mint.suites",
    SUITES,
    _check_suite,
    UnknownSuite,
    "register one with workers.evaluator.suites.register_suite in the evaluator process, a "
    "'mint.suites' entry point, or name it module:attribute",
)


def get_suite(name: str, *, allowed_modules: tuple[str, ...] | None = None) -> Suite:
    """The suite called ``name``: built-in, entry point, or allowed ``module:attribute``
    (``allowed_modules``: prefixes; None: the MINT_PLUGIN_MODULES setting)."""
    return _REGISTRY.get(name, allowed_modules=allowed_modules)


TOY_PROMPTS = (
    "hello world",
    "the cat sat",
    "once upon a time",
    "2 + 2 =",
    "a b c",
    "tell me a story",
    "good morning",
    "one two three",
)
# The demo's task: make completions consist of even token ids (GRPO learns it in a few rounds).
register_suite(Suite("toy-even", TOY_PROMPTS, "even_tokens", max_tokens=8))
register_suite(
    Suite("toy-even-sampled", TOY_PROMPTS, "even_tokens", max_tokens=8, samples=4, temperature=1.0)
)
# The real model's task (SmolLM2-135M-Instruct): held-out one-digit sums, greedy, right answer.
register_suite(
    Suite("arith-heldout", held_out_prompts(), "arith_correct", max_tokens=10, chat=True)
)
