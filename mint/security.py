"""Service credentials: the secret files every deployment shares, and applying the rights.

A secrets folder holds one password per file, ``kafka-<principal>`` (SCRAM) and
``cassandra-<role>``, mode 0600. ``mint security secrets`` creates the missing ones; the Kafka
broker creates its SCRAM users from them when its storage is formatted (``mint dev up --secure``,
the compose file and the Kubernetes manifests do this); ``mint security apply`` then creates the
ACLs (streams.acls) and the Cassandra roles (catalog.roles) as the super users. A process gets
only its own password file (``MINT_KAFKA_PASSWORD_FILE``, ``MINT_CASSANDRA_PASSWORD_FILE``).
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import structlog

from catalog import roles
from schemas.settings import MintSettings
from streams import acls

log = structlog.get_logger()
T = TypeVar("T")

# `mint worker <kind>` (and `mint gateway`) -> its Kafka principal and Cassandra role (one engine
# principal for the three vLLM worker kinds: they share an engine and its topics)
PRINCIPAL_OF = {
    "evaluator": "engine",
    "serving": "engine",
    "rollout": "engine",
    "gateway": "gateway",
}


def secret_names() -> list[str]:
    return [f"kafka-{p}" for p in acls.ALL_PRINCIPALS] + [
        f"cassandra-{r}" for r in (roles.ADMIN_ROLE, *roles.ROLES)
    ]


def ensure_secrets(folder: Path) -> list[str]:
    """Create the missing secret files (random, 0600, folder 0700); returns the new ones."""
    return [name for name in secret_names() if ensure_secret(folder, name)]


def ensure_secret(folder: Path, name: str) -> bool:
    """Create the secret file ``name`` (random, 0600, folder 0700) unless it exists; True if
    it was created. Also for principals made later (``mint security tenant``)."""
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    try:  # created 0600 from the start: never readable by others, not even for a moment
        fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(16))
    return True


def read_secrets(folder: Path) -> dict[str, str]:
    missing = [n for n in secret_names() if not (folder / n).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{folder} lacks {', '.join(missing)}: run `mint security secrets --dir {folder}` first"
        )
    return {n: (folder / n).read_text().strip() for n in secret_names()}


def admin_settings(settings: MintSettings, folder: Path) -> MintSettings:
    """``settings`` as the Kafka super user ``admin`` and the Cassandra ``admin`` role."""
    return settings.model_copy(
        update={
            "kafka_security_protocol": settings.kafka_security_protocol
            if settings.kafka_secure
            else "SASL_PLAINTEXT",
            "kafka_username": acls.ADMIN,
            "kafka_password_file": folder / f"kafka-{acls.ADMIN}",
            "cassandra_username": roles.ADMIN_ROLE,
            "cassandra_password_file": folder / f"cassandra-{roles.ADMIN_ROLE}",
        }
    )


def apply(settings: MintSettings, folder: Path, timeout_s: float = 90.0) -> dict[str, int]:
    """ACLs on the broker and roles in Cassandra, idempotent. Retries while the services answer
    their ports but do not yet accept logins (a fresh node needs a few seconds)."""
    pw = read_secrets(folder)
    admin = admin_settings(settings, folder)
    cassandra_pw = {
        n.removeprefix("cassandra-"): v for n, v in pw.items() if n.startswith("cassandra-")
    }
    n_roles = _retry(lambda: roles.apply(admin, cassandra_pw), "Cassandra roles", timeout_s)
    kafka_pw = {n.removeprefix("kafka-"): v for n, v in pw.items() if n.startswith("kafka-")}
    n_acls = _retry(lambda: acls.apply(admin, kafka_pw), "Kafka ACLs", timeout_s)
    log.info("credentials applied", acls=n_acls, roles=n_roles)
    return {"acls": n_acls, "roles": n_roles}


def _retry(call: Callable[[], T], what: str, timeout_s: float) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except ValueError:
            raise  # our own input is wrong: waiting does not help
        except Exception as e:  # a service that answers its port before it accepts logins
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} failed for {timeout_s:.0f} s: {e}") from e
            time.sleep(1.0)
