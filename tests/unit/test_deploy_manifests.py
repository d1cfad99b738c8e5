"""docker-compose and Kubernetes manifests cannot run here; check they agree with the Python config.

Three Kafka brokers and three Cassandra nodes by default, with the local cluster's settings
(``MINT_DEV_NODES=3``: ``schemas.settings.cluster_defaults``, mint/dev/services/): every MinT
container names all six, topics have replication 3 and min.insync.replicas 2, the keyspace
NetworkTopologyStrategy RF 3 in the nodes' one datacenter.

Credentials are on by default: every MinT container talks SASL/SCRAM to Kafka, each runs as the
principal (and Cassandra role) of its worker kind and holds that principal's password files only;
the broker and Cassandra start with authentication and authorization on. The shell pieces (the
secret layout of mint-secrets, the Kafka start script, the Cassandra entrypoint) run here with
stand-ins for the images' programs.
"""

from __future__ import annotations

import ast
import itertools
import json
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path, PurePosixPath

import click
import pytest
import yaml

from catalog.roles import ADMIN_ROLE, ROLES
from mint.cli import main as mint_cli
from mint.dev.jvm import CLUSTER_BROKER_TIMINGS
from mint.security import PRINCIPAL_OF, ensure_secrets
from schemas.settings import MintSettings, cluster_defaults
from streams.acls import ADMIN, ALL_PRINCIPALS

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KAFKA_SCRIPT = DEPLOY / "kafka" / "start-secure.sh"
CREDENTIAL_KEYS = {
    "MINT_KAFKA_USERNAME",
    "MINT_KAFKA_PASSWORD_FILE",
    "MINT_CASSANDRA_USERNAME",
    "MINT_CASSANDRA_PASSWORD_FILE",
}
SECRET_NAME = "mint-credentials"  # the k8s Secret `kubectl create secret generic` makes
# broker settings that must equal `mint dev up --secure`'s (mint/dev/services/). Not the
# controller listener's: the one-node set-up keeps it on loopback (PLAINTEXT, ANONYMOUS a super
# user), a cluster's voters reach each other over the network and log in as admin.
BROKER_SECURITY_KEYS = (
    "controller.listener.names",
    "inter.broker.listener.name",
    "sasl.enabled.mechanisms",
    "sasl.mechanism.inter.broker.protocol",
    "authorizer.class.name",
    "allow.everyone.if.no.acl.found",
)
# broker settings that must equal the local cluster's (mint/dev/services/server.properties.in
# rendered for three nodes, and what mint/dev/jvm.py appends for a cluster)
BROKER_CLUSTER_KEYS = (
    "process.roles",
    "num.partitions",
    "default.replication.factor",
    "min.insync.replicas",
    "offsets.topic.replication.factor",
    "transaction.state.log.replication.factor",
    "transaction.state.log.min.isr",
    "share.coordinator.state.topic.replication.factor",
    "share.coordinator.state.topic.min.isr",
    "group.initial.rebalance.delay.ms",
    "auto.create.topics.enable",
    *CLUSTER_BROKER_TIMINGS,
)
NODES = 3  # brokers and Cassandra nodes by default
CLUSTER = cluster_defaults(NODES)  # the settings MINT_DEV_NODES=3 implies


