"""The trainer worker: LoRA SFT and GRPO for many policies over one resident base model."""

from workers.trainer.config import LossConfig, TrainerConfig
from workers.trainer.data import Batch, Rollout, SftExample
from workers.trainer.engine import MultiPolicyTrainer, StepResult
from workers.trainer.policies import LoraShape, PolicyState

__all__ = [
    "Batch",
    "LoraShape",
    "LossConfig",
    "MultiPolicyTrainer",
    "PolicyState",
    "Rollout",
    "SftExample",
    "StepResult",
    "TrainerConfig",
]
