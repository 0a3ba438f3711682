"""The one way the trainer gets its tokens: :func:`open_data`, and the data checks of sweep plans.

``open_data(None, ...)`` is the built-in offline corpus (:mod:`scaling.training.data.corpus`, the
default for the CPU proxies and the tests); ``open_data(folder, ...)`` is a prepared shard set
(:mod:`scaling.training.data.shards`, made by ``smelt-scale prepare-data``). Both offer::

    vocab_size, n_train_tokens, bytes_per_token, bpb(loss), identity, provenance, sources
    train_batch(seed, step, batch_size, seq_len, rank=0, world_size=1) -> (x, y)
    val_windows(seq_len, n=None) -> (x, y)
    val_windows_by_source(seq_len, n=None) -> {source: (x, y)}

``train_batch`` is a pure function of its arguments (resume and data-parallel ranks stay exact);
validation windows are fixed by the data (the corpus spec or the manifest).

Passes over the data (for plans): a WSD run with budgets D_1 < ... < D_n trains its trunk on
the batches of steps 0..S_n and replays trunk batches in each cooldown branch, so it reads
D_n distinct-batch tokens; ``epochs = D_n / n_train_tokens``. Windows are drawn uniformly at
random, so an epoch is a count of tokens, not a guarantee that each token is seen once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from scaling.common.errors import UserError
from scaling.common.files import sha256_file
from scaling.training.data.corpus import Corpus, DataSpec, cache_root, load_corpus
from scaling.training.data.shards import ShardSet, load_shards

TokenData = Union[Corpus, ShardSet]
DATA_KEYS = {
    "path": "folder made by `smelt-scale prepare-data` (absent: the built-in corpus)",
    "tokenizer": "tokenizer.json the shards must have been made with",
    "allow_repeat": "allow more passes over the training split than the limit",
    "max_bytes": "built-in corpus only: a small deterministic subset",
    "val_fraction": "built-in corpus only: fraction of documents held out",
    "verify": "cheap (default: re-hash shards whose size or mtime changed) or full (hash every shard)",
}
# [data] keys -> TrainConfig fields
DATA_TO_TRAIN = {"path": "data", "tokenizer": "data_tokenizer", "max_bytes": "data_max_bytes",
                 "val_fraction": "data_val_fraction", "verify": "data_verify",
                 "codec_tables": "data_codec_tables"}


def expand_path(path: str | os.PathLike) -> Path:
    """``~`` and ``$VARS`` expanded; relative paths stay relative to the working directory."""
    return Path(os.path.expandvars(os.path.expanduser(str(path))))


def open_data(
    path: str | os.PathLike | None = None,
    *,
    vocab_size: int,
    max_bytes: int | None = None,
    val_fraction: float = 0.025,
    cache_dir: str | os.PathLike | None = None,
    tokenizer: str | os.PathLike | None = None,
    verify: bool | str = True,
    codec_tables: bool = False,
) -> TokenData:
    """The training data of a model with ``vocab_size`` logits.

    path None: the built-in corpus with a BPE of ``vocab_size`` (``max_bytes``, ``val_fraction``,
    ``codec_tables``: see :class:`~scaling.training.data.corpus.DataSpec`; cached under
    ``cache_dir``). Otherwise the shard folder at ``path``; refused (UserError, one line) when the
    model's vocabulary is smaller than the data's, when ``tokenizer`` is given and is not the file
    the shards were made with, or (``verify``) when a shard's SHA-256 differs from its manifest.

    ``verify``: ``"full"`` hashes every shard (and the tokenizer) now; ``"cheap"`` or True skips
    the files whose (size, mtime) match the last successful full hash of this manifest (kept
    under ``$SMELT_CACHE/verified``), so a change that keeps size and mtime (bit rot) goes
    unseen; False checks sizes only.
    """
    if path is None:
        if tokenizer is not None:
            raise UserError("a data tokenizer applies to a shard folder, not to the built-in corpus")
        return load_corpus(DataSpec(vocab_size=vocab_size, max_bytes=max_bytes, val_fraction=val_fraction,
                                    codec_tables=codec_tables), cache_dir)
    folder = expand_path(path)
    if verify not in (True, False, "cheap", "full"):
        raise UserError(f"data verification must be cheap or full, got {verify!r}")
    shards = load_shards(folder, verify=bool(verify), stamp_dir=cache_root() / "verified",
                         trust_stamps=verify != "full")
    if vocab_size < shards.vocab_size:
        raise UserError(f"model vocabulary {vocab_size:,} is smaller than the vocabulary "
                        f"{shards.vocab_size:,} of the data in {folder}")
    if tokenizer is not None:
        tok = expand_path(tokenizer)
        if not tok.is_file():
            raise UserError(f"data tokenizer {tok} does not exist")
        made_with = (shards.manifest.get("tokenizer") or {}).get("sha256")
        if made_with is None:
            raise UserError(f"the shards in {folder} do not record their tokenizer, so {tok} cannot be "
                            "checked")
        if sha256_file(tok) != made_with:
            raise UserError(f"tokenizer {tok} differs from the one the shards in {folder} were made with "
                            f"(sha256 {made_with[:12]}...)")
    return shards


# ----- sweep plans ------------------------------------------------------------------------


def check_data_table(table: Any, where: str) -> dict[str, Any]:
    """A plan's [data] table, validated (unknown keys and wrong types are errors)."""
    from scaling.training.schema import DATA, check_table

    table = check_table(table, DATA, where, "[data]")
    if "path" in table and ("max_bytes" in table or "val_fraction" in table or "codec_tables" in table):
        raise UserError(f"{where}: [data] max_bytes, val_fraction and codec_tables apply to the built-in "
                        "corpus, not to a path")
    return dict(table)


