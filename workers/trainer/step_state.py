"""A step-trained policy's state in the store: its checkpoint and its named saved states.

The checkpoint is the policy's weights, AdamW state and ``step`` meta (shape, seed, and the
train.steps record it reflects, with that record's answer), written in the eviction format
(workers/trainer/evicted.py, ``<tenant>/<policy>/trainer-state/``) after each ``create``,
``optim_step`` and ``load_state``: a restarted trainer resumes the policy from it. Weights and
optimizer change only at those calls, so the checkpoint always holds the policy's current
ones; gradients waiting for an ``optim_step`` are not in it (their records are replayed).

``save_state`` copies the checkpoint to ``<tenant>/<policy>/states/<name>/`` and ``load_state``
copies one back; both atomically (a copy to a temporary folder, then a rename).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from catalog.store import AdapterStore
from schemas.names import split_policy_id
from workers.trainer import evicted

if TYPE_CHECKING:
    from workers.trainer.engine import MultiPolicyTrainer

STATES_DIR = "states"


def _policy_folder(store: AdapterStore, policy_id: str) -> Path:
    tenant, policy = split_policy_id(policy_id)
    return store.root / tenant / policy


def checkpoint(store: AdapterStore, trainer: MultiPolicyTrainer, policy_id: str) -> None:
    """Write the held policy's weights, optimizer state and step meta as its checkpoint."""
    snap = trainer.snapshot(policy_id)
    if snap is None or snap.optimizer is None:
        raise RuntimeError(f"policy {policy_id!r} is not held (or has no optimizer state)")
    meta = {
        "parent_revision": snap.parent_revision,
        "steps": snap.steps,
        "shapes": [list(p.shape) for p in snap.params],
        "step": snap.of.step_meta,
    }
    with store.io("save a policy's step checkpoint"):
        evicted.save(store, policy_id, snap.params, snap.optimizer, meta)


def checkpoint_meta(store: AdapterStore, policy_id: str) -> dict[str, Any] | None:
    """The meta of the policy's checkpoint (None: it has none, or only an update policy's)."""
    path = _policy_folder(store, policy_id) / evicted.STATE_DIR / "state.json"
    with store.io("read a policy's step checkpoint"):
        try:
            meta = json.loads(path.read_text())["meta"]
        except FileNotFoundError:
            return None
    return meta if meta.get("step") else None


def _copy_folder(source: Path, final: Path) -> None:
    tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex}.tmp")
    shutil.copytree(source, tmp)
    old = final.with_name(f".{final.name}.{uuid.uuid4().hex}.old")
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def save_named(store: AdapterStore, policy_id: str, name: str) -> str:
    """Copy the policy's checkpoint to its saved state ``name``; returns that state's URI."""
    folder = _policy_folder(store, policy_id)
    final = folder / STATES_DIR / name
    with store.io("save a policy's state"):
        final.parent.mkdir(parents=True, exist_ok=True)
        _copy_folder(folder / evicted.STATE_DIR, final)
    return final.as_uri()


def load_named(store: AdapterStore, policy_id: str, uri: str) -> dict[str, Any]:
    """Make the saved state at ``uri`` (in the policy's own folder) its checkpoint; returns
    that state's meta. ValueError (naming ``source_uri``) for anything that is not one."""
    tenant, policy = split_policy_id(policy_id)
    path = store.path_of_uri(uri, owner=(tenant, policy))
    with store.io("load a policy's state"):
        try:
            meta = json.loads((path / "state.json").read_text())["meta"]
        except (FileNotFoundError, NotADirectoryError, KeyError, ValueError):
            meta = None
        if not meta or not meta.get("step"):
            raise ValueError(
                f"source_uri {uri!r} holds no saved training state: pass the state_uri that "
                "save_state answered"
            )
        _copy_folder(path, _policy_folder(store, policy_id) / evicted.STATE_DIR)
    return meta
