"""The projector's consumer wiring: streams' at-least-once loop around ``apply_event``.

Safe under redelivery and restarts: ``catalog.projection.apply_event`` is idempotent on the event
id, and the loop commits an offset only after the event was applied (or dead-lettered: an event
the catalog refuses, e.g. an export numbered out of order, lands on the DLQ with the message).
With ``parallel_keys`` (``--parallel``) each policy's records of a poll go to
``apply_events`` at once (its consecutive exports: one lightweight transaction), policies on
parallel threads; a run the catalog refuses part of is applied again one event at a time.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import structlog
from cassandra.cluster import Session

from catalog.cluster import connect
from catalog.exceptions import MigrationError
from catalog.migrate import applied_versions, load_migrations, migrate
from catalog.projection import Outcome, apply_event, apply_events
from catalog.repository import CatalogRepository
from schemas.logs import configure_logging
from schemas.settings import MintSettings, get_settings
from streams import health
from streams.group import run_consumer
from streams.producer import EventProducer
from streams.records import ConsumerStats, RetryPolicy, stop_on_signals
from streams.topics import POLICY_STATE, topic_for
from workers.projector import metrics as projector_metrics

log = structlog.get_logger()

PROJECTOR_GROUP = "catalog-projector"
# Exports create revisions, alias.moved facts move aliases, eval.completed results are recorded
# with their revision, policy.retired sets or clears a policy's retirement; all keyed by policy, so one policy's events reach one projector in order.
PROJECTOR_TOPICS = ("export.events", "serving.events", "eval.results")


def check_schema(session: Session, keyspace: str) -> None:
    """Refuse to project into a keyspace whose migrations are missing or behind."""
    want = [m.version for m in load_migrations()]
    try:
        have = applied_versions(session, keyspace)
    except Exception as e:  # driver raises InvalidRequest for a missing keyspace/table
        raise MigrationError(
            f"keyspace {keyspace!r} has no catalog schema ({e}): run `mint catalog migrate`"
        ) from e
    if have != want:
        raise MigrationError(
            f"keyspace {keyspace!r} is at migrations {have}, this build needs {want}: "
            "run `mint catalog migrate`"
        )


def run_projector(
    settings: MintSettings,
    *,
    stop: threading.Event | None = None,
    group_id: str = PROJECTOR_GROUP,
    auto_migrate: bool = False,
    idle_timeout_s: float | None = None,
    max_records: int | None = None,
    retry: RetryPolicy | None = None,
    **consumer_options: Any,
) -> ConsumerStats:
    """Consume the catalog's topics and apply each event until ``stop`` is set."""
    cluster, session = connect(settings)
    try:
        if auto_migrate:
            migrate(session, settings.keyspace, settings.keyspace_replication)
        check_schema(session, settings.keyspace)
        repo = CatalogRepository(session, settings.keyspace)
        producer = EventProducer(settings)
        state_topic = topic_for(settings, POLICY_STATE)
        outcomes: Counter[str] = Counter()  # += of a Counter key: one bytecode op per thread

        def handle(env, record) -> None:
            projected(env, record, apply_event(repo, env))

        def handle_run(pairs) -> None:
            done = apply_events(repo, [env for env, _ in pairs])
            for (env, record), outcome in zip(pairs, done, strict=True):
                projected(env, record, outcome)

        def projected(env, record, outcome: Outcome) -> None:
            outcomes.update((outcome.value,))
            projector_metrics.EVENTS.labels(env.type, outcome.value).inc()
            if outcome is Outcome.APPLIED and env.type == "alias.moved":
                projector_metrics.ALIAS_MOVES.labels(env.payload.cause).inc()
            if env.type == "alias.moved" and _is_current_move(repo, env, outcome):
                # Latest pointer per alias on the compacted topic: an engine learns every alias
                # from one read of it.
                key = f"{env.policy_id}@{env.payload.alias}".encode()
                producer.send_raw(state_topic, record.value, key)
            # Its own ids on the line: in a run of one policy's events (handle_run) the bound
            # context is the run's first event's.
            log.debug(
                "projected",
                outcome=outcome.value,
                topic=record.topic,
                offset=record.offset,
                type=env.type,
                event_id=str(env.event_id),
                correlation_id=str(env.correlation_id),
            )

        consumer_options.setdefault("auto_offset_reset", "earliest")
        if consumer_options.get("parallel_keys", 1) > 1:
            consumer_options["run_handler"] = handle_run
        stats = run_consumer(
            settings,
            PROJECTOR_TOPICS,
            group_id,
            handle,
            stop=stop,
            retry=retry,
            idle_timeout_s=idle_timeout_s,
            max_records=max_records,
            **consumer_options,
        )
        log.info("projector stopped", keyspace=settings.keyspace, **outcomes)
        producer.close()
        return stats
    finally:
        cluster.shutdown()


def handler(settings: MintSettings):
    """The projector as a replay processor (``mint replay export.events --processor
    workers.projector:handler``): each event applied to the catalog, idempotent on its event id,
    so re-driving a window the projector saw already changes nothing. Its Cassandra connection
    lasts as long as the process (a replay's)."""
    _, session = connect(settings)
    check_schema(session, settings.keyspace)
    repo = CatalogRepository(session, settings.keyspace)

    def handle(env, record) -> None:
        outcome = apply_event(repo, env)
        log.debug("projected", outcome=outcome.value, topic=record.topic, offset=record.offset)

    return handle


def _is_current_move(repo: CatalogRepository, env, outcome: Outcome) -> bool:
    """A move just applied, or a duplicate that is still the alias's latest move (the crash may
    have come between the catalog write and the send); never a stale move seen again."""
    if outcome is Outcome.APPLIED:
        return True
    if outcome is Outcome.DUPLICATE:
        alias = repo.get_alias(env.tenant, env.policy, env.payload.alias)
        return alias.last_event_id == env.event_id
    return False


def main(auto_migrate: bool = False, parallel: int = 16) -> None:
    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format)
    health.serve(settings.metrics_port)  # MINT_METRICS_PORT: /metrics, /healthz, /readyz
    stop = stop_on_signals()
    # The group carries the topic prefix: deployments (and test runs) sharing a broker never
    # share a consumer group, so one never waits on another's rebalance.
    # Registrations wait on compare-and-set round trips: different policies overlap them.
    run_projector(
        settings,
        stop=stop,
        auto_migrate=auto_migrate,
        parallel_keys=parallel,
        group_id=f"{settings.topic_prefix}-{PROJECTOR_GROUP}",
    )


if __name__ == "__main__":
    main()
