"""The evaluator: runs a policy's evaluation suite against a revision through the serving engine
and emits ``eval.completed`` with metrics and the gate's verdict.

``mint worker evaluator`` (alone, or ``--with-serving --with-rollout`` to share one engine).
"""

from workers.evaluator.core import EvaluatorCore, result_id
from workers.evaluator.exceptions import EvaluatorError, UnknownSuite
from workers.evaluator.suites import SUITES, Suite, get_suite, register_suite
from workers.evaluator.worker import EngineHost, run_evaluator_worker

__all__ = [
    "SUITES",
    "EngineHost",
    "EvaluatorCore",
    "EvaluatorError",
    "Suite",
    "UnknownSuite",
    "get_suite",
    "register_suite",
    "result_id",
    "run_evaluator_worker",
]