def _settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> MintSettings:
    for key in list(os.environ):
        if key.startswith("MINT_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    return MintSettings()


def _known_env_keys() -> set[str]:
    return {f"MINT_{name.upper()}" for name in MintSettings.model_fields}


def _shell_script(argv: list[str]) -> str | None:
    """The script of ``sh -c SCRIPT`` / ``sh -ec SCRIPT`` (compose's ``$$`` unescaped), else None."""
    if len(argv) >= 3 and argv[0] in ("sh", "bash") and re.fullmatch(r"-[a-z]*c", argv[1]):
        return argv[2].replace("$$", "$")
    return None


def _mint_commands(argv: list[str]) -> list[list[str]]:
    """The mint command lines in a container command (those inside a shell script included)."""
    script = _shell_script(argv)
    if script is None:
        return [argv]
    out = []
    for line in script.splitlines():
        for part in re.split(r"&&|\|\||;", line):
            words = shlex.split(part, comments=True)
            if words and words[0] == "mint":
                out.append(words)
    return out


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


def _expected_principal(commands: list[list[str]]) -> str | None:
    """Who a container must run as: a worker its kind's principal, the set-up the super user,
    the rest (port checks, generating the secret files) nobody."""
    for argv in commands:
        if argv[:2] == ["mint", "worker"]:
            return PRINCIPAL_OF.get(argv[2], argv[2])
        if argv[:2] == ["mint", "gateway"]:
            return PRINCIPAL_OF["gateway"]
    for argv in commands:
        if argv[1:3] == ["security", "apply"] or argv[1:2] in (["topics"], ["catalog"]):
            return ADMIN
    return None


def _has_role(principal: str) -> bool:
    return principal == ADMIN_ROLE or principal in ROLES


def _own_files(principal: str) -> set[str]:
    return {f"kafka-{principal}"} | ({f"cassandra-{principal}"} if _has_role(principal) else set())


def _assert_credentials_env(env: dict[str, str], principal: str | None, where: str) -> str | None:
    """The credential variables name ``principal`` and files in one folder; returns the folder."""
    if principal is None:
        assert not set(env) & CREDENTIAL_KEYS, f"{where} needs no credentials"
        return None
    assert principal in ALL_PRINCIPALS, f"{where}: no Kafka principal {principal!r}"
    assert env["MINT_KAFKA_USERNAME"] == principal, where
    kafka_file = PurePosixPath(env["MINT_KAFKA_PASSWORD_FILE"])
    assert kafka_file.name == f"kafka-{principal}", where
    if _has_role(principal):
        assert env["MINT_CASSANDRA_USERNAME"] == principal, where
        cassandra_file = PurePosixPath(env["MINT_CASSANDRA_PASSWORD_FILE"])
        assert cassandra_file == kafka_file.parent / f"cassandra-{principal}", where
    else:
        assert "MINT_CASSANDRA_USERNAME" not in env, f"{where}: no Cassandra role {principal!r}"
    return str(kafka_file.parent)


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


def _mint_services(compose: dict) -> dict[str, dict]:
    return {n: svc for n, svc in compose["services"].items() if n.startswith("mint")}


def _secret_mounts(svc: dict) -> list[dict]:
    return [v for v in svc.get("volumes", []) if isinstance(v, dict) and v["source"] == "secrets"]


def _pods(k8s: list[dict]) -> list[tuple[str, dict]]:
    return [
        (d["metadata"]["name"], d["spec"]["template"]["spec"])
        for d in k8s
        if d["kind"] in ("Deployment", "StatefulSet", "Job")
    ]


def _containers(pod: dict) -> list[dict]:
    return pod.get("initContainers", []) + pod["containers"]


def _env(container: dict) -> dict[str, str]:
    """A container's literal variables (one read from the pod's fields has no value here)."""
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def _env_from_fields(container: dict) -> dict[str, str]:
    """A container's variables read from the pod (the downward API): name -> field path."""
    return {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
        for e in container.get("env", [])
        if "fieldRef" in e.get("valueFrom", {})
    }


def _mint_containers(k8s: list[dict]) -> list[tuple[str, dict, dict]]:
    return [
        (name, pod, c)
        for name, pod in _pods(k8s)
        for c in _containers(pod)
        if c["image"].startswith("mint")
    ]


def _configmap(k8s: list[dict], name: str) -> dict:
    (cm,) = [d for d in k8s if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name]
    return cm


def _properties(text: str) -> dict[str, str]:
    return dict(
        line.split("=", 1) for line in text.splitlines() if re.match(r"[a-z][a-z0-9._-]*=", line)
    )


def _kafka_services(compose: dict) -> dict[str, dict]:
    return {n: s for n, s in compose["services"].items() if re.fullmatch(r"kafka-\d+", n)}


def _cassandra_services(compose: dict) -> dict[str, dict]:
    return {n: s for n, s in compose["services"].items() if re.fullmatch(r"cassandra-\d+", n)}


def _statefulset(k8s: list[dict], name: str) -> dict:
    (found,) = [d for d in k8s if d["kind"] == "StatefulSet" and d["metadata"]["name"] == name]
    return found


def _pod_names(k8s: list[dict], name: str) -> list[str]:
    """The stable DNS names of a StatefulSet's pods: <pod>.<headless service>."""
    sts = _statefulset(k8s, name)
    service = sts["spec"]["serviceName"]
    return [f"{name}-{i}.{service}" for i in range(sts["spec"]["replicas"])]


def _hosts(bootstrap: str) -> list[str]:
    return [part.strip().rpartition(":")[0] for part in bootstrap.split(",")]


# -- settings and commands --------------------------------------------------------------------


def test_every_mint_variable_is_a_setting() -> None:
    texts = [DEPLOY / "docker-compose.yml", *sorted((DEPLOY / "k8s").glob("*.yaml"))]
    used = {m for p in texts for m in re.findall(r"\bMINT_[A-Z0-9_]*[A-Z0-9]", p.read_text())}
    assert used and used <= _known_env_keys(), used - _known_env_keys()


def test_compose_env_is_valid_mint_settings(compose, monkeypatch) -> None:
    env = compose["x-mint-env"]
    assert set(env) <= _known_env_keys(), set(env) - _known_env_keys()
    s = _settings_from(env, monkeypatch)
    brokers = _kafka_services(compose)
    entries = s.kafka_bootstrap.split(",")
    assert _hosts(s.kafka_bootstrap) == sorted(brokers), "bootstrap: every kafka service by name"
    for entry in entries:  # each broker advertises the name and port clients bootstrap with
        port = entry.rpartition(":")[2]
        assert f"listeners=SASL_PLAINTEXT://:{port}," in KAFKA_SCRIPT.read_text()
        advertised = brokers[entry.rpartition(":")[0]]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
        assert advertised == f"{s.kafka_security_protocol}://{entry}"
    assert s.cassandra_contact_points == sorted(_cassandra_services(compose))
    assert s.cassandra_port == 9042  # the cassandra image's native transport port
    assert s.kafka_is_external and s.cassandra_is_external, "containers must never start local JVMs"


def test_compose_mint_services_use_shared_env_and_real_commands(compose, monkeypatch) -> None:
    mint_services = _mint_services(compose)
    assert mint_services
    for name, svc in mint_services.items():
        env = svc["environment"]
        assert {k: env.get(k) for k in compose["x-mint-env"]} == compose["x-mint-env"], name
        assert set(env) - set(compose["x-mint-env"]) <= CREDENTIAL_KEYS, name
        _settings_from(env, monkeypatch)  # valid settings
        commands = _mint_commands(svc["command"])
        assert commands, f"{name} runs no mint command"
        for argv in commands:
            _assert_mint_command(argv)


def test_k8s_configmap_matches_compose(compose, k8s, monkeypatch) -> None:
    cm = _configmap(k8s, "mint-settings")
    data = cm["data"]
    assert set(data) <= _known_env_keys(), set(data) - _known_env_keys()
    # the same settings but the hosts: compose services there, StatefulSet pods here
    hosts = {"MINT_KAFKA_BOOTSTRAP", "MINT_CASSANDRA_HOSTS"}
    shared = set(data) & set(compose["x-mint-env"]) - hosts
    assert {k: data[k] for k in shared} == {k: compose["x-mint-env"][k] for k in shared}
    assert set(compose["x-mint-env"]) <= set(data), set(compose["x-mint-env"]) - set(data)
    assert "MINT_KAFKA_SECURITY_PROTOCOL" in shared and "MINT_TOPIC_MIN_INSYNC" in shared
    s = _settings_from(data, monkeypatch)
    services = {d["metadata"]["name"]: d for d in k8s if d["kind"] == "Service"}
    assert _hosts(s.kafka_bootstrap) == _pod_names(k8s, "kafka")
    assert s.cassandra_contact_points == _pod_names(k8s, "cassandra")
    for entry in s.kafka_bootstrap.split(","):
        service = entry.rpartition(":")[0].split(".")[1]
        assert int(entry.rpartition(":")[2]) in [
            p["port"] for p in services[service]["spec"]["ports"]
        ]
    assert s.cassandra_port in [p["port"] for p in services["cassandra"]["spec"]["ports"]]


def test_k8s_mint_containers_read_the_configmap_and_run_real_commands(k8s) -> None:
    found = 0
    for _, _, c in _mint_containers(k8s):
        found += 1
        assert {"configMapRef": {"name": "mint-settings"}} in c["envFrom"]
        assert set(_env(c)) <= CREDENTIAL_KEYS, c["name"]
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
        [c.get("command", []) for _, pod in _pods(k8s) for c in pod["containers"]]
    )
    assert workers and in_compose == workers and in_k8s == workers


def test_the_gateway_is_deployed_behind_a_service_on_its_port(compose, k8s) -> None:
    svc = compose["services"]["mint-gateway"]
    argv = svc["command"]
    assert argv[:2] == ["mint", "gateway"] and argv[argv.index("--host") + 1] == "0.0.0.0"
    port = int(argv[argv.index("--port") + 1])
    assert svc["ports"] == [f"{port}:{port}"] and "/healthz" in " ".join(svc["healthcheck"]["test"])
    (deployment,) = [
        d for d in k8s if d["kind"] == "Deployment" and d["metadata"]["name"] == "mint-gateway"
    ]
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    assert c["command"] == argv and c["ports"] == [{"name": "http", "containerPort": port}]
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    (service,) = [
        d for d in k8s if d["kind"] == "Service" and d["metadata"]["name"] == "mint-gateway"
    ]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"] == labels
    assert service["spec"]["ports"] == [{"name": "http", "port": port, "targetPort": "http"}]


# -- credentials on by default ----------------------------------------------------------------


def test_credentials_are_on_by_default(compose, k8s, monkeypatch) -> None:
    script = _properties(KAFKA_SCRIPT.read_text())
    envs = {name: svc["environment"] for name, svc in _mint_services(compose).items()}
    cm = _configmap(k8s, "mint-settings")
    for name, _, c in _mint_containers(k8s):
        envs[f"k8s {name}/{c['name']}"] = {**cm["data"], **_env(c)}
    assert len(envs) > 10
    for where, env in envs.items():
        s = _settings_from(env, monkeypatch)
        assert s.kafka_security_protocol.startswith("SASL_"), f"{where}: Kafka without SASL"
        assert s.kafka_sasl_mechanism == script["sasl.enabled.mechanisms"], where
    assert script["allow.everyone.if.no.acl.found"] == "false"
    assert script["authorizer.class.name"].endswith(".StandardAuthorizer")


