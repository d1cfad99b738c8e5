"""`catalog.importer`: validation of import rows and the checks that span lines (no Cassandra)."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.import_checks import DUPLICATE as _DUPLICATE
from catalog.import_checks import Checker as _Checker
from catalog.import_checks import check_chunk as _validate
from catalog.import_rows import ImportRow, parse_row
from schemas.names import ALIAS_RE, POLICY_RE, TENANT_RE

DIGEST = "sha256:" + "ab" * 32
GOOD = {
    "tenant": "acme",
    "policy": "math-rl",
    "revision": 3,
    "digest": DIGEST,
    "uri": "s3://adapters/acme/math-rl/3",
    "base_model": "qwen3-30b-a3b",
}


def line(**changes) -> str:
    row = {**GOOD, **changes}
    return json.dumps({k: v for k, v in row.items() if v is not ...})


def test_a_good_row_with_and_without_the_optional_fields():
    row = parse_row(line())
    assert (row.tenant, row.policy, row.revision, row.created_at, row.rank, row.aliases) == (
        "acme",
        "math-rl",
        3,
        None,
        None,
        [],
    )
    full = parse_row(line(created_at="2025-01-02T03:04:05Z", rank=8, aliases=["prod", "canary"]))
    assert full.created_at.year == 2025 and full.rank == 8 and full.aliases == ["prod", "canary"]
    assert parse_row(line(uri="file:///store/acme/math-rl/3")).uri.startswith("file:///")


@pytest.mark.parametrize(
    ("changes", "field", "says"),
    [
        ({"tenant": "Acme"}, "tenant", "expected 1-63 of [a-z0-9-]"),
        ({"tenant": ""}, "tenant", "expected"),
        ({"policy": "math rl"}, "policy", "expected 1-127 of [a-z0-9._-]"),
        ({"revision": 0}, "revision", "greater than or equal to 1"),
        ({"revision": "3"}, "revision", "valid integer"),
        ({"revision": 2.5}, "revision", "valid integer"),
        ({"revision": True}, "revision", "valid integer"),
        ({"revision": 2**31}, "revision", "less than or equal to"),
        ({"digest": "sha256:abc"}, "digest", "'sha256:' and 64 lowercase hex"),
        ({"digest": DIGEST.upper()}, "digest", "64 lowercase hex"),
        ({"uri": "http://h/acme/math-rl/3"}, "uri", "file:///… or s3://bucket/…"),
        ({"uri": "s3://adapters/acme/../math-rl/3"}, "uri", "'..' segment"),
        ({"uri": "s3://adapters/other/math-rl/3"}, "uri", "lies outside acme/math-rl"),
        ({"uri": "s3://adapters/acme/math-rl"}, "uri", "lies outside acme/math-rl"),
        ({"base_model": ""}, "base_model", "at least 1 character"),
        ({"created_at": "yesterday"}, "created_at", "valid datetime"),
        ({"rank": 0}, "rank", "greater than or equal to 1"),
        ({"rank": 4096}, "rank", "less than or equal to 1024"),
        ({"aliases": ["Prod"]}, "aliases.0", "1-32 of [a-z0-9-] starting with a letter"),
        ({"aliases": ["3"]}, "aliases.0", "starting with a letter"),
        ({"aliases": "prod"}, "aliases", "valid array"),
        ({"aliases": ["prod", "prod"]}, "aliases", "name an alias twice"),
        ({"digest": ...}, "digest", "Field required"),
        ({"revison": 3}, "revison", "Extra inputs are not permitted"),
    ],
)
def test_bad_rows_name_the_field(changes, field, says):
    with pytest.raises(ValueError) as e:
        parse_row(line(**changes))
    reason = str(e.value)
    assert reason.startswith((f"{field}: ", f"{field} ")), reason
    assert says in reason


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{", "not a JSON object"),
        ("[1, 2]", "row: Input should be an object"),
        ("null", "row:"),
        (b"\xff\xfe{}", "not a JSON object"),
    ],
)
def test_lines_that_are_not_objects(text, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_row(text)


def test_several_wrong_fields_are_all_named():
    with pytest.raises(ValueError) as e:
        parse_row(line(tenant="A", revision=-1, digest="x"))
    assert all(f in str(e.value) for f in ("tenant:", "revision:", "digest:"))


names = st.tuples(
    st.from_regex(TENANT_RE, fullmatch=True),
    st.from_regex(POLICY_RE, fullmatch=True),
    st.integers(1, 2**31 - 1),
    st.lists(st.from_regex(ALIAS_RE, fullmatch=True), max_size=4, unique=True),
)


@settings(max_examples=200, deadline=None)
@given(names)
def test_every_valid_name_revision_and_alias_is_accepted(parts):
    tenant, policy, revision, aliases = parts
    if policy in (".", ".."):
        return  # a path segment no URI may hold (in_namespace refuses it)
    uri = f"s3://adapters/{tenant}/{policy}/{revision}"
    row = parse_row(line(tenant=tenant, policy=policy, revision=revision, uri=uri, aliases=aliases))
    assert (row.tenant, row.policy, row.revision, row.aliases) == parts


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80).filter(lambda s: not re.match(TENANT_RE, s)))
def test_any_invalid_tenant_is_refused_naming_tenant(tenant):
    with pytest.raises(ValueError, match=r"^tenant: "):
        parse_row(line(tenant=tenant))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300) | st.text(max_size=300))
def test_arbitrary_input_gives_a_reason_never_another_exception(raw):
    try:
        row = parse_row(raw)
    except ValueError as e:
        assert str(e)
    else:
        assert isinstance(row, ImportRow)


# ---------------------------------------------------------------------------- checks across lines


class EmptyCatalog:
    """The catalog as _Checker sees it, holding nothing yet."""

    def __init__(self) -> None:
        self.tenants: dict = {}
        self.tenant_rows: set = set()

    def load_tenants(self, tenants):
        for t in tenants:
            self.tenants[t] = {}

    def load_newest(self, keys):
        raise AssertionError("nothing exists, so nothing is read")


def rev(n: int, policy: str = "math-rl", **changes) -> dict:
    return {
        **GOOD,
        "policy": policy,
        "revision": n,
        "digest": "sha256:" + f"{n:064x}",
        "uri": f"s3://adapters/acme/{policy}/{n}",
        **changes,
    }


def run(*rows: dict):
    lines = [(i, json.dumps(r).encode()) for i, r in enumerate(rows, start=1)]
    return _validate(_Checker(EmptyCatalog(), 1_700_000_000_000), lines)


def test_rows_of_a_new_policy_become_its_rows():
    rows, rejects, accepted, dups = run(rev(1), rev(2, aliases=["prod"]), rev(1, policy="other"))
    assert (accepted, dups, rejects) == (3, 0, [])
    assert rows.tenants == [("acme", 1_700_000_000_000)]
    assert [(p, b) for _, p, b, _ in rows.policies] == [
        ("math-rl", GOOD["base_model"]),
        ("other", GOOD["base_model"]),
    ]
    assert [(r[1], r[2]) for r in rows.revisions] == [("math-rl", 1), ("math-rl", 2), ("other", 1)]
    assert sorted(rows.latest) == [("acme", "math-rl", 2), ("acme", "other", 1)]
    assert [(a[2], a[3]) for a in rows.aliases] == [("prod", 2)]


@pytest.mark.parametrize(
    ("second", "says"),
    [
        (rev(1, digest="sha256:" + "f" * 64), "revision 1 of acme/math-rl is on line 1 with other"),
        (rev(2, digest="sha256:" + f"{1:064x}"), "is revision 1 of acme/math-rl already (line 1)"),
        (rev(2, aliases=["prod"]), "alias prod of acme/math-rl already points at revision 1"),
        (rev(2, base_model="other-base"), "differs from 'qwen3-30b-a3b'"),
    ],
)
def test_a_line_contradicting_an_earlier_one_is_rejected_with_the_line(second, says):
    _, rejects, accepted, _ = run(rev(1, aliases=["prod"]), second)
    assert accepted == 1 and len(rejects) == 1
    n, reason, raw = rejects[0]
    assert n == 2 and says in reason and json.loads(raw) == second


def test_the_same_line_twice_is_a_duplicate_written_once():
    rows, rejects, accepted, dups = run(rev(1), rev(1), rev(2))
    assert (accepted, dups, rejects) == (2, 1, [])
    assert [r[2] for r in rows.revisions] == [1, 2]


def test_the_latest_pointer_is_the_highest_revision_whatever_the_order():
    rows, *_ = run(rev(3), rev(1), rev(5), rev(2))
    assert rows.latest == [("acme", "math-rl", 5)]


def test_rows_without_created_at_get_the_import_time_and_metadata_keeps_the_rank():
    rows, *_ = run(rev(1, rank=16), rev(2, created_at="2024-02-03T04:05:06.789+02:00"))
    assert rows.revisions[0][6] == 1_700_000_000_000 and rows.revisions[0][7] == '{"rank":16}'
    assert rows.revisions[1][6] == 1_706_925_906_789 and rows.revisions[1][7] == "{}"


def test_validation_rejects_and_context_rejects_come_back_in_line_order():
    _, rejects, accepted, _ = run(
        rev(1), rev(1, digest="bad"), rev(1, uri="s3://x/y/z/1"), rev(1, rank=3)
    )
    assert accepted == 1 and [n for n, _, _ in rejects] == [2, 3, 4]


def test_duplicate_marker_is_not_a_reason():
    assert _DUPLICATE == "duplicate"
