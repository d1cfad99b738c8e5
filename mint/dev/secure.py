"""``mint dev up --secure``: the local Kafka and Cassandra with credentials and per-service rights.

Its own state folder (``<state_dir>/secure``: a broker formatted without SCRAM users cannot gain
them), the same ports. Passwords are generated once into ``secure/secrets/`` (mint.security) and
reach processes only as files; ``secure/env/<principal>.env`` holds the settings a process of
that principal needs (``set -a; . .mint/secure/env/operator.env; set +a``).

- Kafka: SASL/SCRAM-SHA-256, StandardAuthorizer, ACLs from streams.acls (one principal per
  worker kind, ``upstream``, ``downstream``, ``operator``; ``admin`` is the super user). A
  tenant's own reader, ``downstream-<tenant>``, is added later by ``mint security tenant T
  --dir .mint/secure/secrets`` (its login through the admin API, no reformat);
  ``secure_settings(base, "downstream-<tenant>")`` then connects as it.
- Cassandra: PasswordAuthenticator and CassandraAuthorizer; a role per service
  (catalog.roles); the default ``cassandra`` superuser gets a random password and cannot log in.
"""

from __future__ import annotations

from pathlib import Path

from catalog.roles import ROLES
from mint import security
from schemas.settings import MintSettings
from streams.acls import ALL_PRINCIPALS


def secure_state(base: MintSettings) -> Path:
    return base.state_dir if base.state_dir.name == "secure" else base.state_dir / "secure"


def secure_settings(base: MintSettings, principal: str = "admin") -> MintSettings:
    """The settings of ``principal`` against the secure local services."""
    state = secure_state(base)
    secrets = state / "secrets"
    role = principal if principal in ROLES or principal == "admin" else ""
    return base.model_copy(
        update={
            "state_dir": state,
            "kafka_security_protocol": "SASL_PLAINTEXT",
            "kafka_username": principal,
            "kafka_password_file": secrets / f"kafka-{principal}",
            "cassandra_username": role,
            "cassandra_password_file": secrets / f"cassandra-{role}" if role else None,
        }
    )


def ensure_secrets(state: Path) -> dict[str, str]:
    security.ensure_secrets(state / "secrets")
    return security.read_secrets(state / "secrets")


def scram_format_args(state: Path) -> list[str]:
    """``kafka-storage format`` arguments creating every principal's SCRAM credentials."""
    pw = ensure_secrets(state)
    out = []
    for principal in ALL_PRINCIPALS:
        out += [
            "--add-scram",
            f"SCRAM-SHA-256=[name={principal},password={pw[f'kafka-{principal}']}]",
        ]
    return out


def env_for(settings: MintSettings, principal: str) -> dict[str, str]:
    """MINT_* variables of a process running as ``principal``."""
    s = secure_settings(settings, principal)
    env = {
        "MINT_STATE_DIR": str(s.state_dir),
        "MINT_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "MINT_KAFKA_USERNAME": principal,
        "MINT_KAFKA_PASSWORD_FILE": str(s.kafka_password_file),
    }
    if s.cassandra_username:
        env["MINT_CASSANDRA_USERNAME"] = s.cassandra_username
        env["MINT_CASSANDRA_PASSWORD_FILE"] = str(s.cassandra_password_file)
    return env


def setup(settings: MintSettings) -> dict[str, int]:
    """After the secure services answer: ACLs and roles, then one env file per principal."""
    admin = secure_settings(settings, "admin")
    folder = admin.state_dir / "secrets"
    security.ensure_secrets(folder)
    applied = security.apply(admin, folder)
    env_dir = admin.state_dir / "env"
    env_dir.mkdir(exist_ok=True)
    for principal in ALL_PRINCIPALS:
        lines = [f"{k}={v}" for k, v in env_for(settings, principal).items()]
        (env_dir / f"{principal}.env").write_text("\n".join(lines) + "\n")
    return applied
