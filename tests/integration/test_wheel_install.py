"""`pip install` of a wheel built from the committed tree gives a working `mint` outside it.

The wheel is built from the files git tracks (copied away from the checkout, so nothing the
tree happens to hold untracked can help) and installed with ``--no-deps`` into a fresh venv
whose dependencies come from this project's environment through a ``.pth`` line (installing
torch and vLLM again would take minutes and prove nothing about MinT's packaging). Then, from a
folder outside the tree, with ``MINT_HOME`` pointing at a new folder: ``mint --version``,
``mint catalog migrate`` (the migrations are package data) and ``mint topics --create``
against the running services, under this test's own keyspace and topic prefix.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from schemas.settings import MintSettings

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed; returns its bin folder."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    tracked = _run(["git", "ls-files", "-z"], cwd=ROOT).stdout.split("\0")
    for name in filter(None, tracked):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    dist = work / "dist"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(dist),
            str(src),
        ]
    )
    [wheel] = dist.glob("mint-*.whl")
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    (Path(site.stdout.strip()) / "mint_deps.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n"
    )
    _run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)])
    return venv / "bin"


def _env(settings: MintSettings, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINT_")}
    env.pop("PYTHONPATH", None)
    return env | {
        "MINT_HOME": str(home),
        "MINT_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "MINT_CASSANDRA_HOSTS": settings.cassandra_hosts,
        "MINT_CASSANDRA_PORT": str(settings.cassandra_port),
        "MINT_TOPIC_PREFIX": settings.topic_prefix,
        "MINT_KEYSPACE": settings.keyspace,
    }


def test_the_installed_mint_runs_outside_the_tree(
    installed: Path, settings: MintSettings, cassandra_cluster, tmp_path: Path
) -> None:
    outside, home = tmp_path / "elsewhere", tmp_path / "home"
    outside.mkdir()
    env = _env(settings, home)
    run = lambda *args: _run([str(installed / "mint"), *args], cwd=outside, env=env)  # noqa: E731

    where = _run(
        [str(installed / "python"), "-c", "import catalog, mint; print(mint.__file__)"],
        cwd=outside,
        env=env,
    ).stdout
    assert str(ROOT) not in where and str(installed.parent) in where, where
    assert run("--version").stdout.strip() == f"mint {_version()}"
    home_of = _run(
        [
            str(installed / "python"),
            "-c",
            "from schemas.settings import MintSettings as S; s = S(); print(s.state_dir, s.models_dir)",
        ],
        cwd=outside,
        env=env,
    ).stdout.split()
    assert home_of == [str(home), str(home / "models")], "state under MINT_HOME"

    _, session = cassandra_cluster
    try:
        migrated = run("catalog", "migrate").stderr  # a message, not a table: stderr
        assert "applied now" in migrated, migrated
        shipped = {
            int(p.name.split("_")[0]) for p in (ROOT / "catalog" / "migrations").glob("*.cql")
        }
        applied = {
            r.version
            for r in session.execute(f"SELECT version FROM {settings.keyspace}.schema_migrations")
        }
        assert applied == shipped, "every migration of the tree ships in the wheel"
        tables = {
            r.table_name
            for r in session.execute(
                "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s",
                (settings.keyspace,),
            )
        }
        assert {"revisions", "aliases", "schema_migrations"} <= tables, tables
        created = run("topics", "--create")
        assert f"{settings.topic_prefix}.infer.requests" in created.stdout + created.stderr
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}", timeout=60)


def _version() -> str:
    from mint import __version__

    return __version__
