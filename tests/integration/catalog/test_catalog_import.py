"""`mint catalog import` against real Cassandra: bad lines, idempotency, resumption, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from catalog.bulk import PAST_US, EncodedBatch, RowSet, RowWriter
from catalog.exceptions import RevisionNotFound
from catalog.importer import ImportState, default_paths, import_file
from catalog.migrate import migrate
from catalog.repository import CatalogRepository
from catalog.snapshot import compare, dump
from schemas.settings import PROJECT_ROOT

from .conftest import digest_of

# slow: over 9 s a module here (worker processes, own services, waits); `-m "not slow"` skips it
pytestmark = pytest.mark.slow


CREATED = "2025-03-04T05:06:07.089Z"


@pytest.fixture
def migrated(cassandra_cluster, base_settings):
    """A fresh migrated keyspace for each test (and a second one on request)."""
    _, session = cassandra_cluster
    made = []

    def make() -> str:
        ks = f"imp_{uuid.uuid4().hex[:12]}"
        migrate(session, ks, base_settings.keyspace_replication)
        made.append(ks)
        return ks

    yield session, make
    for ks in made:
        session.execute(f"DROP KEYSPACE IF EXISTS {ks}", timeout=60)


def good(t: str, p: str, n: int, **changes) -> dict:
    return {
        "tenant": t,
        "policy": p,
        "revision": n,
        "digest": digest_of(t, p, n),
        "uri": f"file:///store/{t}/{p}/{n}",
        "base_model": "tiny-llama",
        "created_at": CREATED,
        "rank": 8,
        **changes,
    }


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def rejects_of(path: Path) -> list[dict]:
    return [json.loads(x) for x in default_paths(path)[1].read_text().splitlines()]


def test_bad_lines_go_to_rejects_good_ones_resolve_and_a_second_import_changes_nothing(
    migrated, tmp_path
):
    session, make = migrated
    ks = make()
    f = write_jsonl(
        tmp_path / "export.jsonl",
        [
            good("acme", "a", 1),  # 1
            good("acme", "a", 2, aliases=["prod"]),  # 2
            good("acme", "a", 3),  # 3
            "",  # 4 blank
            good("acme", "b", 1, aliases=["prod", "canary"]),  # 5
            good("acme", "b", 2),  # 6
            {**good("acme", "b", 3), "digest": "sha256:nothex"},  # 7 bad digest
            {**good("acme", "b", 3), "uri": "s3://bucket/other/b/3"},  # 8 outside namespace
            good("acme", "a", 2, aliases=["prod"]),  # 9 same line again
            {**good("acme", "a", 2), "digest": digest_of("other")},  # 10 revision 2 again
            {
                **good("acme", "a", 4),
                "digest": digest_of("acme", "a", 1),
            },  # 11 digest of revision 1
            good("acme", "a", 5, aliases=["prod"]),  # 12 prod points at 2
            "{not json",  # 13
            {**good("beta", "c", 1), "parent": 1},  # 14 unknown field
            good("beta", "c", 1, created_at=None),  # 15 undated
            good("beta", "c", 2, base_model="other"),  # 16 another base model
        ],
    )
    result = import_file(session, ks, f, chunk_rows=4)
    c = result.counts
    assert result.complete and result.resumed_from_line == 0
    assert (c.lines, c.accepted, c.duplicates, c.rejected) == (15, 6, 1, 8)
    # 6 revision + 6 digest rows, 3 aliases + 3 history rows, 3 policies, 2 tenants
    assert c.rows_written == result.written_this_run == 23

    repo = CatalogRepository(session, ks)
    assert repo.resolve("acme/a@prod").revision == 2
    assert repo.resolve("acme/a@prod").digest == digest_of("acme", "a", 2)
    assert repo.resolve("acme/b@canary").store_uri == "file:///store/acme/b/1"
    assert repo.resolve(f"acme/a@{digest_of('acme', 'a', 3)}").revision == 3
    assert repo.resolve("beta/c@1").revision == 1
    assert [r.revision for r in repo.iter_revisions("acme", "a")] == [3, 2, 1]
    rev = repo.get_revision("acme", "a", 2)
    assert (rev.created_by, rev.metadata, rev.created_at) == (
        "import",
        {"rank": 8},
        datetime(2025, 3, 4, 5, 6, 7, 89000, tzinfo=UTC),
    )
    pol = repo.get_policy("acme", "a")
    assert (pol.base_model, pol.created_by, pol.created_at) == (
        "tiny-llama",
        "import",
        rev.created_at,
    )
    (move,) = repo.alias_history("acme", "a", "prod")
    assert (move.seq, move.from_revision, move.to_revision, move.moved_by, move.kind) == (
        1,
        None,
        2,
        "import",
        "promote",
    )
    # The undated row took the time the file was first imported, kept in its state file.
    state = ImportState.load(default_paths(f)[0])
    assert state.completed_at and state.line == 16
    started = datetime.fromisoformat(state.started_at).replace(microsecond=0)
    assert repo.get_revision("beta", "c", 1).created_at.replace(microsecond=0) == started

    rejects = rejects_of(f)
    assert [r["line"] for r in rejects] == [7, 8, 10, 11, 12, 13, 14, 16]
    reasons = {r["line"]: r["reason"] for r in rejects}
    assert reasons[7].startswith("digest: not valid: expected 'sha256:'")
    assert "lies outside acme/b" in reasons[8]
    assert "revision 2 of acme/a is on line 2 with other content" in reasons[10]
    assert "is revision 1 of acme/a already (line 1)" in reasons[11]
    assert "alias prod of acme/a already points at revision 2 (line 2)" in reasons[12]
    assert "not a JSON object" in reasons[13]
    assert reasons[14].startswith("parent: Extra inputs are not permitted")
    assert "base model of beta/c" in reasons[16]
    assert json.loads(rejects[0]["raw"])["digest"] == "sha256:nothex"

    # Again: the same rows, the same rejects (written afresh), the same counts; policy and
    # tenant rows that exist already are left as they are.
    before = dump(session, ks)
    again = import_file(session, ks, f, chunk_rows=3)
    assert again.complete and again.counts == replace(c, rows_written=23 - 3 - 2)
    assert dump(session, ks) == before
    assert rejects_of(f) == rejects

    # Live moves after the import win over a re-import; a policy that got live registrations
    # takes no more imported rows.
    repo.move_alias("acme", "b", "prod", 2, expected=1, by="alice")
    new = repo.register_revision(
        "acme", "a", digest=digest_of("live"), store_uri="file:///store/acme/a/4"
    )
    assert new.revision == 4
    third = import_file(session, ks, f)
    # Every acme/a line is refused now (1-3 and the duplicate 9 too), the others as before.
    assert (third.counts.accepted, third.counts.rejected) == (3, 12)
    assert "has live registrations since it was imported (revision 4" in rejects_of(f)[0]["reason"]
    assert repo.resolve("acme/b@prod").revision == 2
    assert [m.seq for m in repo.alias_history("acme", "b", "prod")] == [2, 1]
    assert repo.rollback("acme", "b", "prod", by="alice").to_revision == 1
    assert repo.resolve("acme/b@prod").revision == 1
    assert repo.resolve("acme/a@4").digest == digest_of("live")
    after = repo.register_revision(
        "acme", "a", digest=digest_of("live", 2), store_uri="file:///store/acme/a/5"
    )
    assert after.revision == 5


def interleaved(tenants: int = 2, policies: int = 6, revisions: int = 20) -> list:
    """Lines of several policies interleaved (not grouped by policy), with a bad line every 25."""
    rows: list = []
    for n in range(1, revisions + 1):
        for k in range(policies):
            aliases = ["prod"] if n == 10 else ["canary"] if n == revisions else []
            rows.append(good(f"t{k % tenants}", f"p{k}", n, aliases=aliases))
            if len(rows) % 25 == 0:
                rows.append({**good(f"t{k % tenants}", f"p{k}", n), "revision": 0})
    return rows


@pytest.mark.parametrize("workers", [0, 1])
def test_a_killed_import_resumes_from_its_checkpoint(migrated, tmp_path, base_settings, workers):
    session, make = migrated
    ks, reference = make(), make()
    rows = interleaved()
    f = write_jsonl(tmp_path / "big.jsonl", rows)
    bad_lines = [i for i, r in enumerate(rows, start=1) if r["revision"] == 0]
    assert len(rows) == 124 and len(bad_lines) == 4

    first = import_file(
        session, ks, f, settings=base_settings, workers=workers, chunk_rows=10, stop_after_chunks=4
    )
    assert not first.complete and first.counts.lines == 40
    state = ImportState.load(default_paths(f)[0])
    assert (state.line, state.completed_at) == (40, None)
    assert state.offset == sum(len(json.dumps(r)) + 1 for r in rows[:40])
    repo = CatalogRepository(session, ks)
    assert repo.resolve("t1/p5@1").revision == 1  # line 6: imported
    with pytest.raises(RevisionNotFound):
        repo.resolve("t1/p5@20")  # the last line: not yet

    second = import_file(session, ks, f, settings=base_settings, workers=workers, chunk_rows=7)
    assert second.complete and second.resumed_from_line == 40
    c = second.counts
    assert (c.lines, c.accepted, c.duplicates, c.rejected) == (124, 120, 0, 4)
    assert [r["line"] for r in rejects_of(f)] == bad_lines  # each once
    assert repo.resolve("t1/p5@prod").revision == 10
    assert repo.resolve("t0/p4@canary").revision == 20

    # The same catalog as one uninterrupted import.
    whole = import_file(
        session,
        reference,
        f,
        state_path=tmp_path / "ref.json",
        rejects_path=tmp_path / "ref.rejects.jsonl",
    )
    assert whole.counts == c
    diff = compare(session, ks, reference)
    assert diff.identical, diff.summary()
    # The next live registration follows on from the imported numbers.
    live = repo.register_revision(
        "t0", "p0", digest=digest_of("live"), store_uri="file:///store/t0/p0/21"
    )
    assert live.revision == 21


def test_encoded_batches_carry_the_bytes_the_driver_binds(migrated):
    session, make = migrated
    ks = make()
    writer = RowWriter(session, ks, by="import")
    d, uri, ms = digest_of(1), "file:///store/t/p/7", 1_741_064_767_089
    at = datetime(2025, 3, 4, 5, 6, 7, 89000, tzinfo=UTC)
    rows = RowSet(
        tenants=[("t", ms)],
        policies=[("t", "p", "base", ms)],
        revisions=[("t", "p", 7, d, uri, "base", ms, '{"rank":8}')],
        latest=[("t", "p", 7)],
        aliases=[("t", "p", "prod", 7, d, uri, ms)],
    )
    expected = [
        (writer._policy, ("t", "p", "base", at, "import")),
        (writer._revision, ("t", "p", 7, d, uri, "base", at, "import", '{"rank":8}')),
        (writer._digest, ("t", "p", d, 7)),
        (writer._latest, (PAST_US + 7, 7, "t", "p")),
        (writer._alias, ("t", "p", "prod", 7, d, uri, at, "import", PAST_US + 7)),
        (writer._history, ("t", "p", "prod", 7, at, "import", PAST_US + 7)),
    ]
    requests = list(writer._requests(rows))
    assert requests[0] == (writer._tenant, ("t", datetime.fromtimestamp(ms / 1000, UTC)))
    got = [entry for batch, _ in requests[1:] for entry in batch._statements_and_parameters]
    assert all(isinstance(b, EncodedBatch) for b, _ in requests[1:])
    assert [(qid, values) for _, qid, values in got] == [
        (stmt.query_id, stmt.bind(values).values) for stmt, values in expected
    ]
    assert requests[2][0].routing_key == writer._revision.bind(expected[1][1]).routing_key
    assert writer.write(rows) == 6
    repo = CatalogRepository(session, ks)
    assert repo.resolve("t/p@prod").store_uri == uri
    assert repo.get_revision("t", "p", 7).metadata == {"rank": 8}


def test_cli_imports_reports_rejects_and_resolves(migrated, tmp_path):
    session, make = migrated
    ks = make()
    f = write_jsonl(
        tmp_path / "cli.jsonl",
        [
            good("acme", "m", 1),
            good("acme", "m", 2, aliases=["prod"]),
            {**good("acme", "m", 3), "rank": 0},
        ],
    )
    env = {**os.environ, "MINT_KEYSPACE": ks, "COLUMNS": "200"}

    def mint(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "mint.cli", "catalog", *args],
            env=env,
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )

    p = mint("import", str(f), "--json", "--workers", "0")
    assert p.returncode == 3, p.stderr  # imported, with a rejected line
    result = json.loads(p.stdout)
    assert result["complete"] and result["counts"]["accepted"] == 2
    assert result["counts"]["rejected"] == 1 and result["rejects_path"].endswith(".rejects.jsonl")
    assert "rank: Input should be greater than or equal to 1" in rejects_of(f)[0]["reason"]
    p = mint("import", str(f))
    assert p.returncode == 3 and "2 revisions imported" in p.stderr and "Traceback" not in p.stderr
    resolved = json.loads(mint("resolve", "acme/m@prod").stdout)
    assert resolved["revision"] == 2 and resolved["digest"] == digest_of("acme", "m", 2)
    assert "file:///store/acme/m/1" in mint("revisions", "acme/m").stdout
    nowhere = mint("import", str(f), "--keyspace", "no_such_keyspace_here")
    assert nowhere.returncode == 1 and "run `mint catalog migrate" in nowhere.stderr
