"""`scalelab data`: tokenise a source once per (source, tokenizer) into shared token shards
(jobs/data/prepare.py), and list what is prepared."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.table import Table

from scalelab.cli.console import fail, stdout_console
from scalelab.jobs.data.shards import DEFAULT_SHARD_TOKENS, MANIFEST

app = typer.Typer(
    help="Training text, tokenised once per (source, tokenizer) and shared by every trial.",
    no_args_is_help=True,
)
out = stdout_console(160)


@app.command()
def prepare(
    source: str = typer.Argument(
        ...,
        help="builtin:pydoc, a local .parquet/.jsonl/.json/.csv/.txt file, folder or glob "
        # typer reads help as rich markup: a backslash keeps the "[" literal
        "(quote it), or hf:<owner>/<name>\\[/<config>] (streamed)",
    ),  # fmt: skip
    tokenizer: str = typer.Option("byte", "--tokenizer", "-t", help="byte, gpt2, or a file."),
    tokenizer_file: str = typer.Option(
        None, help="Where GPT-2's vocabulary is, when not installed (data.tokenizer_file)."
    ),
    text_field: str = typer.Option("text", help="The column holding the text."),
    max_tokens: int = typer.Option(
        None,
        min=1,
        help="Stop once this many training tokens are prepared (a later run "
        "with a larger number continues). Default: the whole source.",
    ),  # fmt: skip
    workers: int = typer.Option(
        None, min=0, help="Tokeniser processes (0: in this process). Default: one per CPU."
    ),
    storage: str = typer.Option(
        None,
        help="Also upload the prepared folder to <STORAGE>/data/<folder>/ (manifest.json "
        "last), where trials with this `storage:` fetch it, e.g. s3://bucket/prefix.",
    ),
    shard_tokens: int = typer.Option(
        DEFAULT_SHARD_TOKENS, min=1024, help="Tokens per shard (for a new dataset)."
    ),
) -> None:
    """Tokenise SOURCE into token shards under $SCALELAB_DATA (default
    $SCALELAB_HOME/data). Interrupted, it continues from the last complete shard."""
    from scalelab.contract.storage import check_uri
    from scalelab.jobs.data.prepare import Report, dataset_root, prepare_source
    from scalelab.jobs.data.shards import read_manifest
    from scalelab.jobs.data.sources import TextSource

    try:
        if storage:
            check_uri(storage)
        text = TextSource.open(source, text_field)
        root = dataset_root(text, tokenizer)
        report = Report(f"{source} ({tokenizer})")
        root, m = prepare_source(
            text, tokenizer, tokenizer_file, max_tokens=max_tokens, workers=workers,
            shard_tokens=shard_tokens, report=report,
        )  # fmt: skip
    except ValueError as e:
        raise fail(str(e)) from None
    except KeyboardInterrupt:
        m = read_manifest(root)
        kept = f"{len(m.train)} shards ({m.train_tokens:,} tokens)" if m else "nothing"
        print(f"interrupted: {kept} kept in {root}; run the same command to continue",
              file=sys.stderr)  # fmt: skip
        raise typer.Exit(130) from None
    state = "the whole source" if m.complete else f"stopped at --max-tokens {max_tokens:,}"
    out.print(
        f"{root}\n  {m.train_tokens:,} training tokens in {len(m.train)} shards, "
        f"{m.validation.tokens:,} validation tokens, {m.documents:,} documents, {m.dtype}; "
        f"{state}" + (f"; {report.rate / 1e6:.2f}M tokens/s" if report.tokens else ""),
        highlight=False,
    )
    if storage:
        _push(root, storage)


def _push(root: Path, storage: str) -> None:
    from scalelab.jobs.data.remote_data import RemoteData

    remote = RemoteData(storage, root.name)
    try:
        m = remote.push(root)
    except (OSError, ValueError) as e:
        raise fail(f"uploading {root.name} to {remote.uri} failed: {e}") from None
    out.print(f"  uploaded to {remote.uri}/ ({len(m.train) + 1} files, then {MANIFEST})",
              highlight=False)  # fmt: skip


@app.command("list")
def list_(as_json: bool = typer.Option(False, "--json", help="A JSON list.")) -> None:
    """What is prepared: source, tokenizer, tokens, bytes, and whether it is the whole source."""
    from scalelab.contract.workdir import data_dir
    from scalelab.jobs.data.shards import list_prepared

    rows = []
    for root, m in list_prepared():
        size = sum(p.stat().st_size for p in root.iterdir() if p.is_file())
        rows.append({"folder": root.name, "source": m.source, "tokenizer": m.tokenizer,
                     "dtype": m.dtype, "train_tokens": m.train_tokens,
                     "val_tokens": m.validation.tokens, "shards": len(m.train), "bytes": size,
                     "complete": m.complete})  # fmt: skip
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title=f"prepared data in {data_dir()}")
    for col in ("source", "tokenizer", "train tokens", "val tokens", "shards", "size", "state"):
        table.add_column(
            col, justify="left" if col in ("source", "tokenizer", "state") else "right"
        )
    for r in rows:
        table.add_row(r["source"], r["tokenizer"], f"{r['train_tokens']:,}",
                      f"{r['val_tokens']:,}", str(r["shards"]), f"{r['bytes'] / 2**20:,.1f} MiB",
                      "complete" if r["complete"] else "partial")  # fmt: skip
    table.caption = "none yet: scalelab data prepare SOURCE --tokenizer NAME" if not rows else ""
    out.print(table)
