"""Evaluation suites by name: prompts, a reward from the serving/rollout reward registry, and
decoding settings. Greedy (temperature 0) by default so that an evaluation is reproducible: the
same revision on the same engine gets the same metrics.

Real tasks register theirs with :func:`register_suite` (in the evaluator's process).
"""

from __future__ import annotations

from dataclasses import dataclass

from workers.evaluator.exceptions import UnknownSuite
from workers.serving.arithmetic import held_out_prompts
from workers.serving.rewards import get_reward


@dataclass(frozen=True)
class Suite:
    name: str
    prompts: tuple[str, ...]
    reward: str  # a name in workers.serving.rewards.REWARDS
    max_tokens: int = 8
    samples: int = 1
    temperature: float = 0.0
    seed: int = 0
    chat: bool = False  # prompts are user turns of the model's chat template (instruct models)

    def __post_init__(self) -> None:
        if not self.prompts:
            raise ValueError(f"suite {self.name!r} has no prompts; give at least one")
        get_reward(self.reward)  # fail at registration, not at the first request


SUITES: dict[str, Suite] = {}


def register_suite(suite: Suite) -> Suite:
    SUITES[suite.name] = suite
    return suite


def get_suite(name: str) -> Suite:
    try:
        return SUITES[name]
    except KeyError:
        raise UnknownSuite(
            f"evaluation suite {name!r} is not registered; known: {sorted(SUITES)}; register one "
            "with workers.evaluator.suites.register_suite in the evaluator process"
        ) from None


TOY_PROMPTS = ("hello world", "the cat sat", "once upon a time", "2 + 2 =", "a b c",
               "tell me a story", "good morning", "one two three")  # fmt: skip
# The demo's task: make completions consist of even token ids (GRPO learns it in a few rounds).
register_suite(Suite("toy-even", TOY_PROMPTS, "even_tokens", max_tokens=8))
register_suite(Suite("toy-even-sampled", TOY_PROMPTS, "even_tokens", max_tokens=8, samples=4,
                     temperature=1.0))  # fmt: skip
# The real model's task (SmolLM2-135M-Instruct): held-out one-digit sums, greedy, right answer.
register_suite(Suite("arith-heldout", held_out_prompts(), "arith_correct", max_tokens=10,
                     chat=True))  # fmt: skip
