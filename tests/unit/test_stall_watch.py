"""streams.stall: which owned partitions count as stalled (the client's state faked; the
replacement of a stalled consumer runs against real Kafka in
tests/integration/streams/test_stalled_consumer.py)."""

from __future__ import annotations

import pytest
from kafka import TopicPartition
from kafka.errors import KafkaTimeoutError

from streams import health
from streams.stall import StallWatch

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _own_health(monkeypatch) -> None:
    """Each test's suspicions stay its own (streams.health keeps them per process)."""
    monkeypatch.setattr(health, "_stalled", {})


TP0, TP1 = TopicPartition("mint.t", 0), TopicPartition("mint.t", 1)


class FakeConsumer:
    def __init__(self, *owned: TopicPartition) -> None:
        self.owned = set(owned)
        self.paused_tps: set[TopicPartition] = set()
        self.high: dict[TopicPartition, int | None] = dict.fromkeys(owned)
        self.pos: dict[TopicPartition, int | None] = dict.fromkeys(owned)
        self.topics: set[str] | None = {"mint.t"}  # subscribed (None: partitions assigned)

    def assignment(self):
        return set(self.owned)

    def subscription(self):
        return self.topics

    def paused(self):
        return set(self.paused_tps)

    def highwater(self, tp):
        return self.high[tp]

    def position(self, tp, timeout_ms=None):
        if self.pos[tp] == "raise":
            raise KafkaTimeoutError("Timeout resolving position")
        return self.pos[tp]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def polls(watch: StallWatch, consumer: FakeConsumer, clock: Clock, seconds: float, returned=()):
    """Check after a poll every second for ``seconds``; the last check's stalls."""
    stalls = []
    for _ in range(int(seconds)):
        clock.now += 1
        stalls = watch.check(consumer, returned)
    return stalls


def test_a_partition_never_fetched_stalls_after_the_limit() -> None:
    clock, consumer = Clock(), FakeConsumer(TP0)
    watch = StallWatch(limit_s=90, clock=clock)
    assert polls(watch, consumer, clock, 89) == []
    [stall] = polls(watch, consumer, clock, 2)
    assert (stall.partition, stall.reason) == (TP0, "never_fetched")
    assert "never fetched" in stall.describe()


def test_a_position_behind_the_high_watermark_that_never_moves_stalls() -> None:
    clock, consumer = Clock(), FakeConsumer(TP0, TP1)
    consumer.high.update({TP0: 10, TP1: 5})
    consumer.pos.update({TP0: 3, TP1: 5})  # TP1 caught up: nothing to read is no stall
    watch = StallWatch(limit_s=90, clock=clock)
    [stall] = polls(watch, consumer, clock, 95)
    assert (stall.partition, stall.reason, stall.position, stall.highwater) == (
        TP0,
        "not_handed_out",
        3,
        10,
    )
    assert "position 3 behind high watermark 10" in stall.describe()


def test_progress_records_returned_or_a_moving_position_restart_the_clock() -> None:
    clock, consumer = Clock(), FakeConsumer(TP0)
    consumer.high[TP0], consumer.pos[TP0] = 100, 0
    watch = StallWatch(limit_s=90, clock=clock)
    assert polls(watch, consumer, clock, 80) == []
    consumer.pos[TP0] = 1  # a record was read
    assert polls(watch, consumer, clock, 80) == []
    assert polls(watch, consumer, clock, 80, returned=[TP0]) == []
    assert polls(watch, consumer, clock, 89) == []
    assert polls(watch, consumer, clock, 2) != []  # 91 s since the last records


