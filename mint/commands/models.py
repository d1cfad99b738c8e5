"""`mint models …`: tiny real-architecture models for tests, demos and benchmarks."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console

console = Console(stderr=True)


@click.group("models")
def models() -> None:
    """Build local models (no model hub): random weights of real architectures + a BPE tokenizer."""


@models.command("tiny")
@click.option("--arch", type=click.Choice(["llama", "qwen3-moe", "deepseek-v3"]), required=True,
              help="transformers architecture: Llama, Qwen3-MoE, or DeepSeek-V3 (MLA + MoE).")  # fmt: skip
@click.option("--size", type=click.Choice(["test", "small"]), default="test", show_default=True,
              help="test: ≤ 20M parameters, fp32 (CPU tests); small: ≈ 0.5B, bf16 (benchmarks).")  # fmt: skip
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Folder to write.")
@click.option("--seed", type=int, default=0, show_default=True, help="Same seed, same bytes.")
@click.option("--overwrite", is_flag=True, help="Replace a non-empty --out folder.")
def tiny(arch: str, size: str, out: Path, seed: int, overwrite: bool) -> None:
    """Write a random-weight ARCH model of SIZE to OUT (loads in transformers, PEFT and vLLM)."""
    from workers.models import TinySpec, build_tiny
    from workers.models.exceptions import ModelError

    try:
        path = build_tiny(TinySpec(arch, size, seed), out, overwrite=overwrite)
    except ModelError as e:
        console.print(f"[red]error:[/red] {e}")
        sys.exit(1)
    console.print(f"wrote {arch}/{size} (seed {seed}) to {path}")


COMMANDS: list[click.Command] = [models]
