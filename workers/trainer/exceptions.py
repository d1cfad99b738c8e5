"""Trainer errors: a base class and categories that also inherit the stdlib error they replace."""

from __future__ import annotations

from schemas.exceptions import MintError
from streams.exceptions import TransientError


class TrainerError(MintError):
    """Base of every trainer error."""


class PolicyNotLoaded(TrainerError, KeyError):
    """A step or export named a policy the trainer does not hold."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0])


class BadBatch(TrainerError, ValueError):
    """Training data that cannot be used (empty, wrong fields, ragged logprobs)."""


class UntrainableTarget(TrainerError, ValueError):
    """A LoRA target that the loss never reaches (DSA's indexer): refused, not silently kept."""


class BackendError(TrainerError, RuntimeError):
    """The training backend (torch or DeepSpeed) could not be set up or failed a step."""


class RanksLost(BackendError, TransientError):
    """A data-parallel rank died or the ranks fell out of step (workers/trainer/ranks.py). Not the
    record's fault: the consumer loop never dead-letters it, and rank 0 stops (its ``stop`` is
    set), leaving the record uncommitted for the restarted trainer."""


class AdapterExists(TrainerError, RuntimeError):
    """A policy's adapter name is already in the model while the policy is not held: loading
    into it would mix weights, so the policy is refused instead."""
