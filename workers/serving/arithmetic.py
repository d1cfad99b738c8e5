"""The real model's task: one-digit sums, answered with just the number.

"What is 7 + 5? Answer with just the number." SmolLM2-135M-Instruct (greedy, chat template)
knows most sums but almost never answers with the number alone: it writes "7 + 5 = 12" or
"The answer is 12." (measured: the exact answer 0.02 of the time, the right number somewhere in
the answer 0.59). The reward checks both, so GRPO has something to find and a person can read
the before/after answers. The 45 unordered pairs are split once, by a fixed shuffle, into
training and held-out ones, and each pair is asked in both orders: the gate scores revisions
only on sums never trained on, not even as b + a.
"""

from __future__ import annotations

import random
import re

TEMPLATE = "What is {a} + {b}? Answer with just the number."
_QUESTION = re.compile(r"What is (\d+) \+ (\d+)\?")
_NUMBER = re.compile(r"-?\d+")
HELD_OUT_PAIRS = 16  # of the 45 unordered pairs; the other 29 are for training


def _split() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(held-out, training) ordered pairs; a pair and its swap always fall on the same side."""
    unordered = [(a, b) for a in range(1, 10) for b in range(a, 10)]
    random.Random(0).shuffle(unordered)

    def both(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
        return [o for a, b in pairs for o in dict.fromkeys([(a, b), (b, a)])]

    return both(unordered[:HELD_OUT_PAIRS]), both(unordered[HELD_OUT_PAIRS:])


def held_out_prompts() -> tuple[str, ...]:
    return tuple(TEMPLATE.format(a=a, b=b) for a, b in _split()[0])


def training_prompts(n: int, seed: int) -> list[str]:
    """``n`` distinct training questions (never held-out ones), drawn by ``seed``."""
    pool = _split()[1]
    if not 1 <= n <= len(pool):
        raise ValueError(f"n={n}: ask for 1…{len(pool)} training questions")
    return [TEMPLATE.format(a=a, b=b) for a, b in random.Random(seed).sample(pool, n)]


def answer_of(prompt: str) -> int:
    m = _QUESTION.search(prompt)
    if m is None:
        raise ValueError(
            f"not an arithmetic question: {prompt[:80]!r}; the arith rewards need "
            f"prompts like {TEMPLATE.format(a=3, b=4)!r}"
        )
    return int(m[1]) + int(m[2])


def is_exact(completion: str, answer: int) -> bool:
    """The number alone (a trailing period allowed), nothing before or after it."""
    return completion.strip().removesuffix(".").strip() == str(answer)


def exact_reward(prompt: str, completion: str) -> float:
    return float(is_exact(completion, answer_of(prompt)))


def is_correct(completion: str, answer: int) -> bool:
    """The answer's last number is the sum ("3 + 7 = 10", "The answer is 10.", "10")."""
    numbers = _NUMBER.findall(completion)
    return bool(numbers) and int(numbers[-1]) == answer


def correct_reward(prompt: str, completion: str) -> float:
    return float(is_correct(completion, answer_of(prompt)))


def shaped_reward(prompt: str, completion: str, n_tokens: int) -> float:
    """0.6–1.0 for a correct answer, more the shorter it is (the bare number scores most); 0
    for a wrong one, a ramble, or one cut off before its number."""
    if not is_correct(completion, answer_of(prompt)):
        return 0.0
    return 0.6 + 0.4 * max(0.0, 1.0 - (n_tokens - 2) / 12)
