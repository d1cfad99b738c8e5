"""Command-line arguments every command parses the same way."""

from __future__ import annotations

import click

from catalog.exceptions import InvalidReference
from catalog.refs import Ref, parse_ref
from schemas.names import split_policy_id


def tenant_policy(reference: str) -> tuple[str, str]:
    """``acme/math-rl`` (or ``acme/math-rl@prod``: the alias is ignored) → ``("acme",
    "math-rl")``, both names checked where they enter; a bad one is a usage error (exit 2)."""
    try:
        return split_policy_id(reference.partition("@")[0])
    except ValueError as e:
        raise click.BadParameter(str(e)) from e


REFERENCE_FORMS = "tenant/policy@alias, tenant/policy@N or tenant/policy@sha256:<64 hex>"


def reference(text: str) -> Ref:
    """``tenant/policy@alias|@N|@sha256:…`` (the one reference grammar) → a Ref; a malformed
    one is a usage error that shows the three forms."""
    try:
        return parse_ref(text)
    except InvalidReference as e:
        raise click.BadParameter(str(e)) from e


def alias_reference(text: str, alias: str | None, default: str = "prod") -> Ref:
    """The alias a command moves or reads: ``tenant/policy@alias``, or ``tenant/policy`` with
    ``--alias`` (default ``default``). A revision there, or an ``--alias`` that contradicts the
    reference, is a usage error: moving "acme/math@7" would be a guess."""
    if "@" not in text:
        tenant, policy = tenant_policy(text)
        return Ref(tenant, policy, alias=alias or default)
    ref = reference(text)
    if ref.alias is None:
        raise click.BadParameter(
            f"{text!r} names a revision; this command acts on an alias: "
            f"{ref.tenant}/{ref.policy}@prod (or another alias)"
        )
    if alias is not None and alias != ref.alias:
        raise click.BadParameter(f"{text!r} names alias {ref.alias!r} but --alias is {alias!r}")
    return ref
