"""Stored adapters and their catalog rows, shared by the serving benchmarks (adapter_sweep,
multi_engine, poison_traffic): a LoRA template of the base model, ``n`` distinct revisions of it
in the adapter store, and the import of catalog rows that name them."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any


def make_template(model: Path, out: Path, rank: int = 8) -> Path:
    """A PEFT-saved LoRA (q_proj, v_proj) of ``model``: the keys and config of every adapter."""
    if (out / "adapter_config.json").exists():
        return out
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    peft = get_peft_model(
        base, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"])
    )
    peft.save_pretrained(out)
    return out


def make_adapters(
    template: Path,
    store,
    fingerprint: str,
    n: int,
    work: Path,
    seed0: int = 0,
    *,
    tenant: str = "sweep",
    policy_of=None,
    base_model: str = "tiny",
):
    """``n`` distinct PEFT revisions (the template's keys and config, fresh random weights);
    adapter ``i`` is stored as ``tenant``/``policy_of(i)`` (default ``p{i % 997}``)."""
    import torch
    from safetensors.torch import load_file, save_file

    from catalog.models import Resolved

    shapes = {
        k: tuple(t.shape) for k, t in load_file(str(template / "adapter_model.safetensors")).items()
    }
    config = (template / "adapter_config.json").read_text()
    src = work / "src"
    refs = []
    for i in range(n):
        g = torch.Generator().manual_seed(seed0 + i)
        src.mkdir(exist_ok=True)
        save_file(
            {k: torch.randn(s, generator=g) * 0.3 for k, s in shapes.items()},
            str(src / "adapter_model.safetensors"),
        )
        (src / "adapter_config.json").write_text(config)
        policy = policy_of(i) if policy_of else f"p{i % 997}"
        st = store.put(
            src,
            tenant=tenant,
            policy=policy,
            base_model=base_model,
            base_model_fingerprint=fingerprint,
        )
        refs.append(Resolved(tenant, policy, i + 1, st.digest, st.uri))
    return refs


def store_adapters(
    settings: Any,
    model: Path,
    work: Path,
    n: int,
    seed0: int,
    *,
    tenant: str,
    policy_of: Callable[[int], str],
    base_model: str,
) -> tuple[list[Any], Path]:
    """``n`` adapters of ``model`` in the run's store (``make_adapters`` from the template under
    ``work``); their refs and the scratch folder they were written from."""
    from catalog.artifacts import model_fingerprint
    from catalog.store import AdapterStore

    template = make_template(model, work / "template")
    scratch = work / f"make-{uuid.uuid4().hex[:6]}"
    scratch.mkdir(parents=True)
    refs = make_adapters(
        template,
        AdapterStore.from_settings(settings),
        model_fingerprint(model),
        n,
        scratch,
        seed0,
        tenant=tenant,
        policy_of=policy_of,
        base_model=base_model,
    )
    return refs, scratch


def import_rows(settings: Any, rows: list[dict[str, Any]], path: Path) -> None:
    """Write ``rows`` to ``path`` as JSON Lines and import them (``catalog.importer``); a
    rejected row is an error."""
    from catalog.cluster import connect
    from catalog.importer import import_file

    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cluster, session = connect(settings)
    try:
        res = import_file(session, settings.keyspace, path)
    finally:
        cluster.shutdown()
    if res.counts.rejected:
        raise RuntimeError(
            f"catalog import rejected {res.counts.rejected} rows ({res.rejects_path})"
        )
