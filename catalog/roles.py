"""Cassandra roles: one login per service, with only the rights it needs, table by table.

Applied as a superuser by ``mint security apply`` (and ``mint dev up --secure``) under
PasswordAuthenticator + CassandraAuthorizer. A role reads the tables of :data:`RIGHTS` and
modifies only its own: the trainer registers revisions, the controller moves aliases and keeps
its state, the projector applies the log to both; only ``operator`` (and ``admin``) write API
keys and tenants' rates, and the gateway reads keys, rates, policies and aliases and writes only
the Tinker API's own rows. So a compromised worker cannot mint itself an API key.

Grants name tables, so they are made on the deployment's keyspace (``settings.keyspace``) after
:func:`apply` has migrated it (as ``admin``). A migration that adds a table must give it a place
in :data:`RIGHTS` (tests/unit/test_acls.py checks that every migrated table has one); re-run
``mint security apply`` after an upgrade. Grants of these roles that are not in the plan any
more (e.g. the ``ON ALL KEYSPACES`` grants of earlier versions) are revoked; grants on other
keyspaces are left alone.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import Cluster, NoHostAvailable

from catalog.tables import ACCESS, CATALOG, MIGRATIONS, STATE, TABLES, TINKER
from schemas.settings import MintSettings


@dataclass(frozen=True)
class Rights:
    reads: tuple[str, ...]
    modifies: tuple[str, ...] = ()
    schema: bool = False  # runs migrations: creates the keyspace and tables, alters its own


RIGHTS: dict[str, Rights] = {
    # `mint worker projector --migrate`: CREATE KEYSPACE IF NOT EXISTS needs CREATE on all
    # keyspaces even when it exists; a table a role creates is that role's.
    "projector": Rights(reads=CATALOG + MIGRATIONS, modifies=CATALOG + MIGRATIONS, schema=True),
    # serving commands: aliases moved by compare-and-set, their history; its decisions' state
    "controller": Rights(
        reads=CATALOG + STATE,
        modifies=(
            "aliases",
            "alias_history",
            "worker_state",
            "canary_history",
            "canary_answers",
        ),
    ),
    # a policy's first update creates it; exports register revisions (by digest, by event id)
    "trainer": Rights(
        reads=CATALOG,
        modifies=("tenants", "policies", "revisions", "revisions_by_digest", "applied_events"),
    ),
    # serving, rollout and evaluation only read: the catalog, and the suites the controller
    # keeps in worker_state (controller.configs: the evaluator refuses other suites)
    "engine": Rights(reads=CATALOG + STATE),
    # keys and tenants' rates; a model's policy, digest and aliases (gateway.directory); the
    # Tinker API's shared models, futures, calls and states (catalog.tinker_calls), its own
    "gateway": Rights(
        reads=(
            "api_keys",
            "tenant_access",
            "policies",
            "revisions",
            "revisions_by_digest",
            "aliases",
        )
        + TINKER,
        modifies=TINKER,
    ),
    # reads everything; key management (`mint tenants`, `mint keys`) writes the access rows
    "operator": Rights(reads=TABLES, modifies=ACCESS),
}
# The kinds of permission each role holds (where: RIGHTS).
ROLES: dict[str, tuple[str, ...]] = {
    role: (
        (("CREATE", "ALTER") if r.schema else ())
        + ("SELECT",)
        + (("MODIFY",) if r.modifies else ())
    )
    for role, r in RIGHTS.items()
}
ADMIN_ROLE = "admin"
DEFAULT_SUPERUSER = ("cassandra", "cassandra")  # what a fresh node accepts until it is locked


def grants(keyspace: str) -> dict[str, set[tuple[str, str]]]:
    """Per role, the (permission, resource) pairs it should hold, resources in the form
    Cassandra lists them (``<table ks.t>``, ``<all keyspaces>``)."""
    out: dict[str, set[tuple[str, str]]] = {}
    for role, r in RIGHTS.items():
        # every role reads which migrations ran: a worker refuses a schema behind its build
        want = {("SELECT", f"<table {keyspace}.{t}>") for t in (*r.reads, *MIGRATIONS)}
        want |= {("MODIFY", f"<table {keyspace}.{t}>") for t in r.modifies}
        if r.schema:
            want.add(("CREATE", "<all keyspaces>"))
            want |= {("ALTER", f"<table {keyspace}.{t}>") for t in r.modifies}
        out[role] = want
    return out


def _cql_resource(resource: str) -> str:
    """``<table ks.t>`` → ``TABLE ks.t`` (what GRANT and REVOKE take)."""
    inner = resource.strip("<>")
    if inner == "all keyspaces":
        return "ALL KEYSPACES"
    kind, _, name = inner.partition(" ")
    return f"{kind.upper()} {name}"


def statements(
    role: str, want: set[tuple[str, str]], have: set[tuple[str, str]], keyspace: str
) -> list[str]:
    """GRANT what ``role`` lacks, then REVOKE what it holds on this deployment beyond ``want``
    (in that order: a running worker never loses a right it keeps). Grants on other keyspaces
    (another deployment's roles of the same names) are not touched."""

    def ours(resource: str) -> bool:
        return resource in ("<all keyspaces>", f"<keyspace {keyspace}>") or resource.startswith(
            f"<table {keyspace}."
        )

    out = [f"GRANT {perm} ON {_cql_resource(res)} TO {role}" for perm, res in sorted(want - have)]
    out += [
        f"REVOKE {perm} ON {_cql_resource(res)} FROM {role}"
        for perm, res in sorted(have - want)
        if ours(res)
    ]
    return out


def _session(settings: MintSettings, user: str, password: str):
    cluster = Cluster(
        settings.cassandra_contact_points,
        port=settings.cassandra_port,
        protocol_version=5,
        connect_timeout=10,
        auth_provider=PlainTextAuthProvider(user, password),
    )
    return cluster, cluster.connect()


def apply(settings: MintSettings, passwords: dict[str, str], keyspace: str | None = None) -> int:
    """Create the admin role and every service role (idempotent), lock the default
    ``cassandra`` superuser, migrate ``keyspace`` (default: the settings') and bring every
    role's grants on it to :data:`RIGHTS`. ``passwords`` maps a role to its password and must
    hold ``admin`` and every role of ROLES. Returns the number of roles."""
    from catalog.migrate import migrate

    missing = [r for r in (ADMIN_ROLE, *ROLES) if not passwords.get(r)]
    if missing:
        raise ValueError(
            f"no password for Cassandra role(s) {', '.join(missing)}: create the "
            "secret files with `mint security secrets`"
        )
    keyspace = keyspace or settings.keyspace
    try:  # a fresh node: the default superuser, locked below
        cluster, session = _session(settings, *DEFAULT_SUPERUSER)
    except NoHostAvailable:  # applied before: our admin
        cluster, session = _session(settings, ADMIN_ROLE, passwords[ADMIN_ROLE])
    try:
        # Logins live in system_auth, one replica by default: on a cluster, the node holding
        # a role's row down would refuse that role's logins. Replicate it as the catalog is
        # (existing clusters also need `nodetool repair system_auth` once per node).
        session.execute(
            f"ALTER KEYSPACE system_auth WITH replication = {settings.keyspace_replication}"
        )
        session.execute(
            f"CREATE ROLE IF NOT EXISTS {ADMIN_ROLE} WITH SUPERUSER = true AND "
            "LOGIN = true AND PASSWORD = %s",
            (passwords[ADMIN_ROLE],),
        )
        for role in ROLES:
            session.execute(
                f"CREATE ROLE IF NOT EXISTS {role} WITH LOGIN = true AND PASSWORD = %s",
                (passwords[role],),
            )
    finally:
        cluster.shutdown()
    cluster, session = _session(settings, ADMIN_ROLE, passwords[ADMIN_ROLE])
    try:  # nobody keeps the well-known password
        session.execute(
            "ALTER ROLE cassandra WITH PASSWORD = %s AND LOGIN = false", (secrets.token_hex(16),)
        )
        migrate(session, keyspace, settings.keyspace_replication)  # grants name its tables
        for role, want in grants(keyspace).items():
            rows = session.execute(f"LIST ALL PERMISSIONS OF {role} NORECURSIVE")
            have = {(r.permission, r.resource) for r in rows}
            for stmt in statements(role, want, have, keyspace):
                session.execute(stmt)
    finally:
        cluster.shutdown()
    return len(ROLES) + 1
