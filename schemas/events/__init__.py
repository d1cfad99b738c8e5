"""Payload models, one module per lifecycle stage."""

from schemas.events.canary import (
    CanaryCommand,
    CanaryEnded,
    CanaryRule,
    CanarySide,
    CanaryStarted,
    FeedbackSubmitted,
)
from schemas.events.dead_letter import DeadLetter
from schemas.events.evaluation import EvalCompleted, EvalRequested, Threshold, threshold_failures
from schemas.events.export import ExportCompleted, TrainingFigures
from schemas.events.inference import (
    ChatTurn,
    InferCancel,
    InferChoice,
    InferCompleted,
    InferDelta,
    InferFailed,
    InferRequested,
)
from schemas.events.lifecycle import PolicyConfigured
from schemas.events.load import AdapterEvicted, AdapterLoaded, LoadFailed, LoadRequested
from schemas.events.rollout import RolloutCompleted, RolloutRequested
from schemas.events.sampling import (
    SamplingOptions,
    StructuredOutput,
    TokenLogprob,
    TopLogprob,
)
from schemas.events.serving import (
    AliasMoved,
    PolicyRetirement,
    PromoteCommand,
    RetireCommand,
    RevisionTagged,
    RollbackCommand,
    ServingRefused,
    TagCommand,
)
from schemas.events.steps import (
    AdamSpec,
    StepDatum,
    TrainStepCompleted,
    TrainStepFailed,
    TrainStepRequested,
)
from schemas.events.update import LoraSpec, UpdateCompleted, UpdateRequested

__all__ = [
    "AdamSpec",
    "AdapterEvicted",
    "AdapterLoaded",
    "AliasMoved",
    "CanaryCommand",
    "CanaryEnded",
    "CanaryRule",
    "CanarySide",
    "CanaryStarted",
    "ChatTurn",
    "DeadLetter",
    "EvalCompleted",
    "EvalRequested",
    "ExportCompleted",
    "FeedbackSubmitted",
    "InferCancel",
    "InferChoice",
    "InferCompleted",
    "InferDelta",
    "InferFailed",
    "InferRequested",
    "LoadFailed",
    "LoadRequested",
    "LoraSpec",
    "PolicyConfigured",
    "PolicyRetirement",
    "PromoteCommand",
    "RetireCommand",
    "RevisionTagged",
    "RollbackCommand",
    "RolloutCompleted",
    "RolloutRequested",
    "SamplingOptions",
    "ServingRefused",
    "StepDatum",
    "StructuredOutput",
    "TagCommand",
    "Threshold",
    "TrainStepCompleted",
    "TrainingFigures",
    "TrainStepFailed",
    "TokenLogprob",
    "TopLogprob",
    "TrainStepRequested",
    "UpdateCompleted",
    "UpdateRequested",
    "threshold_failures",
]
