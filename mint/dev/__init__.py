"""Local development infrastructure: Kafka and Cassandra as JVM processes (``mint dev``)."""

from mint.dev.launcher import LauncherError, ServiceStatus, down, status, up

__all__ = ["LauncherError", "ServiceStatus", "down", "status", "up"]