def test_paused_partitions_and_busy_handlers_are_not_stalls() -> None:
    clock, consumer = Clock(), FakeConsumer(TP0)
    consumer.high[TP0], consumer.pos[TP0] = 100, 0
    watch = StallWatch(limit_s=90, clock=clock)
    consumer.paused_tps = {TP0}  # an outage waited out
    assert polls(watch, consumer, clock, 200) == []
    consumer.paused_tps = set()
    assert polls(watch, consumer, clock, 60) == []
    clock.now += 600  # a 10-minute training step between two polls
    assert polls(watch, consumer, clock, 1) == []
    # 89 s of polling since its first position was read (a second after it was resumed)
    assert polls(watch, consumer, clock, 30) == []
    assert polls(watch, consumer, clock, 2) != []


def test_a_partition_that_left_the_assignment_is_forgotten_and_reset_clears_all() -> None:
    clock, consumer = Clock(), FakeConsumer(TP0)
    consumer.high[TP0], consumer.pos[TP0] = 100, 0
    watch = StallWatch(limit_s=90, clock=clock)
    polls(watch, consumer, clock, 80)
    consumer.owned = set()
    polls(watch, consumer, clock, 1)
    consumer.owned = {TP0}
    assert polls(watch, consumer, clock, 80) == []  # assigned again: a new clock
    watch.reset()
    assert polls(watch, consumer, clock, 80) == []


def test_a_position_that_never_resolves_after_a_fetch_stalls() -> None:
    clock, consumer = Clock(), FakeConsumer(TP0)
    consumer.high[TP0], consumer.pos[TP0] = 35, "raise"  # kept over a rebalance, then stuck
    watch = StallWatch(limit_s=90, clock=clock)
    assert polls(watch, consumer, clock, 89) == []
    [stall] = polls(watch, consumer, clock, 2)
    assert (stall.reason, stall.position, stall.highwater) == ("no_position", None, 35)
    assert "position has not resolved" in stall.describe()


class FakeHeartbeat:
    def __init__(self) -> None:
        self.last_receive = float("-inf")


class FakeCoordinator:
    def __init__(self) -> None:
        self.heartbeat, self.is_stable = FakeHeartbeat(), True
        self.coordinator_id: int | str | None = 1

    def stable(self) -> bool:
        return self.is_stable


def grouped(*owned: TopicPartition) -> FakeConsumer:
    consumer = FakeConsumer(*owned)
    consumer.config = {"group_id": "mint-serving"}
    consumer._coordinator = FakeCoordinator()
    return consumer


def test_a_stable_member_whose_heartbeats_go_unanswered_is_replaced() -> None:
    """kafka-python lost its coordinator: polls fetch nothing, the stale high watermark makes
    the partition look caught up, so only the silent heartbeats tell."""
    clock, consumer = Clock(), grouped(TP0)
    consumer.high[TP0], consumer.pos[TP0] = 40, 40  # caught up, as far as the client knows
    watch = StallWatch(limit_s=90, clock=clock, silent_s=60)
    for _ in range(100):  # answered every 3 s: never silent
        clock.now += 3
        consumer._coordinator.heartbeat.last_receive = clock.now
        assert watch.check(consumer) == []
    assert polls(watch, consumer, clock, 59) == []
    [stall] = polls(watch, consumer, clock, 2)
    assert (stall.partition, stall.reason) == (None, "no_heartbeat")
    assert stall.describe() == "group member: no heartbeat answered for 61 s"


def test_heartbeats_are_not_expected_while_the_group_rebalances_or_without_a_group() -> None:
    clock, consumer = Clock(), grouped(TP0)
    consumer.high[TP0], consumer.pos[TP0] = 40, 40
    watch = StallWatch(limit_s=90, clock=clock, silent_s=60)
    consumer._coordinator.is_stable = False  # joining: kafka-python pauses heartbeats
    assert polls(watch, consumer, clock, 140) == []
    consumer._coordinator.is_stable = True  # joined: the clock starts now
    assert polls(watch, consumer, clock, 59) == []
    assert [s.reason for s in polls(watch, consumer, clock, 2)] == ["no_heartbeat"]
    watch.reset()  # a new client
    assert polls(watch, consumer, clock, 59) == []
    consumer.config = {"group_id": None}  # a follower: no group, no heartbeats
    assert polls(watch, consumer, clock, 300) == []


