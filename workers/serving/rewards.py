"""Reward functions a rollout request names (``reward`` in its sampling options), by name.

A reward takes ``(prompt, completion, token_ids)`` and returns a float. Kept tiny and
deterministic; real tasks register theirs with :func:`register`.
"""

from __future__ import annotations

from collections.abc import Callable

from workers.serving import arithmetic
from workers.serving.exceptions import UnknownReward

Reward = Callable[[str, str, list[int]], float]

REWARDS: dict[str, Reward] = {}


def register(name: str) -> Callable[[Reward], Reward]:
    def deco(fn: Reward) -> Reward:
        REWARDS[name] = fn
        return fn

    return deco


@register("length")
def length(prompt: str, completion: str, token_ids: list[int]) -> float:
    """Number of completion tokens (a smoke signal that moves with the policy)."""
    return float(len(token_ids))


@register("distinct")
def distinct(prompt: str, completion: str, token_ids: list[int]) -> float:
    """Share of distinct tokens: 1.0 for no repetition, low for degenerate loops."""
    return len(set(token_ids)) / len(token_ids) if token_ids else 0.0


@register("digits")
def digits(prompt: str, completion: str, token_ids: list[int]) -> float:
    """Share of digit characters in the completion (arithmetic prompts)."""
    return sum(c.isdigit() for c in completion) / len(completion) if completion else 0.0


@register("even_tokens")
def even_tokens(prompt: str, completion: str, token_ids: list[int]) -> float:
    """Share of even completion token ids: ≈ 0.5 for a random base, learnable by GRPO in a few
    rounds (the demo's toy task)."""
    return sum(t % 2 == 0 for t in token_ids) / len(token_ids) if token_ids else 0.0


@register("arith_exact")
def arith_exact(prompt: str, completion: str, token_ids: list[int]) -> float:
    """1.0 when the completion is exactly the sum asked for ("12", or "12."), else 0.0."""
    return arithmetic.exact_reward(prompt, completion)


@register("arith_correct")
def arith_correct(prompt: str, completion: str, token_ids: list[int]) -> float:
    """1.0 when the answer's last number is the sum asked for, else 0.0 (the held-out gate)."""
    return arithmetic.correct_reward(prompt, completion)


@register("arith_shaped")
def arith_shaped(prompt: str, completion: str, token_ids: list[int]) -> float:
    """Training reward for the arithmetic task: correct 0.6–1.0 (shorter is more), wrong 0."""
    return arithmetic.shaped_reward(prompt, completion, len(token_ids))


def get_reward(name: str) -> Reward:
    try:
        return REWARDS[name]
    except KeyError:
        raise UnknownReward(
            f"reward {name!r} is not registered; known: {sorted(REWARDS)}; register one with "
            "workers.serving.rewards.register"
        ) from None
