"""The scale benchmark's smoke mode (10,000 revisions through the importer) against real
Cassandra: what it loads is what it resolves, and every figure comes with a target and a verdict.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from schemas.settings import PROJECT_ROOT, MintSettings

# slow: over 9 s a module here (worker processes, own services, waits); `-m "not slow"` skips it
pytestmark = pytest.mark.slow


def test_catalog_scale_smoke(cassandra_cluster):
    _, session = cassandra_cluster
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.catalog_scale", "--smoke"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, run.stdout
    result = json.loads(lines[0])
    # The import path took every line of the generated file: 1,000 policies x 10 revisions,
    # none rejected; each revision is a revision row and a digest row, each policy a policy row
    # and an alias with its history row, each of the 100 tenants a tenant row.
    imp = result["import"]
    assert result["revisions"] == imp["lines"] == 10_000 and result["policies"] == 1_000
    assert imp["rejected"] == 0
    assert result["rows_written"] == 10_000 * 2 + 1_000 * 3 + 100
    assert result["import_rows_per_s"] == imp["rows_per_s"] > 0 and imp["revisions_per_s"] > 0
    # Imported aliases resolve, from the catalog and from the engine's cache, once per policy.
    for name, n in (("resolve_catalog", 900), ("resolve_cached", 5 * 900)):
        figure = result[name]
        assert figure["n"] == n
        assert 0 < figure["p50_ms"] <= figure["p99_ms"] <= figure["max_ms"]
        assert "load_average_1m" in figure
    assert "load_average_1m" in imp and "load_average_1m" in result["settle"]
    assert result["settle"]["compaction_settled"] is True
    # 10,000 revisions with digests, URIs and index rows take real space, but not absurd space.
    assert 200_000 < result["bytes_on_disk"] < 100_000_000
    targets = {"import_rows_per_s", "resolve_catalog_p99_ms", "resolve_cached_p99_ms"}
    assert set(result["targets"]) == set(result["met"]) == targets
    assert all(isinstance(v, bool) for v in result["met"].values())
    # The benchmark dropped its keyspace.
    keyspaces = {
        r.keyspace_name
        for r in session.execute("SELECT keyspace_name FROM system_schema.keyspaces")
    }
    assert result["keyspace"].startswith("bench_catalog_") and result["keyspace"] not in keyspaces
    # ...and, on the local node, the snapshot auto_snapshot keeps of a dropped keyspace.
    settings = MintSettings()
    if not settings.cassandra_external:
        assert not (settings.state_dir / "cassandra" / "data" / result["keyspace"]).exists()