@dataclass(frozen=True)
class DataUse:
    """How much of its data one planned run reads."""

    run: str
    data: str  # "built-in" or the folder
    train_tokens: int | None  # None: the data could not be opened (see problem)
    read_tokens: int  # D_max (distinct-batch tokens; cooldown branches replay the trunk)
    problem: str | None = None

    @property
    def epochs(self) -> float | None:
        return None if not self.train_tokens else self.read_tokens / self.train_tokens

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "data": self.data, "train_tokens": self.train_tokens,
                "data_tokens": self.read_tokens, "epochs": self.epochs, "data_problem": self.problem}


def plan_data_use(runs, cache_dir: str | os.PathLike | None = None) -> list[DataUse]:
    """DataUse of each PlannedRun; data that cannot be opened gives ``problem``, not an error.
    Shards are checked by size only here (hashes are checked when a run opens them)."""
    opened: dict[tuple, Any] = {}
    out = []
    for run in runs:
        d = run.data
        train = run.train
        key = (d.get("path"), run.model.vocab_size, d.get("max_bytes", train.get("data_max_bytes")),
               d.get("val_fraction", train.get("data_val_fraction", 0.025)), d.get("tokenizer"),
               bool(d.get("codec_tables", train.get("data_codec_tables", False))))
        if key not in opened:
            try:
                data = open_data(key[0], vocab_size=key[1], max_bytes=key[2], val_fraction=key[3],
                                 cache_dir=cache_dir, tokenizer=key[4], verify=False, codec_tables=key[5])
                opened[key] = data.n_train_tokens
            except UserError as exc:
                opened[key] = exc
        got = opened[key]
        label = str(expand_path(key[0])) if key[0] else "the built-in corpus"
        if isinstance(got, UserError):
            problem = got.with_hint()  # a line of `sweep --dry-run`'s report
            if key[0] is not None and not expand_path(key[0]).exists():
                problem = (f"[data] path {label} does not exist: set [data] path to a folder made by "
                           "`smelt-scale prepare-data`")
            out.append(DataUse(run.name, label, None, int(max(run.budgets)), problem))
        else:
            out.append(DataUse(run.name, label, int(got), int(max(run.budgets))))
    return out


def check_data_use(uses: list[DataUse], allow_repeat: bool, max_epochs: float) -> tuple[list[str], list[str]]:
    """(errors, warnings), one message per problem or per data set: unusable data and more than
    ``max_epochs`` passes (unless ``allow_repeat``) are errors; more than one pass is a warning."""
    errors: dict[str, int] = {}
    over: dict[tuple[str, bool], list[DataUse]] = {}
    for u in uses:
        if u.problem:
            errors[u.problem] = errors.get(u.problem, 0) + 1
        elif u.epochs > 1:
            over.setdefault((u.data, u.epochs > max_epochs and not allow_repeat), []).append(u)
    out_errors = [p if n == 1 else f"{p} ({n} runs)" for p, n in errors.items()]
    warnings = []
    for (data, refused), group in over.items():
        worst = max(group, key=lambda u: u.epochs)
        limit = max_epochs if refused else 1
        msg = (f"{len(group)} run(s) read more than {limit:g} pass(es) over the "
               f"training split of {data} ({worst.train_tokens:,} tokens), up to {worst.epochs:.3g} "
               f"({worst.run})")
        if refused:
            out_errors.append(msg + "; add data, or set allow_repeat = true in [data]")
        else:
            warnings.append(msg)
    return out_errors, warnings
