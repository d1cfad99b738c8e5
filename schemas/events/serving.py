"""Serving: promote and rollback commands, the alias-moved fact the catalog records, and the
refusal of a command that could not be carried out."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from typing import Literal

from pydantic import Field, model_validator

from schemas.envelope import Command, Payload
from schemas.names import AliasName, Digest, StoreUri, TagName


class PromoteCommand(Command):
    """Command: move an alias to a revision (compare-and-set on expected_revision)."""

    event_type = "serving.promote"
    topic = "serving.commands"

    alias: AliasName = "prod"
    revision: int = Field(ge=1, description="revision the alias should point to")
    expected_revision: int | None = Field(
        None, ge=1, description="compare-and-set: move only if the alias points here now"
    )
    reason: str = Field("", max_length=1024)
    requested_by: str = Field("", max_length=256)


class RollbackCommand(Command):
    """Command: move an alias back (to its previous revision unless to_revision)."""

    event_type = "serving.rollback"
    topic = "serving.commands"

    alias: AliasName = "prod"
    to_revision: int | None = Field(None, ge=1, description="None: the alias's previous revision")
    expected_revision: int | None = Field(None, ge=1)
    reason: str = Field("", max_length=1024)
    requested_by: str = Field("", max_length=256)


class AliasMoved(Payload):
    """An alias now points to another revision (the catalog's record of a promote or rollback)."""

    event_type = "alias.moved"
    topic = "serving.events"

    alias: AliasName
    from_revision: int | None = Field(None, ge=1, description="None: the alias is new")
    to_revision: int = Field(ge=1)
    adapter_digest: Digest
    store_uri: StoreUri
    cause: Literal["promote", "rollback"]
    reason: str = Field("", max_length=1024)
    requested_by: str = Field(
        "", max_length=256, description="who asked for the move (the command's requested_by)"
    )
    seq: int | None = Field(
        None,
        ge=1,
        description="the alias's move counter in the catalog (its history seq): of "
        "two moves of one alias the higher seq is the newer (None: written before seq existed)",
    )


class ServingRefused(Payload):
    """A serving or registry command (promote, rollback, canary, tag, retire) that was not
    carried out, and why (the caller reads it: the SDK and the CLI print the reason instead of
    waiting for a fact)."""

    event_type = "serving.refused"
    topic = "serving.events"

    command_id: uuid.UUID = Field(description="event_id of the refused command")
    command_type: Literal[
        "serving.promote", "serving.rollback", "serving.canary", "revision.tag", "policy.retire"
    ]
    alias: AliasName = Field("prod", description="the alias the command named (prod if none)")
    reason: str = Field(max_length=2048, description="why, and what to do")
    current_revision: int | None = Field(
        None, ge=1, description="where the alias points now (a stale compare-and-set)"
    )


class PolicyRetirement(Payload):
    """A policy was retired (``retired``: no new revisions, no alias moves; its revisions and
    aliases stay readable and served) or restored (``retired`` False). Published by
    `mint policies retire` on ``serving.events``; the catalog's projector records it (the
    policy's ``retired_at`` is this event's time, ``retired_by`` its requested_by)."""

    event_type = "policy.retired"
    topic = "serving.events"

    retired: bool = Field(True, description="True: retire the policy; False: restore it")
    reason: str = Field("", max_length=1024)
    requested_by: str = Field(
        "", max_length=256, description="who retired or restored it (recorded as retired_by)"
    )


class RetireCommand(Command):
    """Command: retire a policy (``retired`` False: restore it). The controller carries it out
    by publishing the ``policy.retired`` fact, which the projector records: operators and
    tenants ask on ``serving.commands``, only services write facts on ``serving.events``."""

    event_type = "policy.retire"
    topic = "serving.commands"

    retired: bool = Field(True, description="True: retire the policy; False: restore it")
    reason: str = Field("", max_length=1024)
    requested_by: str = Field("", max_length=256)


def check_tag_change(add: Collection[str], remove: Collection[str]) -> None:
    """The one rule of a tag change, wherever one enters (this command, the gateway's body, the
    CLI before it connects): something to do, and no tag both added and removed."""
    if not add and not remove:
        raise ValueError("give a tag to add or one to remove")
    if both := sorted(set(add) & set(remove)):
        raise ValueError(f"{', '.join(both)} both added and removed (name each tag once)")


class TagCommand(Command):
    """Command: add tags to a revision and remove others (a registry's labels: "candidate",
    "reviewed", "release-2026-12"). Carried out by the controller as ``revision.tagged``."""

    event_type = "revision.tag"
    topic = "serving.commands"

    revision: int = Field(ge=1)
    add: list[TagName] = Field(default_factory=list, max_length=32)
    remove: list[TagName] = Field(default_factory=list, max_length=32)
    requested_by: str = Field("", max_length=256)

    @model_validator(mode="after")
    def _a_change(self) -> TagCommand:
        check_tag_change(self.add, self.remove)
        return self


class RevisionTagged(Payload):
    """A revision's tags are now ``tags`` (the whole set, so a replay writes the same)."""

    event_type = "revision.tagged"
    topic = "serving.events"

    revision: int = Field(ge=1)
    tags: list[TagName] = Field(default_factory=list, max_length=64)
    requested_by: str = Field("", max_length=256)
