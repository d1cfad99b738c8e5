"""Adapter store and manifest: content addressing, atomic writes, verified reads, refusals."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from catalog.artifacts import adapter_digest, inspect_adapter, model_fingerprint
from catalog.exceptions import (
    AdapterCorrupted,
    AdapterNotFound,
    AdapterRejected,
    AdapterShapeMismatch,
    BaseModelMismatch,
    CatalogUnavailable,
    InvalidReference,
    NonFiniteWeights,
    StoreUnavailable,
    UnsafeWeightsFormat,
)
from catalog.store import AdapterStore
from schemas.names import in_namespace
from streams.records import is_transient

FP = "sha256:" + "a" * 64
OTHER_FP = "sha256:" + "b" * 64
PREFIX = "base_model.model.model.layers.0.self_attn"


def write_adapter(
    path: Path,
    *,
    r: int = 4,
    tensor_r: int | None = None,
    targets: tuple[str, ...] = ("q_proj", "v_proj"),
    tensor_targets: tuple[str, ...] | None = None,
    seed: int = 0,
    poison: float | None = None,
    extra: dict | None = None,
) -> Path:
    """A hand-made PEFT LoRA directory (no model needed): layer 0, hidden 16."""
    path.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tr = tensor_r or r
    tensors = {}
    for t in tensor_targets or targets:
        tensors[f"{PREFIX}.{t}.lora_A.weight"] = torch.randn(tr, 16, generator=g)
        tensors[f"{PREFIX}.{t}.lora_B.weight"] = torch.randn(16, tr, generator=g)
    if poison is not None:
        tensors[f"{PREFIX}.{targets[0]}.lora_B.weight"][3, 1] = poison
    save_file(tensors, str(path / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "r": r,
        "lora_alpha": 2 * r,
        "target_modules": list(targets),
        "target_parameters": None,
        "rank_pattern": {},
        "base_model_name_or_path": "tiny",
        **(extra or {}),
    }
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path


@pytest.fixture
def store(tmp_path: Path) -> AdapterStore:
    return AdapterStore(tmp_path / "store")


def put(store: AdapterStore, src: Path, **kw):
    args = dict(tenant="acme", policy="math-rl", base_model="tiny", base_model_fingerprint=FP)
    return store.put(src, **(args | kw))


def test_put_then_open_round_trips_and_is_content_addressed(store, tmp_path):
    src = write_adapter(tmp_path / "a")
    stored = put(store, src, training={"objective": "sft", "steps": 3})
    digest, _ = adapter_digest(src)
    assert stored.digest == digest
    assert stored.path.name == digest.removeprefix("sha256:")
    assert sorted(os.listdir(stored.path)) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "manifest.json",
    ]
    m = stored.manifest
    assert (m.rank, m.lora_alpha, m.target_modules) == (4, 8.0, ["q_proj", "v_proj"])
    assert m.training == {"objective": "sft", "steps": 3}
    assert in_namespace(stored.uri, "acme", "math-rl")
    again = store.open(stored.uri, base_model_fingerprint=FP)
    assert again.digest == stored.digest and again.manifest == m
    assert store.list("acme", "math-rl") == [digest]


def test_same_bytes_same_revision_and_no_temporary_leftovers(store, tmp_path):
    a = put(store, write_adapter(tmp_path / "a"))
    b = put(store, write_adapter(tmp_path / "b"))  # identical content, other folder
    c = put(store, write_adapter(tmp_path / "c", seed=1))
    assert a.uri == b.uri and a.digest == b.digest
    assert c.digest != a.digest
    assert os.listdir(store.root / ".tmp") == []


def test_failed_write_leaves_nothing_behind(store, tmp_path, monkeypatch):
    src = write_adapter(tmp_path / "a")
    calls = []
    real_copy = shutil.copyfile

    def flaky_copy(a, b):
        calls.append(a)
        if len(calls) == 2:
            raise OSError("disk full")
        return real_copy(a, b)

    monkeypatch.setattr("catalog.store.shutil.copyfile", flaky_copy)
    with pytest.raises(OSError, match="disk full"):
        put(store, src)
    assert store.list("acme", "math-rl") == []
    assert os.listdir(store.root / ".tmp") == []


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (
            lambda p: (write_adapter(p), (p / "adapter_model.bin").write_bytes(b"\x80\x04pickle")),
            UnsafeWeightsFormat,
            r"\['adapter_model.bin'\]: pickle-based weights .* refused",
        ),
        (
            lambda p: (write_adapter(p), (p / "adapter_model.safetensors").unlink()),
            UnsafeWeightsFormat,
            "adapter_model.safetensors is missing",
        ),
        (
            lambda p: (
                write_adapter(p),
                (p / "adapter_model.safetensors").write_bytes(b"\x80\x04not safetensors"),
            ),
            UnsafeWeightsFormat,
            "not a readable safetensors file",
        ),
        (
            lambda p: write_adapter(p, poison=float("nan")),
            NonFiniteWeights,
            r"q_proj.lora_B.weight' holds 1 NaN/Inf value\(s\) of 64",
        ),
        (
            lambda p: write_adapter(p, poison=float("inf")),
            NonFiniteWeights,
            "NaN/Inf",
        ),
        (
            lambda p: write_adapter(p, r=8, tensor_r=4),
            AdapterShapeMismatch,
            "has rank dimension 4 but r=8",
        ),
        (
            lambda p: write_adapter(
                p, targets=("q_proj", "k_proj", "v_proj"), tensor_targets=("q_proj", "v_proj")
            ),
            AdapterShapeMismatch,
            r"targets \['k_proj'\] but adapter_model.safetensors has no LoRA tensors",
        ),
        (
            lambda p: write_adapter(p, targets=("q_proj",), tensor_targets=("q_proj", "o_proj")),
            AdapterShapeMismatch,
            "module '.*o_proj', which is not in target_modules",
        ),
        (
            lambda p: write_adapter(p, extra={"peft_type": "IA3"}),
            AdapterShapeMismatch,
            "peft_type='IA3', expected 'LORA'",
        ),
    ],
    ids=[
        "pickle",
        "no-safetensors",
        "fake-safetensors",
        "nan",
        "inf",
        "rank",
        "missing-target",
        "extra-target",
        "not-lora",
    ],
)
def test_bad_adapters_are_refused_with_their_message(store, tmp_path, make, error, match):
    src = tmp_path / "bad"
    src.mkdir()
    make(src)
    with pytest.raises(error, match=match):
        put(store, src)
    with pytest.raises(AdapterRejected):
        inspect_adapter(src)
    assert store.list("acme", "math-rl") == []
    assert issubclass(error, ValueError)  # callers that only know ValueError still catch it


def test_base_model_mismatch_is_refused_on_read_and_on_child_write(store, tmp_path):
    parent = put(store, write_adapter(tmp_path / "a"))
    with pytest.raises(BaseModelMismatch, match="trained on base model 'tiny' with fingerprint"):
        store.open(parent.uri, base_model_fingerprint=OTHER_FP)
    with pytest.raises(BaseModelMismatch, match="differs from the parent revision"):
        put(
            store,
            write_adapter(tmp_path / "b", seed=2),
            parent=parent,
            base_model_fingerprint=OTHER_FP,
        )
    child = put(store, write_adapter(tmp_path / "c", seed=3), parent=parent, parent_revision=1)
    assert child.manifest.parent_digest == parent.digest
    assert child.manifest.parent_revision == 1


def test_every_read_verifies_the_digest(store, tmp_path):
    stored = put(store, write_adapter(tmp_path / "a"))
    weights = stored.path / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01  # one flipped bit in the last tensor's bytes
    weights.write_bytes(bytes(data))
    with pytest.raises(AdapterCorrupted, match="content digest is sha256:.* but the manifest says"):
        store.open(stored.uri)


def test_edited_manifest_is_refused(store, tmp_path):
    stored = put(store, write_adapter(tmp_path / "a"))
    path = stored.path / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["rank"] = 16
    path.write_text(json.dumps(manifest))
    with pytest.raises(AdapterShapeMismatch, match="manifest.json: rank=16 but the adapter has 4"):
        store.open(stored.uri)
    path.write_text("{not json")
    with pytest.raises(AdapterCorrupted, match="manifest.json in .* is invalid"):
        store.open(stored.uri)


def test_unknown_and_foreign_uris(store, tmp_path):
    with pytest.raises(AdapterNotFound, match="no stored revision"):
        store.get("acme", "math-rl", "sha256:" + "0" * 64)
    with pytest.raises(InvalidReference, match="outside this store's root"):
        store.open((tmp_path / "elsewhere").as_uri())
    with pytest.raises(InvalidReference, match="scale-out path"):
        AdapterStore("s3://bucket/prefix")


def test_model_fingerprint_is_stable_and_content_derived(tmp_path):
    def model(path: Path, value: float, name: str = "tiny") -> Path:
        path.mkdir()
        (path / "config.json").write_text(
            json.dumps({"model_type": "llama", "hidden_size": 16, "_name_or_path": name})
        )
        save_file({"w": torch.full((4, 4), value)}, str(path / "model.safetensors"))
        return path

    a = model_fingerprint(model(tmp_path / "a", 1.0))
    assert a == model_fingerprint(model(tmp_path / "b", 1.0, name="/other/place"))
    assert a != model_fingerprint(model(tmp_path / "c", 1.5))
    assert a.startswith("sha256:") and len(a) == 71
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "config.json").write_text("{}")
    (tmp_path / "d" / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(UnsafeWeightsFormat, match="no \\*.safetensors weights"):
        model_fingerprint(tmp_path / "d")


def test_request_records_are_written_once(store):
    rid = "6f1c2d3e-0000-4000-8000-000000000001"
    assert store.find_request("acme", "math-rl", rid) is None
    store.record_request("acme", "math-rl", rid, {"revision": 2, "digest": FP})
    store.record_request("acme", "math-rl", rid, {"revision": 3, "digest": OTHER_FP})
    assert store.find_request("acme", "math-rl", rid) == {"revision": 2, "digest": FP}
    with pytest.raises(InvalidReference, match="must be a UUID"):
        store.find_request("acme", "math-rl", "../../etc")


def test_a_revision_opens_only_for_its_own_policy(store, tmp_path):
    import shutil

    from catalog.exceptions import CrossTenantReference

    stored = put(store, write_adapter(tmp_path / "a"))
    assert store.open(stored.uri, owner=("acme", "math-rl")).digest == stored.digest
    # The URI names another policy's folder: refused on its path components.
    with pytest.raises(CrossTenantReference, match="outside other/math-rl's folder"):
        store.open(stored.uri, owner=("other", "math-rl"))
    # The same bytes copied into another tenant's folder: the path passes, the manifest does not.
    copy = store.root / "other" / "math-rl" / "adapters" / stored.path.name
    shutil.copytree(stored.path, copy)
    with pytest.raises(CrossTenantReference, match="belongs to acme/math-rl by its manifest"):
        store.open(copy.as_uri(), owner=("other", "math-rl"))


@pytest.mark.parametrize(
    ("uri", "tenant", "policy", "inside"),
    [
        ("file:///store/acme/math-rl/adapters/x", "acme", "math-rl", True),
        ("file:///store/xacme/math-rl/adapters/x", "acme", "math-rl", False),  # a longer name
        ("file:///store/acme/math-rl", "acme", "math-rl", False),  # nothing below the namespace
        ("file:///store/acme/math-rl/../other/x", "acme", "math-rl", False),  # traversal
        ("s3://bucket/acme/math-rl/rollouts/r.jsonl", "acme", "math-rl", True),
    ],
)
def test_namespace_is_compared_on_path_components(uri, tenant, policy, inside):
    assert in_namespace(uri, tenant, policy) is inside


def test_claim_checks_are_read_only_inside_the_root_and_the_owners_folder(store, tmp_path):
    from catalog.claims import read_jsonl, write_jsonl
    from catalog.exceptions import CrossTenantReference

    uri = write_jsonl(store, "acme", "math-rl", "data", "sft", [{"prompt": "a"}])
    assert read_jsonl(store, uri, owner=("acme", "math-rl")) == [{"prompt": "a"}]
    with pytest.raises(CrossTenantReference):  # another tenant's request naming acme's file
        read_jsonl(store, uri, owner=("evil", "math-rl"))
    outside = tmp_path / "acme" / "math-rl" / "data" / "x.jsonl"  # namespace-looking, no store
    outside.parent.mkdir(parents=True)
    outside.write_text('{"prompt": "b"}\n')
    with pytest.raises(InvalidReference, match="outside this store's root"):
        read_jsonl(store, outside.as_uri(), owner=("acme", "math-rl"))
    with pytest.raises(AdapterNotFound, match="does not exist"):
        read_jsonl(store, uri.replace("sft", "nope"), owner=("acme", "math-rl"))
    bad = store.root / "acme" / "math-rl" / "data" / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(InvalidReference, match="line 1 is not JSON"):
        read_jsonl(store, bad.as_uri())


# A store that is away (unmounted, hung or stale mount, full) is an outage the consumer loop
# waits out, not a bad revision: it was dead-lettered as poison (issue 25, defect 10).
@pytest.mark.parametrize(
    ("error", "unavailable"),
    [
        (OSError(errno.EIO, "Input/output error"), True),
        (OSError(errno.ENOTCONN, "Transport endpoint is not connected"), True),  # FUSE mount gone
        (OSError(errno.ESTALE, "Stale file handle"), True),  # NFS
        (TimeoutError(errno.ETIMEDOUT, "Connection timed out"), True),
        (OSError(errno.ENOSPC, "No space left on device"), True),
        (PermissionError(errno.EACCES, "Permission denied"), False),  # a setup fault: loud
        (OSError(errno.EROFS, "Read-only file system"), False),
    ],
)
def test_a_store_that_is_away_is_unavailable_not_a_bad_revision(
    store, tmp_path, monkeypatch, error, unavailable
):
    stored = put(store, write_adapter(tmp_path / "a"))

    def failing(*args, **kwargs):
        raise error

    monkeypatch.setattr("catalog.store.adapter_digest", failing)  # every read hashes the files
    with pytest.raises(StoreUnavailable if unavailable else type(error)) as caught:
        store.open(stored.uri)
    assert is_transient(caught.value) is unavailable
    if unavailable:
        assert isinstance(caught.value, CatalogUnavailable) and caught.value.__cause__ is error
        assert f"adapter store at {str(store.root)!r} is not reachable" in str(caught.value)
    monkeypatch.setattr("catalog.store.shutil.copyfile", failing)
    with pytest.raises(StoreUnavailable if unavailable else type(error)):
        put(store, write_adapter(tmp_path / "b", seed=1))


def test_a_missing_store_root_is_unavailable_a_missing_revision_is_not(store, tmp_path):
    from catalog.claims import read_jsonl, write_jsonl

    stored = put(store, write_adapter(tmp_path / "a"))
    uri = write_jsonl(store, "acme", "math-rl", "data", "sft", [{"prompt": "a"}])
    with pytest.raises(AdapterNotFound):  # the root is there: this revision is not
        store.get("acme", "math-rl", "sha256:" + "c" * 64)
    shutil.rmtree(store.root)  # unmounted
    with pytest.raises(StoreUnavailable, match="is not there to open a revision"):
        store.open(stored.uri)
    with pytest.raises(StoreUnavailable, match="not reachable to read a claim check"):
        read_jsonl(store, uri, owner=("acme", "math-rl"))
