"""Saved state of policies the trainer evicted (least recently used beyond ``max_policies``).

An evicted policy may hold steps that were never exported and an optimizer state that no
revision carries. Both are written to the store under ``<tenant>/<policy>/trainer-state/`` as
safetensors (weights, optimizer tensors) plus JSON (counters, optimizer hyper-parameters): no
pickle. When the policy returns at the same parent revision, it continues exactly where it was.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from catalog.store import AdapterStore
from schemas.names import split_policy_id

STATE_DIR = "trainer-state"


def storable(policy_id: str) -> bool:
    """Whether the id names a store namespace (``tenant/policy``); the trainer also takes bare
    ids (benchmarks, tests), whose evicted state stays in memory."""
    try:
        split_policy_id(policy_id)
    except ValueError:
        return False
    return True


def _folder(store: AdapterStore, policy_id: str) -> Path:
    tenant, policy = split_policy_id(policy_id)
    return store.root / tenant / policy / STATE_DIR


def save(
    store: AdapterStore,
    policy_id: str,
    params: list[torch.Tensor],
    optimizer: dict[str, Any],
    meta: dict[str, Any],
) -> Path:
    """Write the evicted policy's state (replacing an older one), atomically by rename."""
    final = _folder(store, policy_id)
    tmp = final.with_name(f".{STATE_DIR}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({f"p{i}": t.contiguous() for i, t in enumerate(params)}, tmp / "weights.safetensors")
    tensors, slots = {}, {}
    for idx, st in optimizer["state"].items():
        slots[str(idx)] = {}
        for name, value in st.items():
            if torch.is_tensor(value):
                tensors[f"s{idx}.{name}"] = value.contiguous()
            else:
                slots[str(idx)][name] = value
    save_file(tensors, tmp / "optimizer.safetensors")
    doc = {"meta": meta, "param_groups": optimizer["param_groups"], "scalars": slots}
    (tmp / "state.json").write_text(json.dumps(doc))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def load(store: AdapterStore, policy_id: str) -> tuple[list[torch.Tensor], dict, dict] | None:
    """(params, optimizer state dict, meta) of the policy's saved state, or None."""
    folder = _folder(store, policy_id)
    if not (folder / "state.json").is_file():
        return None
    doc = json.loads((folder / "state.json").read_text())
    weights = load_file(folder / "weights.safetensors")
    params = [weights[f"p{i}"] for i in range(len(weights))]
    tensors = load_file(folder / "optimizer.safetensors")
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        idx, name = key[1:].split(".", 1)
        state.setdefault(int(idx), {})[name] = value
    for idx, scalars in doc["scalars"].items():
        state.setdefault(int(idx), {}).update(scalars)
    return params, {"state": state, "param_groups": doc["param_groups"]}, doc["meta"]


def discard(store: AdapterStore, policy_id: str) -> None:
    shutil.rmtree(_folder(store, policy_id), ignore_errors=True)
