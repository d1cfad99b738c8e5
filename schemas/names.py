"""Validated names and references shared by every event: tenants, policies, aliases, digests,
store URIs. Kept strict because these strings become Kafka keys, Cassandra keys and file paths."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, StringConstraints, WithJsonSchema

TENANT_RE = r"^[a-z0-9][a-z0-9-]{0,62}$"
POLICY_RE = r"^[a-z0-9][a-z0-9._-]{0,126}$"
ALIAS_RE = r"^[a-z][a-z0-9-]{0,31}$"
DIGEST_RE = r"^sha256:[0-9a-f]{64}$"
PRODUCER_RE = r"^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,127}$"
EVENT_TYPE_RE = r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$"

TenantName = Annotated[str, StringConstraints(pattern=TENANT_RE)]
PolicyName = Annotated[str, StringConstraints(pattern=POLICY_RE)]
AliasName = Annotated[str, StringConstraints(pattern=ALIAS_RE)]
Digest = Annotated[str, StringConstraints(pattern=DIGEST_RE)]
ProducerName = Annotated[str, StringConstraints(pattern=PRODUCER_RE)]
TagName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
MetricName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")]
ModuleName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.*]{0,255}$")]

# A reward or suite from outside MinT named as ``module:attribute`` (workers.plugins): a dotted
# module path, a colon and one identifier, nothing else (importing it is gated by the operator).
_PLUGIN_REF = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*"
PLUGIN_REF_RE = rf"^{_PLUGIN_REF}$"
# A reward by name (built-in or ``mint.rewards`` entry point) or by ``module:attribute``.
REWARD_RE = rf"^([a-z][a-z0-9_]{{0,63}}|{_PLUGIN_REF})$"
RewardName = Annotated[str, StringConstraints(pattern=REWARD_RE, max_length=128)]

URI_RE = r"^(file|s3)://[^\s\\%?#]+$"
_URI_RE = re.compile(URI_RE)


def _check_store_uri(uri: str) -> str:
    if not _URI_RE.match(uri):
        raise ValueError(
            f"store URI {uri!r} must be file:///… or s3://bucket/… without spaces, backslashes, "
            "'%', '?' or '#'"
        )
    scheme, _, rest = uri.partition("://")
    if scheme == "file":
        if not rest.startswith("/"):
            raise ValueError(f"store URI {uri!r}: file URIs must be absolute (file:///path/…)")
        path = rest[1:]
    else:
        bucket, _, path = rest.partition("/")
        if not bucket:
            raise ValueError(f"store URI {uri!r}: s3 URIs must name a bucket (s3://bucket/key)")
    segments = path.split("/")
    if any(s in ("..", ".") for s in segments):
        raise ValueError(f"store URI {uri!r} contains a '.' or '..' segment (path traversal)")
    if "" in segments[:-1]:
        raise ValueError(f"store URI {uri!r} contains an empty path segment ('//')")
    return uri


StoreUri = Annotated[
    str,
    StringConstraints(max_length=2048),
    AfterValidator(_check_store_uri),
    # The JSON Schema states what a foreign producer can check; the validator says why it failed.
    WithJsonSchema(
        {
            "type": "string",
            "maxLength": 2048,
            "pattern": URI_RE,
            "description": "file:///… or s3://bucket/…; no '.'/'..' segments; the path must "
            "contain /<tenant>/<policy>/ of the envelope",
        }
    ),
]


def policy_id(tenant: str, policy: str) -> str:
    """The Kafka key and catalog id of a policy: ``tenant/policy``."""
    return f"{tenant}/{policy}"


def split_policy_id(value: str) -> tuple[str, str]:
    """``"acme/math-rl"`` → ``("acme", "math-rl")``, validating both names."""
    tenant, sep, policy = value.partition("/")
    if not sep or not re.match(TENANT_RE, tenant) or not re.match(POLICY_RE, policy):
        raise ValueError(
            f"policy id {value!r} must be tenant/policy with tenant matching {TENANT_RE} "
            f"and policy matching {POLICY_RE} (e.g. acme/math-rl)"
        )
    return tenant, policy


def in_namespace(uri: str, tenant: str, policy: str) -> bool:
    """True when ``uri``'s path has the components ``tenant``, ``policy`` in a row with more
    below them. Compared as split components, never as a substring; ``.``/``..`` segments,
    backslashes and percent-encoding are refused before (``StoreUri``). Where the root is known
    the store checks exactly: ``AdapterStore.open(uri, owner=(tenant, policy))``."""
    parts = uri.partition("://")[2].split("/")
    if any(p in (".", "..") or "\\" in p or "%" in p for p in parts):
        return False
    return any(parts[i : i + 2] == [tenant, policy] for i in range(len(parts) - 2))
