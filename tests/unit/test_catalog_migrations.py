from __future__ import annotations

import pytest

from catalog.exceptions import MigrationError
from catalog.migrate import MIGRATIONS_DIR, load_migrations
from catalog.tables import CATALOG


def test_shipped_migrations_are_ordered_and_templated():
    migs = load_migrations()
    assert [m.version for m in migs] == sorted(m.version for m in migs)
    assert migs[0].version == 1
    for m in migs:
        assert m.statements, m.name
        for stmt in m.statements:
            assert "{keyspace}." in stmt, f"{m.name}: every statement names {{keyspace}}"
            assert "IF NOT EXISTS" in stmt or "IF EXISTS" in stmt, f"{m.name}: not re-runnable"
            assert "--" not in stmt
    assert MIGRATIONS_DIR.is_dir()


def test_aliases_are_only_changed_by_lwt_tables_exist():
    text = " ".join(s for m in load_migrations() for s in m.statements)
    for table in CATALOG:
        assert f"{{keyspace}}.{table} (" in text
    assert "CLUSTERING ORDER BY (revision DESC)" in text


def test_checksum_changes_with_content(tmp_path):
    (tmp_path / "0001_a.cql").write_text(
        "CREATE TABLE IF NOT EXISTS {keyspace}.x (k int PRIMARY KEY);"
    )
    first = load_migrations(tmp_path)[0].checksum
    (tmp_path / "0001_a.cql").write_text(
        "CREATE TABLE IF NOT EXISTS {keyspace}.x (k text PRIMARY KEY);"
    )
    assert load_migrations(tmp_path)[0].checksum != first


@pytest.mark.parametrize(
    "files,fragment",
    [
        (["1_a.cql"], "is not named NNNN_lower_snake.cql"),
        (["0001_Bad.cql"], "is not named NNNN_lower_snake.cql"),
        (["0001_a.cql", "0001_b.cql"], "duplicate migration versions"),
    ],
)
def test_bad_migration_files(tmp_path, files, fragment):
    for f in files:
        (tmp_path / f).write_text("CREATE TABLE IF NOT EXISTS {keyspace}.x (k int PRIMARY KEY);")
    with pytest.raises(MigrationError, match=fragment):
        load_migrations(tmp_path)
