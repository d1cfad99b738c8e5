"""Packed MoE LoRA (catalog/packed.py): lossless conversions between the PEFT layout the trainer
writes, the packed layout and the per-expert layout; the store's packed file and its digest. The
PEFT side is real PEFT on a small module tree shaped like transformers 5's fused experts (no model
download, no transformers model)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict
from safetensors.torch import load_file, save_file
from torch import nn

from catalog.artifacts import PACKED_FILE, WEIGHTS_FILE, adapter_digest, read_manifest
from catalog.exceptions import AdapterCorrupted, AdapterShapeMismatch
from catalog.models import Resolved
from catalog.packed import (
    packed_to_peft,
    packed_to_per_expert,
    peft_to_packed,
    per_expert_to_packed,
    read_packed,
    read_peft_weights,
    stacked_keys,
)
from catalog.store import AdapterStore
from workers.serving.exceptions import AdapterDigestMismatch
from workers.serving.working_set import WorkingSet

# gate_up_proj [E, 2·INTER, H] and down_proj [E, H, INTER] both get lora_B [16, E·r] here: which
# tensor belongs to which parameter comes from PEFT's nesting order, not from shapes.
E, H, INTER, LAYERS = 4, 16, 8, 2
FP = "sha256:" + "a" * 64
EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
PREFIX = "base_model.model.model.layers"
# PEFT warns that rank_pattern/alpha_pattern matched no module although it applies them to the
# wrapped parameters (the "modules" case checks the 2r shapes).
pytestmark = pytest.mark.filterwarnings("ignore:The following .*_pattern keys:RuntimeWarning")


class Experts(nn.Module):  # as transformers 5's Qwen3MoeExperts registers them
    def __init__(self) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.randn(E, 2 * INTER, H))
        self.down_proj = nn.Parameter(torch.randn(E, H, INTER))


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(H, H, bias=False)
        self.mlp = nn.Module()
        self.mlp.experts = Experts()


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.layers = nn.ModuleList([Layer() for _ in range(LAYERS)])


CONFIGS = {
    # What the trainer writes for target_parameters=[...experts.gate_up_proj, ...down_proj].
    "params": dict(r=2, lora_alpha=4, target_modules=["q_proj"], target_parameters=EXPERTS),
    # What PEFT writes when gate/up/down_proj are listed as modules: bare names, gate_up at 2r.
    "modules": dict(
        r=2,
        lora_alpha=4,
        target_modules=["q_proj"],
        target_parameters=["gate_up_proj", "down_proj"],
        rank_pattern={r".*\.gate_up_proj": 4},
        alpha_pattern={r".*\.gate_up_proj": 8},
    ),
}


def peft_toy(kind: str, seed: int = 0) -> PeftModel:
    torch.manual_seed(seed)
    return get_peft_model(Toy(), LoraConfig(**CONFIGS[kind], init_lora_weights=False))


def save_peft(model: PeftModel, out: Path, dtype: torch.dtype = torch.float32) -> Path:
    """A stock PEFT folder, written as the trainer's write_adapter writes it."""
    out.mkdir(parents=True, exist_ok=True)
    sd = get_peft_model_state_dict(model)
    save_file(
        {k: v.detach().to(dtype).contiguous() for k, v in sd.items()},
        str(out / WEIGHTS_FILE),
        metadata={"format": "pt"},
    )
    config = model.peft_config["default"]
    config.inference_mode = True
    config.save_pretrained(str(out))
    return out


def config_of(folder: Path) -> dict:
    return json.loads((folder / "adapter_config.json").read_text())


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


@pytest.fixture
def store(tmp_path: Path) -> AdapterStore:
    return AdapterStore(tmp_path / "store")


