"""Claim checks: large results written to the store, referenced from the event by URI.

Layout ``<store root>/<tenant>/<policy>/rollouts/<name>.jsonl`` (inside the policy's namespace,
as the envelope requires), written to a temporary file and renamed, so a reader sees all or none.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

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


def read_jsonl(store: AdapterStore, uri: str) -> list[Any]:
    path = Path(uri.removeprefix("file://")).resolve()
    if store.root not in path.parents:
        raise ValueError(f"claim check {uri!r} lies outside the store root {store.root}")
    return [json.loads(line) for line in path.read_text().splitlines() if line]
