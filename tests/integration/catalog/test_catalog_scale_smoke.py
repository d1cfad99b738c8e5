"""The scale benchmark's smoke mode (10,000 revisions) runs against real Cassandra."""

from __future__ import annotations

import json
import subprocess
import sys

from schemas.settings import PROJECT_ROOT, MintSettings


def test_catalog_scale_smoke(cassandra_cluster):
    _, session = cassandra_cluster
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.catalog_scale", "--smoke"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, run.stdout
    result = json.loads(lines[0])
    assert result["revisions"] == 10_000 and result["policies"] == 1_000
    assert result["rows_per_s"] > 0 and result["revisions_per_s"] > 0
    assert result["resolve_alias"]["n"] == 1_000
    assert 0 < result["resolve_alias"]["p50_ms"] <= result["resolve_alias"]["p99_ms"]
    # 10,000 revisions with digests, URIs and index rows take real space, but not absurd space.
    assert 200_000 < result["bytes_on_disk"] < 100_000_000
    assert set(result["meets_targets"]) == {"rows_per_s", "resolve_alias_p99_ms"}
    # The benchmark dropped its keyspace.
    keyspaces = {r.keyspace_name for r in session.execute("SELECT keyspace_name FROM system_schema.keyspaces")}  # fmt: skip
    assert result["keyspace"].startswith("bench_catalog_") and result["keyspace"] not in keyspaces
    # ...and, on the local node, the snapshot auto_snapshot keeps of a dropped keyspace.
    settings = MintSettings()
    if not settings.cassandra_external:
        assert not (settings.state_dir / "cassandra" / "data" / result["keyspace"]).exists()
