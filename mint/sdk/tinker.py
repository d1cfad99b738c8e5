"""Tinker-style verbs over the same events, so a Tinker training script ports with small changes.

    service = ServiceClient(MintClient(settings, tenant="acme"))
    training = service.create_lora_training_client(base_model=path, rank=8, policy="math-rl")
    sampler = training.save_weights_for_sampler("init")
    for step in range(10):
        seqs = sampler.sample(prompts, num_samples=4, sampling_params=SamplingParams(max_tokens=8))
        data = [Datum(s.prompt, s.tokens, reward=score(s), group=s.prompt_index,
                      logprobs=s.logprobs) for s in seqs]
        fwd = training.forward_backward(data, loss_fn="importance_sampling")
        training.optim_step(AdamParams(learning_rate=1e-2))
        print(fwd.result().loss)
        sampler = training.save_weights_for_sampler(f"step-{step}")

How they map: ``forward_backward`` queues a batch; ``optim_step`` turns the queued batch into
one ``update.requested`` (one optimizer step). It is sent lazily: when the next step is queued
it goes out with ``export=false``; at ``save_weights_for_sampler`` it goes out with
``export=true``, and the exported revision backs the returned ``SamplingClient``. ``sample`` is a
``rollout.requested`` against that revision. The loss function is the trainer's (GRPO with
importance sampling or PPO clipping, chosen in the trainer's config); ``loss_fn`` names the
objective: ``cross_entropy`` → SFT, anything else → RL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mint.sdk.client import MintClient
from mint.sdk.training import UpdateResult
from schemas.events import LoraSpec


@dataclass(frozen=True)
class Datum:
    prompt: str | list[int]
    completion: str | list[int]
    reward: float | None = None
    group: int | str = 0
    logprobs: list[float] | None = None

    def row(self) -> dict[str, Any]:
        row: dict[str, Any] = {}
        row["prompt" if isinstance(self.prompt, str) else "prompt_ids"] = self.prompt
        key = "completion" if isinstance(self.completion, str) else "completion_ids"
        row[key] = self.completion
        if self.reward is not None:
            row.update(reward=self.reward, group=self.group, logprobs=self.logprobs)
        return row


@dataclass(frozen=True)
class AdamParams:
    learning_rate: float = 1e-4


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    seed: int | None = None


@dataclass
class Sequence:
    prompt: str
    prompt_index: int
    tokens: list[int]
    text: str
    logprobs: list[float]
    reward: float | None = None


@dataclass
class ForwardBackwardOutput:
    loss: float | None
    metrics: dict[str, float] = field(default_factory=dict)
    revision: int | None = None


class Future:
    """Resolves once the step's update.completed arrived (sending the step if still held)."""

    def __init__(self, training: TrainingClient) -> None:
        self._training = training
        self._value: ForwardBackwardOutput | None = None

    def set(self, value: ForwardBackwardOutput) -> None:
        self._value = value

    def result(self) -> ForwardBackwardOutput:
        if self._value is None:
            self._training.flush(export=False)
        assert self._value is not None, "call optim_step before result()"
        return self._value


class SamplingClient:
    def __init__(self, client: MintClient, policy: str, revision: int) -> None:
        self.client, self.policy, self.revision = client, policy, revision

    def sample(
        self,
        prompts: list[str] | str,
        num_samples: int = 1,
        sampling_params: SamplingParams | None = None,
        reward: str = "length",
    ) -> list[Sequence]:
        sp = sampling_params or SamplingParams()
        prompts = [prompts] if isinstance(prompts, str) else prompts
        ro = self.client.rollout(
            self.policy,
            prompts,
            revision=self.revision,
            samples_per_prompt=num_samples,
            max_tokens=sp.max_tokens,
            temperature=sp.temperature,
            seed=sp.seed,
            reward=reward,
        )
        return [
            Sequence(
                r["prompt"],
                r["prompt_index"],
                r["token_ids"],
                r["completion"],
                r.get("logprobs") or [],
                r.get("reward"),
            )
            for r in ro.rows
        ]


class TrainingClient:
    def __init__(self, client: MintClient, policy: str, base_model: str, lora: LoraSpec) -> None:
        self.client, self.policy, self.base_model, self.lora = client, policy, base_model, lora
        self.revision: int | None = client.latest_revision(policy)
        self._queued: list[dict[str, Any]] = []
        self._objective = "rl"
        self._held: tuple[list[dict[str, Any]], str, float, Future] | None = None
        self.steps = 0

    def forward_backward(self, data: list[Datum], loss_fn: str = "importance_sampling") -> Future:
        if self._held is not None:
            self.flush(export=False)  # the previous step goes out now
        self._queued += [d.row() for d in data]
        self._objective = "sft" if loss_fn == "cross_entropy" else "rl"
        self._future = Future(self)
        return self._future

    def optim_step(self, adam: AdamParams | None = None) -> None:
        if not self._queued:
            raise ValueError("optim_step without forward_backward: queue a batch first")
        lr = (adam or AdamParams()).learning_rate
        self._held = (self._queued, self._objective, lr, self._future)
        self._queued = []

    def flush(self, export: bool) -> UpdateResult | None:
        if self._held is None:
            return None
        rows, objective, lr, future = self._held
        self._held = None
        res = self.client.update(
            self.policy,
            rows,
            objective=objective,
            parent_revision=self.revision,
            learning_rate=lr,
            export=export,
            lora=self.lora,
            base_model=self.base_model,
        )
        self.steps += 1
        future.set(ForwardBackwardOutput(res.loss, res.metrics, res.revision))
        return res

    def save_weights_for_sampler(self, name: str = "") -> SamplingClient:
        """Export the policy's current weights as a revision and sample from it."""
        res = self.flush(export=True)
        if res is None and self.revision is None:
            res = self.client.init_policy(self.policy, lora=self.lora, base_model=self.base_model)
        if res is not None:
            self.revision = res.revision
        return SamplingClient(self.client, self.policy, self.revision)  # type: ignore[arg-type]


class ServiceClient:
    def __init__(self, client: MintClient) -> None:
        self.client = client

    def create_lora_training_client(
        self, base_model: str, rank: int = 8, *, policy: str, alpha: float | None = None
    ) -> TrainingClient:
        self.client.base_models[policy] = base_model
        lora = LoraSpec(rank=rank, alpha=alpha or 2.0 * rank)
        return TrainingClient(self.client, policy, base_model, lora)
