"""Serving and rollout workers over vLLM with LoRA: engine, working set, resolution cache,
cold-load scheduling, reward registry.

Build order: ``VllmEngine(EngineConfig(...))`` → ``WorkingSet(engine, store, cache_dir, …)`` →
``ResolutionCache(repo.resolve)`` → ``ServingCore`` / ``RolloutCore`` → the Kafka workers.
"""

from workers.serving.core import ServingCore
from workers.serving.engine import EngineConfig, GenRequest, LoraHandle, VllmEngine
from workers.serving.ids import lora_int_id
from workers.serving.resolution import ResolutionCache
from workers.serving.rewards import REWARDS, get_reward, register
from workers.serving.rollout import RolloutCore, run_rollout_worker
from workers.serving.scheduler import DemandScheduler
from workers.serving.worker import ServingWorker
from workers.serving.working_set import WorkingSet

__all__ = [
    "REWARDS",
    "DemandScheduler",
    "EngineConfig",
    "GenRequest",
    "LoraHandle",
    "ResolutionCache",
    "RolloutCore",
    "ServingCore",
    "ServingWorker",
    "VllmEngine",
    "WorkingSet",
    "get_reward",
    "lora_int_id",
    "register",
    "run_rollout_worker",
]
