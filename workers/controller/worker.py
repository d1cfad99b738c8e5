"""The lifecycle controller as a consumer-group worker on the shared consumer loop.

Every lifecycle topic it reacts to is keyed by policy with the registry's partitions, so one
policy's events reach one controller instance. Per event, in this order:

1. a promote/rollback command is carried out by compare-and-set on the catalog
   (``catalog.execute_serving_command``, idempotent on the command id); a refusal (stale CAS,
   unknown revision, nothing to roll back to) becomes ``serving.refused``;
2. :class:`workers.controller.logic.Controller` decides, and saves the policy's state to
   Cassandra (``worker_state``) before anything is published;
3. the events it led to are published and confirmed by the broker;
4. the loop commits the offset.

Canary commands, and the answers and feedback scores a running canary is judged on, go to
:class:`workers.controller.canary.CanaryJudge` (a rollback of an alias with a running canary
ends the canary); tag and retire commands to :mod:`workers.controller.registry`. Each saves
what it decided, or writes the catalog idempotently, before publishing.

A crash anywhere re-delivers the event; the saved state recognises it and re-emits its outputs
with the same ids. Cassandra or the broker being away is transient: the loop retries it for as
long as it lasts (``streams.group``), never dead-letters it, and never drops a command.

(It ran as a faust agent before; faust-streaming 0.15.3 stalled for good after a kill -9 and
restart in 3 of 5 runs here, see README "Reliability".)
"""

from __future__ import annotations

import threading
from typing import Any

import structlog

from catalog.cluster import connect
from catalog.exceptions import AliasConflict, CatalogError, CatalogUnavailable
from catalog.projection import execute_serving_command
from catalog.repository import CatalogRepository
from catalog.state import StateTable
from schemas import Envelope
from schemas.events import (
    AliasMoved,
    CanaryCommand,
    CanaryEnded,
    CanaryStarted,
    FeedbackSubmitted,
    InferCompleted,
    InferFailed,
    PromoteCommand,
    RetireCommand,
    RollbackCommand,
    TagCommand,
)
from schemas.logs import configure_logging
from schemas.settings import MintSettings, get_settings
from streams import health
from streams.deferred import DeferredWork
from streams.group import run_consumer
from streams.producer import EventProducer
from streams.records import ConsumerStats, stop_on_signals
from workers.controller import registry
from workers.controller.canary import CanaryJudge
from workers.controller.canary_view import CANARY_STATE
from workers.controller.logic import (
    CONFIGS_STATE,
    LIFECYCLE_STATE,
    PRODUCER,
    Controller,
    Refusal,
)
from workers.projector.main import check_schema

log = structlog.get_logger()

CONTROLLER_GROUP = "controller"
# Everything the controller reacts to; all keyed by policy.
SOURCE_TOPICS = (
    "policy.config",
    "export.events",
    "eval.requests",
    "eval.results",
    "serving.commands",
    "serving.events",
    # a running canary is judged on its answers and their scores (workers.controller.canary)
    "infer.results",
    "feedback",
)


def execute(
    repo: CatalogRepository, cmd: Envelope[Any]
) -> tuple[Envelope[AliasMoved] | None, Refusal | None]:
    """(alias.moved, None) when carried out, (None, refusal) when the catalog refuses it.
    CatalogUnavailable propagates: the loop retries it, the command is never dropped."""
    try:
        return execute_serving_command(repo, cmd, producer=PRODUCER), None
    except CatalogUnavailable:
        raise
    except AliasConflict as e:
        return None, Refusal(str(e), e.current)
    except CatalogError as e:
        return None, Refusal(f"{type(e).__name__}: {e}")


def run_controller(
    settings: MintSettings,
    *,
    stop: threading.Event | None = None,
    group_id: str | None = None,
    idle_timeout_s: float | None = None,
    **consumer_options: Any,
) -> ConsumerStats:
    """Consume the lifecycle topics and drive each policy's lifecycle until ``stop`` is set."""
    cluster, session = connect(settings)
    producer = EventProducer(settings, client_id="controller")
    try:
        check_schema(session, settings.keyspace)
        repo = CatalogRepository(session, settings.keyspace)
        configs = StateTable(session, settings.keyspace, CONFIGS_STATE)
        controller = Controller(configs, StateTable(session, settings.keyspace, LIFECYCLE_STATE))
        tags_state = StateTable(session, settings.keyspace, registry.TAGS_STATE)
        judge = CanaryJudge(
            repo,
            StateTable(session, settings.keyspace, CANARY_STATE),
            configs,
            producer=PRODUCER,
        )

        def decide(env: Envelope[Any], record) -> list[Envelope[Any]]:
            p = env.payload
            if isinstance(p, (InferCompleted, InferFailed, FeedbackSubmitted)):
                return judge.observe(env, record)
            if isinstance(p, CanaryCommand):
                return judge.start(env)
            if isinstance(p, (TagCommand, RetireCommand)):
                return registry.carry_out(repo, tags_state, env, producer=PRODUCER)
            if isinstance(p, (CanaryStarted, CanaryEnded)):
                return []  # this controller's own facts, read back
            if isinstance(p, RollbackCommand):
                view = judge.live(env.tenant, env.policy, p.alias)
                if view is not None:  # rolling back a canary ends it; the alias stays
                    return judge.end_by_command(env, view)
            moved = refusal = None
            if isinstance(p, (PromoteCommand, RollbackCommand)):
                moved, refusal = execute(repo, env)
            return controller.handle(env, moved, refusal)  # the state is saved by now

        def handle(env: Envelope[Any], record) -> None:
            out = decide(env, record)
            if out:
                producer.publish_many(out)
            for e in out:
                log.info("transition", type=e.type, policy=e.policy_id, cause=str(e.causation_id))

        consumer_options.setdefault("auto_offset_reset", "earliest")
        return run_consumer(
            settings,
            SOURCE_TOPICS,
            group_id or f"{settings.topic_prefix}-{CONTROLLER_GROUP}",
            handle,
            stop=stop,
            idle_timeout_s=idle_timeout_s,
            producer=producer,
            # a running canary's counts are written once per poll, before its commit
            deferred=DeferredWork(before_commit=judge.flush),
            **consumer_options,
        )
    finally:
        producer.close()
        cluster.shutdown()


def main() -> None:
    from streams.topics import ensure_topics

    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format)
    health.serve(settings.metrics_port)  # MINT_METRICS_PORT: /metrics, /healthz, /readyz
    stop = stop_on_signals()
    ensure_topics(settings)
    run_controller(settings, stop=stop)
