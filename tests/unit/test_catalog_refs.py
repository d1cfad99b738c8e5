from __future__ import annotations

import pytest

from catalog.exceptions import InvalidReference, MalformedDigest
from catalog.refs import Ref, check_alias, check_digest, check_name, check_revision, parse_ref

D = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    "text,expected",
    [
        ("acme/math-rl@prod", Ref("acme", "math-rl", alias="prod")),
        ("acme/math-rl@12", Ref("acme", "math-rl", revision=12)),
        (f"acme/math-rl@{D}", Ref("acme", "math-rl", digest=D)),
        ("a1/p.v2_x@canary-2", Ref("a1", "p.v2_x", alias="canary-2")),
    ],
)
def test_parse_ref(text, expected):
    ref = parse_ref(text)
    assert ref == expected
    assert str(ref) == text


@pytest.mark.parametrize(
    "text,error,fragment",
    [
        ("acme-math@prod", InvalidReference, "expected 'tenant/policy@alias'"),
        ("acme/math", InvalidReference, "expected 'tenant/policy@alias'"),
        ("a/b/c@prod", InvalidReference, "expected 'tenant/policy@alias'"),
        ("Acme/math@prod", InvalidReference, "tenant 'Acme' is not a valid name"),
        ("acme/-x@prod", InvalidReference, "policy '-x' is not a valid name"),
        ("acme/math@0", InvalidReference, "revision 0 is not valid"),
        ("acme/math@Prod", InvalidReference, "alias 'Prod' is not valid"),
        ("acme/math@sha256:abc", MalformedDigest, "64 lowercase hex"),
        ("acme/math@sha256:" + "AB" * 32, MalformedDigest, "malformed"),
        ("acme/math@", InvalidReference, "alias '' is not valid"),
    ],
)
def test_parse_ref_rejects(text, error, fragment):
    with pytest.raises(error, match=fragment):
        parse_ref(text)


def test_errors_are_also_stdlib_errors():
    with pytest.raises(ValueError):
        check_digest("md5:abc")
    with pytest.raises(ValueError):
        check_name("tenant", "")
    with pytest.raises(ValueError):
        check_alias("1abc")
    for bad in (0, -1, True, "3", 1.0):
        with pytest.raises(InvalidReference):
            check_revision(bad)
    assert check_revision(7) == 7 and check_digest(D) == D