@pytest.mark.parametrize("kind", sorted(CONFIGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_peft_and_packed_convert_losslessly(tmp_path, kind, dtype):
    folder = save_peft(peft_toy(kind), tmp_path / "a", dtype)
    peft = load_file(str(folder / WEIGHTS_FILE))
    packed, projections = peft_to_packed(peft, config_of(folder))
    gate_rank = 4 if kind == "modules" else 2
    for layer in range(LAYERS):
        experts = f"{PREFIX}.{layer}.mlp.experts"
        a, b = stacked_keys(f"{experts}.gate_up_proj")
        assert packed[a].shape == (E, gate_rank, H) and packed[b].shape == (E, 2 * INTER, gate_rank)
        a, b = stacked_keys(f"{experts}.down_proj")
        assert packed[a].shape == (E, 2, INTER) and packed[b].shape == (E, H, 2)
        assert f"{PREFIX}.{layer}.self_attn.q_proj.lora_A.weight" in packed  # passed through
    assert len(projections) == 2 * LAYERS and not any(
        k.endswith(".weight") and ".experts." in k for k in packed
    )
    assert_same(packed_to_peft(packed, projections), peft)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_packed_factors_are_peft_expert_updates(tmp_path, kind):
    """Expert e's update scaling·B[e]@A[e] is what PEFT's ParamWrapper adds to that expert's
    weight."""
    model = peft_toy(kind)
    folder = save_peft(model, tmp_path / "a")
    packed, _ = peft_to_packed(load_file(str(folder / WEIGHTS_FILE)), config_of(folder))
    for layer in range(LAYERS):
        down = model.base_model.model.model.layers[layer].mlp.experts
        gate_up = down.base_layer
        assert (gate_up.parameter_name, down.parameter_name) == ("gate_up_proj", "down_proj")
        for wrapper, proj in ((gate_up, "gate_up_proj"), (down, "down_proj")):
            a, b = (packed[k] for k in stacked_keys(f"{PREFIX}.{layer}.mlp.experts.{proj}"))
            scaling = wrapper.scaling["default"]
            expected = wrapper.get_delta_weight("default").detach()  # [E, out, in]
            torch.testing.assert_close(scaling * b @ a, expected, rtol=1e-5, atol=1e-6)


def test_per_expert_and_packed_convert_losslessly(tmp_path):
    folder = save_peft(peft_toy("params"), tmp_path / "a")
    packed, _ = peft_to_packed(load_file(str(folder / WEIGHTS_FILE)), config_of(folder))
    per_expert = packed_to_per_expert(packed)
    assert f"{PREFIX}.1.mlp.experts.3.gate_up_proj.lora_A.weight" in per_expert
    assert sum(".experts." in k for k in per_expert) == LAYERS * 2 * 2 * E
    assert_same(per_expert_to_packed(per_expert), packed)
    assert_same(packed_to_per_expert(per_expert_to_packed(per_expert)), per_expert)
    # vLLM's 2-D naming: gate_proj/up_proj per expert, sharing lora_A; fused back exactly.
    vllm = packed_to_per_expert(packed, split_gate_up=True)
    key = f"{PREFIX}.0.mlp.experts.2"
    assert vllm[f"{key}.gate_proj.lora_B.weight"].shape == (INTER, 2)
    assert torch.equal(vllm[f"{key}.gate_proj.lora_A.weight"], vllm[f"{key}.up_proj.lora_A.weight"])
    assert not any("gate_up_proj" in k for k in vllm)
    assert_same(per_expert_to_packed(vllm, fuse_gate_up=True), packed)
    # save_file takes them as they are (no shared storage) and gives them back.
    save_file(vllm, str(tmp_path / "per_expert.safetensors"))
    assert_same(load_file(str(tmp_path / "per_expert.safetensors")), vllm)


def test_incomplete_or_unknown_expert_layouts_are_refused(tmp_path):
    folder = save_peft(peft_toy("params"), tmp_path / "a")
    peft, config = load_file(str(folder / WEIGHTS_FILE)), config_of(folder)
    with pytest.raises(AdapterShapeMismatch, match="no known nesting order"):
        peft_to_packed(peft, {**config, "target_parameters": ["mlp.experts.w13"]})
    packed, _ = peft_to_packed(peft, config)
    per_expert = packed_to_per_expert(packed)
    del per_expert[f"{PREFIX}.0.mlp.experts.1.down_proj.lora_A.weight"]
    with pytest.raises(AdapterShapeMismatch, match="not 0..n-1"):
        per_expert_to_packed(per_expert)


def put(store: AdapterStore, src: Path, policy: str = "moe"):
    return store.put(src, tenant="acme", policy=policy, base_model="toy", base_model_fingerprint=FP)


def test_store_writes_packed_file_beside_stock_peft_files(store, tmp_path):
    model = peft_toy("params")
    src = save_peft(model, tmp_path / "src")
    stored = put(store, src)
    m = stored.manifest
    assert m.layout == "packed-moe"
    assert sorted(m.files) == ["adapter_config.json", "adapter_model.safetensors", PACKED_FILE]
    assert (stored.digest, m.files) == adapter_digest(stored.path)
    assert m.size_bytes == sum((stored.path / n).stat().st_size for n in m.files)
    # The PEFT files are stored unchanged, and the packed file rebuilds them exactly.
    assert (stored.path / WEIGHTS_FILE).read_bytes() == (src / WEIGHTS_FILE).read_bytes()
    assert_same(read_peft_weights(stored.path), load_file(str(src / WEIGHTS_FILE)))
    assert read_peft_weights(src) is None  # no packed file there
    # Stock PEFT loads the stored folder as it is.
    loaded = PeftModel.from_pretrained(Toy(), str(stored.path))
    want = get_peft_model_state_dict(model)
    assert_same(
        {k: v.detach() for k, v in get_peft_model_state_dict(loaded).items()},
        {k: v.detach() for k, v in want.items()},
    )
    # Deterministic: the same adapter gives the same packed bytes and digest in another store.
    again = put(AdapterStore(tmp_path / "other"), src)
    assert again.digest == stored.digest
    assert (again.path / PACKED_FILE).read_bytes() == (stored.path / PACKED_FILE).read_bytes()
    assert put(store, src).path == stored.path  # idempotent


def test_digest_and_verification_cover_the_packed_file(store, tmp_path):
    stored = put(store, save_peft(peft_toy("params"), tmp_path / "src"))
    packed = stored.path / PACKED_FILE
    original = packed.read_bytes()
    tensors, projections = read_packed(stored.path)
    key = stacked_keys(projections[0].stem)[1]
    tensors[key] = tensors[key] + 1  # a valid safetensors file, other numbers
    save_file(tensors, str(packed))
    with pytest.raises(AdapterCorrupted, match="digest"):
        store.open_path(stored.path)
    packed.unlink()  # a missing packed file changes the digest too
    with pytest.raises(AdapterCorrupted, match="digest"):
        store.open_path(stored.path)
    packed.write_bytes(original)
    assert store.open_path(stored.path).digest == stored.digest
    # A manifest edited to hide the packed file is refused (the folder still holds it).
    manifest = json.loads((stored.path / "manifest.json").read_text())
    (stored.path / "manifest.json").write_text(json.dumps({**manifest, "layout": "peft"}))
    with pytest.raises(AdapterCorrupted, match="layout"):
        store.open_path(stored.path)


def test_dense_adapters_and_old_manifests_stay_as_they_were(store, tmp_path):
    src = tmp_path / "dense"
    src.mkdir()
    key = f"{PREFIX}.0.self_attn.q_proj"
    dense = {f"{key}.lora_A.weight": torch.randn(2, H), f"{key}.lora_B.weight": torch.randn(H, 2)}
    save_file(dense, str(src / WEIGHTS_FILE))
    (src / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]})
    )
    stored = put(store, src, policy="dense")
    assert stored.manifest.layout == "peft" and not (stored.path / PACKED_FILE).exists()
    assert sorted(stored.manifest.files) == ["adapter_config.json", "adapter_model.safetensors"]
    # A manifest written before the layout field existed still validates (as "peft").
    path = stored.path / "manifest.json"
    old = json.loads(path.read_text())
    del old["layout"]
    path.write_text(json.dumps(old))
    assert read_manifest(stored.path).layout == "peft"
    assert store.open_path(stored.path).digest == stored.digest


