"""Serving errors: a base, and categories that also inherit the stdlib exception they replace."""

from __future__ import annotations

from schemas.exceptions import MintError


class ServingError(MintError):
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


class EngineRefusedAdapter(LoadError):
    """vLLM's add_lora refused or failed on files that passed verification."""

    kind = "engine"


class StoreFailed(LoadError, OSError):
    """The adapter store or the engine's cache failed with an error that does not pass by
    itself (permission denied, read-only file system, ...): the load fails loudly. A store
    that is away is ``catalog.exceptions.StoreUnavailable`` instead, and is waited out."""

    kind = "store"


class RequestRefused(ServingError, ValueError):
    """The engine cannot run this request as sent (checked before batching: stage validate).

    ``code`` is the OpenAI error code the gateway answers with: ``context_length_exceeded``
    (the prompt does not fit the model's context) or ``invalid_value`` (a sampling value the
    engine cannot run)."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


class WorkingSetFull(LoadError, MemoryError):
    """Every CPU slot is pinned or in use; unpin something or raise max_cpu_loras."""

    kind = "full"
    retryable = True


class UnknownReward(ServingError, KeyError):
    """A rollout asked for a reward function the registry does not have."""
