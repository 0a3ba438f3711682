"""`smelt-scale prepare-data`: a user's corpus (text, JSONL, Parquet) or existing token files -> shards."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from scaling.cli._util import emit_json, run_cli, show_progress, stderr, stdout, warn
from scaling.common.errors import UserError


class _Bar:
    """Rich progress bar with MB/s on stderr, one task per phase (hashing, tokenizer, tokenizing)."""

    def __init__(self, enabled: bool):
        self.bar, self.tasks = None, {}
        if enabled:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self.bar = Progress(TextColumn("[bold]{task.description:<18}"), BarColumn(), DownloadColumn(),
                                TransferSpeedColumn(), TimeRemainingColumn(), console=stderr)

    def __enter__(self):
        if self.bar:
            self.bar.start()
        return self

    def __exit__(self, *exc):
        if self.bar:
            self.bar.stop()

    def __call__(self, phase: str, done: int, total: int) -> None:
        if self.bar is None:
            return
        if phase not in self.tasks:
            self.tasks[phase] = self.bar.add_task(phase, total=total)
        self.bar.update(self.tasks[phase], completed=done)


def _summary(m: dict) -> dict:
    tok = m.get("tokenizer") or {}
    return {
        "dtype": m["dtype"],
        "vocab_size": m["vocab_size"],
        "shards": len(m["shards"]),
        "train_tokens": sum(s["tokens"] for s in m["shards"] if s["split"] == "train"),
        "val_tokens": sum(s["tokens"] for s in m["shards"] if s["split"] == "val"),
        "documents": m.get("documents"),
        "val_bytes_per_token": m.get("val_bytes_per_token"),
        "val_sources": [s["name"] for s in m.get("val_sources", [])],
        "tokenizer_sha256": tok.get("sha256"),
    }


def register(app: typer.Typer) -> None:
    @app.command("prepare-data")
    @run_cli
    def prepare_data(
        sources: List[str] = typer.Argument(
            ..., help="Input files, folders or glob patterns; prefix NAME= to name a source "
            "(code=src/*.jsonl)."
        ),
        out: Optional[Path] = typer.Option(
            None, "--out", help="Output folder for the shards and manifest.json."
        ),
        tokenizer: Optional[Path] = typer.Option(
            None, help="Hugging Face tokenizer.json to encode with (copied into the output)."
        ),
        vocab_size: Optional[int] = typer.Option(
            None, help="Train a byte-level BPE of this vocabulary on the training split (no --tokenizer); "
            "with --dtype: the vocabulary of the existing shards."
        ),
        text_field: str = typer.Option("text", help="JSONL key / Parquet column holding the text."),
        id_field: str = typer.Option("id", help="Document id field; missing: the SHA-256 of the text."),
        split_by: str = typer.Option(
            "text", help="What the validation split hashes: text (exact duplicates share a split, whatever "
            "their ids) or id (revisions of one document share a split)."
        ),
        source_field: Optional[str] = typer.Option(
            None, help="Field naming each document's source (for per-source validation loss)."
        ),
        val_fraction: float = typer.Option(
            0.01, help="Fraction of documents held out, chosen by a hash of each text (see --split-by)."
        ),
        shard_tokens: int = typer.Option(1 << 24, help="Tokens per shard."),
        tokenizer_train_bytes: int = typer.Option(
            1 << 30, help="Text (bytes of the training split) the BPE is trained on."
        ),
        bos_token: Optional[str] = typer.Option(None, help="BOS token of --tokenizer (default: by name)."),
        eos_token: Optional[str] = typer.Option(None, help="EOS token of --tokenizer (default: by name)."),
        dtype: Optional[str] = typer.Option(
            None, help="Index existing token files instead (uint16 or uint32; needs --vocab-size)."
        ),
        bos_id: Optional[int] = typer.Option(None, help="With --dtype: the BOS id the files use."),
        eos_id: Optional[int] = typer.Option(None, help="With --dtype: the EOS id the files use."),
        overwrite: bool = typer.Option(False, "--overwrite", help="Replace shards already in --out."),
        quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
        json_out: bool = typer.Option(False, "--json", help="Print the manifest summary as one JSON object."),
    ) -> None:
        """Tokenize text, JSONL or Parquet into uint16/uint32 token shards with a manifest.json.

        Documents go to validation by a hash of their text (or of their id: --split-by), never by
        position. The output is resumable: rerun the same command after an interruption and finished
        shards are kept.

        Existing shards without a manifest (nanoGPT's train.bin/val.bin, OLMo-style .npy token
        files) are accepted too: pass their folder with --dtype and --vocab-size (and optionally
        --tokenizer to record it and measure bytes per token); a manifest.json is written beside them.
        """
        from scaling.training.data.prepare import PrepareOptions, fallback_warnings, index_existing, prepare

        with _Bar(show_progress(json_out, quiet)) as bar:
            if dtype is not None:
                if len(sources) != 1 or vocab_size is None:
                    raise UserError("--dtype indexes one folder of existing shards and needs --vocab-size")
                if out is not None and Path(out).resolve() != Path(sources[0]).resolve():
                    raise UserError("--dtype writes manifest.json beside the existing shards; omit --out")
                manifest = index_existing(sources[0], dtype, vocab_size,
                                          tokenizer=str(tokenizer) if tokenizer else None,
                                          bos_id=bos_id, eos_id=eos_id, progress=bar)
                folder = Path(sources[0])
            else:
                if out is None:
                    raise UserError("--out is required (the output folder)")
                if tokenizer is None and vocab_size is None:
                    raise UserError("give --tokenizer tokenizer.json or --vocab-size N")
                opts = PrepareOptions(
                    text_field=text_field, id_field=id_field, source_field=source_field, split_by=split_by,
                    val_fraction=val_fraction, tokenizer=str(tokenizer) if tokenizer else None,
                    vocab_size=vocab_size, tokenizer_train_bytes=tokenizer_train_bytes,
                    bos_token=bos_token, eos_token=eos_token, shard_tokens=shard_tokens,
                )
                manifest = prepare(sources, out, opts, overwrite=overwrite, progress=bar)
                folder = out
        s = _summary(manifest)
        for w in fallback_warnings(manifest):
            warn(w)
        if json_out:
            emit_json({"out": str(folder), "manifest": str(folder / "manifest.json"), **s,
                       "field_fallbacks": manifest.get("field_fallbacks")})
            return
        bpt = s["val_bytes_per_token"]
        stdout.print(
            f"{folder}/manifest.json: {s['shards']} {s['dtype']} shards, vocab {s['vocab_size']:,}; "
            f"train {s['train_tokens']:,} tokens, val {s['val_tokens']:,} tokens"
            + (f", {bpt:.3f} bytes/token" if bpt else "")
            + (f"; val sources {', '.join(s['val_sources'])}" if s["val_sources"] else ""),
            highlight=False, markup=False,
        )
