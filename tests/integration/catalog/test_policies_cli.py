"""`mint policies list`: one tenant's policies, or every tenant's for an operator, on real
Cassandra."""

from __future__ import annotations

import json

from click.testing import CliRunner

from catalog.repository import CatalogRepository

DIGEST = "sha256:" + "cd" * 32


def test_policies_list_for_one_tenant_and_across_tenants(
    repo: CatalogRepository, catalog_keyspace, tenant, monkeypatch
) -> None:
    from mint.cli import main
    from schemas.settings import get_settings

    other = tenant + "b"
    repo.create_policy(tenant, "math", "tiny")
    repo.create_policy(tenant, "chat", "tiny")
    repo.create_policy(other, "math", "tiny")
    repo.register_revision(tenant, "math", digest=DIGEST, store_uri=f"file:///s/{tenant}/math/x")
    monkeypatch.setenv("MINT_KEYSPACE", catalog_keyspace[1])
    get_settings.cache_clear()
    try:
        runner = CliRunner()
        one = runner.invoke(main, ["policies", "list", tenant, "-o", "json"])
        assert one.exit_code == 0, one.output
        rows = {r["policy"]: r for r in map(json.loads, one.stdout.splitlines())}
        assert sorted(rows) == ["chat", "math"]
        assert rows["math"]["latest_revision"] == 1 and rows["chat"]["latest_revision"] is None
        assert rows["math"]["retired_at"] is None

        every = runner.invoke(main, ["policies", "list", "-o", "json"])
        assert every.exit_code == 0, every.output
        seen = {(r["tenant"], r["policy"]) for r in map(json.loads, every.stdout.splitlines())}
        assert {(tenant, "math"), (tenant, "chat"), (other, "math")} <= seen

        table = runner.invoke(main, ["policies", "list"])
        assert table.exit_code == 0 and "tenant" in table.stdout  # the column, across tenants
        bad = runner.invoke(main, ["policies", "list", "no such tenant"])
        assert bad.exit_code == 2
    finally:
        get_settings.cache_clear()


def test_a_missing_keyspace_is_one_error_line_that_names_the_fix(cassandra_cluster) -> None:
    # Before: the Cassandra driver's "Error preparing query:" traceback came first.
    import os
    import subprocess
    import sys
    import uuid

    keyspace = f"absent_{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "MINT_KEYSPACE": keyspace, "MINT_LOG_LEVEL": "INFO"}
    result = subprocess.run(
        [sys.executable, "-m", "mint.cli", "policies", "list", "demo"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1 and result.stdout == "", result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert f"keyspace {keyspace} does not exist" in result.stderr
    assert "run `mint catalog migrate`" in result.stderr
