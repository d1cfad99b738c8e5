"""Serving errors: a base, and categories that also inherit the stdlib exception they replace."""

from __future__ import annotations


class ServingError(Exception):
    """Base of every serving/rollout worker error."""


class EngineError(ServingError, RuntimeError):
    """vLLM refused or failed an operation (start, add_lora, generate)."""


class LoadError(ServingError, RuntimeError):
    """An adapter could not be brought into the working set; ``kind`` names why."""

    kind = "load"
    retryable = False


class AdapterMissing(LoadError, FileNotFoundError):
    kind = "missing"


class AdapterDigestMismatch(LoadError, ValueError):
    kind = "digest_mismatch"


class RankTooLarge(LoadError, ValueError):
    kind = "rank_too_large"


class WrongBaseModel(LoadError, ValueError):
    kind = "wrong_base_model"


class LoraIdCollision(LoadError, ValueError):
    kind = "id_collision"


class WorkingSetFull(LoadError, MemoryError):
    """Every CPU slot is pinned or in use; unpin something or raise max_cpu_loras."""

    kind = "full"
    retryable = True


class UnknownReward(ServingError, KeyError):
    """A rollout asked for a reward function the registry does not have."""
