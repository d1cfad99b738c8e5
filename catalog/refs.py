"""Names, digests and references: ``tenant/policy@alias``, ``tenant/policy@N``,
``tenant/policy@sha256:<64 hex>``. Validation happens here, before anything touches Cassandra."""

from __future__ import annotations

import re
from dataclasses import dataclass

from catalog.exceptions import InvalidReference, MalformedDigest
from schemas.names import ALIAS_RE, DIGEST_RE, POLICY_RE, TENANT_RE

# The same rules as the wire events (schemas.names). Aliases start with a letter, so `@3` is
# always a revision number.
_NAMES = {
    "tenant": (re.compile(TENANT_RE), "1-63 of [a-z0-9-] starting with a letter or digit"),
    "policy": (re.compile(POLICY_RE), "1-127 of [a-z0-9._-] starting with a letter or digit"),
}
ALIAS = re.compile(ALIAS_RE)
DIGEST = re.compile(DIGEST_RE)


def check_name(field: str, value: object) -> str:
    """Validate a tenant or policy name (``field`` is "tenant" or "policy")."""
    pattern, rule = _NAMES[field]
    if not isinstance(value, str) or not pattern.match(value):
        raise InvalidReference(
            f"{field} {value!r} is not a valid name: expected {rule}, e.g. 'acme' or 'math-rl'"
        )
    return value


def check_alias(value: object) -> str:
    if not isinstance(value, str) or not ALIAS.match(value):
        raise InvalidReference(
            f"alias {value!r} is not valid: expected 1-32 of [a-z0-9-] starting with a letter, "
            "e.g. 'prod' or 'canary'"
        )
    return value


def check_digest(value: object) -> str:
    if not isinstance(value, str) or not DIGEST.match(value):
        raise MalformedDigest(
            f"digest {value!r} is malformed: expected 'sha256:' followed by 64 lowercase hex "
            "digits (the sha256 of the adapter's content, as written in its manifest)"
        )
    return value


def check_revision(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidReference(f"revision {value!r} is not valid: expected an integer >= 1")
    return value


@dataclass(frozen=True)
class Ref:
    """A parsed reference; exactly one of alias, revision, digest is set."""

    tenant: str
    policy: str
    alias: str | None = None
    revision: int | None = None
    digest: str | None = None

    def __str__(self) -> str:
        target = self.alias or (str(self.revision) if self.revision is not None else self.digest)
        return f"{self.tenant}/{self.policy}@{target}"


def parse_ref(text: str) -> Ref:
    """Parse ``tenant/policy@alias|N|sha256:…``; raises InvalidReference with the expected form."""
    if not isinstance(text, str) or text.count("/") != 1 or "@" not in text:
        raise InvalidReference(
            f"reference {text!r} is malformed: expected 'tenant/policy@alias', "
            "'tenant/policy@N' or 'tenant/policy@sha256:<64 hex>'"
        )
    path, _, target = text.partition("@")
    tenant, _, policy = path.partition("/")
    check_name("tenant", tenant)
    check_name("policy", policy)
    if target.startswith("sha256:"):
        return Ref(tenant, policy, digest=check_digest(target))
    if target.isdigit():
        return Ref(tenant, policy, revision=check_revision(int(target)))
    return Ref(tenant, policy, alias=check_alias(target))
