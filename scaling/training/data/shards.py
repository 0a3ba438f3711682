"""Token shards on disk: the ``manifest.json`` format and its memory-mapped reader.

A shard folder holds flat little-endian ``uint16`` (vocabulary <= 65,536) or ``uint32`` token
arrays that ``numpy.memmap`` reads without a header (``*.bin``, as nanoGPT writes them), or
``.npy`` files (the header is skipped by its stated ``offset``), and ``manifest.json``::

    format, format_version       "smelt-scale token shards", 1
    dtype, vocab_size            token dtype and the vocabulary the ids come from
    bos_id, eos_id               document layout: [bos] + ids + [eos] (each only if not null)
    tokenizer                    {path, sha256, vocab_size, kind} or null (ids made elsewhere)
    shards                       [{path, split, tokens, sha256, offset}] in stream order
    splits                       {train|val: {tokens, documents, bytes}}
    val_sources                  [{name, start, stop, documents, bytes, tokens}]: token ranges
                                 of the validation stream, one per named source
    val_bytes_per_token          UTF-8 bytes per token of the validation documents
                                 (separators excluded); null when unknown
    sources                      [{path, bytes, sha256, source, documents}] input files
    split_rule                   how documents were sent to validation

A split's *stream* is the concatenation of its shards in manifest order. Sampling follows
:class:`scaling.training.data.corpus.Corpus` exactly: a training batch is a pure function of
``(seed, step)`` (``batch_size`` windows of ``seq_len + 1`` tokens at offsets drawn by
``numpy.random.default_rng([seed, step])``, uniform over the stream, windows may cross shard
boundaries), and rank r of W takes rows [r*B/W, (r+1)*B/W). Validation windows tile the
validation stream (or one source's range of it) with stride ``seq_len + 1``, evenly spaced.

Integrity: every shard's size must equal ``offset + tokens * itemsize``; SHA-256 hashes are
checked at open. A successful check is remembered in ``$SMELT_CACHE/verified/`` under the
manifest hash with each file's (size, mtime), so a 100 GB set is hashed once per change, not
once per run (the trainer's default, ``data_verify = "cheap"``); a change that keeps a file's
size and mtime (bit rot, a tool that restores mtimes) is only caught by a full check
(``data_verify = "full"``, ``train --verify-data full``), which hashes every file again.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from scaling.common.errors import UserError
from scaling.common.files import check_regular_file, parse_json, read_json, read_text, sha256_file

MANIFEST = "manifest.json"
FORMAT = "smelt-scale token shards"
FORMAT_VERSION = 1
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}


def dtype_for_vocab(vocab_size: int) -> str:
    """The smallest shard dtype that holds every id of a vocabulary."""
    if vocab_size < 1:
        raise UserError(f"vocabulary size must be >= 1, got {vocab_size}")
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def npy_header(path: Path) -> tuple[int, np.dtype, int] | None:
    """(data offset, dtype, length) of a 1-D ``.npy`` file; None when ``path`` has no npy magic."""
    with open(path, "rb") as fh:
        if fh.read(6) != b"\x93NUMPY":
            return None
    try:
        arr = np.load(path, mmap_mode="r")  # reads the header only; the data stays on disk
    except ValueError as exc:
        raise UserError(f"{path} is not a readable .npy file ({exc})") from None
    if arr.ndim != 1:
        raise UserError(f"{path} holds an array of shape {arr.shape}; token shards are 1-D")
    return int(arr.offset), arr.dtype, int(arr.shape[0])


class _Stream:
    """One split's shards as a single random-access token stream (memory-mapped, opened lazily)."""

    def __init__(self, root: Path, shards: list[dict], dtype: np.dtype):
        self.root, self.shards, self.dtype = root, shards, dtype
        self.ends = np.cumsum([int(s["tokens"]) for s in shards], dtype=np.int64)
        self._maps: dict[int, np.memmap] = {}

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def _map(self, i: int) -> np.memmap:
        if i not in self._maps:
            s = self.shards[i]
            self._maps[i] = np.memmap(
                resolve(self.root, s["path"]), dtype=self.dtype, mode="r",
                offset=int(s.get("offset", 0)), shape=(int(s["tokens"]),),
            )
        return self._maps[i]

    def read(self, start: int, length: int) -> np.ndarray:
        """Tokens [start, start + length) of the stream (crossing shard boundaries as needed)."""
        out = np.empty(length, dtype=self.dtype)
        pos, filled = start, 0
        i = int(np.searchsorted(self.ends, pos, side="right"))
        while filled < length:
            lo = pos - (int(self.ends[i - 1]) if i else 0)
            take = min(length - filled, int(self.ends[i]) - pos)
            out[filled:filled + take] = self._map(i)[lo:lo + take]
            filled, pos, i = filled + take, pos + take, i + 1
        return out