def test_a_member_that_knows_no_coordinator_for_a_minute_is_replaced_even_while_joining() -> None:
    """The coordinator limbo met while joining: heartbeats pause then, so only the lost
    coordinator tells. A coordinator found again within the minute starts the clock over."""
    clock, consumer = Clock(), grouped(TP0)
    consumer.high[TP0], consumer.pos[TP0] = 40, 40
    watch = StallWatch(limit_s=90, clock=clock, silent_s=60)
    consumer._coordinator.is_stable = False
    assert polls(watch, consumer, clock, 140) == []  # a long join with a coordinator: fine
    consumer._coordinator.coordinator_id = None
    assert polls(watch, consumer, clock, 50) == []
    consumer._coordinator.coordinator_id = "coordinator-1"  # found again
    assert polls(watch, consumer, clock, 5) == []
    consumer._coordinator.coordinator_id = None
    assert polls(watch, consumer, clock, 59) == []
    [stall] = polls(watch, consumer, clock, 2)
    assert (stall.partition, stall.reason) == (None, "no_coordinator")
    assert stall.describe() == "group member: no group coordinator known for 60 s"
    watch.reset()  # a new client: its own minute
    assert polls(watch, consumer, clock, 59) == []


def test_a_join_that_never_completes_is_replaced_after_join_s() -> None:
    """kafka-python pauses heartbeats while it joins: a join that never completes is silent
    (the broker drops the member and its polls return nothing), so its length tells."""
    clock, consumer = Clock(), grouped(TP0)
    consumer.high[TP0], consumer.pos[TP0] = 40, 40
    watch = StallWatch(limit_s=90, clock=clock, silent_s=60, join_s=150)
    consumer._coordinator.is_stable = False
    assert polls(watch, consumer, clock, 100) == []
    consumer._coordinator.is_stable = True  # joined: a later join has its own clock
    assert polls(watch, consumer, clock, 5) == []
    consumer._coordinator.heartbeat.last_receive = clock.now
    consumer._coordinator.is_stable = False
    assert polls(watch, consumer, clock, 149) == []
    [stall] = polls(watch, consumer, clock, 2)
    assert (stall.partition, stall.reason) == (None, "no_join")
    assert stall.describe().startswith(
        "group member: joining its group for 150 s without an assignment (state="
    )
    watch.reset()  # a new client joins: its own clock
    assert polls(watch, consumer, clock, 149) == []


def test_a_reader_that_assigned_its_partitions_under_a_group_id_never_joins_and_is_fine() -> None:
    """A follower keeping its position under a group id (a replay's re-drive) is never stable:
    it never joins, and nothing expects it to."""
    clock, consumer = Clock(), grouped(TP0)
    consumer.high[TP0], consumer.pos[TP0], consumer.topics = 40, 40, None
    consumer._coordinator.is_stable = False
    watch = StallWatch(limit_s=90, clock=clock, silent_s=60, join_s=150)
    assert polls(watch, consumer, clock, 600) == []


def test_a_host_busy_between_polls_does_not_count_against_its_join() -> None:
    clock, consumer = Clock(), grouped()  # eager rebalancing: nothing owned while it joins
    watch = StallWatch(limit_s=90, clock=clock, silent_s=60, join_s=150)
    consumer._coordinator.is_stable = False
    assert polls(watch, consumer, clock, 100) == []
    clock.now += 600  # a handler (an evaluation wave) kept this loop unpolled
    assert polls(watch, consumer, clock, 49) == []
    assert [s.reason for s in polls(watch, consumer, clock, 3)] == ["no_join"]


def _readiness() -> dict:
    body = health.report()
    return {
        g: [(c["reason"], c["partition"]) for c in v["stalled"]]
        for g, v in body["groups"].items()
        if v["stalled"]
    }


