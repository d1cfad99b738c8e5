from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from mint.dev import jvm, launcher
from schemas.settings import MintSettings


def test_kafka_config_is_rendered_into_the_state_folder(tmp_path, monkeypatch) -> None:
    s = MintSettings(
        state_dir=tmp_path, kafka_bootstrap="127.0.0.1:29092", kafka_controller_port=29093
    )
    svc = launcher.services(s)["kafka"]
    monkeypatch.setattr(jvm.subprocess, "run", _fake_storage_tool)
    cmd = jvm.kafka_command(s, svc, "java")
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
    cmd = jvm.cassandra_command(s, svc, "java")
    yaml_text = (tmp_path / "cassandra" / "cassandra.yaml").read_text()
    assert "native_transport_port: 29042" in yaml_text and f"{tmp_path}/cassandra/data" in yaml_text
    assert "-Xmx1024m" in cmd and any(a.startswith("-javaagent:") and "jamm" in a for a in cmd)
    # a node that may be killed -9 keeps its schema on disk unless tests ask for speed
    assert "-Dcassandra.unsafesystem=true" not in cmd
    fast = s.model_copy(update={"cassandra_fast_schema": True})
    assert "-Dcassandra.unsafesystem=true" in jvm.cassandra_command(fast, svc, "java")


def test_missing_jars_without_maven_says_what_to_set(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(jvm, "VENDORED_JVM", tmp_path / "nowhere")
    monkeypatch.setattr(jvm.shutil, "which", lambda _: None)
    with pytest.raises(launcher.LauncherError, match="set MINT_KAFKA_JARS"):
        jvm.resolve_jars("kafka", MintSettings(state_dir=tmp_path))


def test_configured_jar_folder_must_hold_jars(tmp_path) -> None:
    with pytest.raises(launcher.LauncherError, match="holds no .jar files"):
        jvm.resolve_jars("cassandra", MintSettings(state_dir=tmp_path, cassandra_jars=tmp_path))


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


def test_a_local_cluster_is_three_nodes_of_each_on_their_own_addresses(
    tmp_path, monkeypatch
) -> None:
    s = MintSettings(state_dir=tmp_path, dev_nodes=3)
    svcs = launcher.services(s)
    assert list(svcs) == [f"{k}-{i}" for k in ("kafka", "cassandra") for i in (1, 2, 3)]
    assert {svc.host for svc in svcs.values()} == {"127.0.0.1", "127.0.0.2", "127.0.0.3"}
    assert svcs["kafka-2"].home == tmp_path / "cluster" / "kafka-2"
    # the clients' settings follow: every node a contact point, RF 3, two in-sync replicas
    assert s.kafka_bootstrap.split(",") == [f"127.0.0.{i}:19092" for i in (1, 2, 3)]
    assert s.cassandra_contact_points == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    assert (s.topic_replication, s.topic_min_insync) == (3, 2)
    assert "NetworkTopologyStrategy" in s.keyspace_replication and not s.kafka_is_external

    calls = []
    monkeypatch.setattr(
        jvm.subprocess, "run", lambda cmd, **kw: calls.append(cmd) or _fake_storage_tool(cmd)
    )
    jvm.kafka_command(s, svcs["kafka-2"], "java")
    jvm.kafka_command(s, svcs["kafka-3"], "java")
    props = (svcs["kafka-2"].home / "server.properties").read_text()
    assert "node.id=2" in props and "PLAINTEXT://127.0.0.2:19092" in props
    assert "controller.quorum.voters=1@127.0.0.1:19093,2@127.0.0.2:19093,3@127.0.0.3:19093" in props
    assert "min.insync.replicas=2" in props and "offsets.topic.replication.factor=3" in props
    formats = [c for c in calls if "format" in c]
    assert len(formats) == 2 and not any("--standalone" in c for c in formats)
    ids = {c[c.index("-t") + 1] for c in formats}
    assert len(ids) == 1  # one cluster id for every broker
    cmd = jvm.cassandra_command(s, svcs["cassandra-3"], "java")
    yaml_text = (svcs["cassandra-3"].home / "cassandra.yaml").read_text()
    assert (
        "listen_address: 127.0.0.3" in yaml_text and "127.0.0.1:17000,127.0.0.2:17000" in yaml_text
    )
    assert f"{tmp_path}/cluster/cassandra-3/data" in yaml_text
    assert "-Dcassandra.consistent.rangemovement=false" in cmd
    # each node its own tokens: nodes joining at once would otherwise compute the same ones
    tokens = [
        yaml_text.split("initial_token: ")[1].split()[0]
        for yaml_text in (
            (svcs[f"cassandra-{i}"].home / "cassandra.yaml").read_text()
            for i in (1, 2, 3)
            if jvm.cassandra_command(s, svcs[f"cassandra-{i}"], "java")
        )
    ]
    every = [t for line in tokens for t in line.split(",")]
    assert len(every) == len(set(every)) == 48  # num_tokens 16 on each of three nodes


def test_one_node_keeps_its_standalone_quorum(tmp_path, monkeypatch) -> None:
    s = MintSettings(state_dir=tmp_path)
    calls = []
    monkeypatch.setattr(
        jvm.subprocess, "run", lambda cmd, **kw: calls.append(cmd) or _fake_storage_tool(cmd)
    )
    jvm.kafka_command(s, launcher.services(s)["kafka"], "java")
    props = (tmp_path / "kafka" / "server.properties").read_text()
    assert "controller.quorum.bootstrap.servers=127.0.0.1:19093" in props and "node.id=1" in props
    assert "offsets.topic.replication.factor=1" in props
    assert any("--standalone" in c for c in calls if "format" in c)


def test_naming_a_node_that_does_not_exist_says_which_do(tmp_path) -> None:
    with pytest.raises(launcher.LauncherError, match="need MINT_DEV_NODES=3"):
        launcher.up(MintSettings(state_dir=tmp_path), only=("kafka-2",))
    with pytest.raises(launcher.LauncherError, match="choose from kafka-1"):
        launcher.kill(MintSettings(state_dir=tmp_path, dev_nodes=3), "kafka-9")


def test_min_insync_above_replication_is_refused() -> None:
    with pytest.raises(ValueError, match="MINT_TOPIC_MIN_INSYNC=2 exceeds"):
        MintSettings(topic_min_insync=2)


def _fake_storage_tool(cmd, **kwargs):
    import subprocess

    out = "00000000-0000-0000-0000-000000000000\n" if "random-uuid" in cmd else ""
    return subprocess.CompletedProcess(cmd, 0, stdout=out, stderr="")


def test_a_cluster_does_not_start_over_a_running_single_pair(tmp_path, monkeypatch) -> None:
    def must_not_start(*args, **kwargs):  # a miss here once left two real Cassandra nodes up
        raise AssertionError("launcher.up started a service over a running single pair")

    monkeypatch.setattr(launcher, "_start", must_not_start)
    single = launcher.services(MintSettings(state_dir=tmp_path))["kafka"]
    single.home.mkdir(parents=True)
    # a live process whose command line names the single pair's folder (killed below)
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)", str(single.home)]
    )
    try:
        single.pid_file.write_text(str(proc.pid))
        # until the child has exec'd, /proc/<pid>/cmdline is still pytest's (seen under load)
        deadline = time.monotonic() + 30
        while launcher._read_pid(single) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(launcher.LauncherError, match="stop them first with `mint dev down`"):
            launcher.up(MintSettings(state_dir=tmp_path, dev_nodes=3))
    finally:
        proc.kill()
