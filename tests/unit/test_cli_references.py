"""One reference grammar on the command line: tenant/policy@alias|@N|@sha256:…"""

from __future__ import annotations

import click
import pytest

from mint.commands.args import alias_reference, reference

D = "sha256:" + "ab" * 32


def test_the_three_forms_parse_and_anything_else_says_what_is_expected():
    assert reference("acme/math@prod").alias == "prod"
    assert reference("acme/math@7").revision == 7
    assert reference(f"acme/math@{D}").digest == D
    for bad in ("acme/math", "acme@7", "a/b/c@1"):
        with pytest.raises(click.BadParameter, match="tenant/policy@"):
            reference(bad)
    with pytest.raises(click.BadParameter, match="alias '-1' is not valid"):
        reference("acme/math@-1")


def test_a_command_that_moves_an_alias_takes_the_alias_never_a_revision():
    assert alias_reference("acme/math", None).alias == "prod"
    assert alias_reference("acme/math", "staging").alias == "staging"
    assert alias_reference("acme/math@staging", None).alias == "staging"
    assert alias_reference("acme/math@staging", "staging").alias == "staging"
    with pytest.raises(click.BadParameter, match="names a revision"):
        alias_reference("acme/math@7", None)
    with pytest.raises(click.BadParameter, match="--alias is 'prod'"):
        alias_reference("acme/math@staging", "prod")