def test_a_condition_of_30_s_makes_the_process_not_ready_until_it_clears() -> None:
    """/readyz goes 503 a minute before the watch replaces the consumer, and ready again when
    the partition moves."""
    clock, consumer = Clock(), grouped(TP0, TP1)
    consumer.high.update({TP0: 10, TP1: 5})
    consumer.pos.update({TP0: 3, TP1: 5})
    watch = StallWatch(limit_s=90, clock=clock, silent_s=60)
    consumer._coordinator.heartbeat.last_receive = float("inf")  # heartbeats answered
    # Its first position read at the second look: 29 s unmoved after 31 looks, then 30.
    assert polls(watch, consumer, clock, 31) == [] and health.report()["status"] == "ready"
    assert polls(watch, consumer, clock, 1) == []  # suspected, not yet replaced
    body = health.report()
    assert body["status"] == "stalled" and body["stalled"] == ["mint-serving"]
    [condition] = body["groups"]["mint-serving"]["stalled"]
    assert condition["reason"] == "not_handed_out" and condition["partition"] == "mint.t[0]"
    assert (
        condition["for_s"] == 30.0 and "position 3 behind high watermark 10" in condition["detail"]
    )
    assert body["reason"].startswith("mint-serving: stalled: not_handed_out on mint.t[0] since ")
    consumer.pos[TP0] = 4  # it moved: ready again at the next look
    assert polls(watch, consumer, clock, 1) == [] and health.report()["status"] == "ready"


def test_a_replaced_consumer_is_ready_again() -> None:
    clock, consumer = Clock(), FakeConsumer(TP0)
    consumer.config = {"group_id": None, "client_id": "timeline"}  # a follower: its client id
    watch = StallWatch(limit_s=90, clock=clock)
    polls(watch, consumer, clock, 60)
    assert _readiness() == {"timeline": [("never_fetched", "mint.t[0]")]}
    assert [s.reason for s in polls(watch, consumer, clock, 31)] == ["never_fetched"]
    watch.reset()  # what the loop does with a stall: a new client
    assert health.report()["status"] == "ready"
    assert polls(watch, consumer, clock, 29) == [] and _readiness() == {}


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        ({"is_stable": False}, "no_join"),  # joining for 30 s (the stall: 150 s)
        ({"coordinator_id": None}, "no_coordinator"),  # none known for 30 s (the stall: 60 s)
        ({"answered": False}, "no_heartbeat"),  # none answered for 30 s (the stall: 60 s)
    ],
)
def test_a_silent_member_is_suspected_after_30_s(state: dict, reason: str) -> None:
    clock, consumer = Clock(), grouped(TP0)
    consumer.high[TP0], consumer.pos[TP0] = 40, 40
    state = dict(state)
    answered = state.pop("answered", True)
    consumer._coordinator.heartbeat.last_receive = float("inf" if answered else "-inf")
    for key, value in state.items():
        setattr(consumer._coordinator, key, value)
    watch = StallWatch(limit_s=90, clock=clock, silent_s=60, join_s=150, reader="mint-trainer")
    assert polls(watch, consumer, clock, 30) == [] and _readiness() == {}
    assert polls(watch, consumer, clock, 2) == []
    assert _readiness() == {"mint-trainer": [(reason, None)]}
    assert "the group member since" in health.report()["reason"]


def test_two_consumers_of_one_group_are_suspected_each_on_its_own() -> None:
    """A trainer's --consumers 2: one consumer's clean look does not clear the other's."""
    clock, stuck, fine = Clock(), grouped(TP0), grouped(TP1)
    stuck.high[TP0], stuck.pos[TP0] = 10, 3
    fine.high[TP1], fine.pos[TP1] = 5, 5
    for c in (stuck, fine):
        c._coordinator.heartbeat.last_receive = float("inf")
    one, other = StallWatch(clock=clock), StallWatch(clock=clock)
    for _ in range(32):
        clock.now += 1
        one.check(stuck)
        other.check(fine)
    assert _readiness() == {"mint-serving": [("not_handed_out", "mint.t[0]")]}
