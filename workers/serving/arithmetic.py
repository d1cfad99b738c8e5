"""The real model's task: one-digit sums, answered with just the number.

"What is 7 + 5? Answer with just the number." SmolLM2-135M-Instruct (greedy, chat template)
knows most sums but almost never answers with the number alone: it writes "7 + 5 = 12" or
"The answer is 12." (measured: the exact answer 0.02 of the time, the right number somewhere in
the answer 0.59). The reward checks both, so GRPO has something to find and a person can read
the before/after answers. The 81 pairs are split once, by a fixed shuffle, into training and
held-out questions: the gate scores revisions only on questions never trained on.
"""

from __future__ import annotations

import random
import re

TEMPLATE = "What is {a} + {b}? Answer with just the number."
_QUESTION = re.compile(r"What is (\d+) \+ (\d+)\?")
_NUMBER = re.compile(r"-?\d+")
HELD_OUT = 32  # of the 81 pairs; the other 49 are for training


def _pairs() -> list[tuple[int, int]]:
    pairs = [(a, b) for a in range(1, 10) for b in range(1, 10)]
    random.Random(0).shuffle(pairs)
    return pairs


def held_out_prompts() -> tuple[str, ...]:
    return tuple(TEMPLATE.format(a=a, b=b) for a, b in _pairs()[:HELD_OUT])


def training_prompts(n: int, seed: int) -> list[str]:
    """``n`` distinct training questions (never held-out ones), drawn by ``seed``."""
    pool = _pairs()[HELD_OUT:]
    if not 1 <= n <= len(pool):
        raise ValueError(f"n={n}: ask for 1…{len(pool)} training questions")
    return [TEMPLATE.format(a=a, b=b) for a, b in random.Random(seed).sample(pool, n)]


def answer_of(prompt: str) -> int:
    m = _QUESTION.search(prompt)
    if m is None:
        raise ValueError(f"not an arithmetic question: {prompt[:80]!r}; the arith rewards need "
                         f"prompts like {TEMPLATE.format(a=3, b=4)!r}")  # fmt: skip
    return int(m[1]) + int(m[2])


def is_exact(completion: str, answer: int) -> bool:
    """The number alone (a trailing period allowed), nothing before or after it."""
    return completion.strip().removesuffix(".").strip() == str(answer)


def exact_reward(prompt: str, completion: str) -> float:
    return float(is_exact(completion, answer_of(prompt)))


def shaped_reward(prompt: str, completion: str, n_tokens: int) -> float:
    """1 for the exact answer; 0.2–0.5 when the last number is right (more for shorter
    answers); 0 otherwise. The partial credit keeps a gradient while exact answers are rare."""
    answer = answer_of(prompt)
    if is_exact(completion, answer):
        return 1.0
    numbers = _NUMBER.findall(completion)
    if numbers and int(numbers[-1]) == answer:
        return 0.2 + 0.3 * max(0.0, 1.0 - (n_tokens - 2) / 12)
    return 0.0
