"""Cassandra roles: one login per service, with only the rights it needs.

Applied as a superuser by ``mint security apply`` (and ``mint dev up --secure``) under
PasswordAuthenticator + CassandraAuthorizer. Rights are granted on ALL KEYSPACES because
keyspaces are per deployment and per test run; a cluster shared with other applications should
grant them on the deployment's keyspace instead (``keyspace=``).
"""

from __future__ import annotations

import secrets

from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import Cluster, NoHostAvailable

from schemas.settings import MintSettings

ROLES: dict[str, tuple[str, ...]] = {
    "projector": ("CREATE", "ALTER", "SELECT", "MODIFY"),  # it runs the migrations (--migrate)
    "controller": ("SELECT", "MODIFY"),
    "trainer": ("SELECT", "MODIFY"),
    "engine": ("SELECT",),  # serving, rollout and evaluation only read the catalog
    "gateway": ("SELECT",),  # API keys, tenants' rates, policies (`mint keys` runs as admin)
    "operator": ("SELECT",),
}
ADMIN_ROLE = "admin"
DEFAULT_SUPERUSER = ("cassandra", "cassandra")  # what a fresh node accepts until it is locked


def _session(settings: MintSettings, user: str, password: str):
    cluster = Cluster(settings.cassandra_contact_points, port=settings.cassandra_port,
                      protocol_version=5, connect_timeout=10,
                      auth_provider=PlainTextAuthProvider(user, password))  # fmt: skip
    return cluster, cluster.connect()


def apply(settings: MintSettings, passwords: dict[str, str], keyspace: str | None = None) -> int:
    """Create the admin role and every service role (idempotent), then lock the default
    ``cassandra`` superuser. ``passwords`` maps a role to its password and must hold ``admin``
    and every role of ROLES. Returns the number of roles."""
    missing = [r for r in (ADMIN_ROLE, *ROLES) if not passwords.get(r)]
    if missing:
        raise ValueError(f"no password for Cassandra role(s) {', '.join(missing)}: create the "
                         "secret files with `mint security secrets`")  # fmt: skip
    try:  # a fresh node: the default superuser, locked below
        cluster, session = _session(settings, *DEFAULT_SUPERUSER)
    except NoHostAvailable:  # applied before: our admin
        cluster, session = _session(settings, ADMIN_ROLE, passwords[ADMIN_ROLE])
    where = f"KEYSPACE {keyspace}" if keyspace else "ALL KEYSPACES"
    try:
        session.execute(f"CREATE ROLE IF NOT EXISTS {ADMIN_ROLE} WITH SUPERUSER = true AND "
                        "LOGIN = true AND PASSWORD = %s", (passwords[ADMIN_ROLE],))  # fmt: skip
        for role, perms in ROLES.items():
            session.execute(f"CREATE ROLE IF NOT EXISTS {role} WITH LOGIN = true AND "
                            "PASSWORD = %s", (passwords[role],))  # fmt: skip
            for perm in perms:
                session.execute(f"GRANT {perm} ON {where} TO {role}")
    finally:
        cluster.shutdown()
    cluster, session = _session(settings, ADMIN_ROLE, passwords[ADMIN_ROLE])
    try:  # nobody keeps the well-known password
        session.execute("ALTER ROLE cassandra WITH PASSWORD = %s AND LOGIN = false",
                        (secrets.token_hex(16),))  # fmt: skip
    finally:
        cluster.shutdown()
    return len(ROLES) + 1
