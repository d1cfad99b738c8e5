"""The demo's flow as a test (fewer rounds, a lower gate): real Kafka, Cassandra, trainer,
vLLM engine, controller and projector processes; the catalog equals a replay of the log."""

from __future__ import annotations

from rich.console import Console

from mint.demo import TINY, run_lifecycle
from tests.integration.lifecycle._replay import assert_catalog_equals_replay


def test_demo_flow_promotes_through_the_gate_serves_and_rolls_back(
    lifecycle_settings, lifecycle_model, cassandra_cluster, tmp_path
) -> None:
    console = Console(file=(tmp_path / "console.txt").open("w"), width=120)
    res = run_lifecycle(
        lifecycle_settings,
        lifecycle_model,
        console,
        max_rounds=4,
        gate=0.8,
        png=tmp_path / "curve.png",
        log_dir=tmp_path / "logs",
    )
    logs = {p.name: p.read_text()[-1500:] for p in (tmp_path / "logs").glob("*.log")}
    assert res.ok, (res, logs)
    # The promoted revision is the first that met the gate; revision 1 (the base) did not.
    assert res.evals[res.promoted]["reward"] >= 0.8 > res.evals[1]["reward"]
    assert all(res.evals[r.revision]["reward"] < 0.8 for r in res.rounds[:-1])
    assert {a.revision for a in res.served_before} == {res.promoted} and res.rolled_back_to == 1
    assert {a.revision for a in res.served_after} == {1}
    assert [a.prompt for a in res.served_after] == list(TINY.show)
    moves = [(m.from_revision, m.to_revision, m.kind, m.moved_by) for m in res.history]
    assert moves == [
        (res.promoted, 1, "rollback", "demo"),
        (1, res.promoted, "promote", "controller"),
        (None, 1, "promote", "demo"),
    ]
    assert res.png.stat().st_size > 10_000
    assert res.seconds < 600
    assert_catalog_equals_replay(lifecycle_settings, cassandra_cluster[1])
