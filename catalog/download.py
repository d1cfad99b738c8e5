"""A stored revision written out as a plain PEFT adapter folder, for tools outside MinT.

The store keeps a revision as MinT wrote it (``manifest.json`` beside the PEFT files, or a
packed MoE file: catalog.packed). What stock PEFT (``PeftModel.from_pretrained``) and
``vllm serve --lora-modules NAME=DIR`` load is ``adapter_config.json`` with
``adapter_model.safetensors``: the store keeps those files of every revision as written (a
packed MoE revision has them beside its packed file; one with the packed file alone is unpacked,
losslessly), and the manifest goes along as ``mint-revision.json`` (where it came from: tenant, policy, digest, base
model), which neither tool reads.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from catalog.artifacts import MANIFEST_FILE
from catalog.exceptions import CatalogError
from catalog.packed import read_peft_weights
from catalog.store import StoredAdapter

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
PROVENANCE = "mint-revision.json"


class DownloadRefused(CatalogError, ValueError):
    """The destination cannot take the revision (not empty, not a folder)."""


def write_peft_folder(stored: StoredAdapter, dest: Path) -> list[str]:
    """Write ``stored`` (already verified by the store) to the new or empty folder ``dest``;
    returns the file names written."""
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise DownloadRefused(
            f"{dest} is not an empty folder: choose a new one (or empty it) so that no file of "
            "another adapter is mixed in"
        )
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(stored.path / CONFIG, dest / CONFIG)
    if (stored.path / WEIGHTS).is_file():  # every revision stored since the packed layout came
        shutil.copyfile(stored.path / WEIGHTS, dest / WEIGHTS)
    else:  # a packed file alone: PEFT's tensors rebuilt from it, bit for bit
        from safetensors.torch import save_file

        unpacked = read_peft_weights(stored.path) or {}
        save_file({k: v.contiguous() for k, v in unpacked.items()}, str(dest / WEIGHTS))
    shutil.copyfile(stored.path / MANIFEST_FILE, dest / PROVENANCE)
    return [CONFIG, WEIGHTS, PROVENANCE]