def resolve(root: Path, rel: str) -> Path:
    p = Path(rel)
    return p if p.is_absolute() else root / p


def window_index(length: int, seq_len: int, n: int | None, what: str) -> np.ndarray:
    """Which of the non-overlapping (seq_len + 1)-token windows tiling a validation stream of
    ``length`` tokens are evaluated: ``n`` evenly spaced ones (all when None or more than the
    tiling). The one rule for the built-in corpus and for shards, so both evaluate alike."""
    total = length // (seq_len + 1)
    if total < 1:
        raise UserError(f"{what} ({length} tokens) is shorter than seq_len + 1 = {seq_len + 1}")
    if n is None or n >= total:
        return np.arange(total)
    return np.unique(np.linspace(0, total - 1, n).round().astype(np.int64))


def _windows(stream: _Stream, start: int, stop: int, seq_len: int, n: int | None, what: str):
    idx = window_index(stop - start, seq_len, n, what)
    win = np.stack([stream.read(start + int(i) * (seq_len + 1), seq_len + 1) for i in idx]).astype(np.int64)
    return win[:, :-1], win[:, 1:]


@dataclass(frozen=True)
class _Stamp:
    path: Path

    def load(self) -> dict:
        try:
            stamp = read_json(self.path, "verification stamp")
            return stamp if isinstance(stamp, dict) else {}
        except (OSError, ValueError):
            return {}

    def save(self, entries: dict) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(entries))
            os.replace(tmp, self.path)
        except OSError:  # a read-only cache only costs a re-hash next time
            pass


