"""The catalog projector: consumes lifecycle events and applies them to the Cassandra catalog.

``run_projector(settings)`` is the consumer-group member (start more for more partitions);
``handler(settings)`` is the same as a ``mint replay --processor``;
``read_log(settings)`` replays the catalog's topics from the start, for ``mint catalog rebuild``.
"""

from workers.projector.main import (
    PROJECTOR_GROUP,
    PROJECTOR_TOPICS,
    handler,
    main,
    run_projector,
)
from workers.projector.replay import LogStats, read_log

__all__ = [
    "PROJECTOR_GROUP",
    "PROJECTOR_TOPICS",
    "LogStats",
    "handler",
    "main",
    "read_log",
    "run_projector",
]
