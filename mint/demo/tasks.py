"""What the demo trains: the tiny toy task and the real arithmetic task, the run's settings and
its base model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mint.dev.workers import TINY_ENGINE_ARGS, tiny_model
from schemas.settings import MintSettings

TENANT = "demo"
PROMPTS = ["hello world", "the model", "red green blue", "once upon a time"]
# lm_head in the LoRA lets GRPO move the token distribution of a tiny random model in a few
# rounds (attention/MLP LoRA alone barely moves it: measured flat for 8 rounds).
LORA_TARGETS = ["q_proj", "v_proj", "lm_head"]
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class DemoTask:
    """What the demo trains: policy, reward, gate suite, GRPO settings, engine size."""

    model: str  # a name in workers.models.pretrained.PRETRAINED, or "tiny-llama"
    policy: str
    suite: str  # the gate's held-out suite (workers.evaluator.suites)
    reward: str  # the training reward (workers.serving.rewards)
    gate: float  # suite reward a revision needs to be promoted
    metric: str  # what the suite's reward means, for people
    round_prompts: Callable[[int], list[str]]
    show: tuple[str, ...]  # asked through prod before and after the rollback
    lora_rank: int = 8
    lora_targets: tuple[str, ...] = tuple(LORA_TARGETS)
    learning_rate: float = 5e-2
    steps_per_round: int = 4
    samples_per_prompt: int = 8
    max_tokens: int = 8
    temperature: float = 1.0
    chat: bool = False
    engine_args: tuple[str, ...] = TINY_ENGINE_ARGS
    trainer_threads: int = 1  # the tiny model trains in 1 thread while the engine has the other


def _arith_round(i: int) -> list[str]:
    from workers.serving.arithmetic import training_prompts

    return training_prompts(8, seed=i)


def _held_out(k: int) -> tuple[str, ...]:
    from workers.serving.arithmetic import held_out_prompts

    return held_out_prompts()[:k]


TINY = DemoTask(
    model="tiny-llama",
    policy="toy-even",
    suite="toy-even-sampled",
    reward="even_tokens",
    gate=0.8,
    metric="share of even token ids",
    round_prompts=lambda i: PROMPTS,
    show=tuple(PROMPTS[:3]),
)
# SmolLM2-135M-Instruct learns to answer held-out one-digit sums with just the number (see
# workers/serving/arithmetic.py; settings and figures in the README, "The real model").
REAL = DemoTask(
    model="smollm2-135m-instruct",
    policy="arith",
    suite="arith-heldout",
    reward="arith_shaped",
    gate=0.83,
    metric="held-out sums answered right",
    round_prompts=_arith_round,
    show=_held_out(4),
    lora_targets=tuple(ALL_LINEAR),
    learning_rate=3e-3,
    steps_per_round=1,
    max_tokens=12,
    chat=True,
    engine_args=("--max-model-len", "256", "--max-lora-rank", "8", "--max-num-seqs", "128"),
    trainer_threads=2,
)


def demo_settings(base: MintSettings, run: str) -> MintSettings:
    return base.model_copy(update={"topic_prefix": f"demo-{run}", "keyspace": f"demo_{run}"})


def demo_model(settings: MintSettings, task: DemoTask) -> Path:
    """The task's base model folder: fetched (converted once) or built (tiny)."""
    if task.model == "tiny-llama":
        return tiny_model(settings)
    from workers.models.pretrained import fetch

    return fetch(task.model, settings.models_dir)
