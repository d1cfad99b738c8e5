"""fault_injection.py --cluster: the faults of a three-node Kafka and Cassandra cluster, and the
clock that measures what a client sees of them (the longest time without an answer).

A node fault is a kill -9 of one broker or one Cassandra node, started again after ``down_s``; a
rolling restart stops and starts every node of one kind in turn (SIGTERM: a broker hands its
leaderships over), waiting before the next one until the restarted node is back in service
(a broker: every partition has all its replicas in sync again; a Cassandra node: its native
port answers and the other nodes had a moment to see it up). The clock watches the SDK's event
stream, so a gap is what a downstream consumer of answers experiences.
"""

from __future__ import annotations

import sys
import threading
import time

from benchmarks._fault_traffic import POLICY

NODE_FAULTS = ("kafka-node", "cassandra-node")
ROLLING = ("kafka-rolling", "cassandra-rolling")
CLUSTER_FAULTS = NODE_FAULTS + ROLLING
GAP_TARGET_S = 5.0
NODES = 3


def cluster_settings(base, ports: dict[str, int]):
    """``base`` with a local three-node cluster on ``ports`` (kafka, controller, cql, storage)."""
    from schemas.settings import cluster_defaults

    return base.model_copy(
        update={
            **cluster_defaults(NODES, ports["kafka"]),
            "dev_nodes": NODES,
            "kafka_controller_port": ports["controller"],
            "cassandra_port": ports["cql"],
            "cassandra_storage_port": ports["storage"],
        }
    )


class AnswerClock(threading.Thread):
    """When each request's answer (completed or failed) was first seen: the SDK's watcher keeps
    the events it read; this thread notes the new ones every 50 ms."""

    def __init__(self, client, every_s: float = 0.05) -> None:
        super().__init__(name="answer-clock", daemon=True)
        self.client, self.every_s = client, every_s
        self.seen: dict[str, float] = {}
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(self.every_s):
            now = time.monotonic()
            for env in self.client.events(POLICY, ["infer.completed", "infer.failed"]):
                self.seen.setdefault(env.payload.request_id, now)

    def longest_gap(self, start: float, end: float) -> float:
        """The longest stretch of [start, end] with no answer arriving."""
        times = sorted(t for t in self.seen.values() if start <= t <= end)
        edges = [start, *times, end]
        return round(max(b - a for a, b in zip(edges, edges[1:], strict=False)), 2)


def inject(fault: str, settings, down_s: float, killed: list[str]) -> threading.Thread | None:
    """Carry out ``fault`` (a node it kills is added to ``killed``). A node fault returns at
    once after the kill, the node coming back in the returned thread (join it before the next
    fault), so that the round's update and probe run while the node is down, as a cluster must
    serve them; a rolling restart returns when every node is back."""
    from mint.dev import launcher

    kind = fault.split("-")[0]
    if fault in NODE_FAULTS:
        # A broker: the active KRaft controller, the worst case (an election comes before the
        # dead broker is fenced and its leaderships move). A Cassandra node: the first contact
        # point of every client, and a seed.
        node = (kafka_controller(settings) if kind == "kafka" else None) or f"{kind}-1"
        print(f"  kill -9 {node}", file=sys.stderr, flush=True)
        killed.append(node)
        launcher.kill(settings, node)

        def back() -> None:
            time.sleep(down_s)
            launcher.up(settings, only=(node,))

        restart = threading.Thread(target=back, name=f"restart-{node}", daemon=True)
        restart.start()
        return restart
    for i in range(1, NODES + 1):
        node = f"{kind}-{i}"
        print(f"  rolling restart: {node}", file=sys.stderr, flush=True)
        launcher.stop(settings, node)
        launcher.up(settings, only=(node,))
        (in_sync if kind == "kafka" else settled)(settings)


def kafka_controller(settings) -> str | None:
    """The broker that is the active KRaft controller: the leader of the newest epoch among
    the nodes' ``quorum-state`` files (each node's view of the metadata quorum)."""
    import json

    from mint.dev import launcher

    best: tuple[int, int] | None = None
    for svc in launcher.services(settings).values():
        state = svc.home / "kafka-data" / "__cluster_metadata-0" / "quorum-state"
        if svc.kind != "kafka" or not state.exists():
            continue
        try:
            q = json.loads(state.read_text())
        except (OSError, ValueError):  # being rewritten: the other nodes tell
            continue
        if q.get("leaderId", -1) >= 0 and (best is None or q["leaderEpoch"] > best[0]):
            best = (q["leaderEpoch"], q["leaderId"])
    return None if best is None else f"kafka-{best[1]}"


def in_sync(settings, timeout_s: float = 120.0) -> None:
    """Wait until every partition of every topic has all its replicas in sync."""
    from streams.clients import make_admin

    admin = make_admin(settings)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            try:
                lagging = [
                    (t["name"], p["partition_index"])
                    for t in admin.describe_topics()
                    for p in t["partitions"]
                    if len(p["isr_nodes"]) < len(p["replica_nodes"])
                ]
            except Exception:  # noqa: BLE001 - a metadata call during the restart: ask again
                lagging = ["?"]
            if not lagging:
                return
            time.sleep(0.5)
        raise TimeoutError(f"partitions still under-replicated after {timeout_s:.0f} s")
    finally:
        admin.close()


def settled(settings, pause_s: float = 3.0) -> None:
    """A restarted Cassandra node answers once its native port is open; the others mark it up
    by gossip within a second or two: give them that before the next node goes down."""
    time.sleep(pause_s)