def test_compose_each_service_runs_as_its_own_principal(compose) -> None:
    assert not {"all", "broker"} & set(ALL_PRINCIPALS), "secret folder names are taken"
    principals = {}
    for name, svc in _mint_services(compose).items():
        commands = _mint_commands(svc["command"])
        principal = _expected_principal(commands)
        folder = _assert_credentials_env(svc["environment"], principal, name)
        mounts = _secret_mounts(svc)
        if ["mint", "security", "secrets"] in [a[:3] for a in commands]:  # writes them all
            assert principal is None and svc["volumes"] == ["secrets:/secrets"], name
            continue
        if principal is None:
            assert not mounts and not any("secrets" in str(v) for v in svc.get("volumes", []))
            continue
        principals[name] = principal
        (mount,) = mounts
        assert mount["read_only"] is True and mount["target"] == folder, name
        # the one-shot set-up applies every password (it sets the roles'); a worker its own
        setup = any(a[:3] == ["mint", "security", "apply"] for a in commands)
        assert mount["volume"]["subpath"] == ("all" if setup else principal), name
        if setup:
            assert f"--dir {folder}" in " ".join(svc["command"]), name
    assert set(principals.values()) == _service_principals()
    # each broker mounts the folder of Kafka passwords, no Cassandra node any
    for svc in _kafka_services(compose).values():
        (broker_mount,) = _secret_mounts(svc)
        assert broker_mount["volume"]["subpath"] == "broker" and broker_mount["read_only"] is True
    for svc in _cassandra_services(compose).values():
        assert not _secret_mounts(svc)


def _workers() -> set[str]:
    return set(mint_cli.commands["worker"].commands)


def _service_principals() -> set[str]:
    """Who the deployed containers run as: the set-up, each worker kind, the gateway."""
    return {ADMIN, *(PRINCIPAL_OF.get(k, k) for k in _workers()), PRINCIPAL_OF["gateway"]}


def _fake_mint(bin_dir: Path) -> None:
    """A ``mint`` on PATH that runs this checkout's CLI."""
    mint = bin_dir / "mint"
    code = "import sys; from mint.cli import main; sys.argv[0] = 'mint'; main()"
    mint.write_text(f'#!/bin/sh\nexec "{sys.executable}" -c "{code}" "$@"\n')
    mint.chmod(0o755)


def test_compose_secret_layout_gives_each_principal_only_its_files(compose, tmp_path) -> None:
    svc = compose["services"]["mint-secrets"]
    script = _shell_script(svc["command"])
    assert script and "mint security secrets --dir /secrets/all" in script
    root = tmp_path / "secrets"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_mint(bin_dir)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    runs = []
    for _ in range(2):  # every `up` runs it again: the same passwords, the same folders
        subprocess.run(
            ["sh", "-ec", script.replace("/secrets", str(root))], env=env, check=True, cwd=ROOT
        )
        runs.append({p.name: p.read_text() for p in (root / "all").iterdir()})
    everything = runs[0]
    assert runs[1] == everything and set(everything) == {
        *(f"kafka-{p}" for p in ALL_PRINCIPALS),
        *(f"cassandra-{r}" for r in (ADMIN_ROLE, *ROLES)),
    }
    used = {m["volume"]["subpath"] for s in compose["services"].values() for m in _secret_mounts(s)}
    assert used <= {p.name for p in root.iterdir()}, "a mounted subpath the layout lacks"
    for principal in ALL_PRINCIPALS:
        folder = root / principal
        assert {p.name for p in folder.iterdir()} == _own_files(principal), principal
        for p in folder.iterdir():
            assert p.read_text() == everything[p.name] and stat.S_IMODE(p.stat().st_mode) == 0o600
    broker = {p.name: p for p in (root / "broker").iterdir()}
    assert set(broker) == {f"kafka-{p}" for p in ALL_PRINCIPALS}, "the broker: Kafka's only"
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o444 for p in broker.values())


def test_k8s_each_container_runs_as_its_own_principal(k8s) -> None:
    kustomization = (DEPLOY / "k8s" / "kustomization.yaml").read_text()
    assert f"create secret generic {SECRET_NAME} --from-file=" in kustomization
    assert "mint security secrets --dir" in kustomization
    assert not [d for d in k8s if d["kind"] == "Secret"], "passwords never live in the repo"
    principals, whole_secret = {}, []
    for name, pod, c in _mint_containers(k8s):
        where = f"{name}/{c['name']}"
        principal = _expected_principal([c["command"]])
        folder = _assert_credentials_env(_env(c), principal, where)
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        mounted = [
            (m, volumes[m["name"]]["secret"])
            for m in c.get("volumeMounts", [])
            if "secret" in volumes[m["name"]]
        ]
        if principal is None:
            assert not mounted, f"{where} needs no credentials"
            continue
        principals[where] = principal
        ((mount, secret),) = mounted
        assert secret["secretName"] == SECRET_NAME and mount.get("readOnly") is True, where
        assert mount["mountPath"] == folder, where
        if "items" not in secret:  # the whole Secret: only `mint security apply` needs that
            assert c["command"][:3] == ["mint", "security", "apply"], where
            assert c["command"][c["command"].index("--dir") + 1] == folder, where
            whole_secret.append(where)
            continue
        assert {i["key"] for i in secret["items"]} == _own_files(principal), where
        assert all(i["path"] == i["key"] for i in secret["items"]), where
    assert len(whole_secret) == 1
    assert set(principals.values()) == _service_principals()


# -- Kafka -------------------------------------------------------------------------------------


def _kafka_pod(k8s: list[dict]) -> dict:
    ((_, pod),) = [(n, p) for n, p in _pods(k8s) if n == "kafka"]
    return pod


def _k8s_kafka_env(c: dict, pod_name: str) -> dict[str, str]:
    """A broker container's variables as the pod ``pod_name`` sees them."""
    fields = {"metadata.name": pod_name}
    env = {name: fields[path] for name, path in _env_from_fields(c).items()}
    for name, value in _env(c).items():  # $(VAR): a variable defined before it
        env[name] = re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], value)
    return env


def test_kafka_start_script_is_the_same_in_compose_and_k8s(compose, k8s) -> None:
    script = KAFKA_SCRIPT.read_text()
    cm = _configmap(k8s, "kafka-start")
    assert cm["data"] == {"start-secure.sh": script}, "copy deploy/kafka/start-secure.sh"
    brokers = _kafka_services(compose)
    assert len(brokers) == NODES
    for svc in brokers.values():
        (mount,) = [v for v in svc["volumes"] if isinstance(v, str) and "start-secure.sh" in v]
        source, target, mode = mount.split(":")
        assert (DEPLOY / source).resolve() == KAFKA_SCRIPT and mode == "ro"
        assert svc["command"] == ["sh", target]
        assert svc["depends_on"]["mint-secrets"] == {"condition": "service_completed_successfully"}
    svc = brokers["kafka-1"]
    pod = _kafka_pod(k8s)
    volumes = {v["name"]: v for v in pod["volumes"]}
    (init,) = pod["initContainers"]
    (broker,) = pod["containers"]
    assert init["command"] == ["sh", target, "format"] and broker["command"] == ["sh", target]
    for c, keys in ((init, {f"kafka-{p}" for p in ALL_PRINCIPALS}), (broker, {"kafka-admin"})):
        assert c["image"] == svc["image"]
        assert c["env"] == broker["env"], "the init container formats with the broker's settings"
        env = _k8s_kafka_env(c, "kafka-0")
        assert env["KAFKA_HEAP_OPTS"] == svc["environment"]["KAFKA_HEAP_OPTS"]
        mounts = {m["mountPath"]: volumes.get(m["name"], {}) for m in c["volumeMounts"]}
        assert mounts[str(PurePosixPath(target).parent)]["configMap"]["name"] == "kafka-start"
        secret = mounts["/run/secrets/mint"]["secret"]
        assert secret["secretName"] == SECRET_NAME
        assert {i["key"] for i in secret["items"]} == keys, c["name"]


