"""Step-level training calls (the Tinker API): ``train.step.requested`` in, one answer out.

The gateway turns each Tinker training call into a command on ``train.steps``, keyed by policy
(one policy's calls arrive in order). :class:`StepService` runs it on the trainer's resident
base and answers ``train.step.completed`` or ``train.step.failed`` on ``train.step.results``
(the answer's event id derives from the command's, so a re-sent answer is the same event):

- ``create``: a fresh LoRA adapter and optimizer (``lora``, ``seed``). Again for a policy
  that has one of the same shape: answered completed again.
- ``forward`` / ``forward_backward``: per-datum per-position logprobs of ``target_tokens`` and
  the loss (workers/trainer/losses.py ``step_loss``); ``forward_backward`` ADDS its gradients
  to the policy's, which wait for ``optim_step`` (AdamW with the call's ``adam``, then zeroed).
- ``save_for_sampler``: a revision exported exactly as an update exports one
  (``RevisionExporter.export_revision``: store, catalog, ``export.completed``).
- ``save_state`` / ``load_state``: weights and AdamW state to and from
  ``<tenant>/<policy>/states/<name>/`` (step_state.py).

A call's failure is its own answer (``train.step.failed`` with the stage and a reason the
caller can act on), never a dead letter or a stalled partition; an outage (store, catalog or
broker away) is raised, so the consumer loop waits it out and runs the call again.

Restarts and redelivery. After ``create``, each ``optim_step`` and ``load_state`` the policy's
weights and optimizer state are checkpointed to the store with the position of that record
(step_state.py). Gradients of ``forward_backward`` live in memory only, so their records'
offsets are held uncommitted (streams.deferred) until the ``optim_step`` that used them was
checkpointed: a trainer that dies in between resumes the policy from its checkpoint and gets
those records again, which add the same gradients again (the answers, same event ids, are
re-sent). A replayed record from before the checkpoint was answered already and is skipped;
the checkpoint's own record gets its saved answer again. In one process, answers are
remembered by command event id and re-sent, never recomputed. A partition a rebalance takes
away drops its policies here (the new owner resumes them the same way). What is kept in memory
is bounded (step_limits.py): pinned policies per tenant, idle gradients, remembered answers.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict
from typing import Any, Protocol

import structlog

from catalog.store import AdapterStore, StoredAdapter
from schemas import Envelope
from schemas.envelope import make_reply
from schemas.events import ExportCompleted
from schemas.events.steps import (
    TrainStepCompleted,
    TrainStepFailed,
    TrainStepRequested,
    loss_config,
)
from schemas.events.update import LoraSpec
from streams.deferred import DeferredWork
from streams.producer import EventProducer
from streams.records import is_transient
from workers.trainer import step_state
from workers.trainer.engine import MultiPolicyTrainer
from workers.trainer.exporting import derived_id
from workers.trainer.policies import LoraShape, PolicyState
from workers.trainer.step_compute import NonFiniteGradients
from workers.trainer.step_limits import (
    Answer,
    RememberedAnswers,
    StepRefused,
    WaitingGradients,
    classify,
)

log = structlog.get_logger()


class StepHost(Protocol):
    """What StepService uses of the update handler (worker.TrainerService, which builds it):
    named here so that worker.py imports this module and nothing imports back."""

    trainer: MultiPolicyTrainer
    store: AdapterStore
    producer: EventProducer
    name: str

    def _policy_lock(self, policy_id: str) -> threading.Lock: ...
    def _open_revision(self, tenant: str, policy: str, revision: int) -> StoredAdapter: ...
    def export_revision(self, env: Envelope[Any], training: dict[str, Any]) -> dict[str, Any]: ...
    def export_event(self, env: Envelope[Any], r: dict[str, Any]) -> Envelope[ExportCompleted]: ...


def _shape(spec: LoraSpec) -> LoraShape:
    return LoraShape(
        spec.rank,
        spec.alpha,
        spec.dropout,
        list(spec.target_modules),
        list(spec.target_parameters),
    )


def _position(record: Any) -> tuple[str, int, int] | None:
    if record is None or getattr(record, "offset", None) is None:
        return None
    return (record.topic, record.partition, record.offset)


class StepService:
    """Runs step-level calls against the trainer, store, catalog and producer of ``service``
    (the update handler, whose per-policy locks and export it shares)."""

    def __init__(self, service: StepHost) -> None:
        self.service, self.trainer, self.store = service, service.trainer, service.store
        # Answers by command event id (the most recent, bounded), re-sent on redelivery.
        self._answers = RememberedAnswers()
        # Per policy: forward_backward calls whose gradients wait for an optim_step (while
        # any wait the policy is pinned: eviction saves weights and optimizer, not gradients).
        config = self.trainer.config
        self._waiting = WaitingGradients(config.max_pinned_per_tenant, config.pinned_idle_s)
        self.trainer.evict_listeners.append(self._evicted)
        self._unsaved: dict[str, str] = {}  # policy -> the call whose checkpoint is not written
        self._where: dict[str, tuple[str, int]] = {}  # policy -> (topic, partition) it came on

    def handle(
        self, env: Envelope[Any], record: Any = None, deferred: DeferredWork | None = None
    ) -> Answer | None:
        """Answer one call (None: a replayed record that the policy's checkpoint already
        reflects and that was answered before). ``deferred``: the consumer's, to hold the
        offsets of forward_backward records until the optim_step that uses their gradients."""
        p: TrainStepRequested = env.payload
        pid, eid = env.policy_id, str(env.event_id)
        self._expire_idle()
        with self.service._policy_lock(pid):
            self._waiting.touch(pid)
            pos = _position(record)
            if pos is not None:
                self._where[pid] = pos[:2]
            known, answer = self._known(env, pos)
            if not known:
                answer = self._answer(env, p)
                self._remember(pid, eid, answer)
            elif answer is None:
                log.info("train_step_replay_skipped", request=p.request_id, op=p.op, at=pos)
                return None
            else:
                log.info("train_step_redelivered", request=p.request_id, op=p.op)
                # A copy of the call sent again (same event id) may wait under another future.
                answer = answer.model_copy(update={"request_id": p.request_id})
            if self._unsaved.get(pid) == eid:  # (again, if an outage stopped it last time)
                saved = self._checkpoint(pid, pos, answer)
                if saved and deferred is not None and p.op in ("optim_step", "load_state"):
                    deferred.release(("grads", pid))  # their gradients were used (or dropped)
            if (
                deferred is not None
                and record is not None
                and p.op == "forward_backward"
                and isinstance(answer, TrainStepCompleted)
                and pid in self._waiting
            ):
                # Its gradients exist in memory only: replayed after a restart (the policy
                # resumes from its checkpoint), committed once its optim_step is checkpointed.
                deferred.hold(record, ("grads", pid))
                self._waiting.held_in(pid, deferred)
            self._waiting.release_due(deferred)  # of gradients dropped (idle, not finite)
            self._publish(env, answer)
            return answer

    def revoked(self, tps: set[Any]) -> None:
        """A rebalance took partitions away (DeferredWork ``on_revoked``): their policies are
        dropped here, pending gradients and all, since the new owner resumes them from their
        checkpoints and replays the held forward_backward records."""
        gone = {(tp.topic, tp.partition) for tp in tps}
        for pid in [pid for pid, where in list(self._where.items()) if where in gone]:
            with self.service._policy_lock(pid):
                self._drop(pid)
            log.info("step_policy_dropped_on_revoke", policy=pid)

    def _expire_idle(self) -> None:
        self._waiting.expire_idle(self.service._policy_lock, self._drop_expired)

    def _drop_expired(self, pid: str) -> None:
        if pid in self.trainer.policies:
            self.trainer.drop_gradients(pid)
        self.trainer.unpin(pid)

    def _evicted(self, pid: str) -> None:
        """The trainer evicted ``pid`` (on its compute thread): what is kept for it goes too."""
        self._answers.drop(pid)
        self._where.pop(pid, None)

    def _known(self, env: Envelope[Any], pos: tuple | None) -> tuple[bool, Answer | None]:
        """(True, answer) for a call answered before: remembered, or at the checkpoint's own
        record. (True, None): a replayed record from before the checkpoint (done, answered)."""
        pid = env.policy_id
        cached = self._answers.get(pid, str(env.event_id))
        try:
            state = self.trainer.policies.get(pid) or self._resume(env)
        except Exception as e:
            if is_transient(e):
                raise
            state = None  # the call itself meets the error and answers it
        meta = (state.step_meta or {}) if state is not None else {}
        through = meta.get("through")
        if pos is not None and through and list(pos[:2]) == through[:2]:
            if pos[2] < through[2]:
                return True, cached
            if pos[2] == through[2]:
                return True, cached or TrainStepCompleted.model_validate(meta["answer"])
        return cached is not None, cached

    def _remember(self, pid: str, event_id: str, answer: Answer) -> None:
        self._answers.put(pid, event_id, answer)

    def _checkpoint(self, pid: str, pos: tuple | None, answer: Answer) -> bool:
        """Write the checkpoint of the call just answered; False if the store refused it."""
        state = self.trainer.policy(pid)
        state.step_meta = {
            **(state.step_meta or {}),
            "through": list(pos) if pos is not None else None,
            "answer": answer.model_dump(mode="json"),
        }
        try:
            step_state.checkpoint(self.store, self.trainer, pid)
        except Exception as e:
            if is_transient(e):
                raise  # waited out; the redelivered call finds its answer and writes it then
            # Not the call's failure: it ran, and its answer stands. Its forward_backward
            # records stay held, so a restart replays them onto the last checkpoint written.
            log.error("step_checkpoint_failed", policy=pid, error=f"{type(e).__name__}: {e}")
            self._unsaved.pop(pid, None)
            return False
        self._unsaved.pop(pid, None)
        return True

    def _drop(self, pid: str) -> None:
        self._where.pop(pid, None)
        self._answers.drop(pid)
        self._unsaved.pop(pid, None)
        self._unpin(pid)
        self._waiting.forget_releases(pid)  # a revoke forgets the held records itself
        if pid in self.trainer.policies:
            self.trainer.remove_policy(pid)

    def _publish(self, env: Envelope[Any], answer: Answer) -> None:
        reply = make_reply(
            answer, env, producer=self.service.name, event_id=derived_id(env.event_id, "step")
        )
        self.service.producer.publish_many([reply])

    def _answer(self, env: Envelope[Any], p: TrainStepRequested) -> Answer:
        t0 = time.perf_counter()
        try:
            with self.trainer.updating(env.policy_id):  # never evicted mid-call
                fields = self._run(env, p)
            # Built here: a non-finite value (the schema refuses it) is this call's failure.
            return TrainStepCompleted(
                request_id=p.request_id, op=p.op, duration_s=time.perf_counter() - t0, **fields
            )
        except Exception as e:
            if is_transient(e):
                raise  # an outage: the consumer loop waits it out and runs the call again
            stage, retryable = classify(e)
            log.warning("train_step_failed", op=p.op, stage=stage, error=str(e)[:300])
            return TrainStepFailed(
                request_id=p.request_id,
                op=p.op,
                stage=stage,
                reason=f"{p.op}: {e}"[:2000],
                retryable=retryable,
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
        self._waiting.check_expired(env.policy_id, p.op)
        if p.op == "load_state":
            return self._load_state(env, p)
        state = self.trainer.policies.get(env.policy_id) or self._resume(env)
        if p.op == "create":
            return self._create(env, p, state)
        if state is None:
            raise StepRefused(
                "policy",
                f"policy {env.policy_id!r} has no training state (never created, or created "
                "on a trainer of another store): send op=create first, or load_state",
            )
        if p.op in ("forward", "forward_backward"):
            return self._forward(env, p)
        if p.op == "optim_step":
            return self._optim_step(env, p)
        if p.op == "save_for_sampler":
            return self._save_for_sampler(env, p)
        uri = step_state.save_named(self.store, env.policy_id, p.name or "")  # save_state
        return {"state_uri": uri}

    def _resume(self, env: Envelope[Any]) -> PolicyState | None:
        """The policy from its checkpoint (None: it has none): evicted, or a restart since."""
        pid = env.policy_id
        meta = step_state.checkpoint_meta(self.store, pid)
        if meta is None:
            return None
        rev, step = meta["parent_revision"], meta["step"]
        parent = None
        if rev is not None:
            parent = self.service._open_revision(env.tenant, env.policy, rev)
        state = self.trainer.add_policy(
            pid, LoraShape(**step["lora"]), parent=parent, parent_revision=rev
        )
        if state.step_meta is None:  # the eviction code found it stale: never resumed as is
            self.trainer.remove_policy(pid)
            raise StepRefused(
                "store",
                f"the checkpoint of policy {pid!r} does not fit its adapter; load_state a "
                "saved state or create another policy",
            )
        log.info("step_policy_resumed", policy=pid, steps=state.steps, at=step.get("through"))
        return state

    def _create(
        self, env: Envelope[Any], p: TrainStepRequested, state: PolicyState | None
    ) -> dict[str, Any]:
        pid, lora = env.policy_id, _shape(p.lora or LoraSpec())
        if state is not None:
            have = LoraShape(**state.step_meta["lora"]) if state.step_meta else state.lora
            if have != lora:
                raise StepRefused(
                    "validate",
                    f"policy {pid!r} already exists with rank={have.rank}, alpha={have.alpha}, "
                    f"target_modules={have.target_modules}; create another policy for another "
                    "adapter shape",
                )
            if state.step_meta is not None:
                return {}  # created before (a redelivery, or the client asked again)
        else:
            try:
                state = self.trainer.add_policy(pid, lora, seed=p.seed)
            except ValueError as e:  # PEFT: target modules the model lacks; untrainable ones
                raise StepRefused("validate", f"lora: {e}") from e
        state.step_meta = {"lora": asdict(lora), "seed": p.seed}
        self._unsaved[pid] = str(env.event_id)
        return {}

    def _forward(self, env: Envelope[Any], p: TrainStepRequested) -> dict[str, Any]:
        pid, eid = env.policy_id, str(env.event_id)
        try:
            config = loss_config(p.loss_fn, dict(p.loss_fn_config))
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
        # A forward_backward whose gradients were added already (delivered again, its answer
        # no longer remembered) is answered from a forward: nothing is added twice.
        backward = p.op == "forward_backward" and eid not in self._waiting.calls(pid)
        if backward:
            self._waiting.check_room(env.tenant, pid)
        loss, logprobs, tokens = self.trainer.forward_datums(
            pid, list(p.datums), p.loss_fn, config, backward
        )
        if backward and self._waiting.add(pid, env.tenant, eid):
            self.trainer.pin(pid)
        metrics = {"tokens": float(tokens), "datums": float(len(p.datums))}
        return {"loss": loss, "logprobs": logprobs, "metrics": metrics}

    def _optim_step(self, env: Envelope[Any], p: TrainStepRequested) -> dict[str, Any]:
        assert p.adam is not None  # the schema requires it
        pid = env.policy_id
        try:
            metrics = self.trainer.optim_step(pid, p.adam.model_dump())
        except NonFiniteGradients as e:  # the gradients were dropped: so is their pin
            self._unpin(pid, release=True)
            raise StepRefused("compute", str(e)) from e
        self._unpin(pid)
        self._unsaved[pid] = str(env.event_id)
        return {"metrics": metrics}

    def _unpin(self, pid: str, release: bool = False) -> None:
        if self._waiting.pop(pid, release):
            self.trainer.unpin(pid)

    def _save_for_sampler(self, env: Envelope[Any], p: TrainStepRequested) -> dict[str, Any]:
        state = self.trainer.policy(env.policy_id)
        training = {
            "objective": "steps",
            "steps": state.steps,
            "name": p.name,
            "request_id": p.request_id,
        }
        r = self.service.export_revision(env, training)
        # export.completed first: the catalog's projection and the engines learn of the revision
        # before the caller, who may sample from it at once.
        self.service.producer.publish_many([self.service.export_event(env, r)])
        if env.policy_id not in self._waiting:
            # The checkpoint keeps the new parent revision. With gradients waiting it is left
            # as it is (it would pass their records); their replay replays this call too, which
            # registers the same revision again (same digest, same event id).
            self._unsaved[env.policy_id] = str(env.event_id)
        return {"revision": r["revision"], "metrics": {"size_bytes": float(r["size_bytes"])}}

    def _load_state(self, env: Envelope[Any], p: TrainStepRequested) -> dict[str, Any]:
        pid = env.policy_id
        assert p.source_uri is not None  # the schema requires it
        step_state.load_named(self.store, pid, p.source_uri)
        self._drop(pid)  # what it held, waiting gradients too, gives way to the loaded state
        state = self._resume(env)
        assert state is not None
        self._unsaved[pid] = str(env.event_id)
        return {"metrics": {"steps": float(state.steps)}}
