"""structlog set-up for entry points (workers' ``main``, the CLI). Library code only calls
``structlog.get_logger()``; correlation ids are bound per event with :func:`bound_event`."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import structlog


def configure_logging(level: str = "INFO", fmt: str = "json") -> None:
    """Configure structlog and stdlib logging once. JSON for machines, console for people."""
    renderer = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
    # Drivers are chatty at INFO; their warnings still show.
    for noisy in ("kafka", "cassandra", "aiokafka"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(level)))
    hush_driver_noise()


def hush_driver_noise() -> None:
    """Drop what drivers log as errors that are not (idempotent)."""
    cluster = logging.getLogger("kafka.cluster")
    if not any(isinstance(f, _CancelledOnClose) for f in cluster.filters):
        cluster.addFilter(_CancelledOnClose())


class _CancelledOnClose(logging.Filter):
    """kafka-python logs "Metadata refresh: failed Cancelled" at ERROR when a client closes with
    a refresh in flight: the close itself, not an error (it printed before every normal answer
    of `mint history`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not any(type(a).__name__ == "Cancelled" for a in args)


@contextmanager
def bound_event(**ids: object) -> Iterator[None]:
    """Bind correlation ids (event_id, correlation_id, tenant, policy…) to every log line inside."""
    with structlog.contextvars.bound_contextvars(**{k: v for k, v in ids.items() if v is not None}):
        yield