def _fake_kafka_bin(folder: Path) -> Path:
    folder.mkdir()
    (folder / "kafka-storage.sh").write_text(
        "#!/bin/sh\n"
        'if [ "$1" = random-uuid ]; then echo q1Sh-9_ISia_zwGINzRvyQ; exit 0; fi\n'
        'printf "%s\\n" "$@" >> "$BROKER_DATA/../format.log"\n'
        'touch "$BROKER_DATA/meta.properties"\n'
    )
    (folder / "kafka-server-start.sh").write_text(
        '#!/bin/sh\nprintf "%s\\n" "$@" > "$BROKER_DATA/../started"\n'
    )
    for p in folder.iterdir():
        p.chmod(0o755)
    return folder


def _run_kafka_script(
    folder: Path, secrets: Path, node_env: dict[str, str], modes=("format", "start")
) -> tuple[dict[str, str], list[str], subprocess.CompletedProcess]:
    """Run the start script as one broker with stand-in programs: (its server.properties, its
    format arguments, the last run)."""
    folder.mkdir()
    data, conf = folder / "data", folder / "conf"
    data.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("KAFKA_") and k != "POD_NAME"},
        "SECRETS_DIR": str(secrets),
        "BROKER_BIN": str(_fake_kafka_bin(folder / "bin")),
        "BROKER_DATA": str(data),
        "BROKER_CONF": str(conf),
        **node_env,
    }
    done = None
    for mode in modes:
        argv = ["sh", str(KAFKA_SCRIPT)] + ([mode] if mode == "format" else [])
        done = subprocess.run(argv, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            return {}, [], done
    props = _properties((conf / "server.properties").read_text())
    log = folder / "format.log"
    return props, (log.read_text().splitlines() if log.exists() else []), done


def _local_cluster_broker() -> dict[str, str]:
    """The local cluster's broker settings (MINT_DEV_NODES=3): the template rendered as
    mint/dev/jvm.py renders it for three nodes, with the lines it appends."""
    text = (ROOT / "mint" / "dev" / "services" / "server.properties.in").read_text()
    rf = CLUSTER["topic_replication"]
    text = text.replace("@RF@", str(rf)).replace("@MIN_ISR@", str(CLUSTER["topic_min_insync"]))
    appended = [f"{k}={v}" for k, v in CLUSTER_BROKER_TIMINGS.items()]
    return _properties(text + "\n" + "\n".join(appended))


def test_kafka_start_script_formats_scram_users_once_with_the_secure_config(
    compose, tmp_path
) -> None:
    secrets = tmp_path / "secrets"
    ensure_secrets(secrets)
    passwords = {p: (secrets / f"kafka-{p}").read_text() for p in ALL_PRINCIPALS}
    svc = compose["services"]["kafka-1"]
    props, log, _ = _run_kafka_script(tmp_path / "kafka-1", secrets, svc["environment"])
    # `format` then `start`: the second run finds the storage formatted, no second format
    assert log.count("format") == 1
    scram = {log[i + 1] for i, word in enumerate(log) if word == "--add-scram"}
    assert scram == {f"SCRAM-SHA-256=[name={p},password={pw}]" for p, pw in passwords.items()}, (
        "a SCRAM user per principal"
    )
    conf = tmp_path / "kafka-1" / "conf"
    started = (tmp_path / "kafka-1" / "started").read_text().split()
    assert started == [str(conf / "server.properties")]

    local = _properties(
        (ROOT / "mint" / "dev" / "services" / "server-secure.properties.in").read_text()
    )
    assert {k: props[k] for k in BROKER_SECURITY_KEYS} == {
        k: local[k] for k in BROKER_SECURITY_KEYS
    }
    assert props["advertised.listeners"] == svc["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert props["log.dirs"] == str(tmp_path / "kafka-1" / "data")
    assert (
        f'username="admin" password="{passwords["admin"]}";'
        in props["listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config"]
    )
    client = _properties((conf / "admin.properties").read_text())
    assert client["security.protocol"] == "SASL_PLAINTEXT"
    assert f'password="{passwords["admin"]}"' in client["sasl.jaas.config"]
    for p in conf.iterdir():  # they hold admin's password
        assert stat.S_IMODE(p.stat().st_mode) == 0o600


def test_kafka_controller_listener_takes_admin_logins_only(compose, tmp_path) -> None:
    """The voters reach each other's controller listener over the network: SASL/PLAIN as
    admin (controllers cannot check SCRAM), never PLAINTEXT with ANONYMOUS a super user."""
    secrets = tmp_path / "secrets"
    ensure_secrets(secrets)
    admin = (secrets / "kafka-admin").read_text()
    props, _, _ = _run_kafka_script(
        tmp_path / "kafka-1", secrets, compose["services"]["kafka-1"]["environment"]
    )
    (controller,) = props["controller.listener.names"].split(",")
    protocols = dict(p.split(":") for p in props["listener.security.protocol.map"].split(","))
    assert set(protocols.values()) == {"SASL_PLAINTEXT"}, "every listener takes logins"
    listeners = dict(
        re.fullmatch(r"(\w+)://(.*)", p).groups() for p in props["listeners"].split(",")
    )
    assert listeners == {"SASL_PLAINTEXT": ":9092", controller: ":9093"}
    prefix = f"listener.name.{controller.lower()}"
    assert props[f"{prefix}.sasl.enabled.mechanisms"] == "PLAIN"
    assert props["sasl.mechanism.controller.protocol"] == "PLAIN"
    jaas = props[f"{prefix}.plain.sasl.jaas.config"]
    assert jaas.startswith("org.apache.kafka.common.security.plain.PlainLoginModule required")
    users = dict(re.findall(r'(\w+)="([^"]*)"', jaas))
    assert users == {"username": "admin", "password": admin, "user_admin": admin}
    assert props["super.users"] == "User:admin", "no ANONYMOUS super user"


def test_kafka_brokers_form_one_cluster_with_the_local_cluster_settings(
    compose, k8s, tmp_path
) -> None:
    """Each compose broker and each k8s pod, run through the start script: node ids 1-3, one
    static quorum of all three, one cluster id, no --standalone, the local cluster's
    replication settings."""
    secrets = tmp_path / "secrets"
    ensure_secrets(secrets)
    local = _local_cluster_broker()
    (broker,) = _kafka_pod(k8s)["containers"]
    runs = {name: svc["environment"] for name, svc in _kafka_services(compose).items()}
    runs |= {
        f"k8s-{pod}": _k8s_kafka_env(broker, pod.split(".")[0]) for pod in _pod_names(k8s, "kafka")
    }
    for deployment in ("kafka-", "k8s-"):
        mine = {n: e for n, e in runs.items() if n.startswith(deployment)}
        assert len(mine) == NODES
        seen = {}
        for name, env in mine.items():
            props, log, done = _run_kafka_script(tmp_path / name, secrets, env, ("format",))
            assert done.returncode == 0, done.stderr
            seen[name] = props
            assert "--standalone" not in log, "a static quorum: no --standalone"
            assert log[log.index("--cluster-id") + 1] == env["KAFKA_CLUSTER_ID"]
            assert {k: props[k] for k in BROKER_CLUSTER_KEYS} == {
                k: local[k] for k in BROKER_CLUSTER_KEYS
            }, name
            # the advertised name is the one clients bootstrap with; its voter entry is this node
            host = props["advertised.listeners"].rpartition("//")[2].rpartition(":")[0]
            voters = dict(v.split("@") for v in props["controller.quorum.voters"].split(","))
            assert voters[props["node.id"]] == f"{host}:9093", name
        assert sorted(int(p["node.id"]) for p in seen.values()) == list(range(1, NODES + 1))
        assert len({p["controller.quorum.voters"] for p in seen.values()}) == 1
        assert len({e["KAFKA_CLUSTER_ID"] for e in mine.values()}) == 1
    assert props["default.replication.factor"] == str(CLUSTER["topic_replication"])
    assert props["min.insync.replicas"] == str(CLUSTER["topic_min_insync"])


def test_kafka_start_script_refuses_a_node_outside_the_quorum(compose, tmp_path) -> None:
    secrets = tmp_path / "secrets"
    ensure_secrets(secrets)
    env = dict(compose["services"]["kafka-1"]["environment"])
    cases = {
        "not-a-voter": {**env, "KAFKA_NODE_ID": "4"},
        "no-ordinal": {**{k: v for k, v in env.items() if k != "KAFKA_NODE_ID"}, "POD_NAME": "x"},
        "no-cluster-id": {k: v for k, v in env.items() if k != "KAFKA_CLUSTER_ID"},
    }
    for name, case in cases.items():
        _, log, done = _run_kafka_script(tmp_path / name, secrets, case, ("format",))
        assert done.returncode != 0 and not log, name
    # one voter and no id: a single broker formats with a random cluster id
    single = {
        **env,
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@kafka-1:9093",
        "KAFKA_CLUSTER_ID": "",
    }
    props, log, done = _run_kafka_script(tmp_path / "single", secrets, single, ("format",))
    assert done.returncode == 0, done.stderr
    assert log[log.index("--cluster-id") + 1] == "q1Sh-9_ISia_zwGINzRvyQ"
    assert props["default.replication.factor"] == props["min.insync.replicas"] == "1"


def test_kafka_health_checks_log_in_with_the_file_the_script_writes(compose, k8s) -> None:
    text = KAFKA_SCRIPT.read_text()
    default_conf = re.search(r"conf=\$\{BROKER_CONF:-([^}]+)\}", text)[1]
    client_file = f"{default_conf}/admin.properties"
    assert 'cat >"$conf/admin.properties"' in text
    for svc in _kafka_services(compose).values():
        health = svc["healthcheck"]["test"][1]
        assert f"--command-config {client_file}" in health
    (broker,) = _kafka_pod(k8s)["containers"]
    probe = broker["readinessProbe"]["exec"]["command"]
    assert probe[probe.index("--command-config") + 1] == client_file


# -- Cassandra ---------------------------------------------------------------------------------


def _cassandra_scripts(compose: dict, k8s: list[dict]) -> dict[str, str]:
    ((_, pod),) = [(n, p) for n, p in _pods(k8s) if n == "cassandra"]
    (c,) = pod["containers"]
    scripts = {
        name: _shell_script(svc["entrypoint"]) for name, svc in _cassandra_services(compose).items()
    }
    assert len(scripts) == NODES and len(set(scripts.values())) == 1, "one entrypoint for all"
    return {"compose": scripts["cassandra-1"], "k8s": _shell_script(c["command"])}


CASSANDRA_5_YAML = """\
# - AllowAllAuthenticator performs no checks - set it to disable authentication.
authenticator:
  class_name : org.apache.cassandra.auth.AllowAllAuthenticator
internode_authenticator: org.apache.cassandra.auth.AllowAllInternodeAuthenticator
authorizer:
  class_name: AllowAllAuthorizer
role_manager: CassandraRoleManager
network_authorizer: AllowAllNetworkAuthorizer
"""


@pytest.mark.parametrize(
    "conf, starts",
    [
        (CASSANDRA_5_YAML, True),
        ("authenticator: AllowAllAuthenticator\nauthorizer: AllowAllAuthorizer\n", True),
        ("# authenticator: AllowAllAuthenticator\n", False),  # not edited: never start open
    ],
)
def test_cassandra_starts_with_logins_and_permissions_or_not_at_all(
    compose, k8s, tmp_path, conf, starts
) -> None:
    scripts = _cassandra_scripts(compose, k8s)
    assert scripts["compose"] == scripts["k8s"], "the same entrypoint in compose and k8s"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    entry = bin_dir / "docker-entrypoint.sh"
    entry.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/started\n')
    entry.chmod(0o755)
    (tmp_path / "cassandra.yaml").write_text(conf)
    env = {**os.environ, "CASSANDRA_CONF": str(tmp_path), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = subprocess.run(["sh", "-ec", scripts["compose"]], env=env, capture_output=True)
    assert (done.returncode == 0) == starts == (tmp_path / "started").exists()
    if starts:
        assert (tmp_path / "started").read_text().split() == ["cassandra", "-f"]
        edited = (tmp_path / "cassandra.yaml").read_text()
        active = yaml.safe_load(edited)
        assert "PasswordAuthenticator" in str(active["authenticator"])
        assert "CassandraAuthorizer" in str(active["authorizer"])
        unrelated = [line for line in conf.splitlines() if "AllowAllAuth" not in line]
        assert unrelated == [line for line in edited.splitlines() if line in unrelated]


def test_cassandra_health_checks_need_no_password(compose, k8s) -> None:
    """A fresh node has only the default superuser, locked by `mint security apply`: a check
    that logs in would fail before the roles exist or after the lock."""
    ((_, pod),) = [(n, p) for n, p in _pods(k8s) if n == "cassandra"]
    checks = [" ".join(s["healthcheck"]["test"]) for s in _cassandra_services(compose).values()]
    checks.append(" ".join(pod["containers"][0]["readinessProbe"]["exec"]["command"]))
    assert len(checks) == NODES + 1
    for check in checks:
        assert "nodetool" in check and "cqlsh" not in check


# -- no passwords in the manifests -------------------------------------------------------------


def _manifest_texts() -> dict[str, str]:
    paths = [DEPLOY / "docker-compose.yml", KAFKA_SCRIPT, *sorted((DEPLOY / "k8s").glob("*.yaml"))]
    return {p.name: p.read_text() for p in paths}


def test_no_password_literal_in_any_manifest(compose, k8s) -> None:
    for name, text in _manifest_texts().items():
        assert not re.search(r"\b[0-9a-f]{32}\b", text), f"{name}: a generated password?"
        for value in re.findall(r"password[ \t]*[=:][ \t]*\\?\"?([^\"\s;,\]\\]*)", text, re.I):
            assert value.startswith("$"), f"{name}: password {value!r} is not read from a file"
        assert not re.search(r"(cqlsh|nodetool)[^\n]*\s(-p|-pw|--password)\b", text), name
        assert not re.search(r"MINT_(KAFKA|CASSANDRA)_PASSWORD\b(?!_FILE)\s*:", text), name
    envs = [svc.get("environment", {}) for svc in compose["services"].values()]
    envs += [_env(c) for _, pod in _pods(k8s) for c in _containers(pod)]
    for env in envs:
        assert not [k for k in env if k.upper().endswith(("PASSWORD", "SECRET"))], env
    for d in k8s:
        assert d["kind"] != "Secret" or not (d.get("data") or d.get("stringData"))


# -- metrics: every worker scraped, the dashboard asks for defined metrics ---------------------

PROMETHEUS = DEPLOY / "prometheus"
GRAFANA = DEPLOY / "grafana"
DASHBOARD = GRAFANA / "mint-dashboard.json"
METRIC_NAME = re.compile(r"\bmint_[a-z0-9_]+")


def _metric_modules() -> list[str]:
    """Every module that defines MinT metrics: streams' and each worker package's metrics.py."""
    found = [f"workers.{p.parent.name}.metrics" for p in sorted(ROOT.glob("workers/*/metrics.py"))]
    return ["streams.health", "streams.metrics", *found]


def _defined_metrics(gateway: bool = True) -> dict[str, tuple[str, set[str]]]:
    """family name -> (type, the sample names Prometheus stores for it), of every mint_ metric:
    the workers' (the process registry) and the gateway's (a registry per instance)."""
    import importlib

    from prometheus_client import REGISTRY

    for module in _metric_modules():
        importlib.import_module(module)
    families = list(REGISTRY.collect())
    if gateway:
        from gateway.metrics import GatewayMetrics

        families += GatewayMetrics().registry.collect()
    suffixes = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
    return {
        m.name: (m.type, {m.name + s for s in suffixes[m.type]})
        for m in families
        if m.name.startswith("mint_")
    }


def _metrics_port(argv: list[str], settings: MintSettings) -> int | None:
    """Where a container serves /metrics: a worker on MINT_METRICS_PORT, the gateway beside its
    API on its own --port; None: it serves none (one-shot set-up)."""
    if argv[:2] == ["mint", "worker"]:
        return settings.metrics_port
    if argv[:2] == ["mint", "gateway"]:
        return int(argv[argv.index("--port") + 1])
    return None


def _exprs(dashboard: dict) -> list[str]:
    out = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            out.append(var["query"]["query"] if isinstance(var["query"], dict) else var["query"])
    return out


def test_dashboard_queries_only_metrics_the_code_defines_and_charts_them_all() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    defined = _defined_metrics()
    samples = set().union(*(names for _, names in defined.values()))
    used = {name for expr in _exprs(dashboard) for name in METRIC_NAME.findall(expr)}
    assert used, "the dashboard queries no mint_ metric"
    assert used <= samples, f"queried but defined nowhere: {sorted(used - samples)}"
    charted = {family for family, (_, names) in defined.items() if names & used}
    assert charted == set(defined), f"defined but not on the dashboard: {set(defined) - charted}"
    for expr in _exprs(dashboard):  # counters are read as rates, never as raw totals
        for name in re.findall(r"\b(?:mint_|vllm:)[a-z0-9_]+_total\b", expr):
            assert re.search(rf"(rate|increase)\({name}\b", expr), expr
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel.get("targets", []):  # a worker's metrics follow the job selector
            if "mint_gateway_" not in target["expr"]:
                worker_metrics = len(re.findall(r"\b(?:mint_|vllm:)", target["expr"]))
                assert worker_metrics == target["expr"].count('job=~"$job"'), target["expr"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


VLLM_METRIC = re.compile(r"\bvllm:[a-z0-9_]+")


def test_dashboard_queries_vllm_metrics_vllm_defines() -> None:
    """The generation row reads the ``vllm:*`` metrics vLLM's PrometheusStatLogger exports
    (read from its source: importing vLLM is slow), as samples of the right type."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed")
    source = (Path(spec.submodule_search_locations[0]) / "v1/metrics/loggers.py").read_text()
    kinds = {  # vllm:name -> counter / gauge / histogram, from `self._<kind>_cls(name="vllm:…"`
        name: kind
        for kind, name in re.findall(
            r"_(counter|gauge|histogram)_cls\(\s*name=\"(vllm:[a-z0-9_]+)\"", source
        )
    }
    suffixes = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
    samples = {name + s for name, kind in kinds.items() for s in suffixes[kind]}
    used = {n for e in _exprs(json.loads(DASHBOARD.read_text())) for n in VLLM_METRIC.findall(e)}
    assert "vllm:time_to_first_token_seconds_bucket" in used, "no generation row"
    assert used <= samples, f"not exported by this vLLM: {sorted(used - samples)}"


def test_every_metric_is_documented() -> None:
    workers = _defined_metrics(gateway=False)
    docs = {
        DEPLOY / "README.md": workers,
        ROOT / "gateway" / "README.md": {
            k: v for k, v in _defined_metrics().items() if k not in workers
        },
    }
    for path, metrics in docs.items():
        text = path.read_text()
        for family, (kind, _) in metrics.items():
            name = f"{family}_total" if kind == "counter" else family
            assert f"`{name}" in text, f"{path.relative_to(ROOT)} does not list {name}"


def test_compose_scrapes_every_worker_on_its_metrics_port(compose, monkeypatch) -> None:
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    jobs = {
        name: sd["port"]
        for job in config["scrape_configs"]
        for sd in job.get("dns_sd_configs", [])
        for name in sd["names"]
    }
    served = {}
    for name, svc in _mint_services(compose).items():
        settings = _settings_from(svc["environment"], monkeypatch)
        ports = {_metrics_port(argv, settings) for argv in _mint_commands(svc["command"])} - {None}
        if ports:
            (served[name],) = ports
    workers = {
        n
        for n, s in _mint_services(compose).items()
        if _deployed_workers(_mint_commands(s["command"]))
    }
    assert workers and workers < set(served), "every worker serves metrics, and the gateway"
    assert set(served) == set(jobs), "a scrape job per service that serves metrics, no other"
    for name, port in served.items():
        assert jobs[name] == port, f"{name} serves metrics on {port}, scraped on {jobs[name]}"
    prometheus, grafana = compose["services"]["prometheus"], compose["services"]["grafana"]
    mounts = dict(v.split(":")[:2] for v in prometheus["volumes"] if v.startswith("./"))
    assert (DEPLOY / "prometheus/prometheus.yml").resolve() == (
        DEPLOY / next(k for k, v in mounts.items() if v == "/etc/prometheus/prometheus.yml")
    ).resolve()
    assert f"--config.file={mounts['./prometheus/prometheus.yml']}" in prometheus["command"]
    grafana_mounts = dict(v.split(":")[:2] for v in grafana["volumes"] if v.startswith("./"))
    provisioning = grafana_mounts["./grafana/provisioning"]
    assert provisioning == "/etc/grafana/provisioning"
    dashboards = yaml.safe_load((GRAFANA / "provisioning/dashboards/mint.yml").read_text())
    (provider,) = dashboards["providers"]
    assert grafana_mounts["./grafana/mint-dashboard.json"] == (
        f"{provider['options']['path']}/{DASHBOARD.name}"
    )
    sources = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
    (source,) = sources["datasources"]
    port = prometheus["ports"][0].split(":")[-1]
    assert source["type"] == "prometheus" and source["url"] == f"http://prometheus:{port}"


def test_k8s_every_worker_pod_is_annotated_for_scraping_on_its_metrics_port(k8s) -> None:
    cm = _configmap(k8s, "mint-settings")
    settings = MintSettings(metrics_port=int(cm["data"]["MINT_METRICS_PORT"]))
    workers = gateways = 0
    for d in k8s:
        if d["kind"] != "Deployment":
            continue
        template = d["spec"]["template"]
        for c in template["spec"]["containers"]:
            port = _metrics_port(c.get("command", []), settings)
            if port is None:
                continue
            where = d["metadata"]["name"]
            assert "MINT_METRICS_PORT" not in _env(c), f"{where}: the ConfigMap's port"
            notes = template["metadata"].get("annotations", {})
            assert notes.get("prometheus.io/scrape") == "true", where
            assert notes.get("prometheus.io/port") == str(port), where
            assert notes.get("prometheus.io/path", "/metrics") == "/metrics", where
            assert port in [p["containerPort"] for p in c.get("ports", [])], where
            if _deployed_workers([c["command"]]):
                workers += 1
                ports = {p["name"]: p["containerPort"] for p in c["ports"]}
                assert ports.get("metrics") == port, where
                probe = c["readinessProbe"]["httpGet"]
                assert probe["path"] == "/readyz" and probe["port"] == "metrics", where
            else:
                gateways += 1
    assert workers == len(_workers()) and gateways == 1
    # Prometheus: the scrape config is deploy/prometheus/prometheus-k8s.yml, keeping the pods so
    # annotated, on the annotated port, and may list the pods of its namespace.
    text = (PROMETHEUS / "prometheus-k8s.yml").read_text()
    assert _configmap(k8s, "prometheus-config")["data"] == {"prometheus.yml": text}
    (job,) = yaml.safe_load(text)["scrape_configs"]
    (sd,) = job["kubernetes_sd_configs"]
    assert sd["role"] == "pod" and sd["namespaces"] == {"own_namespace": True}
    relabel = {tuple(r["source_labels"]): r for r in job["relabel_configs"]}
    keep = relabel[("__meta_kubernetes_pod_annotation_prometheus_io_scrape",)]
    assert keep["action"] == "keep" and keep["regex"] == "true"
    address = relabel[
        ("__meta_kubernetes_pod_ip", "__meta_kubernetes_pod_annotation_prometheus_io_port")
    ]
    assert address["target_label"] == "__address__"
    assert re.fullmatch(address["regex"], f"10.0.0.7;{settings.metrics_port}")
    (deployment,) = [
        d for d in k8s if d["kind"] == "Deployment" and d["metadata"]["name"] == "prometheus"
    ]
    pod = deployment["spec"]["template"]["spec"]
    (role,) = [d for d in k8s if d["kind"] == "Role" and d["metadata"]["name"] == "prometheus"]
    (binding,) = [d for d in k8s if d["kind"] == "RoleBinding"]
    assert binding["roleRef"]["name"] == "prometheus"
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"]
    assert {"list", "watch"} <= set(role["rules"][0]["verbs"])
    assert "pods" in role["rules"][0]["resources"]
    (c,) = pod["containers"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in c["args"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/etc/prometheus"]
    assert volumes[mount["name"]]["configMap"]["name"] == "prometheus-config"


# -- three of each: one node down is not an outage ----------------------------------------------


def _replication(text: str) -> dict:
    return ast.literal_eval(text)


def _mint_envs(compose: dict, k8s: list[dict]) -> dict[str, dict[str, str]]:
    """Every MinT container's MINT_* environment: compose services and k8s containers."""
    envs = {name: svc["environment"] for name, svc in _mint_services(compose).items()}
    cm = _configmap(k8s, "mint-settings")
    for name, _, c in _mint_containers(k8s):
        envs[f"k8s {name}/{c['name']}"] = {**cm["data"], **_env(c)}
    return envs


def test_compose_runs_three_brokers_and_three_cassandra_nodes(compose) -> None:
    brokers, nodes = _kafka_services(compose), _cassandra_services(compose)
    assert sorted(brokers) == [f"kafka-{i}" for i in range(1, NODES + 1)]
    assert sorted(nodes) == [f"cassandra-{i}" for i in range(1, NODES + 1)]
    for name, svc in {**brokers, **nodes}.items():
        assert "profiles" not in svc, f"{name} runs by default"
        assert "scale" not in svc and "replicas" not in svc.get("deploy", {}), name
    # brokers: ids 1-3, one quorum of all three by service name, one cluster id, own volumes
    envs = {name: svc["environment"] for name, svc in brokers.items()}
    assert [envs[n]["KAFKA_NODE_ID"] for n in sorted(envs)] == ["1", "2", "3"]
    voters = {e["KAFKA_CONTROLLER_QUORUM_VOTERS"] for e in envs.values()}
    assert voters == {",".join(f"{e['KAFKA_NODE_ID']}@{n}:9093" for n, e in sorted(envs.items()))}
    assert len({e["KAFKA_CLUSTER_ID"] for e in envs.values()}) == 1
    for name, svc in brokers.items():  # started together: a quorum needs two of three
        assert set(svc["depends_on"]) == {"mint-secrets"}, name
    # Cassandra: every node a seed, one datacenter through the gossiping snitch, one cluster
    envs = {name: svc["environment"] for name, svc in nodes.items()}
    assert len({json.dumps(e, sort_keys=True) for e in envs.values()}) == 1, "one node config"
    env = envs["cassandra-1"]
    assert env["CASSANDRA_SEEDS"].split(",") == sorted(nodes)
    assert env["CASSANDRA_ENDPOINT_SNITCH"] == "GossipingPropertyFileSnitch"
    assert env["CASSANDRA_DC"] == "datacenter1" and env["CASSANDRA_CLUSTER_NAME"]
    # one at a time: each node waits until the one before serves CQL (its healthcheck), so it
    # takes its tokens knowing the ring
    order = sorted(nodes)
    assert "depends_on" not in nodes[order[0]]
    for before, after in itertools.pairwise(order):
        assert nodes[after]["depends_on"] == {before: {"condition": "service_healthy"}}
        assert "statusbinary" in " ".join(nodes[before]["healthcheck"]["test"])
    # each node its own data volume; the set-up waits for all six
    data = [
        v.split(":")[0]
        for svc in {**brokers, **nodes}.values()
        for v in svc["volumes"]
        if isinstance(v, str) and v.split(":")[1] in ("/var/lib/kafka/data", "/var/lib/cassandra")
    ]
    assert len(data) == 2 * NODES == len(set(data)) and set(data) <= set(compose["volumes"])
    for name in ("mint-init", "mint-check"):
        wait = compose["services"][name]["depends_on"]
        assert wait == {n: {"condition": "service_healthy"} for n in {**brokers, **nodes}}, name


def _anti_affinity(pod: dict) -> dict:
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    return term["podAffinityTerm"]


def test_k8s_runs_three_of_each_as_statefulsets(k8s) -> None:
    services = {d["metadata"]["name"]: d for d in k8s if d["kind"] == "Service"}
    budgets = {d["metadata"]["name"]: d for d in k8s if d["kind"] == "PodDisruptionBudget"}
    for name in ("kafka", "cassandra"):
        sts = _statefulset(k8s, name)
        spec, labels = sts["spec"], sts["spec"]["template"]["metadata"]["labels"]
        assert spec["replicas"] == NODES, name
        # stable names: <pod>.<headless service>, resolvable before the pods are ready
        service = services[spec["serviceName"]]["spec"]
        assert service["clusterIP"] == "None" and service["publishNotReadyAddresses"] is True
        assert service["selector"] == labels == spec["selector"]["matchLabels"]
        # one pod at a time for voluntary disruptions; spread over machines where there are some
        budget = budgets[name]
        assert budget["apiVersion"] == "policy/v1" and budget["spec"]["maxUnavailable"] == 1
        assert budget["spec"]["selector"]["matchLabels"] == labels
        term = _anti_affinity(spec["template"]["spec"])
        assert term["labelSelector"]["matchLabels"] == labels
        assert term["topologyKey"] == "kubernetes.io/hostname"
    # Kafka: all pods at once (a quorum needs two), the voters built from the pods' DNS names
    assert _statefulset(k8s, "kafka")["spec"]["podManagementPolicy"] == "Parallel"
    (broker,) = _kafka_pod(k8s)["containers"]
    pods = _pod_names(k8s, "kafka")
    voters = _env(broker)["KAFKA_CONTROLLER_QUORUM_VOTERS"]
    assert voters == ",".join(f"{i + 1}@{pod}:9093" for i, pod in enumerate(pods))
    assert _env_from_fields(broker) == {"POD_NAME": "metadata.name"}
    for pod in pods:
        advertised = _k8s_kafka_env(broker, pod.split(".")[0])["KAFKA_ADVERTISED_LISTENERS"]
        assert advertised == f"SASL_PLAINTEXT://{pod}:9092"
    # Cassandra: one at a time (OrderedReady: each waits until the one before is ready), every
    # pod a seed, one datacenter
    assert _statefulset(k8s, "cassandra")["spec"]["podManagementPolicy"] == "OrderedReady"
    ((_, pod),) = [(n, p) for n, p in _pods(k8s) if n == "cassandra"]
    env = _env(pod["containers"][0])
    assert env["CASSANDRA_SEEDS"].split(",") == _pod_names(k8s, "cassandra")
    assert env["CASSANDRA_ENDPOINT_SNITCH"] == "GossipingPropertyFileSnitch"
    assert env["CASSANDRA_DC"] == "datacenter1"


def test_every_mint_container_names_every_node_with_the_cluster_settings(
    compose, k8s, monkeypatch
) -> None:
    """Each MinT container lists all three brokers and all three Cassandra nodes (any one may
    be down when it starts) and has the local cluster's replication settings: topics RF 3 with
    min.insync.replicas 2, the keyspace NetworkTopologyStrategy RF 3 in the nodes' datacenter."""
    brokers = {
        "compose": [f"{n}:9092" for n in sorted(_kafka_services(compose))],
        "k8s": [f"{p}:9092" for p in _pod_names(k8s, "kafka")],
    }
    nodes = {"compose": sorted(_cassandra_services(compose)), "k8s": _pod_names(k8s, "cassandra")}
    dcs = {
        "compose": {
            s["environment"]["CASSANDRA_DC"] for s in _cassandra_services(compose).values()
        },
        "k8s": {
            _env(c)["CASSANDRA_DC"]
            for c in _statefulset(k8s, "cassandra")["spec"]["template"]["spec"]["containers"]
        },
    }
    envs = _mint_envs(compose, k8s)
    assert len(envs) > 10
    for where, env in envs.items():
        deployment = "k8s" if where.startswith("k8s ") else "compose"
        s = _settings_from(env, monkeypatch)
        assert s.kafka_bootstrap.split(",") == brokers[deployment], where
        assert s.cassandra_contact_points == nodes[deployment], where
        assert len(brokers[deployment]) == len(nodes[deployment]) == NODES
        assert s.topic_replication == CLUSTER["topic_replication"] == 3, where
        assert s.topic_min_insync == CLUSTER["topic_min_insync"] == 2, where
        (dc,) = dcs[deployment]
        replication = _replication(s.keyspace_replication)
        assert replication == _replication(CLUSTER["keyspace_replication"]), where
        assert replication == {"class": "NetworkTopologyStrategy", dc: 3}, where


def _bytes(size: str) -> int:
    """Docker's 1g / 512m, Kubernetes' 1Gi, the JVM's 1G / 512m."""
    m = re.fullmatch(r"(\d+)([kKmMgG])i?[bB]?", size.strip())
    assert m, size
    return int(m[1]) * 1024 ** " kmg".index(m[2].lower())


def _heaps(compose: dict) -> dict[str, tuple[int, int]]:
    """Each JVM service: (heap, memory limit) in bytes."""
    out = {}
    for name, svc in _kafka_services(compose).items():
        opts = svc["environment"]["KAFKA_HEAP_OPTS"].split()
        xmx = next(o for o in opts if o.startswith("-Xmx"))[4:]
        assert f"-Xms{xmx}" in opts, f"{name}: the whole heap from the start"
        out[name] = (_bytes(xmx), _bytes(svc["mem_limit"]))
    for name, svc in _cassandra_services(compose).items():
        out[name] = (_bytes(svc["environment"]["MAX_HEAP_SIZE"]), _bytes(svc["mem_limit"]))
    return out


def test_the_six_jvms_fit_a_24_gb_machine_beside_the_workers(compose, k8s) -> None:
    """The local launcher's heaps (MINT_KAFKA_HEAP_MB, MINT_CASSANDRA_HEAP_MB defaults), each in
    a container with room off the heap; the six take at most 9 GiB of a 24 GB machine."""
    defaults = MintSettings()
    heaps = _heaps(compose)
    assert len(heaps) == 2 * NODES
    for name, (heap, limit) in heaps.items():
        want = defaults.kafka_heap_mb if name.startswith("kafka") else defaults.cassandra_heap_mb
        assert heap == want * 2**20, name
        assert limit >= 2 * heap, f"{name}: page cache, off-heap buffers and metaspace"
    assert sum(limit for _, limit in heaps.values()) <= 9 * 2**30
    # Kubernetes: the same heaps and limits, requested in full (a JVM never gives its heap back)
    for name, compose_name in (("kafka", "kafka-1"), ("cassandra", "cassandra-1")):
        ((_, pod),) = [(n, p) for n, p in _pods(k8s) if n == name]
        (c,) = pod["containers"]
        resources = c["resources"]
        assert resources["requests"]["memory"] == resources["limits"]["memory"], name
        assert _bytes(resources["limits"]["memory"]) == heaps[compose_name][1], name
        env = _env(c)
        heap = env.get("MAX_HEAP_SIZE") or env["KAFKA_HEAP_OPTS"].split("-Xmx")[1]
        assert _bytes(heap) == heaps[compose_name][0], name
