"""The lifecycle controller as a faust worker: one agent over the lifecycle topics, two tables
keyed by policy (``configs``, ``lifecycle``), decisions in :mod:`workers.controller.logic`.

Faust traps handled here (see DESIGN.md): every registry topic is created through
``streams.topics.ensure_topics`` *before* the worker starts (a worker started earlier stays
unsubscribed), and the tables' changelog topics get the registry's partition count (``make_app``
sets ``topic_partitions``), equal to their source topics'.

Promote and rollback commands are executed against the Cassandra catalog by compare-and-set
(``catalog.execute_serving_command``, idempotent on the command id) in a thread, so the event
loop never blocks on the driver; the resulting ``alias.moved`` is published, and the projector
records it as a history row.
"""

from __future__ import annotations

import asyncio
from typing import Any

import faust
import structlog

from catalog.exceptions import CatalogError
from catalog.projection import execute_serving_command
from catalog.repository import CatalogRepository
from schemas import Envelope, encode_event
from schemas.events import PromoteCommand, RollbackCommand
from schemas.settings import MintSettings
from streams.faust_app import decoded, make_app
from streams.topics import topic_for, topic_for_type
from workers.controller.logic import PRODUCER, Controller

log = structlog.get_logger()

APP_ID = "controller"
# Everything the controller reacts to; all keyed by policy, all with the registry's partitions,
# so one policy's events reach one controller instance, and its table rows live there too.
SOURCE_TOPICS = ("policy.config", "export.events", "eval.requests", "eval.results",
                 "serving.commands", "serving.events")  # fmt: skip


def build_app(settings: MintSettings, repo: CatalogRepository | None, **overrides: Any):
    """(app, agent) of a controller; ``repo`` None refuses serving commands (tests of gates)."""
    app = make_app(settings, APP_ID, **overrides)
    source = app.topic(*(topic_for(settings, t) for t in SOURCE_TOPICS),
                       key_serializer="raw", value_serializer="raw")  # fmt: skip
    configs = app.Table("configs", default=dict, partitions=settings.topic_partitions)
    lifecycle = app.Table("lifecycle", default=dict, partitions=settings.topic_partitions)

    def execute(cmd: Envelope[Any]):
        if repo is None:
            log.warning("no catalog: serving command dropped", event_id=str(cmd.event_id))
            return None
        try:
            return execute_serving_command(repo, cmd, producer=PRODUCER)
        except CatalogError as e:  # stale CAS, unknown revision, nothing to roll back to
            log.warning("serving command refused", type=cmd.type, policy=cmd.policy_id,
                        event_id=str(cmd.event_id), error=str(e))  # fmt: skip
            return None

    controller = Controller(configs, lifecycle)

    @app.agent(source, name="lifecycle")
    async def lifecycle_agent(stream):
        loop = asyncio.get_running_loop()
        async for env in decoded(app, settings, stream, f"{settings.topic_prefix}-{APP_ID}"):
            moved = None
            if isinstance(env.payload, (PromoteCommand, RollbackCommand)):
                moved = await loop.run_in_executor(None, execute, env)  # the driver blocks
            out = controller.handle(env, moved)
            for e in out:
                await app.producer.send_and_wait(topic_for_type(settings, e.type), e.key,
                                                 encode_event(e), None, None, None)  # fmt: skip
                log.info("transition", type=e.type, policy=e.policy_id,
                         cause=str(e.causation_id))  # fmt: skip

    return app, lifecycle_agent, controller


def main() -> None:
    from catalog.cluster import connect
    from schemas.logs import configure_logging
    from schemas.settings import get_settings
    from streams.topics import ensure_topics

    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format)
    ensure_topics(settings)  # before the worker starts: faust does not pick up later topics
    cluster, session = connect(settings)
    try:
        app, _, _ = build_app(settings, CatalogRepository(session, settings.keyspace))
        worker = faust.Worker(app, loglevel=settings.log_level.lower(), quiet=True)
        worker.execute_from_commandline()
    finally:
        cluster.shutdown()
