"""Step-level training calls (the Tinker API): ``train.step.requested`` in, one answer out.

The gateway turns each Tinker training call into a command on ``train.steps``, keyed by policy
(one policy's calls arrive in order). :class:`StepService` runs it on the trainer's resident
base and answers ``train.step.completed`` or ``train.step.failed`` on ``train.step.results``
(the answer's event id derives from the command's, so a re-sent answer is the same event):

- ``create``: a fresh LoRA adapter and optimizer (``lora``, ``seed``). Again for a policy
  held with the same shape: answered completed again.
- ``forward`` / ``forward_backward``: per-datum per-position logprobs of ``target_tokens`` and
  the loss (workers/trainer/losses.py ``step_loss``); ``forward_backward`` ADDS its gradients
  to the policy's, which wait for ``optim_step`` (AdamW with the call's ``adam``, then zeroed).
- ``save_for_sampler``: a revision exported exactly as an update exports one
  (``TrainerService.export_revision``: store, catalog, ``export.completed``).

A call's failure is its own answer (``train.step.failed`` with the stage and a reason the
caller can act on), never a dead letter or a stalled partition; an outage (store, catalog or
broker away) is raised, so the consumer loop waits it out and runs the call again.

Redelivery: answers are remembered by command event id and re-sent, not recomputed.
Accumulated gradients live in memory only; see workers/trainer/README.md (step-level calls)
for what a trainer restart between ``forward_backward`` and ``optim_step`` does.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from catalog.exceptions import CatalogError
from schemas import Envelope
from schemas.envelope import make_reply
from schemas.events.steps import TrainStepCompleted, TrainStepFailed, TrainStepRequested
from schemas.events.update import LoraSpec
from streams.records import is_transient
from workers.trainer.exceptions import BackendError, BadBatch
from workers.trainer.losses import step_loss_config
from workers.trainer.policies import LoraShape

if TYPE_CHECKING:
    from workers.trainer.worker import TrainerService

log = structlog.get_logger()

ANSWERS_KEPT = 4096  # answers remembered for redelivered commands (the most recent)
Answer = TrainStepCompleted | TrainStepFailed


class StepRefused(Exception):
    """A call that cannot run as sent: answered failed at ``stage`` with this message."""

    def __init__(self, stage: str, reason: str) -> None:
        super().__init__(reason)
        self.stage = stage


@dataclass
class Created:
    """What ``create`` made a policy with: its shape, so an evicted policy comes back alike."""

    lora: LoraShape
    seed: int | None
    revision: int | None = None  # its last save_for_sampler: where an evicted one resumes


def _shape(spec: LoraSpec) -> LoraShape:
    return LoraShape(
        spec.rank,
        spec.alpha,
        spec.dropout,
        list(spec.target_modules),
        list(spec.target_parameters),
    )


class StepService:
    """Runs step-level calls against the trainer, store, catalog and producer of ``service``
    (the update handler, whose per-policy locks and export it shares)."""

    def __init__(self, service: TrainerService) -> None:
        self.service = service
        self.trainer = service.trainer
        self._created: dict[str, Created] = {}
        self._answers: OrderedDict[str, Answer] = OrderedDict()  # command event id -> answer
        self._pinned: set[str] = set()  # policies pinned while gradients wait for optim_step

    def handle(self, env: Envelope[Any], record: Any = None) -> Answer:
        p: TrainStepRequested = env.payload
        with self.service._policy_lock(env.policy_id):
            answer = self._answers.get(str(env.event_id))
            if answer is None:
                answer = self._answer(env, p)
                self._remember(str(env.event_id), answer)
            else:
                log.info("train_step_redelivered", request=p.request_id, op=p.op)
            self._publish(env, answer)
            return answer

    def _remember(self, event_id: str, answer: Answer) -> None:
        self._answers[event_id] = answer
        while len(self._answers) > ANSWERS_KEPT:
            self._answers.popitem(last=False)

    def _publish(self, env: Envelope[Any], answer: Answer) -> None:
        reply = make_reply(
            answer, env, producer=self.service.name, event_id=_answer_id(env.event_id)
        )
        self.service.producer.publish_many([reply])

    def _answer(self, env: Envelope[Any], p: TrainStepRequested) -> Answer:
        t0 = time.perf_counter()
        try:
            with self.trainer.updating(env.policy_id):  # never evicted mid-call
                fields = self._run(env, p)
        except Exception as e:
            if is_transient(e):
                raise  # an outage: the consumer loop waits it out and runs the call again
            stage, retryable = _classify(e)
            log.warning("train_step_failed", op=p.op, stage=stage, error=str(e)[:300])
            return TrainStepFailed(
                request_id=p.request_id,
                op=p.op,
                stage=stage,
                reason=f"{p.op}: {e}"[:2000],
                retryable=retryable,
            )
        return TrainStepCompleted(
            request_id=p.request_id, op=p.op, duration_s=time.perf_counter() - t0, **fields
        )

    # The calls.

    def _run(self, env: Envelope[Any], p: TrainStepRequested) -> dict[str, Any]:
        base = self.trainer.config.base_model
        if p.base_model != base:
            raise StepRefused(
                "validate",
                f"base_model={p.base_model!r} but this trainer holds {base!r}; send the call to "
                "a trainer of that base model (one consumer group per base)",
            )
        if p.op == "create":
            return self._create(env.policy_id, p)
        self._held(env, p.op)
        if p.op in ("forward", "forward_backward"):
            return self._forward(env.policy_id, p)
        if p.op == "optim_step":
            return self._optim_step(env.policy_id, p)
        if p.op == "save_for_sampler":
            return self._save_for_sampler(env, p)
        raise StepRefused("validate", f"op {p.op!r} is not supported by this trainer yet")

    def _create(self, pid: str, p: TrainStepRequested) -> dict[str, Any]:
        lora = _shape(p.lora or LoraSpec())
        created, held = self._created.get(pid), self.trainer.policies.get(pid)
        if created is not None or held is not None:
            have = created.lora if created is not None else held.lora  # type: ignore[union-attr]
            if have == lora:
                self._created.setdefault(pid, Created(lora, p.seed))
                return {}  # created before (a redelivery, or the client asked again)
            raise StepRefused(
                "validate",
                f"policy {pid!r} already exists here with rank={have.rank}, "
                f"alpha={have.alpha}, target_modules={have.target_modules}; create another "
                "policy for another adapter shape",
            )
        try:
            self.trainer.add_policy(pid, lora, seed=p.seed)
        except ValueError as e:  # PEFT: target modules the model lacks; untrainable targets
            raise StepRefused("validate", f"lora: {e}") from e
        self._created[pid] = Created(lora, p.seed)
        return {}

    def _held(self, env: Envelope[Any], op: str) -> None:
        """Make sure the policy is held: an evicted one comes back (weights and optimizer
        state from the store, at its last revision); one never created here is refused."""
        pid = env.policy_id
        if pid in self.trainer.policies:
            return
        created = self._created.get(pid)
        if created is None:
            raise StepRefused(
                "policy",
                f"policy {pid!r} has no training state on this trainer (never created, or the "
                "trainer restarted since): send op=create first, or load_state from a saved "
                "state",
            )
        parent = None
        if created.revision is not None:
            parent = self.service._open_revision(env.tenant, env.policy, created.revision)
        self.trainer.add_policy(
            pid, created.lora, parent=parent, parent_revision=created.revision, seed=created.seed
        )

    def _forward(self, pid: str, p: TrainStepRequested) -> dict[str, Any]:
        try:
            config = step_loss_config(p.loss_fn, dict(p.loss_fn_config))
        except ValueError as e:
            raise StepRefused("validate", str(e)) from e
        vocab = self.trainer.vocab_size()
        for i, d in enumerate(p.datums):
            for name in ("tokens", "target_tokens"):
                top = max(getattr(d, name))
                if top >= vocab:
                    raise StepRefused(
                        "validate",
                        f"datums[{i}].{name} has token id {top}; this base model's vocabulary "
                        f"has {vocab} ids (0..{vocab - 1}): tokenize with the base's tokenizer",
                    )
        backward = p.op == "forward_backward"
        loss, logprobs, tokens = self.trainer.forward_datums(
            pid, list(p.datums), p.loss_fn, config, backward
        )
        if backward and pid not in self._pinned:
            # Eviction saves weights and optimizer state, not gradients: keep the policy held
            # until its optim_step took them.
            self.trainer.pin(pid)
            self._pinned.add(pid)
        metrics = {"tokens": float(tokens), "datums": float(len(p.datums))}
        return {"loss": loss, "logprobs": logprobs, "metrics": metrics}

    def _optim_step(self, pid: str, p: TrainStepRequested) -> dict[str, Any]:
        assert p.adam is not None  # the schema requires it
        metrics = self.trainer.optim_step(pid, p.adam.model_dump())
        if pid in self._pinned:
            self._pinned.discard(pid)
            self.trainer.unpin(pid)
        return {"metrics": metrics}

    def _save_for_sampler(self, env: Envelope[Any], p: TrainStepRequested) -> dict[str, Any]:
        state = self.trainer.policy(env.policy_id)
        training = {
            "objective": "steps",
            "steps": state.steps,
            "name": p.name,
            "request_id": p.request_id,
        }
        r = self.service.export_revision(env, training)
        created = self._created.get(env.policy_id)
        if created is not None:
            created.revision = r["revision"]
        # export.completed first: the catalog's projection and the engines learn of the revision
        # before the caller, who may sample from it at once.
        self.service.producer.publish_many([self.service.export_event(env, r)])
        return {"revision": r["revision"], "metrics": {"size_bytes": float(r["size_bytes"])}}


def _answer_id(event_id: Any) -> Any:
    from workers.trainer.worker import derived_id

    return derived_id(event_id, "step")


def _classify(e: Exception) -> tuple[str, bool]:
    """(stage, retryable) of a failed call."""
    if isinstance(e, StepRefused):
        return e.stage, False
    if isinstance(e, CatalogError | OSError):
        return "store", False
    if isinstance(e, BackendError):
        return "validate", False
    if isinstance(e, BadBatch):
        return "compute", False
    return "compute", isinstance(e, RuntimeError)  # e.g. out of memory: another try may pass
