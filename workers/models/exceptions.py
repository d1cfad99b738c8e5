"""Errors of the tiny model builder."""

from __future__ import annotations

from schemas.exceptions import MintError


class ModelError(MintError):
    """Base of model-building errors."""


class ModelBuildError(ModelError, ValueError):
    """A tiny model cannot be built as asked (unknown arch/size, folder in the way, too large)."""


class ModelFetchError(ModelError, RuntimeError):
    """A pretrained model cannot be fetched: package missing, file corrupt, folder in the way."""
