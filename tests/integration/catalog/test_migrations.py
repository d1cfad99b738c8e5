from __future__ import annotations

import shutil
import time
import uuid

import pytest

from catalog.exceptions import MigrationError
from catalog.migrate import MIGRATIONS_DIR, applied_versions, load_migrations, migrate
from catalog.snapshot import TABLES


@pytest.fixture
def fresh_keyspace(cassandra_cluster):
    _, session = cassandra_cluster
    keyspace = f"mig_{uuid.uuid4().hex[:12]}"
    yield session, keyspace
    session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)


def test_migrate_creates_every_table_once_and_is_idempotent(fresh_keyspace, base_settings):
    session, ks = fresh_keyspace
    t0 = time.perf_counter()
    first = migrate(session, ks, base_settings.keyspace_replication)
    took = time.perf_counter() - t0
    versions = [m.version for m in load_migrations()]
    assert first == versions
    assert took < 15, f"migrating a new keyspace took {took:.1f} s"
    tables = {
        r.table_name
        for r in session.execute(
            "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s", (ks,)
        )
    }
    # The projection's tables, the migrations' record, stream processors' state (and the
    # controller's canary joins), the gateway's access configuration (rates, API keys) and the
    # Tinker API's rows its instances share.
    access = {"tenant_access", "api_keys", "api_keys_by_tenant"}
    state = {"worker_state", "canary_answers"}
    tinker = {"tinker_models", "tinker_futures", "tinker_calls", "tinker_states"}
    assert set(TABLES) | {"schema_migrations"} | state | access | tinker == tables
    assert migrate(session, ks, base_settings.keyspace_replication) == []
    assert applied_versions(session, ks) == versions


def test_changed_migration_file_is_refused(fresh_keyspace, base_settings, tmp_path):
    session, ks = fresh_keyspace
    for f in MIGRATIONS_DIR.glob("*.cql"):
        shutil.copy(f, tmp_path / f.name)
    migrate(session, ks, base_settings.keyspace_replication, tmp_path)
    first = sorted(tmp_path.glob("*.cql"))[0]
    first.write_text(first.read_text() + "\n-- edited after applying\n")
    with pytest.raises(MigrationError, match="was changed after it was applied"):
        migrate(session, ks, base_settings.keyspace_replication, tmp_path)


def test_new_migration_applies_on_top(fresh_keyspace, base_settings, tmp_path):
    session, ks = fresh_keyspace
    for f in MIGRATIONS_DIR.glob("*.cql"):
        shutil.copy(f, tmp_path / f.name)
    migrate(session, ks, base_settings.keyspace_replication, tmp_path)
    (tmp_path / "9999_extra.cql").write_text(
        "CREATE TABLE IF NOT EXISTS {keyspace}.extra (k int PRIMARY KEY);"
    )
    assert migrate(session, ks, base_settings.keyspace_replication, tmp_path) == [9999]
    assert 9999 in applied_versions(session, ks)
