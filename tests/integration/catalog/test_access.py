"""Tenants' access rows and API keys on real Cassandra (migration 4, catalog.access), and the
`mint tenants` / `mint keys` commands."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from catalog.access import AccessRepository
from catalog.apikeys import parse_key, verify_secret
from catalog.exceptions import InvalidReference, KeyNotFound, TenantNotFound


@pytest.fixture(scope="module")
def access(catalog_keyspace) -> AccessRepository:
    return AccessRepository(*catalog_keyspace)


def test_tenant_rows_are_idempotent_and_hold_their_rate(access, tenant) -> None:
    first = access.create_tenant(tenant, rate_per_s=5.0, burst=10, by="test")
    again = access.create_tenant(tenant, rate_per_s=99.0)
    assert first.is_new and not again.is_new
    assert (again.rate_per_s, again.burst, again.created_by) == (5.0, 10, "test")
    assert access.set_limits(tenant, None, None).rate_per_s is None
    assert tenant in [t.tenant for t in access.list_tenants()]
    with pytest.raises(TenantNotFound, match="mint tenants create"):
        access.set_limits(tenant + "x", 1.0, 1)
    with pytest.raises(InvalidReference, match="rate"):
        access.create_tenant(tenant, rate_per_s=0.0)


def test_a_key_is_stored_as_a_salted_hash_listed_and_revoked(access, tenant) -> None:
    with pytest.raises(TenantNotFound):
        access.create_key(tenant)
    access.create_tenant(tenant)
    key, row = access.create_key(tenant, name="ci", by="test")
    key_id, secret = parse_key(key.text)
    got = access.get_key(key_id)
    assert got == row and got.tenant == tenant and got.name == "ci" and not got.revoked
    assert secret.encode() not in got.hash and verify_secret(secret, got.salt, got.hash, got.kdf)
    other, _ = access.create_key(tenant)
    assert [k.key_id for k in access.list_keys(tenant)] == [key_id, other.key_id]
    with pytest.raises(KeyNotFound):
        access.revoke_key(key_id, tenant="someone-else")
    revoked = access.revoke_key(key_id, by="test")
    assert revoked.revoked and revoked.revoked_by == "test"
    assert access.revoke_key(key_id).revoked_at == revoked.revoked_at  # idempotent
    assert [k.revoked for k in access.list_keys(tenant)] == [True, False]
    assert access.get_key("0" * 12) is None


def test_cli_creates_tenants_and_prints_a_key_once(catalog_keyspace, tenant, monkeypatch) -> None:
    from mint.cli import main
    from schemas.settings import get_settings

    _, keyspace = catalog_keyspace
    monkeypatch.setenv("MINT_KEYSPACE", keyspace)
    get_settings.cache_clear()
    try:
        runner = CliRunner()
        done = runner.invoke(main, ["tenants", "create", tenant, "--rate", "2", "--burst", "3"])
        assert done.exit_code == 0, done.output
        made = runner.invoke(main, ["keys", "create", "--tenant", tenant, "--name", "ci"])
        assert made.exit_code == 0, made.output
        text = made.stdout.strip().splitlines()[-1]
        key_id, _ = parse_key(text)
        listed = runner.invoke(main, ["keys", "list", "--tenant", tenant])
        assert key_id in listed.stdout and text not in listed.stdout
        gone = runner.invoke(main, ["keys", "revoke", key_id])
        assert gone.exit_code == 0, gone.output
        missing = runner.invoke(main, ["keys", "create", "--tenant", tenant + "x"])
        assert missing.exit_code == 1 and "does not exist" in missing.output
    finally:
        get_settings.cache_clear()
