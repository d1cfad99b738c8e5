"""Claim checks: large results written to the store, referenced from the event by URI.

Layout ``<store root>/<tenant>/<policy>/rollouts/<name>.jsonl`` (inside the policy's namespace,
as the envelope requires), written to a temporary file and renamed, so a reader sees all or none.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable
from typing import Any

from catalog.exceptions import AdapterNotFound, InvalidReference
from catalog.store import AdapterStore


def write_jsonl(
    store: AdapterStore, tenant: str, policy: str, kind: str, name: str, rows: Iterable[Any]
) -> str:
    folder = store.root / tenant / policy / kind
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"{name}.jsonl"
    tmp = folder / f".{name}.{uuid.uuid4().hex}.tmp"
    with tmp.open("w") as f:
        for row in rows:
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    return final.as_uri()


def read_jsonl(store: AdapterStore, uri: str, owner: tuple[str, str] | None = None) -> list[Any]:
    """The rows of the claim check at ``uri``, which must lie under the store root (and in
    ``owner``'s (tenant, policy) folder when given): the one reader of JSONL claim checks, for
    rollouts, prompts and training data alike."""
    path = store.path_of_uri(uri, owner)
    try:
        with store.io("read a claim check"):  # an unmounted store is an outage, not a bad URI
            lines = path.read_text().splitlines()
    except FileNotFoundError as e:
        raise AdapterNotFound(f"claim check {uri!r} does not exist; check the URI") from e
    rows = []
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise InvalidReference(f"claim check {uri!r} line {n} is not JSON ({e})") from e
    return rows
