"""The trainer worker: consume ``update.requested``, train, export, register, announce; and
``train.step.requested``, the Tinker API's step-level calls (workers/trainer/steps.py).

For each request (one policy, keyed by policy so one policy's updates arrive in order):

1. If the store holds a record for this request id, it was done before: re-publish the same
   events (their ids derive from the request id, so consumers dedupe) and stop. A redelivered
   request therefore returns the same revision and trains nothing twice.
2. Make sure the policy is held (fresh LoRA, or resumed from ``parent_revision`` through the
   catalog and the verified store) and that it sits on this trainer's base model.
3. Run ``steps`` optimizer steps (SFT cross-entropy or GRPO) over the claim-checked data.
4. Export a revision to the store, register it in the catalog (idempotent by digest and by the
   request id), publish ``export.completed`` then ``update.completed``, record the request.

Several consumer threads may share one trainer (``consumers``): each is a group member with its
own partitions, and while one waits on I/O another trains on the same resident base.
"""

from __future__ import annotations

import functools
import socket
import threading
import time
from typing import Any

import structlog

from catalog.claims import read_jsonl
from catalog.exceptions import CatalogError
from catalog.repository import CatalogRepository
from catalog.store import AdapterStore, StoredAdapter
from schemas import Envelope
from schemas.envelope import make_reply
from schemas.events import TrainingFigures, UpdateCompleted, UpdateRequested
from schemas.events.steps import TrainStepRequested
from schemas.settings import MintSettings
from streams import health
from streams.deferred import DeferredWork
from streams.group import run_consumer
from streams.producer import EventProducer
from streams.records import ConsumerStats, RetryPolicy, stop_on_signals
from workers.trainer import metrics as trainer_metrics
from workers.trainer.config import TrainerConfig
from workers.trainer.data import parse_examples
from workers.trainer.engine import MultiPolicyTrainer
from workers.trainer.exceptions import BadBatch
from workers.trainer.exporting import RevisionExporter, derived_id
from workers.trainer.policies import LoraShape
from workers.trainer.steps import StepService

log = structlog.get_logger()

TRAINER_GROUP = "trainer"
TRAINER_TOPICS = ("update.requests", "train.steps")


