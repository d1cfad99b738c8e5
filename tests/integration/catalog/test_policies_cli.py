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
