"""`mint catalog import FILE`: revisions from another registry, in checkpointed chunks."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console

from mint.commands.cassandra import catalog_session
from mint.commands.errors import one_line_errors
from schemas.settings import get_settings

console = Console(stderr=True)
_FILE = click.Path(dir_okay=False, path_type=Path)


@click.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--keyspace", default=None, help="Keyspace to import into (default MINT_KEYSPACE).")
@click.option(
    "--workers",
    type=click.IntRange(0),
    default=1,
    help="Writer processes (each its own connection) beside the one reading the file; 0 "
    "writes from the reading process.",
)
@click.option("--concurrency", type=click.IntRange(1), default=64, help="Requests in flight each.")
@click.option(
    "--chunk-rows",
    type=click.IntRange(1),
    default=20_000,
    help="Lines per chunk (checkpoint step).",
)
@click.option(
    "--restart", is_flag=True, help="Discard the checkpoint and import from the first line."
)
@click.option(
    "--state", "state_path", type=_FILE, help="Checkpoint file (default FILE.import-state.json)."
)
@click.option(
    "--rejects", "rejects_path", type=_FILE, help="Rejected lines (default FILE.rejects.jsonl)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON line.")
@one_line_errors
def import_cmd(
    file: Path,
    keyspace: str | None,
    workers: int,
    concurrency: int,
    chunk_rows: int,
    restart: bool,
    state_path: Path | None,
    rejects_path: Path | None,
    as_json: bool,
) -> None:
    """Import revisions from another registry: FILE is JSON Lines, one revision a line.

    \b
    {"tenant": "acme", "policy": "math-rl", "revision": 3,
     "digest": "sha256:<64 hex>", "uri": "s3://adapters/acme/math-rl/3",
     "base_model": "qwen3-30b-a3b", "created_at": "2025-01-02T03:04:05Z",
     "rank": 8, "aliases": ["prod"]}

    created_at, rank and aliases are optional. JSONL only: Parquet needs pyarrow, which MinT
    does not install. A bad line goes to FILE.rejects.jsonl with its line number and reason;
    the rest are imported. The import checkpoints after every chunk (FILE.import-state.json): run
    the same command again after a crash to continue where it stopped; running it again after it
    finished leaves the same catalog. Imported revisions are not in the event log, so
    `mint catalog rebuild` does not recreate them (keep the file).

    Exit status: 0 imported, 3 imported with rejected lines, 1 error.
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from catalog.importer import import_file
    from schemas.exceptions import MintError

    settings = get_settings()
    ks = keyspace or settings.keyspace
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TextColumn("{task.fields[rows]:,} revisions, {task.fields[rejected]:,} rejected"),
        TextColumn("[cyan]{task.fields[rate]:,.0f} rows/s"),
        TimeElapsedColumn(),
        console=console,
        disable=as_json,
    )
    task = progress.add_task("import", total=file.stat().st_size, rows=0, rejected=0, rate=0)

    def on_progress(p) -> None:
        progress.update(
            task,
            completed=p.bytes_done,
            rows=p.counts.accepted,
            rejected=p.counts.rejected,
            rate=p.rows_per_s,
            description="re-reading checkpointed lines" if p.rereading else "import",
        )

    try:
        with catalog_session(settings) as session, progress:
            result = import_file(
                session,
                ks,
                file,
                settings=settings,
                workers=workers,
                concurrency=concurrency,
                chunk_rows=chunk_rows,
                restart=restart,
                state_path=state_path,
                rejects_path=rejects_path,
                on_progress=on_progress,
            )
    except KeyboardInterrupt:
        console.print(
            "[yellow]interrupted[/yellow]: run the same command again to continue "
            "from the last checkpoint"
        )
        sys.exit(130)
    except MintError:
        raise  # some are ConnectionErrors, hence OSErrors: printed by one_line_errors
    except OSError as e:  # the file, its checkpoint or its rejects file
        raise click.ClickException(
            f"{e}; pass --state and --rejects to keep the checkpoint and rejects elsewhere"
        ) from e
    c = result.counts
    if as_json:
        click.echo(json.dumps(result.as_dict()))
    else:
        resumed = (
            f" (resumed after line {result.resumed_from_line:,})"
            if result.resumed_from_line
            else ""
        )
        console.print(
            f"{file} -> {ks}{resumed}: {c.accepted:,} revisions imported, {c.duplicates:,} "
            f"duplicate lines, {c.rejected:,} rejected; {result.written_this_run:,} rows in "
            f"{result.seconds:.1f} s ({result.rows_per_s:,.0f} rows/s)"
        )
        if c.rejected:
            console.print(f"[yellow]rejected lines:[/yellow] {result.rejects_path}")
    sys.exit(3 if c.rejected else 0)