class TrainerService(RevisionExporter):
    """Handles update requests against one trainer, one store, one catalog and one producer."""

    def __init__(
        self,
        trainer: MultiPolicyTrainer,
        store: AdapterStore,
        repo: CatalogRepository,
        producer: EventProducer,
        name: str | None = None,
    ) -> None:
        self.trainer, self.store, self.repo, self.producer = trainer, store, repo, producer
        self.name = name or f"trainer/{socket.gethostname()}"
        # One policy's requests are handled one at a time even across consumer threads.
        self._policy_locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self.steps = StepService(self)  # step-level calls (train.steps, the Tinker API)

    def _policy_lock(self, policy_id: str) -> threading.Lock:
        with self._locks_guard:
            return self._policy_locks.setdefault(policy_id, threading.Lock())

    def handle(
        self, env: Envelope[Any], record: Any = None, deferred: DeferredWork | None = None
    ) -> dict[str, Any] | None:
        """Consumer-loop handler; returns the request's result record (None: not an update).
        ``deferred``: the consumer's, which step-level calls hold offsets in (steps.py)."""
        if isinstance(env.payload, TrainStepRequested):
            self.steps.handle(env, record, deferred)
            return None
        if not isinstance(env.payload, UpdateRequested):
            return None
        log.info(
            "update_received",
            request=str(env.event_id),
            policy=env.policy_id,
            parent_revision=env.payload.parent_revision,
            steps=env.payload.steps,
        )
        with self._policy_lock(env.policy_id):
            done = self.store.find_request(env.tenant, env.policy, str(env.event_id))
            if done is not None:
                log.info(
                    "update_redelivered", request=str(env.event_id), revision=done.get("revision")
                )
                self._publish(env, done)
                trainer_metrics.UPDATES.labels("redelivered").inc()
                return done
            result = self._run(env)
            t_published = time.perf_counter()
            self._publish(env, result)
            log.info(
                "update_published",
                request=str(env.event_id),
                revision=result.get("revision"),
                trained_s=round(result["duration_s"], 1),
                publish_s=round(time.perf_counter() - t_published, 1),
            )
            self.store.record_request(env.tenant, env.policy, str(env.event_id), result)
            trainer_metrics.UPDATES.labels("trained").inc()
            trainer_metrics.UPDATE_SECONDS.observe(result["duration_s"])
            return result

    # The work.

    def _check_base(self, p: UpdateRequested) -> None:
        if p.base_model != self.trainer.config.base_model:
            raise BadBatch(
                f"base_model={p.base_model!r} but this trainer holds "
                f"{self.trainer.config.base_model!r}; route the request to a trainer of that "
                "base model (one consumer group per base)"
            )

    def _ensure_policy(self, env: Envelope[Any], p: UpdateRequested) -> None:
        pid = env.policy_id
        held = self.trainer.policies.get(pid)
        if held is not None and held.parent_revision == p.parent_revision:
            return
        if held is not None:
            # Our copy is at another revision (another trainer moved the policy on): reload.
            self.trainer.remove_policy(pid)
        if p.parent_revision is None:
            lora = LoraShape(
                p.lora.rank,
                p.lora.alpha,
                p.lora.dropout,
                list(p.lora.target_modules),
                list(p.lora.target_parameters),
            )
            self.trainer.add_policy(pid, lora, seed=p.seed)
            return
        parent = self._open_revision(env.tenant, env.policy, p.parent_revision)
        self.trainer.add_policy(pid, parent=parent, parent_revision=p.parent_revision)

    def _open_revision(self, tenant: str, policy: str, revision: int) -> StoredAdapter:
        rev = self.repo.get_revision(tenant, policy, revision)
        return self.store.open(
            rev.store_uri, owner=(tenant, policy), base_model_fingerprint=self.trainer.fingerprint
        )

    def _run(self, env: Envelope[Any]) -> dict[str, Any]:
        p: UpdateRequested = env.payload
        t0 = time.perf_counter()
        self._check_base(p)
        if p.export:
            self.refuse_retired(env)  # its revision could not be registered: train nothing
        try:  # the store root and the request's own namespace, like every claim check
            rows = read_jsonl(self.store, p.data_uri, owner=(env.tenant, env.policy))
        except CatalogError as e:
            raise BadBatch(f"data_uri: {e}") from e
        examples = parse_examples(rows, p.objective)
        if not examples:
            raise BadBatch(f"data_uri {p.data_uri} holds no examples")
        pid = env.policy_id
        # Pinned from before it is held until it is done or back at its start: another consumer
        # thread's policy would otherwise evict it mid-update and save half-updated weights.
        with self.trainer.updating(pid):
            self._ensure_policy(env, p)
            before = self.trainer.snapshot(pid)
            try:
                return self._train(env, p, examples, t0)
            except BaseException:
                # A retry must start from the weights and optimizer this request started from,
                # not from half-updated ones.
                self.trainer.restore(pid, before)
                raise

    def _train(self, env: Envelope[Any], p: UpdateRequested, examples: list, t0: float) -> dict:
        pid = env.policy_id
        losses, metrics, tokens, rewards = [], {}, 0, []
        for step in range(p.steps):
            start = (step * p.batch_size) % len(examples)
            chunk = (examples + examples)[start : start + min(p.batch_size, len(examples))]
            batch = self.trainer.collate(chunk, add_eos=p.objective == "sft")
            if p.objective == "sft":
                result = self.trainer.sft_step(pid, batch, p.learning_rate)
            else:
                result = self.trainer.rl_step(pid, batch, p.learning_rate)
            trainer_metrics.observe_step(p.objective, result.seconds, result.tokens)
            losses.append(result.loss)
            tokens += result.tokens
            if "reward_mean" in result.metrics:  # RL steps: the mean reward of their batch
                rewards.append(result.metrics["reward_mean"])
            metrics = {**result.metrics, "grad_norm": result.grad_norm, "tokens": result.tokens}
        out: dict[str, Any] = {
            "request_id": str(env.event_id),
            "parent_revision": p.parent_revision,
            "steps": p.steps,
            "loss": losses[-1],
            "first_loss": losses[0],
            "metrics": {k: float(v) for k, v in metrics.items()},
            "exported": p.export,
        }
        if p.export:
            figures = TrainingFigures.known(
                steps=p.steps,
                tokens=tokens,
                loss=losses[-1],
                reward=sum(rewards) / len(rewards) if rewards else None,
                learning_rate=p.learning_rate,
            )
            out.update(self._export(env, p, losses, figures))
        out["duration_s"] = time.perf_counter() - t0
        return out

    def _export(
        self,
        env: Envelope[Any],
        p: UpdateRequested,
        losses: list[float],
        figures: TrainingFigures | None,
    ) -> dict:
        training = {
            "objective": p.objective,
            "steps": p.steps,
            "loss": losses[-1],
            "learning_rate": p.learning_rate,
            "request_id": str(env.event_id),
        }
        return self.export_revision(env, training, figures)

    def _publish(self, env: Envelope[Any], r: dict[str, Any]) -> None:
        events = []
        if r.get("exported") and r.get("revision") is not None:
            events.append(self.export_event(env, r))
        done = UpdateCompleted(
            parent_revision=r["parent_revision"],
            steps=r["steps"],
            loss=r["loss"],
            metrics={**r["metrics"], "first_loss": r["first_loss"]},
            duration_s=r.get("duration_s", 0.0),
            exported=bool(r.get("revision")),
        )
        update_id = derived_id(env.event_id, "update")
        events.append(make_reply(done, env, producer=self.name, event_id=update_id))
        self.producer.publish_many(events)


