"""Evaluator errors: a base and categories that also inherit the stdlib exception they replace."""

from __future__ import annotations

from schemas.exceptions import MintError


class EvaluatorError(MintError):
    """Base of every evaluator error."""


class UnknownSuite(EvaluatorError, LookupError):
    """An evaluation request names a suite that is not registered."""
