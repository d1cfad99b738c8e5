"""Names, digests and references: ``tenant/policy@alias``, ``tenant/policy@N``,
``tenant/policy@sha256:<64 hex>``. Validation happens here, before anything touches Cassandra."""

from __future__ import annotations

import re
from dataclasses import dataclass

from catalog.exceptions import InvalidReference, MalformedDigest
from schemas.names import ALIAS_RE, DIGEST_RE, POLICY_RE, TENANT_RE

# The same rules as the wire events (schemas.names). Aliases start with a letter, so `@3` is
# always a revision number. Per field: its pattern, the error a bad value raises, and what
# that error says after ``<field> <value>``.
ALIAS = re.compile(ALIAS_RE)
DIGEST = re.compile(DIGEST_RE)
_NAME = "is not a valid name: expected {}, e.g. 'acme' or 'math-rl'"
_RULES: dict[str, tuple[re.Pattern[str], type[Exception], str]] = {
    "tenant": (
        re.compile(TENANT_RE),
        InvalidReference,
        _NAME.format("1-63 of [a-z0-9-] starting with a letter or digit"),
    ),
    "policy": (
        re.compile(POLICY_RE),
        InvalidReference,
        _NAME.format("1-127 of [a-z0-9._-] starting with a letter or digit"),
    ),
    "alias": (
        ALIAS,
        InvalidReference,
        "is not valid: expected 1-32 of [a-z0-9-] starting with a letter, e.g. 'prod' or 'canary'",
    ),
    "digest": (
        DIGEST,
        MalformedDigest,
        "is malformed: expected 'sha256:' followed by 64 lowercase hex digits (the sha256 of "
        "the adapter's content, as written in its manifest)",
    ),
}


def check_name(field: str, value: object) -> str:
    """Validate a tenant or policy name (``field`` is "tenant" or "policy"; the alias and
    digest rules are here too, for check_alias and check_digest)."""
    pattern, error, rule = _RULES[field]
    if not isinstance(value, str) or not pattern.match(value):
        raise error(f"{field} {value!r} {rule}")
    return value


def check_alias(value: object) -> str:
    return check_name("alias", value)


def check_digest(value: object) -> str:
    return check_name("digest", value)


def check_revision(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidReference(f"revision {value!r} is not valid: expected an integer >= 1")
    return value


@dataclass(frozen=True)
class Ref:
    """A reference to a policy's revision; exactly one of alias, revision, digest is set.

    The one reference type: the gateway parses a request's model into it, the engine builds it
    from a decoded event's (already validated) fields, the catalog resolves it. It is rendered
    to text only for people (messages, logs, the ``ref`` of an answer)."""

    tenant: str
    policy: str
    alias: str | None = None
    revision: int | None = None
    digest: str | None = None

    @property
    def target(self) -> str:
        """What follows the ``@``: the alias, the revision number or the digest."""
        return (
            self.alias or (str(self.revision) if self.revision is not None else self.digest) or ""
        )

    def __str__(self) -> str:
        return f"{self.tenant}/{self.policy}@{self.target}"


def ref_to(tenant: str, policy: str, target: str) -> Ref:
    """The reference of checked names and an unchecked ``target`` (``alias``, ``N`` or
    ``sha256:…``, told apart by form: aliases start with a letter); InvalidReference or
    MalformedDigest say what was expected."""
    if target.startswith("sha256:"):
        return Ref(tenant, policy, digest=check_digest(target))
    if target.isdigit():
        return Ref(tenant, policy, revision=check_revision(int(target)))
    return Ref(tenant, policy, alias=check_alias(target))


def parse_ref(text: str) -> Ref:
    """Parse ``tenant/policy@alias|N|sha256:…``; raises InvalidReference with the expected form."""
    if not isinstance(text, str) or text.count("/") != 1 or "@" not in text:
        raise InvalidReference(
            f"reference {text!r} is malformed: expected 'tenant/policy@alias', "
            "'tenant/policy@N' or 'tenant/policy@sha256:<64 hex>'"
        )
    path, _, target = text.partition("@")
    tenant, _, policy = path.partition("/")
    return ref_to(check_name("tenant", tenant), check_name("policy", policy), target)
