"""A second, private launcher instance on its own ports and state folder: up, idempotent up,
failure reporting and a down that leaves no process behind."""

from __future__ import annotations

import shutil
import socket
import time
from pathlib import Path

import pytest

from mint.dev import jvm, launcher
from schemas.settings import MintSettings
from tests.conftest import IN_CI


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def private_settings(tmp_path: Path) -> MintSettings:
    if shutil.which("java") is None or not any((jvm.VENDORED_JVM / "kafka").glob("*.jar")):
        if IN_CI:
            pytest.fail("CI=true but java or the vendored jars are missing")
        pytest.skip("needs java and ../shared/vendor/jvm")
    return MintSettings(
        state_dir=tmp_path,
        kafka_bootstrap=f"127.0.0.1:{_free_port()}",
        kafka_controller_port=_free_port(),
        cassandra_port=_free_port(),
        cassandra_storage_port=_free_port(),
    )


@pytest.mark.slow
def test_up_is_idempotent_and_down_leaves_nothing(private_settings: MintSettings) -> None:
    s = private_settings
    try:
        ready = launcher.up(s)
        assert set(ready) == {"kafka", "cassandra"}
        assert ready["kafka"] < 30 and ready["cassandra"] < 30, ready
        pids = {st.name: st.pid for st in launcher.status(s)}
        assert all(st.answering for st in launcher.status(s))

        assert launcher.up(s) == {}, "a second up starts nothing"
        assert {st.name: st.pid for st in launcher.status(s)} == pids
    finally:
        stopped = launcher.down(s)
    assert sorted(stopped) == ["cassandra", "kafka"]
    for pid in pids.values():
        assert (
            not Path(f"/proc/{pid}/cmdline").exists()
            or not Path(f"/proc/{pid}/cmdline").read_bytes()
        )
    assert not any(st.answering for st in launcher.status(s))


def test_a_failed_start_names_the_port_and_the_log(private_settings: MintSettings) -> None:
    with socket.socket() as blocker:  # the controller port is taken, so Kafka exits at start
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        s = private_settings.model_copy(update={"kafka_controller_port": blocker.getsockname()[1]})
        t0 = time.monotonic()
        with pytest.raises(launcher.LauncherError) as err:
            launcher.up(s, only=("kafka",))
        launcher.down(s)
    message = str(err.value)
    assert f"port {launcher.services(s)['kafka'].port}" in message
    assert "server.log" in message and "kafka.out" in message
    assert time.monotonic() - t0 < 60
