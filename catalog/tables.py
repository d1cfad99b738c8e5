"""The keyspace's tables by kind: one list that the roles' grants, the catalog dump and the
rebuild all read, so a table added by a migration is added here once (tests/unit/test_acls.py
checks that every migrated table is in :data:`TABLES`)."""

from __future__ import annotations

# The catalog (a projection of the log), the controller's state, the gateway's access rows.
CATALOG = (
    "tenants",
    "policies",
    "revisions",
    "revisions_by_digest",
    "aliases",
    "alias_history",
    "applied_events",
    "revision_evaluations",
    "canary_history",
)
# worker_state: stream processors' documents; canary_answers: the controller's join of feedback
# scores to the revision that answered
STATE = ("worker_state", "canary_answers")
ACCESS = ("tenant_access", "api_keys", "api_keys_by_tenant")
# What the Tinker API's gateway instances share (catalog.tinker_calls): written by the gateway
TINKER = ("tinker_models", "tinker_futures", "tinker_calls", "tinker_states")
MIGRATIONS = ("schema_migrations",)
TABLES = CATALOG + STATE + ACCESS + TINKER + MIGRATIONS
