"""docker-compose and Kubernetes manifests cannot run here; check they agree with the Python config."""

from __future__ import annotations

import shlex
from pathlib import Path

import click
import pytest
import yaml

from mint.cli import main as mint_cli
from schemas.settings import MintSettings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> MintSettings:
    for key in list(__import__("os").environ):
        if key.startswith("MINT_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    return MintSettings()


def _known_env_keys() -> set[str]:
    return {f"MINT_{name.upper()}" for name in MintSettings.model_fields}


def _mint_commands(argv: list[str]) -> list[list[str]]:
    """The mint command lines in a container command (``sh -c "mint a && mint b"`` included)."""
    if argv[:2] == ["sh", "-c"]:
        return [shlex.split(part) for part in argv[2].split("&&")]
    return [argv]


def _assert_mint_command(argv: list[str]) -> None:
    assert argv[0] == "mint", argv
    group: click.Command = mint_cli
    for word in argv[1:]:
        if word.startswith("-"):
            break
        assert isinstance(group, click.Group) and word in group.commands, (
            f"`{' '.join(argv)}`: no command {word!r}"
        )
        group = group.commands[word]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def k8s() -> list[dict]:
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    docs = []
    for resource in kustomization["resources"]:
        docs += [d for d in yaml.safe_load_all((DEPLOY / "k8s" / resource).read_text()) if d]
    return docs


def test_compose_env_is_valid_mint_settings(compose, monkeypatch) -> None:
    env = compose["x-mint-env"]
    assert set(env) <= _known_env_keys(), set(env) - _known_env_keys()
    s = _settings_from(env, monkeypatch)
    host, _, port = s.kafka_bootstrap.rpartition(":")
    kafka_env = compose["services"]["kafka"]["environment"]
    assert host in compose["services"], "bootstrap host must be the kafka service name"
    assert f"PLAINTEXT://:{port}" in kafka_env["KAFKA_LISTENERS"]
    assert kafka_env["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://{s.kafka_bootstrap}"
    assert s.cassandra_contact_points == ["cassandra"] and "cassandra" in compose["services"]
    assert s.cassandra_port == 9042  # the cassandra image's native transport port
    assert s.kafka_is_external and s.cassandra_is_external, "containers must never start local JVMs"


def test_compose_mint_services_use_shared_env_and_real_commands(compose) -> None:
    mint_services = {n: svc for n, svc in compose["services"].items() if n.startswith("mint")}
    assert mint_services
    for svc in mint_services.values():
        assert svc["environment"] == compose["x-mint-env"]
        for argv in _mint_commands(svc["command"]):
            _assert_mint_command(argv)


def test_k8s_configmap_matches_compose(compose, k8s, monkeypatch) -> None:
    (cm,) = [d for d in k8s if d["kind"] == "ConfigMap"]
    data = cm["data"]
    assert set(data) <= _known_env_keys(), set(data) - _known_env_keys()
    shared = set(data) & set(compose["x-mint-env"])
    assert {k: data[k] for k in shared} == {k: compose["x-mint-env"][k] for k in shared}
    s = _settings_from(data, monkeypatch)
    services = {d["metadata"]["name"]: d for d in k8s if d["kind"] == "Service"}
    host, _, port = s.kafka_bootstrap.rpartition(":")
    assert int(port) in [p["port"] for p in services[host]["spec"]["ports"]]
    assert s.cassandra_port in [
        p["port"] for p in services[s.cassandra_contact_points[0]]["spec"]["ports"]
    ]


def test_k8s_mint_containers_read_the_configmap_and_run_real_commands(k8s) -> None:
    (cm,) = [d for d in k8s if d["kind"] == "ConfigMap"]
    found = 0
    for doc in k8s:
        if doc["kind"] not in ("Deployment", "StatefulSet", "Job"):
            continue
        pod = doc["spec"]["template"]["spec"]
        for c in pod["containers"] + pod.get("initContainers", []):
            if c["image"].startswith("mint"):
                found += 1
                assert {"configMapRef": {"name": cm["metadata"]["name"]}} in c["envFrom"]
                _assert_mint_command(c["command"])
    assert found


def _deployed_workers(commands: list[list[str]]) -> set[str]:
    return {argv[2] for argv in commands if argv[:2] == ["mint", "worker"]}


def test_every_worker_is_deployed_in_compose_and_k8s(compose, k8s) -> None:
    workers = set(mint_cli.commands["worker"].commands)
    in_compose = _deployed_workers(
        [
            a
            for svc in compose["services"].values()
            if "command" in svc
            for a in _mint_commands(svc["command"])
        ]
    )
    in_k8s = _deployed_workers(
        [
            c.get("command", [])
            for d in k8s
            if d["kind"] in ("Deployment", "StatefulSet", "Job")
            for c in d["spec"]["template"]["spec"]["containers"]
        ]
    )
    assert workers and in_compose == workers and in_k8s == workers