def run_trainer(
    settings: MintSettings,
    config: TrainerConfig,
    *,
    stop: threading.Event | None = None,
    consumers: int = 1,
    group_id: str = TRAINER_GROUP,
    idle_timeout_s: float | None = None,
    max_records: int | None = None,
    retry: RetryPolicy | None = None,
    trainer: MultiPolicyTrainer | None = None,
    **consumer_options: Any,
) -> list[ConsumerStats]:
    """Consume update requests with ``consumers`` threads over ONE trainer until ``stop``."""
    from catalog.cluster import connect

    store = AdapterStore.from_settings(settings)
    trainer = trainer or MultiPolicyTrainer(config, store=store)
    trainer.store = store
    cluster, session = connect(settings)
    producer = EventProducer(settings, client_id=f"{group_id}-events")
    try:
        service = TrainerService(
            trainer, store, CatalogRepository(session, settings.keyspace), producer
        )
        consumer_options.setdefault("auto_offset_reset", "earliest")
        # Training a step can take longer than kafka-python's default poll interval.
        consumer_options.setdefault("max_poll_interval_ms", 30 * 60 * 1000)
        results: list[ConsumerStats] = [ConsumerStats()] * consumers

        def consume(i: int) -> None:
            # Step-level calls hold forward_backward offsets until their optim_step (steps.py).
            deferred = DeferredWork(on_revoked=service.steps.revoked)
            results[i] = run_consumer(
                settings,
                TRAINER_TOPICS,
                group_id,
                functools.partial(service.handle, deferred=deferred),
                deferred=deferred,
                stop=stop,
                retry=retry,
                idle_timeout_s=idle_timeout_s,
                max_records=max_records,
                producer=producer,
                **consumer_options,
            )

        threads = [
            threading.Thread(target=consume, args=(i,), name=f"trainer-consumer-{i}")
            for i in range(consumers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results
    finally:
        producer.close()
        cluster.shutdown()


def main(
    base_model: str | None = None, backend: str = "torch", consumers: int = 1, ranks: int = 1
) -> None:
    from schemas.logs import configure_logging
    from schemas.settings import get_settings

    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format)
    model = base_model or settings.base_model
    if not model:
        raise SystemExit("no base model: pass --base-model PATH or set MINT_BASE_MODEL")
    stop = stop_on_signals()
    config = TrainerConfig(base_model=model, backend=backend)  # type: ignore[arg-type]
    trainer = None
    if ranks > 1:  # DeepSpeed data parallel (ranks.py): rank 0 consumes, the others follow it
        from workers.trainer import ranks as data_parallel
        from workers.trainer.exceptions import RanksLost

        if (data_parallel.launched_rank() or 0) > 0:
            try:
                data_parallel.follow(config, ranks)
            except RanksLost as e:
                raise SystemExit(f"trainer rank {data_parallel.launched_rank()}: {e}") from None
            return
        trainer = data_parallel.start(config, ranks, stop=stop)
    # Rank 0 only (the others returned above): one port per machine's MINT_METRICS_PORT.
    health.serve(settings.metrics_port)
    try:
        # The group carries the topic prefix: deployments (and test runs) sharing a broker never
        # share a consumer group, so one never waits on another's rebalance.
        run_trainer(
            settings,
            config,
            stop=stop,
            consumers=consumers,
            trainer=trainer,
            group_id=f"{settings.topic_prefix}-{TRAINER_GROUP}",
        )
    finally:
        if trainer is not None:
            trainer.close()
    if trainer is not None and trainer.lost:
        raise SystemExit(f"trainer stopped: {trainer.lost} (unfinished records stay uncommitted)")
