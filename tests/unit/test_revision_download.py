"""`mint revision download`: a stored revision as a folder stock PEFT loads (catalog.download),
and the command around it (the catalog faked; the store and PEFT real)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from peft import PeftModel, get_peft_model_state_dict
from safetensors.torch import load_file

from catalog.download import DownloadRefused, write_peft_folder
from catalog.store import AdapterStore
from tests.unit.test_packed import FP, Toy, assert_same, peft_toy, save_peft

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("kind", ["params", "modules"])
def test_a_stored_revision_downloads_as_a_folder_stock_peft_loads(tmp_path: Path, kind) -> None:
    model = peft_toy(kind)
    src = save_peft(model, tmp_path / "src")
    store = AdapterStore(tmp_path / "store")
    stored = store.put(
        src, tenant="acme", policy="moe", base_model="toy", base_model_fingerprint=FP
    )
    dest = tmp_path / "out"
    assert write_peft_folder(stored, dest) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "mint-revision.json",
    ]
    assert_same(
        load_file(str(dest / "adapter_model.safetensors")),
        load_file(str(src / "adapter_model.safetensors")),
    )
    loaded = PeftModel.from_pretrained(Toy(), str(dest))
    assert_same(
        {k: v.detach() for k, v in get_peft_model_state_dict(loaded).items()},
        {k: v.detach() for k, v in get_peft_model_state_dict(model).items()},
    )
    provenance = json.loads((dest / "mint-revision.json").read_text())
    assert (provenance["tenant"], provenance["policy"], provenance["digest"]) == (
        "acme",
        "moe",
        stored.digest,
    )


def test_a_folder_with_files_in_it_is_refused(tmp_path: Path) -> None:
    store = AdapterStore(tmp_path / "store")
    src = save_peft(peft_toy("params"), tmp_path / "src")
    stored = store.put(
        src, tenant="acme", policy="moe", base_model="toy", base_model_fingerprint=FP
    )
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "adapter_model.safetensors").write_bytes(b"another adapter")
    with pytest.raises(DownloadRefused, match="not an empty folder"):
        write_peft_folder(stored, tmp_path / "full")
    assert (tmp_path / "full" / "adapter_model.safetensors").read_bytes() == b"another adapter"


def test_the_command_resolves_the_reference_and_refuses_another_policys_store_path(
    tmp_path: Path, monkeypatch
) -> None:
    from contextlib import contextmanager

    from mint.cli import main
    from mint.commands import revisions

    store = AdapterStore(tmp_path / "store")
    src = save_peft(peft_toy("params"), tmp_path / "src")
    mine = store.put(src, tenant="acme", policy="moe", base_model="toy", base_model_fingerprint=FP)
    theirs = store.put(
        src, tenant="other", policy="moe", base_model="toy", base_model_fingerprint=FP
    )
    uris = {"acme": mine.uri, "evil": theirs.uri}

    class Repo:
        def resolve(self, ref):
            assert (ref.tenant, ref.policy) in {("acme", "moe"), ("evil", "moe")}
            return SimpleNamespace(revision=3)

        def get_revision(self, tenant, policy, revision):
            return SimpleNamespace(
                ref=f"{tenant}/{policy}@{revision}", digest=mine.digest, store_uri=uris[tenant]
            )

    @contextmanager
    def fake_repo():
        yield Repo()

    monkeypatch.setattr(revisions, "catalog_repo", fake_repo)
    monkeypatch.setattr(AdapterStore, "from_settings", classmethod(lambda cls, s: store))
    runner = CliRunner()
    got = runner.invoke(
        main, ["revision", "download", "acme/moe@prod", "--out", str(tmp_path / "a")]
    )
    assert got.exit_code == 0, got.output
    assert "acme/moe@3" in got.stderr and (tmp_path / "a" / "adapter_model.safetensors").is_file()
    # a catalog row pointing at another tenant's files is refused by the store's owner check
    evil = runner.invoke(main, ["revision", "download", "evil/moe@1", "--out", str(tmp_path / "b")])
    assert evil.exit_code == 1 and "error:" in evil.stderr
    assert not (tmp_path / "b").exists()
