"""`mint catalog …` end to end in subprocesses, against real Cassandra and Kafka."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from catalog.repository import CatalogRepository
from streams.topics import ensure_topics
from workers.controller.worker import run_controller

from .conftest import digest_of

# slow: over 9 s a module here (worker processes, own services, waits); `-m "not slow"` skips it
pytestmark = pytest.mark.slow


@pytest.fixture
def cli(settings, cassandra_cluster):
    _, session = cassandra_cluster
    ensure_topics(settings)
    env = {
        **os.environ,
        "MINT_TOPIC_PREFIX": settings.topic_prefix,
        "MINT_KEYSPACE": settings.keyspace,
        "COLUMNS": "200",
    }

    stop, controller = threading.Event(), []

    def run(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
        if args[0] in ("promote", "rollback") and not controller:
            # Alias commands go through serving.commands: the controller carries them out.
            controller.append(
                threading.Thread(
                    target=run_controller, args=(settings,), kwargs={"stop": stop}, daemon=True
                )
            )
            controller[0].start()
        p = subprocess.run(
            [sys.executable, "-m", "mint.cli", "catalog", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert (p.returncode == 0) == ok, p.stderr
        return p

    yield run, session
    stop.set()
    for t in controller:
        t.join(timeout=30)
    session.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}", timeout=60)


def test_migrate_promote_rollback_resolve_history(cli, settings):
    run, session = cli
    from catalog.migrate import load_migrations

    assert f"applied now {[m.version for m in load_migrations()]}" in run("migrate").stderr
    assert "applied now nothing" in run("migrate").stderr
    run("create-policy", "acme/math-rl", "--base-model", "tiny-llama")
    repo = CatalogRepository(session, settings.keyspace)
    for n in (1, 2):
        repo.register_revision(
            "acme", "math-rl", digest=digest_of(n), store_uri=f"file:///s/acme/math-rl/{n}"
        )
    run("promote", "acme/math-rl@prod", "--to", "1", "--by", "alice")
    run("promote", "acme/math-rl@prod", "--to", "2", "--expected", "1", "--reason", "eval ok")
    stale = run("promote", "acme/math-rl@prod", "--to", "1", "--expected", "1", ok=False)
    assert "is at revision 2, not the expected 1" in stale.stderr
    assert "Traceback" not in stale.stderr
    run("rollback", "acme/math-rl@prod", "--reason", "regression")
    resolved = json.loads(run("resolve", "acme/math-rl@prod").stdout)
    assert resolved["revision"] == 1 and resolved["digest"] == digest_of(1)
    history = run("history", "acme/math-rl@prod").stdout
    assert "rollback" in history and "regression" in history and "alice" in history
    assert "file:///s/acme/math-rl/2" in run("revisions", "acme/math-rl").stdout
    # -o json: one object per line, every field whole (for jq), nothing else on stdout
    moves = [
        json.loads(line)
        for line in run("history", "acme/math-rl@prod", "-o", "json").stdout.splitlines()
    ]
    assert [(m["kind"], m["to_revision"]) for m in moves][0] == ("rollback", 1)
    assert moves[0]["reason"] == "regression" and moves[-1]["moved_by"] == "alice"
    revs = run("revisions", "acme/math-rl", "-o", "json").stdout.splitlines()
    assert [json.loads(r)["revision"] for r in revs] == [2, 1]
    assert json.loads(revs[0])["digest"] == digest_of(2)
    bad = run("resolve", "acme/math-rl@sha256:xyz", ok=False)
    assert "is malformed" in bad.stderr
