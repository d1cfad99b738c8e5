"""The SDK's training verbs (rollout, update, init_policy, train, evaluate): each publishes its
command and waits for the event it caused, like every MintClient verb (mint.sdk.client)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from catalog.claims import read_jsonl, write_jsonl
from schemas import Envelope
from schemas.events import (
    EvalRequested,
    LoraSpec,
    RolloutRequested,
    Threshold,
    UpdateRequested,
)

log = structlog.get_logger()


@dataclass
class Rollouts:
    revision: int | None
    mean_reward: float | None
    rows: list[dict[str, Any]]
    event: Envelope[Any]


@dataclass
class UpdateResult:
    revision: int | None
    loss: float | None
    metrics: dict[str, float]
    update: Envelope[Any]
    export: Envelope[Any] | None = None


@dataclass
class Round:
    round: int
    sampled_revision: int | None
    revision: int | None
    mean_reward: float | None
    loss: float | None
    events: list[Envelope[Any]] = field(default_factory=list)


def rollouts_to_examples(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rollout rows (the rollout worker's claim check) → the trainer's RL examples: one group
    per prompt, the sampled token ids and their logprobs (for the importance ratio)."""
    out = []
    for r in rows:
        if not r["token_ids"]:
            continue  # an empty completion teaches nothing (and the trainer refuses it)
        out.append(
            {
                "prompt": r["prompt"],
                "prompt_ids": r["prompt_token_ids"],
                "completion_ids": r["token_ids"],
                "logprobs": r.get("logprobs") or None,
                "reward": r["reward"],
                "group": r["prompt_index"],
            }
        )
    return out


class TrainingVerbs:
    """Mixed into MintClient: uses its send, wait_caused_by, catalog, store, tenant, _base and
    latest_revision."""

    def rollout(
        self,
        policy: str,
        prompts: list[str],
        *,
        revision: int | None = None,
        alias: str = "prod",
        samples_per_prompt: int = 4,
        max_tokens: int = 8,
        temperature: float = 1.0,
        reward: str = "length",
        seed: int | None = None,
        base_model: str | None = None,
        chat: bool = False,
    ) -> Rollouts:
        """Sample completions from a revision (or the alias) and score them with ``reward``;
        ``chat`` sends each prompt as a user turn of the model's chat template."""
        cmd = self.send(
            policy,
            RolloutRequested(
                base_model=self._base(policy, base_model),
                revision=revision,
                alias=alias,
                prompts=prompts,
                samples_per_prompt=samples_per_prompt,
                max_tokens=max_tokens,
                temperature=temperature,
                seed=seed,
                reward=reward,
                chat=chat,
            ),
        )
        done = self.wait_caused_by(cmd, "rollout.completed")
        rows = read_jsonl(self.store, done.payload.rollouts_uri, owner=(self.tenant, policy))
        return Rollouts(done.payload.revision, done.payload.mean_reward, rows, done)

    def update(
        self,
        policy: str,
        examples: list[dict[str, Any]],
        *,
        objective: str = "rl",
        parent_revision: int | None = None,
        steps: int = 1,
        batch_size: int | None = None,
        learning_rate: float = 1e-2,
        export: bool = True,
        lora: LoraSpec | None = None,
        seed: int | None = None,
        base_model: str | None = None,
        caused_by_env: Envelope[Any] | None = None,
    ) -> UpdateResult:
        """Train ``steps`` steps on ``examples`` (claim-checked to the store) and, with
        ``export``, wait for the new revision."""
        name = uuid.uuid4().hex
        uri = write_jsonl(self.store, self.tenant, policy, "data", name, examples)
        cmd = self.send(
            policy,
            UpdateRequested(
                base_model=self._base(policy, base_model),
                parent_revision=parent_revision,
                objective=objective,
                data_uri=uri,
                steps=steps,
                batch_size=batch_size or len(examples),
                learning_rate=learning_rate,
                lora=lora or LoraSpec(),
                export=export,
                seed=seed,
            ),
            caused_by_env,
        )
        done = self.wait_caused_by(cmd, "update.completed")
        exported = self.wait_caused_by(cmd, "export.completed") if done.payload.exported else None
        rev = exported.payload.revision if exported else None
        return UpdateResult(rev, done.payload.loss, dict(done.payload.metrics), done, exported)

    def init_policy(
        self,
        policy: str,
        *,
        lora: LoraSpec | None = None,
        seed: int = 0,
        base_model: str | None = None,
    ) -> UpdateResult:
        """Revision 1: a fresh LoRA (B = 0, so it behaves as the base model) exported after one
        negligible SFT step (lr 1e-12), so that rollouts have a revision to sample."""
        return self.update(
            policy,
            [{"prompt": "init", "completion": "init"}],
            objective="sft",
            learning_rate=1e-12,
            lora=lora,
            seed=seed,
            base_model=base_model,
        )

    def train(
        self,
        policy: str,
        prompts: list[str],
        *,
        rounds: int = 3,
        reward: str = "length",
        samples_per_prompt: int = 4,
        max_tokens: int = 8,
        temperature: float = 1.0,
        learning_rate: float = 1e-2,
        steps_per_round: int = 1,
        lora: LoraSpec | None = None,
        start_revision: int | None = None,
        seed: int = 0,
        chat: bool = False,
        on_round: Callable[[Round], None] | None = None,
    ) -> list[Round]:
        """The RL loop (GRPO): sample the latest revision, score, update, export; repeat.
        Each round's new revision is exported (and, if configured, evaluated and promoted by the
        controller)."""
        latest = start_revision
        if latest is None:
            latest = self.latest_revision(policy)
        if latest is None:
            latest = self.init_policy(policy, lora=lora).revision
        out = []
        for i in range(1, rounds + 1):
            ro = self.rollout(
                policy,
                prompts,
                revision=latest,
                reward=reward,
                samples_per_prompt=samples_per_prompt,
                max_tokens=max_tokens,
                temperature=temperature,
                seed=seed * 1000 + i,
                chat=chat,
            )
            examples = rollouts_to_examples(ro.rows)
            up = self.update(
                policy,
                examples,
                objective="rl",
                parent_revision=latest,
                steps=steps_per_round,
                learning_rate=learning_rate,
                caused_by_env=ro.event,
            )
            r = Round(
                i,
                ro.revision,
                up.revision,
                ro.mean_reward,
                up.loss,
                [ro.event, up.update] + ([up.export] if up.export else []),
            )
            out.append(r)
            if on_round:
                on_round(r)
            latest = up.revision or latest
        return out

    def evaluate(
        self,
        policy: str,
        revision: int,
        *,
        suite: str,
        thresholds: dict[str, Threshold | dict] | None = None,
        promote_to: str | None = None,
    ) -> Envelope[Any]:
        """Evaluate a revision on a suite; returns the ``eval.completed`` event."""
        rev = self.catalog.get_revision(self.tenant, policy, revision)
        cmd = self.send(
            policy,
            EvalRequested(
                revision=revision,
                adapter_digest=rev.digest,
                suite=suite,
                promote_to=promote_to,
                thresholds={k: Threshold.model_validate(v) for k, v in (thresholds or {}).items()},
            ),
        )
        return self.wait_caused_by(cmd, "eval.completed")
