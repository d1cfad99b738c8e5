from __future__ import annotations

import os
import socket

import pytest

from mint.dev import launcher
from schemas.settings import MintSettings


def test_kafka_config_is_rendered_into_the_state_folder(tmp_path, monkeypatch) -> None:
    s = MintSettings(
        state_dir=tmp_path, kafka_bootstrap="127.0.0.1:29092", kafka_controller_port=29093
    )
    svc = launcher.services(s)["kafka"]
    monkeypatch.setattr(launcher.subprocess, "run", _fake_storage_tool)
    cmd = launcher._kafka_command(s, svc, "java")
    props = (tmp_path / "kafka" / "server.properties").read_text()
    assert "listeners=PLAINTEXT://127.0.0.1:29092,CONTROLLER://127.0.0.1:29093" in props
    assert f"log.dirs={tmp_path}/kafka/kafka-data" in props
    assert "@" not in props.replace("1@", "")
    assert cmd[1:3] == ["-Xms512m", "-Xmx512m"] and cmd[-2:] == [
        "kafka.Kafka",
        str(tmp_path / "kafka" / "server.properties"),
    ]


def test_cassandra_heap_is_bounded_and_paths_are_local(tmp_path) -> None:
    s = MintSettings(state_dir=tmp_path, cassandra_port=29042, cassandra_storage_port=27000)
    svc = launcher.services(s)["cassandra"]
    cmd = launcher._cassandra_command(s, svc, "java")
    yaml_text = (tmp_path / "cassandra" / "cassandra.yaml").read_text()
    assert "native_transport_port: 29042" in yaml_text and f"{tmp_path}/cassandra/data" in yaml_text
    assert "-Xmx1024m" in cmd and any(a.startswith("-javaagent:") and "jamm" in a for a in cmd)


def test_missing_jars_without_maven_says_what_to_set(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(launcher, "VENDORED_JVM", tmp_path / "nowhere")
    monkeypatch.setattr(launcher.shutil, "which", lambda _: None)
    with pytest.raises(launcher.LauncherError, match="set MINT_KAFKA_JARS"):
        launcher.resolve_jars("kafka", MintSettings(state_dir=tmp_path))


def test_configured_jar_folder_must_hold_jars(tmp_path) -> None:
    with pytest.raises(launcher.LauncherError, match="holds no .jar files"):
        launcher.resolve_jars(
            "cassandra", MintSettings(state_dir=tmp_path, cassandra_jars=tmp_path)
        )


def test_a_foreign_pid_is_never_ours(tmp_path) -> None:
    s = MintSettings(state_dir=tmp_path)
    svc = launcher.services(s)["kafka"]
    svc.home.mkdir(parents=True)
    svc.pid_file.write_text(str(os.getpid()))  # alive, but its command line does not name our state
    assert launcher._read_pid(svc) is None
    assert launcher.down(s) == []


def test_status_reports_a_silent_port_as_down(tmp_path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        free_port = sock.getsockname()[1]
    s = MintSettings(
        state_dir=tmp_path, kafka_bootstrap=f"127.0.0.1:{free_port}", cassandra_port=free_port
    )
    assert [st.answering for st in launcher.status(s)] == [False, False]


def _fake_storage_tool(cmd, **kwargs):
    import subprocess

    out = "00000000-0000-0000-0000-000000000000\n" if "random-uuid" in cmd else ""
    return subprocess.CompletedProcess(cmd, 0, stdout=out, stderr="")
