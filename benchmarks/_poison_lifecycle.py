"""The lifecycle policy of benchmarks/poison_traffic.py, ``carol/gated``: its revisions, and
the controller and evaluator steps of the wrong-suite and replayed-move kinds."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks import _engine_group as eg
from benchmarks._adapters import store_adapters
from benchmarks._poison import Sent

POLICY = "gated"  # carol's policy with a lifecycle
SUITES = ("toy-even", "toy-even-sampled")  # the configured one is the better scoring one
TOLERANCE = 0.01  # the rollback rule's: two runs of one suite on one revision score the same
PROBES = 4  # requests through carol/gated@prod right after the replay


def store_revisions(
    settings: Any, model: Path, work: Path, tenant: str, policy: str, n: int, seed0: int
) -> list[dict[str, Any]]:
    """``n`` stored adapters of ``tenant/policy`` as catalog import rows, revisions 1..n."""
    refs, _ = store_adapters(
        settings,
        model,
        work,
        n,
        seed0,
        tenant=tenant,
        policy_of=lambda i: policy,
        base_model=eg.BASE_MODEL,
    )
    return [
        {
            "tenant": tenant,
            "policy": policy,
            "revision": i + 1,
            "digest": r.digest,
            "uri": r.store_uri,
            "base_model": eg.BASE_MODEL,
        }
        for i, r in enumerate(refs)
    ]


class Lifecycle:
    """``carol/gated`` through the controller and the evaluator (on ``e1``)."""

    def __init__(
        self, client: Any, upstream: Any, settings: Any, partitions: int, kinds: tuple[str, ...]
    ) -> None:
        self.client, self.upstream, self.settings = client, upstream, settings
        self.partitions, self.kinds = partitions, kinds
        self.suite, self.wrong = SUITES
        self.digests: dict[int, str] = {}
        self.setup_info: dict[str, Any] = {}
        self.outcome: dict[str, Any] = {}
        self.m1: Any = None  # the alias.moved 1 -> 2 that the poisoned phase replays

    # ---------------------------------------------------------------- reading answers

    def eval(self, revision: int, suite: str, promote_to: str | None = None):
        from schemas.events import EvalRequested

        return self.client.send(
            POLICY,
            EvalRequested(
                revision=revision,
                adapter_digest=self.digests[revision],
                suite=suite,
                promote_to=promote_to,
            ),
        )

    def answer(self, req: Any, timeout_s: float = 120.0) -> tuple[str, Any]:
        """("completed", eval.completed) with metrics, ("refused", reason), ("dead", letter)
        or ("none", None) when nothing came within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for e in self.client.events(POLICY, ["eval.completed"]):
                if e.causation_id == req.event_id:
                    refused = e.payload.model_dump().get("refused")
                    return ("refused", refused) if refused else ("completed", e)
            letter = self.client.watcher.dead.get(str(req.event_id))
            if letter is not None:
                return "dead", letter
            time.sleep(0.2)
        return "none", None

    def wait_moved(self, revision: int, since: datetime, timeout_s: float = 90.0):
        """("moved", alias.moved to ``revision``), ("refused", reason) or ("none", None)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for e in self.client.events(POLICY, ["alias.moved", "serving.refused"]):
                if e.occurred_at < since:
                    continue
                if e.type == "serving.refused":
                    return "refused", e.payload.reason
                if e.payload.to_revision == revision:
                    return "moved", e
            time.sleep(0.2)
        return "none", None

    def prod(self) -> int | None:
        return self.client.catalog.get_alias("carol", POLICY, "prod").revision

    def wait_answered(self, sent: list[Sent], timeout_s: float) -> bool:
        """Until every request sent has a result or a dead letter (False: timed out)."""
        deadline, shown = time.monotonic() + timeout_s, 0.0
        while True:
            done = {
                e.causation_id
                for e in self.client.watcher.events()
                if e.type in ("infer.completed", "infer.failed")
            }
            dead = self.client.watcher.dead
            left = [s for s in list(sent) if s.event_id not in done and str(s.event_id) not in dead]
            if not left:
                return True
            if time.monotonic() > deadline:
                eg.say(f"[red]{len(left)} requests without an answer after {timeout_s:.0f} s")
                return False
            if time.monotonic() - shown > 15:
                eg.say(f"waiting for {len(left)} answers ({sorted({s.kind for s in left})})")
                shown = time.monotonic()
            time.sleep(0.5)

    # ---------------------------------------------------------------- the steps

    def setup(self) -> None:
        """Score revision 2 on both suites (no configuration yet: an evaluator that refuses
        unconfigured suites refuses these too, and then the order does not matter), configure
        the better one with a rollback rule on ``reward``, promote revision 2 through the gate."""
        self.digests = {r.revision: r.digest for r in self.client.revisions(POLICY)}
        asked = {s: self.eval(2, s) for s in SUITES}
        scores = {}
        for s, req in asked.items():
            kind, got = self.answer(req)
            scores[s] = got.payload.metrics["reward"] if kind == "completed" else kind
        if all(isinstance(v, float) for v in scores.values()):
            self.suite, self.wrong = sorted(SUITES, key=lambda s: -scores[s])
        gap = (
            scores[self.suite] - scores[self.wrong]
            if all(isinstance(v, float) for v in scores.values())
            else None
        )
        self.setup_info = {
            "configured_suite": self.suite,
            "wrong_suite": self.wrong,
            "calibration": scores,
            "reward_gap": gap,
            "rollback_provokable": None if gap is None else gap > TOLERANCE,
        }
        self.configure()
        self.wait_configured()
        for _ in range(3):
            since = datetime.now(UTC)
            kind, _ = self.answer(self.eval(2, self.suite, promote_to="prod"))
            if kind == "completed":
                moved, self.m1 = self.wait_moved(2, since)
                if moved == "moved":
                    return
        raise RuntimeError(
            "setup: carol/gated was not promoted to revision 2 through its gate "
            "(see the controller's and e1's logs)"
        )

    def wait_state(self, name: str, done: Any, what: str, timeout_s: float = 180.0) -> None:
        """Until ``done(document)`` of the controller's state ``name`` for carol/gated."""
        from catalog.cluster import connect
        from catalog.state import StateTable

        cluster, session = connect(self.settings)
        try:
            table = StateTable(session, self.settings.keyspace, name)
            deadline = time.monotonic() + timeout_s
            while not done(table.get(f"carol/{POLICY}") or {}):
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the controller did not take {what} of carol/{POLICY} "
                        f"within {timeout_s:.0f} s (see its log)"
                    )
                time.sleep(0.5)
        finally:
            cluster.shutdown()

    def configure(self) -> Any:
        return self.client.create_policy(
            POLICY,
            base_model=eg.BASE_MODEL,
            suite=self.suite,
            thresholds={"reward": {"min": 0.0}},
            rollback_metric="reward",
            rollback_tolerance=TOLERANCE,
        )

    def wait_configured(self) -> None:
        """Until the controller stored the configuration (where the evaluator reads it)."""
        from workers.controller.logic import CONFIGS_STATE

        self.wait_state(CONFIGS_STATE, lambda c: c.get("suite") == self.suite, "the configuration")

    def age(self) -> int:
        """Make the move to replay older than the controller's redelivery dedupe (its last
        RECENT event ids per policy; an operator's replay is of old moves): RECENT + 4 more
        events of the policy, the same configuration again (it changes nothing)."""
        from workers.controller.logic import LIFECYCLE_STATE, RECENT

        last = [self.configure() for _ in range(RECENT + 4)][-1]
        self.wait_state(
            LIFECYCLE_STATE,
            lambda st: str(last.event_id) in st.get("recent", ()),
            f"{RECENT + 4} configurations",
        )
        return RECENT + 4

    def plain(self, phase: str) -> None:
        """The baseline's lifecycle load, as the poisoned phase's without its bad parts: three
        evaluations of prod on the configured suite and the same burst of configurations."""
        self.answer(self.eval(2, self.suite))
        self.answer(self.eval(2, self.suite))
        self.age()
        self.answer(self.eval(2, self.suite))

    def poisoned(self, phase: str) -> None:
        try:
            self._poisoned(phase)
        except Exception as e:  # the figures say where the steps stopped
            self.outcome["error"] = f"{type(e).__name__}: {e}"[:600]
            eg.say(f"[red]lifecycle steps stopped: {self.outcome['error']}")

    def _poisoned(self, phase: str) -> None:
        o = self.outcome
        if "wrong_suite_eval" in self.kinds:
            o["wrong_suite"] = self.answer(self.eval(2, self.wrong))
            time.sleep(3.0)  # a rollback it caused comes at once
        if "replayed_alias_move" in self.kinds:
            self._replayed(phase)
        o["history"] = [
            (m.seq, m.from_revision, m.to_revision, m.kind, m.moved_by)
            for m in self.client.history(POLICY)
        ]

    def _replayed(self, phase: str) -> None:
        """Promote revision 3, age the move to 2 past the dedupe, replay it; then what prod
        serves, where the catalog points and whether the next promotion (to 4) goes through."""
        o = self.outcome
        since = datetime.now(UTC)
        self.answer(self.eval(3, self.suite, promote_to="prod"))
        o["promoted_3"] = self.wait_moved(3, since)[0]
        o["aged_by_events"] = self.age()
        o["prod_at_replay"] = self.prod()
        before = [self.upstream.send("carol", POLICY, "probe", phase) for _ in range(2)]
        self.wait_answered(before, 60)  # the control: what prod serves before the replay
        o["probes_before"] = before
        o["replayed"] = self.replay(self.m1)
        probes = []
        for _ in range(PROBES):
            probes.append(self.upstream.send("carol", POLICY, "probe", phase))
            time.sleep(0.3)
        o["probes"] = probes
        time.sleep(2.0)
        o["prod_after_replay"] = self.prod()
        since = datetime.now(UTC)
        self.answer(self.eval(4, self.suite, promote_to="prod"))
        o["promoted_4"] = self.wait_moved(4, since)

    def replay(self, moved: Any) -> int:
        """Re-publish ``moved`` from serving.events to serving.events (``mint replay``'s
        functions: a window by time on the policy's partition)."""
        from streams.replay import republish, resolve_window

        topic = self.settings.topic("serving.events")
        window = resolve_window(
            self.settings,
            topic,
            from_time=moved.occurred_at,
            to_time=moved.occurred_at + timedelta(seconds=5),
            partitions=[eg.partition_of("carol", POLICY, self.partitions)],
        )
        return republish(self.settings, window, topic)