class ShardSet:
    """A prepared token-shard folder. Get one with :func:`load_shards` (or ``open_data``)."""

    def __init__(self, path: Path, manifest: dict, manifest_sha256: str):
        self.path = Path(path)
        self.manifest = manifest
        self.manifest_sha256 = manifest_sha256
        self.dtype = DTYPES[manifest["dtype"]]
        by_split = {"train": [], "val": []}
        for s in manifest["shards"]:
            by_split[s["split"]].append(s)
        self._train = _Stream(self.path, by_split["train"], self.dtype)
        self._val = _Stream(self.path, by_split["val"], self.dtype)

    # ----- the interface shared with the built-in Corpus ------------------------------
    @property
    def vocab_size(self) -> int:
        return int(self.manifest["vocab_size"])

    @property
    def n_train_tokens(self) -> int:
        return len(self._train)

    @property
    def n_val_tokens(self) -> int:
        return len(self._val)

    @property
    def bytes_per_token(self) -> float | None:
        v = self.manifest.get("val_bytes_per_token")
        return None if v is None else float(v)

    def bpb(self, loss_nats: float) -> float | None:
        """Bits per byte: loss / ln 2 / bytes_per_token (None when bytes per token is unknown)."""
        bpt = self.bytes_per_token
        return None if bpt is None else loss_nats / math.log(2) / bpt

    @property
    def identity(self) -> dict[str, Any]:
        """What a run records and a resume must match: the manifest's hash and what it implies."""
        tok = self.manifest.get("tokenizer") or {}
        return {
            "kind": "shards",
            "manifest_sha256": self.manifest_sha256,
            "tokenizer_sha256": tok.get("sha256"),
            "vocab_size": self.vocab_size,
            "dtype": self.manifest["dtype"],
            "train_tokens": self.n_train_tokens,
            "val_tokens": self.n_val_tokens,
        }

    @property
    def provenance(self) -> dict[str, Any]:
        """The manifest without its shard list, plus the folder and the manifest hash."""
        m = {k: v for k, v in self.manifest.items() if k != "shards"}
        return {**m, "path": str(self.path.resolve()), "manifest_sha256": self.manifest_sha256,
                "n_shards": len(self.manifest["shards"])}

    @property
    def sources(self) -> list[str]:
        return [s["name"] for s in self.manifest.get("val_sources", [])]

    def train_batch(
        self, seed: int, step: int, batch_size: int, seq_len: int, rank: int = 0, world_size: int = 1
    ) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, targets), int64 [batch_size / world_size, seq_len]; see the module docstring."""
        if batch_size % world_size:
            raise UserError(f"batch size {batch_size} is not divisible by world size {world_size}")
        n = self.n_train_tokens - seq_len - 1
        if n <= 0:
            raise UserError(f"training split ({self.n_train_tokens} tokens) is shorter than seq_len + 1")
        starts = np.random.default_rng([seed, step]).integers(0, n + 1, size=batch_size)
        per = batch_size // world_size
        starts = starts[rank * per:(rank + 1) * per]
        win = np.stack([self._train.read(int(s), seq_len + 1) for s in starts]).astype(np.int64)
        return win[:, :-1], win[:, 1:]

    def val_windows(self, seq_len: int, n_windows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The fixed validation windows over the whole validation stream, int64 [n, seq_len]."""
        return _windows(self._val, 0, self.n_val_tokens, seq_len, n_windows, "validation split")

    def val_windows_by_source(
        self, seq_len: int, n_windows: int | None = None
    ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """{source: windows} tiling each named source's range of the validation stream
        (``n_windows`` per source); sources too short for one window are left out."""
        out = {}
        for s in self.manifest.get("val_sources", []):
            if s["stop"] - s["start"] >= seq_len + 1:
                out[s["name"]] = _windows(self._val, s["start"], s["stop"], seq_len, n_windows, s["name"])
        return out

    @cached_property
    def tokenizer(self):
        """The tokenizers.Tokenizer the shards were made with (None when not recorded)."""
        tok = self.manifest.get("tokenizer")
        if not tok or not tok.get("path"):
            return None
        from tokenizers import Tokenizer

        path = check_regular_file(resolve(self.path, tok["path"]), "tokenizer file")
        return Tokenizer.from_file(str(path))

    def summary(self) -> str:
        m = self.manifest
        bpt = self.bytes_per_token
        return (
            f"shards {self.path} ({self.manifest_sha256[:12]}): {len(m['shards'])} {m['dtype']} shards, "
            f"vocab {self.vocab_size:,}; train {self.n_train_tokens:,} tokens, val {self.n_val_tokens:,} "
            f"tokens" + (f", {bpt:.3f} bytes/token" if bpt else "")
            + (f"; sources {', '.join(self.sources)}" if self.sources else "")
        )

    # ----- integrity ------------------------------------------------------------------
    def check_sizes(self) -> None:
        for s in self.manifest["shards"]:
            p = resolve(self.path, s["path"])
            want = int(s.get("offset", 0)) + int(s["tokens"]) * self.dtype.itemsize
            try:
                got = p.stat().st_size
            except FileNotFoundError:
                raise UserError(f"shard {s['path']} listed in {self.path / MANIFEST} is missing") from None
            if got != want:
                raise UserError(f"shard {p} is corrupt: {got} bytes, the manifest says {want}")

    def verify(self, stamp_dir: Path | None = None, trust_stamps: bool = True) -> None:
        """Check sizes and SHA-256 of every shard (and the tokenizer file); UserError on a mismatch.
        With ``trust_stamps``, files whose (size, mtime) match the last successful check recorded
        in ``stamp_dir`` are skipped; without, every file is hashed (and the record renewed)."""
        self.check_sizes()
        stamp = _Stamp(stamp_dir / f"{self.manifest_sha256[:32]}.json") if stamp_dir else None
        seen = stamp.load() if stamp and trust_stamps else {}
        ok = {}
        files = [(s["path"], s["sha256"], int(s.get("offset", 0))) for s in self.manifest["shards"]]
        tok = self.manifest.get("tokenizer") or {}
        if tok.get("path"):
            files.append((tok["path"], tok["sha256"], 0))
        for rel, want, offset in files:
            p = resolve(self.path, rel)
            try:
                st = p.stat()
            except FileNotFoundError:
                raise UserError(f"{rel} listed in {self.path / MANIFEST} is missing") from None
            key = str(p.resolve())
            mark = [st.st_size, st.st_mtime_ns, want]
            if seen.get(key) != mark:
                got = sha256_file(p, offset)
                if got != want:
                    raise UserError(
                        f"shard {p} is corrupt: sha256 {got[:12]}... differs from the manifest's "
                        f"{want[:12]}...; prepare the data again"
                    )
            ok[key] = mark
        if stamp:
            stamp.save(ok)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)    # JSON true is not a vocabulary size


def _require(cond: bool, path: Path, what: str) -> None:
    if not cond:
        raise UserError(f"{path} is not a valid shard manifest: {what}")


