"""Reward functions a rollout request names (``reward`` in its sampling options), by name.

A reward takes ``(prompt, completion, token_ids)`` and returns a float. The built-ins are kept
tiny and deterministic; tasks from outside MinT bring theirs as a ``mint.rewards`` entry point
or an operator-allowed ``module:function`` (workers.plugins), or register them in-process with
:func:`register`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from workers.plugins import Registry
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


def _check_reward(obj: object) -> Reward:
    """A plugin's reward: a callable that accepts ``(prompt, completion, token_ids)``."""
    expected = "expected a function (prompt: str, completion: str, token_ids: list[int]) -> float"
    if not callable(obj):
        raise TypeError(f"{expected}, got {type(obj).__name__}")
    try:
        inspect.signature(obj).bind("", "", [])
    except TypeError as e:
        raise TypeError(f"{expected}, got one with signature {inspect.signature(obj)} ({e})") from e
    except ValueError:
        pass  # no signature to inspect (a builtin): its first call will tell
    return obj  # type: ignore[return-value]


_REGISTRY = Registry(
    "reward",
    "mint.rewards",
    REWARDS,
    _check_reward,
    UnknownReward,
    "register one with workers.serving.rewards.register, a 'mint.rewards' entry point, or "
    "name it module:function",
)


def get_reward(name: str, *, allowed_modules: tuple[str, ...] | None = None) -> Reward:
    """The reward called ``name``: built-in, entry point, or allowed ``module:function``
    (``allowed_modules``: prefixes; None: the MINT_PLUGIN_MODULES setting)."""
    return _REGISTRY.get(name, allowed_modules=allowed_modules)