class FakeEngine:
    def __init__(self) -> None:
        self.loaded: dict[int, Path] = {}

    def load(self, handle) -> None:
        self.loaded[handle.lora_id] = handle.path

    def pin(self, lora_id: int) -> None: ...

    def evict(self, lora_id: int) -> None:
        del self.loaded[lora_id]

    def list(self) -> set[int]:
        return set(self.loaded)


def test_working_set_fetches_the_packed_file_and_verifies_it(store, tmp_path):
    stored = put(store, save_peft(peft_toy("params"), tmp_path / "src"))
    engine = FakeEngine()
    ws = WorkingSet(
        engine,
        store,
        tmp_path / "cache",
        base_model_fingerprint=FP,
        max_loras=1,
        max_cpu_loras=1,
        max_disk_loras=2,
        max_lora_rank=8,
    )
    handle = ws.ensure(Resolved("acme", "moe", 1, stored.digest, stored.uri))
    assert (handle.path / PACKED_FILE).read_bytes() == (stored.path / PACKED_FILE).read_bytes()
    ws.evict(stored.digest)
    shutil.copyfile(handle.path / WEIGHTS_FILE, handle.path / PACKED_FILE)  # rot on local disk
    with pytest.raises(AdapterDigestMismatch, match="digest"):
        ws.ensure(Resolved("acme", "moe", 1, stored.digest, stored.uri))