def read_manifest(folder: Path | str) -> tuple[dict, str]:
    """(manifest, sha256 of its bytes) of a shard folder; UserError when missing or malformed."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not folder.is_dir():
        raise UserError(f"data folder {folder} does not exist or is not a folder")
    if not path.exists():
        raise UserError(
            f"no {MANIFEST} in {folder}",
            hint="make one with `smelt-scale prepare-data` (which also indexes existing nanoGPT/OLMo-style "
                 "shards when told their dtype and vocabulary)", sep=": ")
    text = read_text(path, "manifest")
    raw = text.encode("utf-8")
    m = parse_json(text, str(path))
    _require(isinstance(m, dict) and m.get("format") == FORMAT, path, f"format is not {FORMAT!r}")
    _require(m.get("format_version") == FORMAT_VERSION, path, f"format_version is not {FORMAT_VERSION}")
    _require(m.get("dtype") in DTYPES, path, f"dtype must be one of {', '.join(DTYPES)}")
    _require(_is_int(m.get("vocab_size")) and m["vocab_size"] > 0, path,
             "vocab_size must be a positive integer")
    for key in ("bos_id", "eos_id"):
        v = m.get(key)
        _require(v is None or (_is_int(v) and 0 <= v < m["vocab_size"]), path,
                 f"{key} must be null or an id below vocab_size, got {v!r}")
    _require(m["vocab_size"] <= np.iinfo(DTYPES[m["dtype"]]).max + 1, path, "vocab_size exceeds the dtype")
    shards = m.get("shards")
    _require(isinstance(shards, list), path, "shards must be a list")
    for s in shards:
        _require(isinstance(s, dict) and {"path", "split", "tokens", "sha256"} <= set(s), path,
                 "each shard needs path, split, tokens and sha256")
        _require(s["split"] in ("train", "val"), path, f"shard split {s['split']!r} is not train or val")
        _require(isinstance(s["path"], str) and bool(s["path"]), path, f"shard path {s['path']!r} must be "
                 "a file name")
        _require(_is_int(s["tokens"]) and s["tokens"] >= 0, path, f"shard tokens {s['tokens']!r} must be a "
                 "non-negative integer")
        _require(isinstance(s["sha256"], str) and len(s["sha256"]) == 64, path, "shard sha256 must be a hex "
                 "digest")
        _require(_is_int(s.get("offset", 0)) and s.get("offset", 0) >= 0, path, "shard offset must be a "
                 "non-negative integer")
    for split in ("train", "val"):
        _require(any(s["split"] == split and s["tokens"] > 0 for s in shards), path, f"no {split} tokens")
    # the optional fields the trainer reads (2026-12-07 review: a tokenizer "x" or a val_sources entry
    # without a range crashed `train`)
    tok = m.get("tokenizer")
    _require(tok is None or (isinstance(tok, dict) and all(
        tok.get(k) is None or isinstance(tok[k], str) for k in ("path", "sha256"))), path,
        "tokenizer must be null or an object whose path and sha256 are strings")
    n_val = sum(s["tokens"] for s in shards if s["split"] == "val")
    sources = m.get("val_sources", [])
    _require(isinstance(sources, list), path, "val_sources must be a list")
    for src in sources:
        _require(isinstance(src, dict) and isinstance(src.get("name"), str) and _is_int(src.get("start"))
                 and _is_int(src.get("stop")) and 0 <= src["start"] <= src["stop"] <= n_val, path,
                 f"each of val_sources needs a name and a start <= stop within the {n_val} validation "
                 f"tokens, got {str(src)[:60]}")
    bpt = m.get("val_bytes_per_token")
    _require(bpt is None or (isinstance(bpt, (int, float)) and not isinstance(bpt, bool)
                             and 0 < bpt < math.inf), path,
             "val_bytes_per_token must be null or a positive number")
    return m, hashlib.sha256(raw).hexdigest()


def load_shards(folder: Path | str, verify: bool = True, stamp_dir: Path | None = None,
                trust_stamps: bool = True) -> ShardSet:
    """Open a shard folder: manifest checks, file sizes, and (``verify``) SHA-256 of every shard
    (see :meth:`ShardSet.verify`)."""
    manifest, digest = read_manifest(folder)
    shards = ShardSet(Path(folder), manifest, digest)
    if verify:
        shards.verify(stamp_dir, trust_stamps)
    else:
        shards.check_sizes()
    return shards
