"""Prepare a user's corpus as token shards (:mod:`scaling.training.data.shards`):
``smelt-scale prepare-data``.

Inputs. Local files, folders (searched recursively for the suffixes in ``SUFFIXES``) and glob
patterns, each optionally prefixed ``name=`` to name its source. JSON Lines (``.jsonl``,
``.ndjson``, optionally ``.gz``): one document per object, its text in ``text_field``;
Parquet (``.parquet``, needs pyarrow): one document per row; any other file: one document per
file. Text must be UTF-8. A record's source is its ``source_field`` value when that is set and
present, else the name given to its input, else none.

Document id and split. A document's id is its ``id_field`` value when present, else the
SHA-256 of its text. It is held out for validation iff ``sha256(key) / 2**64 < val_fraction``
(first 8 bytes), never by position, so the split does not depend on file order or on the other
documents. The key (``split_by``) is by default the SHA-256 of the text, so exact duplicates
share a split whatever their ids (dumps re-post the same text under new ids; split by id, 200
such pairs put every validation document's copy in training); ``split_by="id"`` keys on the id
instead, for corpora whose ids name revisions of one document. Documents without an id split the
same way under both keys.

Tokenizer. A Hugging Face ``tokenizer.json`` (copied into the output), or a byte-level BPE
trained on the first ``tokenizer_train_bytes`` of the training split (the built-in corpus's
trainer, :func:`scaling.training.data.corpus.train_tokenizer`, deterministic). Each document becomes
``[bos] + ids + [eos]`` (each separator only when defined: the trained BPE uses ``<|bos|>``;
another tokenizer's separators are found by name, see ``_SEPARATORS``, or given). A special
token's spelling inside a text (``</s>`` in HTML, ``<|endoftext|>`` in a scraped page) is encoded
as text (``Tokenizer.encode_special_tokens``): only the separators the layout adds are separators.

Output. Training documents in input order (files sorted by path) form the training stream,
cut into shards of exactly ``shard_tokens`` tokens (the last one shorter). Validation
documents are sorted by (source, id) -- so the validation stream is the same whatever the
file order -- and each source's range is recorded for per-source evaluation.

Work is done in chunks of about ``chunk_bytes`` of text, encoded with ``Tokenizer.encode_batch``
(Rust threads on every core). Resumable: after every chunk a state file records the input
position, the finished shards and the lengths of the append-only work files under
``.prepare/``; a rerun truncates the work files to those lengths and continues. Every file under
its final name is complete (written to a temporary name, fsynced, renamed): a kill can leave
at most work files, which the rerun reuses, never a half-written shard or manifest. Given the
same inputs and options the output is byte-identical however often the run was interrupted.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import os
import re
import shutil
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from scaling.common.errors import UserError
from scaling.common.files import check_nesting, check_regular_file, read_config, read_json, sha256_file
from scaling.training.data.corpus import SPECIAL_TOKENS, _hash_unit, train_tokenizer
from scaling.training.data.shards import (
    DTYPES,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    dtype_for_vocab,
    npy_header,
)
from scaling.training.runlog import atomic_write, atomic_write_bytes, exclusive, write_json

SUFFIXES = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz", ".json.gz", ".parquet",
            ".txt", ".md", ".rst", ".py", ".text")
WORK = ".prepare"
TOKENIZER = "tokenizer.json"
PREPARED_BY = "smelt-scale prepare-data"  # created_by.tool of a manifest whose shards this tool wrote
# Separators looked up by name in a given tokenizer: (bos, eos) candidates, first match wins.
_SEPARATORS = (("<|bos|>", None), (None, "<|endoftext|>"), ("<s>", "</s>"), ("<|begin_of_text|>", None),
               ("[CLS]", "[SEP]"))


@dataclass(frozen=True)
class PrepareOptions:
    """How to turn inputs into shards (everything that changes the output bytes).

    text_field / id_field / source_field   record fields (JSONL keys, Parquet columns)
    split_by                "text" (default) or "id": what the validation split hashes
    val_fraction            target fraction of documents held out for validation
    tokenizer               path of a Hugging Face tokenizer.json; None: train a byte-level BPE
    vocab_size              vocabulary of the trained BPE (with tokenizer=None)
    tokenizer_train_bytes   UTF-8 bytes of training documents the BPE is trained on (stream order)
    bos_token / eos_token   separators of a given tokenizer (None: found by name)
    shard_tokens            tokens per shard (the last of each split shorter)
    chunk_bytes             text per encode_batch call and per resume checkpoint
    """

    text_field: str = "text"
    id_field: str = "id"
    source_field: str | None = None
    split_by: str = "text"
    val_fraction: float = 0.01
    tokenizer: str | None = None
    vocab_size: int | None = None
    tokenizer_train_bytes: int = 1 << 30
    bos_token: str | None = None
    eos_token: str | None = None
    shard_tokens: int = 1 << 24
    chunk_bytes: int = 8 << 20

    def __post_init__(self) -> None:
        if not 0.0 < self.val_fraction < 0.5:
            raise UserError(f"validation fraction must be in (0, 0.5), got {self.val_fraction}")
        if (self.tokenizer is None) == (self.vocab_size is None):
            raise UserError("give either a tokenizer file or a vocabulary size to train one, not both")
        if self.vocab_size is not None and not 256 + len(SPECIAL_TOKENS) <= self.vocab_size <= 1 << 16:
            raise UserError(f"vocabulary size must be in [{256 + len(SPECIAL_TOKENS)}, 65536], "
                            f"got {self.vocab_size}")
        if self.shard_tokens < 1 or self.chunk_bytes < 1 or self.tokenizer_train_bytes < 1:
            raise UserError("shard_tokens, chunk_bytes and tokenizer_train_bytes must be >= 1")
        if not self.text_field:
            raise UserError("the text field must not be empty")
        if self.split_by not in ("text", "id"):
            raise UserError(f"split_by must be 'text' or 'id', got {self.split_by!r}")


@dataclass(frozen=True)
class InputFile:
    path: str  # absolute
    kind: str  # "jsonl" | "parquet" | "text"
    source: str | None  # the name given to its input argument
    bytes: int
    mtime_ns: int


@dataclass
class _Doc:
    text: str
    id: str
    source: str | None
    record: bool = False  # a JSONL object or Parquet row (a text file has no fields)
    fell_back: tuple[str, ...] = ()  # of "id", "source": the record lacked that field (or it was null)


# ----- inputs -----------------------------------------------------------------------------


def _kind(path: Path) -> str:
    name = path.name.lower()
    if name.endswith((".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz", ".json.gz")):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    return "text"


def find_inputs(specs: list[str]) -> list[InputFile]:
    """Files of the SOURCE arguments (``[name=]file|folder|glob``), sorted by path, no repeats."""
    if not specs:
        raise UserError("no input sources given")
    found: dict[str, InputFile] = {}
    for spec in specs:
        name, sep, pattern = spec.partition("=")
        if not sep or Path(spec).exists() or not name.replace("-", "").replace("_", "").isalnum():
            name, pattern = "", spec
        name = name or None
        pattern = os.path.expanduser(pattern)
        if any(c in pattern for c in "*?["):
            paths = [Path(p) for p in sorted(glob.glob(pattern, recursive=True)) if Path(p).is_file()]
            if not paths:
                raise UserError(f"no files match {pattern!r}")
        elif Path(pattern).is_dir():
            paths = sorted(p for p in Path(pattern).rglob("*") if p.is_file() and not any(
                part.startswith(".") for part in p.relative_to(pattern).parts)
                and p.name.lower().endswith(SUFFIXES))
            if not paths:
                raise UserError(f"folder {pattern} holds no input files ({', '.join(SUFFIXES)})")
        elif Path(pattern).is_file():
            paths = [Path(pattern)]
        elif Path(pattern).exists():
            raise UserError(f"input source {pattern} is not a regular file (a device, FIFO or socket)")
        else:
            raise UserError(f"input source {pattern} does not exist")
        for p in paths:
            p = p.resolve()
            st = p.stat()
            if st.st_size == 0:
                raise UserError(f"input source {p} is empty")
            seen = found.get(str(p))
            if seen is not None and seen.source != name:
                # one file, two source names: its documents would silently count for the first only
                raise UserError(f"input file {p} is given under two source names ({seen.source or 'none'} "
                                f"and {name or 'none'}); a document has one source")
            found.setdefault(str(p), InputFile(str(p), _kind(p), name, st.st_size, st.st_mtime_ns))
    return [found[k] for k in sorted(found)]


def _decode(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{where} is not UTF-8 text (byte {exc.start}: {raw[exc.start:exc.start + 4]!r})") \
            from None


def _record_doc(rec: Any, opts: PrepareOptions, where: str, source: str | None) -> _Doc | None:
    if not isinstance(rec, dict):
        raise UserError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    if opts.text_field not in rec:
        raise UserError(f"{where}: no text field {opts.text_field!r} (fields: {', '.join(map(str, rec))})")
    text = rec[opts.text_field]
    if not isinstance(text, str):
        raise UserError(f"{where}: text field {opts.text_field!r} is {type(text).__name__}, not a string")
    if not text:
        return None
    fell_back = []
    doc_id = rec.get(opts.id_field)
    if doc_id is None:
        fell_back.append("id")
    doc_id = str(doc_id) if doc_id is not None else hashlib.sha256(text.encode()).hexdigest()
    if opts.source_field:
        if rec.get(opts.source_field) is not None:
            source = str(rec[opts.source_field])
        else:
            fell_back.append("source")
    return _Doc(text, doc_id, source, True, tuple(fell_back))


def _units(f: InputFile, offset: int, opts: PrepareOptions) -> Iterator[tuple[list[_Doc], int, int]]:
    """(documents, next offset, bytes of input consumed) of one file from ``offset`` (bytes of a
    JSONL file, row group of a Parquet file, 0 for a text file)."""
    if f.kind == "text":
        if offset == 0:
            raw = Path(f.path).read_bytes()
            text = _decode(raw, f.path)
            docs = [_Doc(text, hashlib.sha256(raw).hexdigest(), f.source)] if text else []
            yield docs, 1, f.bytes
        return
    if f.kind == "parquet":
        yield from _parquet_units(f, offset, opts)
        return
    try:
        yield from _jsonl_units(f, offset, opts)
    except (OSError, EOFError, zlib.error) as exc:  # a truncated or corrupt .gz
        raise UserError(f"{f.path} cannot be read ({exc})") from None


def _jsonl_units(f: InputFile, offset: int, opts: PrepareOptions):
    opener = gzip.open if f.path.endswith(".gz") else open
    with opener(f.path, "rb") as fh:
        fh.seek(offset)
        pos, docs, size = offset, [], 0
        for line in fh:
            where = f"{f.path} at byte {pos}"
            pos += len(line)
            if not line.strip():
                continue
            try:
                rec = check_nesting(json.loads(line), where)
            except UnicodeDecodeError:
                raise UserError(f"{where} is not UTF-8 text") from None
            except json.JSONDecodeError as exc:
                raise UserError(f"{where}: not a JSON line ({exc.msg})") from None
            except RecursionError:
                raise UserError(f"{where}: a JSON line nested too deeply to read") from None
            doc = _record_doc(rec, opts, where, f.source)
            if doc is not None:
                docs.append(doc)
                size += len(doc.text)
            if size >= 1 << 20:
                yield docs, pos, pos - offset
                offset, docs, size = pos, [], 0
        if docs or pos > offset:
            yield docs, pos, pos - offset


# How a special token's spelling inside a document is encoded (recorded in the fingerprint and the
# manifest: earlier versions made it the special token, a false document boundary)
SPECIALS_IN_TEXT = "encoded as text"
SAMPLE_RECORDS = 1000  # records per file read to check that a named field exists at all


def _check_named_fields(files: list[InputFile], opts: PrepareOptions) -> None:
    """A ``source_field`` (or an ``id_field`` other than the default "id") that no record holds is a
    typo, not a choice: without it every document falls back to no source (no per-source
    validation) or to its text's hash as id (another split). UserError when none of the first
    ``SAMPLE_RECORDS`` records of any JSONL file, and no Parquet file's columns, name it."""
    named = [(flag, f) for flag, f in (("--source-field", opts.source_field),
                                       ("--id-field", None if opts.id_field == "id" else opts.id_field)) if f]
    records = [f for f in files if f.kind != "text"]
    if not named or not records:
        return
    seen: set[str] = set()
    for f in records:
        if f.kind == "parquet":
            try:
                import pyarrow.parquet as pq

                seen.update(pq.ParquetFile(f.path).schema_arrow.names)
            except Exception:  # unreadable: _parquet_units says so in one line
                return
            continue
        opener = gzip.open if f.path.endswith(".gz") else open
        try:
            with opener(f.path, "rb") as fh:
                for n, line in enumerate(fh):
                    if n >= SAMPLE_RECORDS:
                        break
                    rec = json.loads(line) if line.strip() else None
                    if isinstance(rec, dict):
                        seen.update(rec)
        except (OSError, EOFError, zlib.error, ValueError):  # _jsonl_units names the bad line
            return
    for flag, name in named:
        if name not in seen:
            raise UserError(f"{flag} {name!r}: no record holds it (first {SAMPLE_RECORDS} records of each "
                            f"file checked; fields: {', '.join(sorted(map(str, seen))[:8])})")


def _parquet_units(f: InputFile, offset: int, opts: PrepareOptions):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError("reading Parquet needs pyarrow: pip install 'smelt-scale[parquet]'") from None
    try:
        pf = pq.ParquetFile(f.path)
    except Exception as exc:  # pyarrow raises its own error types for a bad file
        raise UserError(f"{f.path} is not a readable Parquet file ({exc})") from None
    names = pf.schema_arrow.names
    if opts.text_field not in names:
        raise UserError(f"{f.path}: no text column {opts.text_field!r} (columns: {', '.join(names)})")
    cols = [c for c in (opts.text_field, opts.id_field, opts.source_field) if c and c in names]
    total_rows = max(1, pf.metadata.num_rows)
    for rg in range(offset, pf.num_row_groups):
        table = pf.read_row_group(rg, columns=cols)
        data = {c: table.column(c).to_pylist() for c in cols}
        docs = []
        for i in range(table.num_rows):
            rec = {c: data[c][i] for c in cols}
            if rec[opts.text_field] is None:
                continue
            doc = _record_doc(rec, opts, f"{f.path} row group {rg} row {i}", f.source)
            if doc is not None:
                docs.append(doc)
        yield docs, rg + 1, f.bytes * table.num_rows // total_rows


def _chunks(files: list[InputFile], position: list[int], opts: PrepareOptions,
            doc_counts: list[int]) -> Iterator[tuple[list[_Doc], list[int], int]]:
    """Chunks of about chunk_bytes of text: (documents, position after them, input bytes read)."""
    fi, offset = position
    docs, size, read = [], 0, 0
    while fi < len(files):
        f = files[fi]
        for unit, nxt, nbytes in _units(f, offset, opts):
            docs += unit
            doc_counts[fi] += len(unit)
            size += sum(len(d.text) for d in unit)
            read += nbytes
            offset = nxt
            if size >= opts.chunk_bytes:
                yield docs, [fi, offset], read
                docs, size, read = [], 0, 0
        if doc_counts[fi] == 0:
            raise UserError(f"input source {f.path} holds no documents (no non-empty text)")
        fi, offset = fi + 1, 0
    yield docs, [fi, 0], read


# ----- tokenizer ----------------------------------------------------------------------------


def _separators(tok, opts: PrepareOptions) -> tuple[int | None, int | None]:
    def tid(token: str | None, what: str) -> int | None:
        if token is None:
            return None
        i = tok.token_to_id(token)
        if i is None:
            raise UserError(f"the tokenizer has no {what} token {token!r}")
        return i

    if opts.tokenizer is None:
        return tid("<|bos|>", "BOS"), None
    if opts.bos_token or opts.eos_token:
        return tid(opts.bos_token, "BOS"), tid(opts.eos_token, "EOS")
    for bos, eos in _SEPARATORS:
        if all(t is None or tok.token_to_id(t) is not None for t in (bos, eos)):
            return tid(bos, "BOS"), tid(eos, "EOS")
    raise UserError("the tokenizer has no known document separator (<|endoftext|>, <s>, <|bos|>, ...); "
                    "name its BOS or EOS token")


def _load_tokenizer(path: str):
    from tokenizers import Tokenizer

    check_regular_file(path, "tokenizer file")      # a FIFO or /dev/zero would never finish
    try:
        return Tokenizer.from_file(path)
    except Exception as exc:  # tokenizers raises a bare Exception for a bad file
        if not Path(path).is_file():
            raise UserError(f"tokenizer file {path} does not exist") from None
        raise UserError(f"{path} is not a Hugging Face tokenizer.json ({str(exc).splitlines()[0]})") from None


def _train_bpe(files: list[InputFile], opts: PrepareOptions, out: Path, progress) -> None:
    seen = [0]  # training documents handed to the trainer

    def texts():
        # streamed: the trainer counts words as documents arrive, so at most one chunk of text
        # (not up to tokenizer_train_bytes of Python strings) is held at a time
        size = 0
        counts = [0] * len(files)
        for docs, _, nbytes in _chunks(files, [0, 0], opts, counts):
            for d in docs:
                if _hash_unit(d.id) >= opts.val_fraction and size < opts.tokenizer_train_bytes:
                    seen[0] += 1
                    size += len(d.text.encode())
                    yield d.text
            progress("training tokenizer", nbytes)
            if size >= opts.tokenizer_train_bytes:
                break

    tok = train_tokenizer(texts(), opts.vocab_size)
    if not seen[0]:
        raise UserError("no training documents to train the tokenizer on")
    atomic_write_bytes(out, tok.to_str(pretty=True).encode())


# ----- the pipeline -----------------------------------------------------------------------


@dataclass
class _State:
    fingerprint: dict
    tokenizer_sha256: str
    position: list[int] = field(default_factory=lambda: [0, 0])
    train_shards: list[dict] = field(default_factory=list)
    partial_tokens: int = 0
    val_bytes: int = 0
    val_index_bytes: int = 0
    doc_counts: list[int] = field(default_factory=list)
    counts: dict = field(default_factory=lambda: {s: {"documents": 0, "bytes": 0, "tokens": 0}
                                                 for s in ("train", "val")})
    input_done: bool = False
    # JSONL/Parquet documents, and those of them whose id_field / source_field was absent or null
    records: int = 0
    fallbacks: dict = field(default_factory=lambda: {"id": 0, "source": 0})


def _fingerprint(files: list[InputFile], opts: PrepareOptions, sha: dict[str, str]) -> dict:
    o = asdict(opts)
    if opts.tokenizer:
        o["tokenizer"] = sha256_file(opts.tokenizer)
    o.pop("chunk_bytes")  # does not change the output
    return {"options": o, "inputs": [[f.path, f.source, f.bytes, sha[f.path]] for f in files],
            "format_version": FORMAT_VERSION, "special_tokens_in_text": SPECIALS_IN_TEXT}


def _differs(old: dict | None, new: dict) -> str:
    """What changed between two fingerprints, in words."""
    old = old or {}
    a, b = old.get("options") or {}, new["options"]
    if a.get("tokenizer") != b.get("tokenizer") or a.get("vocab_size") != b.get("vocab_size"):
        return "another tokenizer"
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    if keys:
        return f"other options ({', '.join(keys)})"
    if old.get("special_tokens_in_text") != new.get("special_tokens_in_text"):
        return "an earlier version of this tool (it encoded special tokens written in a text as separators)"
    return "other inputs"


def _hash_inputs(files: list[InputFile], work: Path, progress) -> dict[str, str]:
    """SHA-256 of each input, remembered under (size, mtime) so a resumed run does not re-read."""
    cache_path = work / "input_hashes.json"
    try:
        cache = read_json(cache_path)
        cache = cache if isinstance(cache, dict) else {}
    except (OSError, ValueError):
        cache = {}
    out = {}
    for f in files:
        key = f"{f.path}|{f.bytes}|{f.mtime_ns}"
        if key not in cache:
            cache[key] = sha256_file(f.path)
        out[f.path] = cache[key]
        progress("hashing inputs", f.bytes)
    write_json(cache_path, cache)
    return out


def _append(path: Path, arr: np.ndarray) -> None:
    with open(path, "ab") as fh:
        fh.write(arr.tobytes())


def _truncate(path: Path, nbytes: int) -> None:
    with open(path, "ab") as fh:
        fh.truncate(nbytes)


def _fsync(path: Path) -> None:
    with open(path, "rb+") as fh:
        os.fsync(fh.fileno())


def _shard_name(split: str, i: int) -> str:
    return f"{split}-{i:05d}.bin"


_OWN_SHARD = re.compile(r"(?:train|val)-\d{5}\.bin")  # every name _shard_name gives


def _finish_shard(work_file: Path, final: Path, dtype: np.dtype) -> dict:
    _fsync(work_file)
    digest = sha256_file(work_file)
    tokens = work_file.stat().st_size // dtype.itemsize
    os.replace(work_file, final)
    return {"path": final.name, "split": "train", "tokens": tokens, "sha256": digest, "offset": 0}


def prepare(
    specs: list[str],
    out: Path | str,
    opts: PrepareOptions,
    *,
    overwrite: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
    after_shard: Callable[[int], None] | None = None,
) -> dict:
    """Prepare ``specs`` (see :func:`find_inputs`) into shards under ``out``; returns the manifest.

    Resumes an interrupted run with the same inputs and options; a finished folder with the same
    inputs and options is returned as is; anything else in ``out`` needs ``overwrite``, which
    replaces only an earlier preparation's files, and only once the new ones are complete
    (:func:`_prepare_over`). Stages: hash the inputs and fingerprint them with the options;
    check the folder (:func:`_finished`, :func:`_read_state`); fix the tokenizer
    (:func:`_tokenizer`); bring the work files back to the last checkpoint (:func:`_restore`);
    tokenize into training shards (:func:`_tokenize`); sort the validation documents into their
    shards (:func:`_write_val`); write the manifest (:func:`_manifest`).

    ``after_shard(n)`` is called each time a training shard is complete under its final name
    (``n`` shards so far), before the checkpoint records it: where the tests interrupt a
    preparation to check that a rerun gives the same output.
    """
    out = Path(out)
    files = find_inputs(specs)
    _check_shard_count(sum(f.bytes for f in files), opts.shard_tokens)
    if out.exists() and not out.is_dir():
        raise UserError(f"output {out} exists and is not a folder")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create the folder of {out}: {exc.strerror or exc}") from None
    # one preparation per output folder: two would append to the same work files
    busy = f"output folder {out} is being prepared by another process; wait for it to end"
    with exclusive(out.parent / f".{out.name}.prepare-lock", busy):
        _finish_swap(out)          # an --overwrite killed while it swapped files: finish it first
        created = not out.exists()
        try:
            return _prepare_locked(specs, files, out, opts, overwrite, progress, after_shard)
        except UserError:
            if created:
                _remove_if_only_hashes(out)
            raise


def _remove_if_only_hashes(out: Path) -> None:
    """Remove a folder this run created when it holds no more than its input-hash cache (the input
    was refused before anything was tokenized): a refusal leaves no output folder behind."""
    work = out / WORK
    try:
        if {p.name for p in out.iterdir()} <= {WORK} and \
                (not work.exists() or {p.name for p in work.iterdir()} <= {"input_hashes.json"}):
            shutil.rmtree(out)
    except OSError:
        pass


# Byte-level BPE gives at most about one token per byte: more shard files than this from the inputs'
# bytes means a --shard-tokens typo (1 would write a file per token), not a layout anyone reads
MAX_SHARDS = 1_000_000


def _check_shard_count(total_bytes: int, shard_tokens: int) -> None:
    if total_bytes / shard_tokens > MAX_SHARDS:
        raise UserError(f"--shard-tokens {shard_tokens} would cut these {total_bytes:,} bytes of input into "
                        f"up to {-(-total_bytes // shard_tokens):,} shard files (more than {MAX_SHARDS:,}); "
                        f"give at least {-(-total_bytes // MAX_SHARDS):,} [default: {1 << 24}]")


def _prepare_locked(specs: list[str], files: list[InputFile], out: Path, opts: PrepareOptions,
                    overwrite: bool, progress: Callable[[str, int, int], None] | None,
                    after_shard: Callable[[int], None] | None) -> dict:
    tick = _ticker(progress, sum(f.bytes for f in files))
    _check_named_fields(files, opts)
    if out.is_dir() and not overwrite and not (out / MANIFEST).exists() and not (out / WORK).exists():
        # a folder that holds no preparation: refused before any file is made or input hashed
        _read_state(out, {})
    if overwrite and out.exists() and any(out.iterdir()):
        return _prepare_over(specs, files, out, opts, progress, after_shard)
    try:
        (out / WORK).mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise UserError(f"cannot create the output folder {out} (a file is in the way)") from None
    sha = _hash_inputs(files, out / WORK, tick)
    fp = _fingerprint(files, opts, sha)
    if (out / MANIFEST).exists():
        return _finished(out, fp)
    state, tok = _tokenizer(out, files, opts, _read_state(out, fp), fp, tick)
    tok.encode_special_tokens = True   # see SPECIALS_IN_TEXT
    vocab = tok.get_vocab_size(with_added_tokens=True)
    work = _restore(out, state, DTYPES[dtype_for_vocab(vocab)])
    bos, eos = _separators(tok, opts)
    _tokenize(files, opts, state, work, tok, (bos, eos), tick, after_shard)
    shards = list(state.train_shards)
    if state.partial_tokens:
        shards.append(_finish_shard(work.partial, out / _shard_name("train", work.k), work.dtype))
    index = [json.loads(line) for line in work.val_index.read_text().splitlines()]
    if not shards:
        raise UserError("no document went to the training split; add data or lower the validation fraction")
    if not index:
        raise UserError("no document went to the validation split; add data or raise the validation fraction")
    index.sort(key=lambda r: (r["source"] or "", r["id"], r["text_sha"]))
    val_shards, val_sources = _write_val(out, index, work.val_tmp, work.dtype, opts.shard_tokens)
    manifest = _manifest(opts, state, files, sha, fp, (vocab, work.dtype, bos, eos), shards + val_shards,
                         index, val_sources)
    write_json(out / MANIFEST, manifest)
    shutil.rmtree(out / WORK, ignore_errors=True)
    return manifest


def _ticker(progress: Callable[[str, int, int], None] | None, total: int) -> Callable[[str, int], None]:
    """``tick(phase, nbytes)``: count bytes per phase (from 0 at each new phase), report to ``progress``."""
    done = {"phase": None, "n": 0}

    def tick(phase: str, nbytes: int) -> None:
        if done["phase"] != phase:
            done.update(phase=phase, n=0)
        done["n"] += nbytes
        if progress:
            progress(phase, done["n"], total)

    return tick


def _finished(out: Path, fp: dict) -> dict:
    """The manifest of a finished preparation with this fingerprint; refused for another one."""
    manifest = read_config(out / MANIFEST, "manifest")
    if manifest.get("fingerprint") != fp:
        what = _differs(manifest.get("fingerprint"), fp)
        raise UserError(f"{out} already holds shards made with {what}; "
                        "choose another output folder or overwrite it")
    shutil.rmtree(out / WORK, ignore_errors=True)
    return manifest


def _read_state(out: Path, fp: dict) -> _State | None:
    """The checkpoint of an unfinished preparation with this fingerprint, or None for a fresh start
    (then ``out`` must hold nothing but work files and a tokenizer)."""
    work = out / WORK
    state_path = work / "state.json"
    if not state_path.exists():
        leftovers = [p.name for p in out.iterdir() if p.name not in (WORK, TOKENIZER)]
        if leftovers:
            raise UserError(f"output folder {out} is not empty ({', '.join(sorted(leftovers)[:3])}, ...); "
                            "choose another folder or overwrite it")
        return None
    try:
        state = _State(**read_config(state_path, "preparation state"))
    except TypeError:
        raise UserError(f"{state_path} is not a preparation state; delete {work} to start "
                        "again") from None
    if state.fingerprint != fp:
        what = _differs(state.fingerprint, fp)
        raise UserError(f"{out} holds an unfinished preparation made with {what}; "
                        "rerun it unchanged, choose another output folder or overwrite it")
    return state


def _tokenizer(out: Path, files: list[InputFile], opts: PrepareOptions, state: _State | None, fp: dict,
               tick) -> tuple[_State, Any]:
    """The tokenizer of this preparation: copied or trained on a fresh start (which writes the first
    checkpoint), checked against the checkpoint's SHA-256 on a resume."""
    tok_path = out / TOKENIZER
    if state is None:
        if opts.tokenizer is not None:
            _load_tokenizer(opts.tokenizer)  # a clear error before anything is written
            atomic_write_bytes(tok_path, Path(opts.tokenizer).read_bytes())
        else:
            _train_bpe(files, opts, tok_path, tick)
        state = _State(fp, sha256_file(tok_path), doc_counts=[0] * len(files))
        write_json(out / WORK / "state.json", asdict(state))
    elif not tok_path.exists() or sha256_file(tok_path) != state.tokenizer_sha256:
        raise UserError(f"{tok_path} differs from the tokenizer this unfinished preparation started with; "
                        "overwrite the output folder")
    return state, _load_tokenizer(str(tok_path))


@dataclass
class _Work:
    """The append-only work files of a preparation: the training shard being filled (index ``k``)
    and the validation tokens and index, in input order until :func:`_write_val` sorts them."""

    out: Path
    dtype: np.dtype
    k: int
    partial: Path
    val_tmp: Path
    val_index: Path

    def next_shard(self) -> None:
        self.k += 1
        self.partial = self.out / WORK / f"train-{self.k:05d}.partial"
        self.partial.write_bytes(b"")  # a killed earlier attempt may have left one


def _restore(out: Path, state: _State, dtype: np.dtype) -> _Work:
    """Bring the work files back to the last checkpoint (truncate what a kill appended after it)."""
    work = out / WORK
    k = len(state.train_shards)
    partial = work / f"train-{k:05d}.partial"
    if not partial.exists():
        partial.touch()
        final = out / _shard_name("train", k)
        if state.partial_tokens and final.exists():  # killed after renaming, before checkpointing
            with open(final, "rb") as fh:
                _append(partial, np.frombuffer(fh.read(state.partial_tokens * dtype.itemsize), dtype))
    _truncate(partial, state.partial_tokens * dtype.itemsize)
    if partial.stat().st_size != state.partial_tokens * dtype.itemsize:
        raise UserError(f"work file {partial} is shorter than its checkpoint; overwrite the output folder")
    val_tmp, val_index = work / "val.tmp", work / "val_index.jsonl"
    for p, n in ((val_tmp, state.val_bytes), (val_index, state.val_index_bytes)):
        p.touch()
        _truncate(p, n)
    return _Work(out, dtype, k, partial, val_tmp, val_index)


def _doc_tokens(ids: list[int], separators: tuple[int | None, int | None], dtype: np.dtype) -> np.ndarray:
    """``[bos] + ids + [eos]``, each separator only when it is defined."""
    bos, eos = separators
    a = np.empty(len(ids) + (bos is not None) + (eos is not None), dtype=dtype)
    if bos is not None:
        a[0] = bos
    a[int(bos is not None):len(a) - int(eos is not None)] = ids
    if eos is not None:
        a[-1] = eos
    return a


def _tokenize(files: list[InputFile], opts: PrepareOptions, state: _State, work: _Work, tok,
              separators: tuple[int | None, int | None], tick,
              after_shard: Callable[[int], None] | None = None) -> None:
    """Encode the inputs chunk by chunk from the checkpoint on: training tokens into shards of
    ``shard_tokens``, validation tokens and their index into work files; after every chunk the
    work files are fsynced and the checkpoint rewritten."""
    skip = sum(f.bytes for f in files[:state.position[0]])
    if skip:
        tick("tokenizing", skip)
    if state.input_done:
        return
    for docs, position, nbytes in _chunks(files, list(state.position), opts, state.doc_counts):
        encs = tok.encode_batch([d.text for d in docs], add_special_tokens=False) if docs else []
        train_parts, val_parts, val_lines = _split_chunk(docs, encs, opts, state, separators, work.dtype)
        stream = np.concatenate(train_parts) if train_parts else np.empty(0, work.dtype)
        while len(stream):
            take = min(len(stream), opts.shard_tokens - state.partial_tokens)
            _append(work.partial, stream[:take])
            stream, state.partial_tokens = stream[take:], state.partial_tokens + take
            if state.partial_tokens == opts.shard_tokens:
                state.train_shards.append(_finish_shard(work.partial, work.out / _shard_name("train", work.k),
                                                        work.dtype))
                if after_shard is not None:
                    after_shard(len(state.train_shards))
                state.partial_tokens = 0
                work.next_shard()
        if val_parts:
            _append(work.val_tmp, np.concatenate(val_parts))
        with open(work.val_index, "a") as fh:
            fh.writelines(val_lines)
        for p in (work.partial, work.val_tmp, work.val_index):
            _fsync(p)
        state.position = position
        state.val_bytes = work.val_tmp.stat().st_size
        state.val_index_bytes = work.val_index.stat().st_size
        state.input_done = position[0] >= len(files)
        write_json(work.out / WORK / "state.json", asdict(state))
        tick("tokenizing", nbytes)


def _split_chunk(docs: list[_Doc], encs: list, opts: PrepareOptions, state: _State,
                 separators: tuple[int | None, int | None], dtype: np.dtype
                 ) -> tuple[list[np.ndarray], list[np.ndarray], list[str]]:
    """One chunk's documents by split: training token arrays, validation token arrays and their
    index lines (offsets continue the validation work file); counts the split totals in ``state``."""
    train_parts, val_parts, val_lines = [], [], []
    val_off = state.val_bytes
    for d, e in zip(docs, encs):
        raw = d.text.encode()
        # a record without an id took sha256(text) as its id (_record_doc): not hashed twice
        text_sha = d.id if "id" in d.fell_back else hashlib.sha256(raw).hexdigest()
        # a document without an id has id == text_sha: the same split under either key
        split = "val" if _hash_unit(text_sha if opts.split_by == "text" else d.id) < opts.val_fraction \
            else "train"
        arr = _doc_tokens(e.ids, separators, dtype)
        c = state.counts[split]
        c["documents"] += 1
        if d.record:
            state.records += 1
            for name in d.fell_back:
                state.fallbacks[name] += 1
        nb = len(raw)
        c["bytes"] += nb
        c["tokens"] += len(arr)
        if split == "train":
            train_parts.append(arr)
            continue
        val_lines.append(json.dumps({"source": d.source, "id": d.id,
                                     "text_sha": text_sha,
                                     "offset": val_off, "tokens": len(arr), "bytes": nb,
                                     "doc_tokens": len(e.ids)}) + "\n")
        val_parts.append(arr)
        val_off += arr.nbytes
    return train_parts, val_parts, val_lines


def _write_val(out: Path, index: list[dict], val_tmp: Path, dtype: np.dtype, shard_tokens: int
               ) -> tuple[list[dict], dict[str, dict]]:
    """Write the validation documents in ``index`` order (sorted by source, id) as shards of
    ``shard_tokens``; return their manifest entries and each source's token range."""
    val = np.memmap(val_tmp, dtype=dtype, mode="r")
    shards: list[dict] = []
    sources: dict[str, dict] = {}
    buf, buffered, pos = [], 0, 0
    for r in index:
        start = r["offset"] // dtype.itemsize
        arr = np.asarray(val[start:start + r["tokens"]])
        name = r["source"] or "unnamed"
        s = sources.setdefault(name, {"name": name, "start": pos, "stop": pos, "documents": 0,
                                      "bytes": 0, "tokens": 0})
        s["stop"] = pos + len(arr)
        s["documents"] += 1
        s["bytes"] += r["bytes"]
        s["tokens"] += r["doc_tokens"]
        pos += len(arr)
        buf.append(arr)
        buffered += len(arr)
        if buffered >= shard_tokens:
            buf = _flush_val(out, buf, shard_tokens, shards, final=False)
            buffered = sum(len(b) for b in buf)
    _flush_val(out, buf, shard_tokens, shards, final=True)
    del val
    return shards, sources


def _flush_val(out: Path, buf: list[np.ndarray], shard_tokens: int, shards: list[dict], final: bool
               ) -> list[np.ndarray]:
    """Write the full validation shards in ``buf`` (and the rest when ``final``), appending their
    entries to ``shards``; return what is left for the next shard."""
    if not buf:
        return []
    data = np.concatenate(buf)
    while len(data) >= shard_tokens or (final and len(data)):
        piece, data = data[:shard_tokens], data[shard_tokens:]
        name = _shard_name("val", len(shards))
        atomic_write(out / name, lambda fh: fh.write(piece.tobytes()))
        shards.append({"path": name, "split": "val", "tokens": int(len(piece)),
                       "sha256": hashlib.sha256(piece.tobytes()).hexdigest(), "offset": 0})
    return [data] if len(data) else []


def _manifest(opts: PrepareOptions, state: _State, files: list[InputFile], sha: dict[str, str], fp: dict,
              vocabulary: tuple[int, np.dtype, int | None, int | None], shards: list[dict],
              index: list[dict], val_sources: dict[str, dict]) -> dict:
    """The shard set's manifest (:mod:`scaling.training.data.shards` reads it); ``vocabulary`` is
    (vocab_size, token dtype, bos id, eos id)."""
    from importlib.metadata import version

    vocab, dtype, bos, eos = vocabulary
    val_doc_tokens = sum(r["doc_tokens"] for r in index)
    val_bytes = sum(r["bytes"] for r in index)
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "dtype": dtype.name,
        "byte_order": "little",
        "vocab_size": vocab,
        "bos_id": bos,
        "eos_id": eos,
        "document_layout": "[bos] + ids + [eos] per document (each separator only if its id is not null)",
        "special_tokens_in_text": SPECIALS_IN_TEXT,
        "tokenizer": {"path": TOKENIZER, "sha256": state.tokenizer_sha256, "vocab_size": vocab,
                      "kind": "trained byte-level BPE" if opts.tokenizer is None else "given",
                      "given_path": opts.tokenizer},
        "shard_tokens": opts.shard_tokens,
        "shards": shards,
        "splits": {s: dict(state.counts[s]) for s in ("train", "val")},
        "documents": {s: state.counts[s]["documents"] for s in ("train", "val")},
        "bytes": {s: state.counts[s]["bytes"] for s in ("train", "val")},
        "val_sources": list(val_sources.values()) if any(r["source"] for r in index) else [],
        "val_bytes_per_token": val_bytes / val_doc_tokens if val_doc_tokens else None,
        "sources": [{"path": f.path, "source": f.source, "format": f.kind, "bytes": f.bytes,
                     "sha256": sha[f.path], "documents": n} for f, n in zip(files, state.doc_counts)],
        "field_fallbacks": {
            "records": state.records,
            "id": {"field": opts.id_field, "records_without": state.fallbacks["id"], "used": "sha256(text)"},
            "source": {"field": opts.source_field,
                       "records_without": state.fallbacks["source"] if opts.source_field else None,
                       "used": "the input's NAME= or none"},
        },
        "split_rule": {"val_fraction": opts.val_fraction, "id": f"{opts.id_field!r} field, else sha256(text)",
                       "key": "sha256(text) (hex)" if opts.split_by == "text" else "id",
                       "rule": "validation iff int(sha256(key)[:8 bytes]) / 2**64 < val_fraction",
                       "val_order": "sorted by (source, id)"},
        "created_by": {"tool": PREPARED_BY, "tokenizers": version("tokenizers")},
        "fingerprint": fp,
    }


def fallback_warnings(manifest: dict) -> list[str]:
    """Warnings for records whose named field was missing, from a manifest's ``field_fallbacks``.
    A missing source field is always worth a line (those documents drop out of per-source
    validation); a missing id only when some records had one or the field was named (``id``
    absent everywhere is the documented default: the text's hash is the id)."""
    fb = manifest.get("field_fallbacks")
    if not isinstance(fb, dict) or not fb.get("records"):
        return []
    total, out = fb["records"], []
    src = fb.get("source") or {}
    if src.get("field") and src.get("records_without"):
        out.append(f"{src['records_without']:,} of {total:,} records have no {src['field']!r} field: their "
                   "source is the input's NAME= (or none)")
    ident = fb.get("id") or {}
    n = ident.get("records_without") or 0
    if n and (n < total or ident.get("field") != "id"):
        by_id = (manifest.get("split_rule") or {}).get("key") == "id"
        out.append(f"{n:,} of {total:,} records have no {ident.get('field')!r} field: their id is the "
                   "SHA-256 of their text" + (", and so is their split key (--split-by id)" if by_id else
                                              " (the split hashes the text either way: --split-by text)"))
    return out


def _owned(out: Path) -> set[str]:
    """Names in ``out`` that an earlier preparation wrote: what its manifest lists (shards, tokenizer,
    the manifest itself; only the manifest when it indexes shards made elsewhere), or for an
    unfinished one its work folder, tokenizer and finished shards.
    UserError when the manifest or state cannot be read: then nothing can be told apart."""
    owned: set[str] = set()
    if (out / MANIFEST).exists():
        m = read_config(out / MANIFEST, "manifest")
        shards, tok = m.get("shards"), m.get("tokenizer")
        if not isinstance(shards, list) or not all(isinstance(x, dict) and isinstance(x.get("path"), str)
                                                   for x in shards):
            raise UserError(f"{out / MANIFEST} lists no shards; cannot tell the earlier preparation's files "
                            "from others: clear the folder yourself or choose another")
        owned.add(MANIFEST)
        made = m.get("created_by")
        if isinstance(made, dict) and made.get("tool") == PREPARED_BY:
            owned |= {x["path"] for x in shards}
            if isinstance(tok, dict) and isinstance(tok.get("path"), str):
                owned.add(tok["path"])
        # else a manifest of shards made elsewhere (``index_existing``): the shards are the user's
    state_path = out / WORK / "state.json"
    if (out / WORK).exists():
        owned.add(WORK)
        if state_path.exists():
            try:
                st = _State(**read_config(state_path, "preparation state"))
            except TypeError:
                raise UserError(f"{state_path} is not a preparation state") from None
            owned |= {TOKENIZER, *(x["path"] for x in st.train_shards if isinstance(x, dict)),
                      _shard_name("train", len(st.train_shards))}
    # the manifest and state are user data: only names this tool gives its own files count, each
    # a regular file (the work folder excepted), never a path outside ``out``
    def own(n: str) -> bool:
        p = out / n
        if n == WORK:
            return p.is_dir() and not p.is_symlink()
        return (n in (MANIFEST, TOKENIZER) or _OWN_SHARD.fullmatch(n) is not None) and (p.is_symlink()
                                                                                       or p.is_file())
    return {n for n in owned if isinstance(n, str) and Path(n).name == n and own(n)}


def _prepare_over(specs: list[str], files: list[InputFile], out: Path, opts: PrepareOptions,
                  progress: Callable[[str, int, int], None] | None,
                  after_shard: Callable[[int], None] | None = None) -> dict:
    """``--overwrite`` of a folder that holds something: validate, prepare into a fresh folder beside
    ``out``, then replace only the earlier preparation's files (:func:`_owned`) with the new ones,
    manifest last, through a journal (:func:`_finish_swap`: killed mid-swap, the next run into
    ``out`` finishes it). Nothing in ``out`` is touched before the new shards are complete; files
    the earlier preparation did not write (the user's) are never deleted, and a new file whose
    name one of them holds is refused."""
    owned = _owned(out)
    doomed = {(out / n).resolve() for n in owned}
    for f in files:
        p = Path(f.path).resolve()
        if p in doomed or any(p.is_relative_to(d) for d in doomed if d.is_dir()):
            raise UserError(f"input {f.path} is one of the files --overwrite would replace in {out}; "
                            "move it out of the output folder first")
    if opts.tokenizer is not None:
        _load_tokenizer(opts.tokenizer)       # a bad tokenizer is refused before any work
    tmp = out.parent / f"{_build_prefix(out)}{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        manifest = _prepare_locked(specs, files, tmp, opts, False, progress, after_shard)  # out's lock held
        new = sorted(p.name for p in tmp.iterdir())
        clash = [n for n in new if (out / n).exists() and n not in owned]
        if clash:
            raise UserError(f"{out} holds {', '.join(clash[:3])}, which no earlier preparation wrote and "
                            "the new one would replace; move it away or choose another folder")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # from here on the swap is journaled: killed at any point, the next run into ``out`` finishes it
    write_json(_journal(out), {"build": tmp.name, "owned": sorted(owned), "new": new})
    _finish_swap(out)
    return manifest


def _build_prefix(out: Path) -> str:
    """Name prefix of the folders an ``--overwrite`` of ``out`` builds in (beside it; + pid)."""
    return f".{out.name}.overwrite-"


def _journal(out: Path) -> Path:
    return out.parent / f".{out.name}.overwrite-swap.json"


def _finish_swap(out: Path) -> None:
    """Complete the swap a journal records (called under ``out``'s lock): delete what the earlier
    preparation owned, move each new file still in the build folder into ``out``, the manifest last;
    then drop the journal and the build folder. Every step may be repeated, so a swap killed
    anywhere, even inside this function, is finished by the next run. Build folders left by a
    killed ``--overwrite`` before its swap (nothing refers to them) are deleted."""
    journal = _journal(out)
    build = None
    if journal.exists():
        j = read_config(journal, "overwrite journal")
        names = [*j.get("owned", []), *j.get("new", []), j.get("build", "")]
        if not all(isinstance(n, str) and n and Path(n).name == n for n in names) or \
                not j["build"].startswith(_build_prefix(out)):
            raise UserError(f"{journal} is not an overwrite journal this tool wrote; remove it and "
                            f"check {out} by hand")
        build = out.parent / j["build"]
        new = set(j["new"])
        for n in j["owned"]:
            p = out / n
            if n == WORK and p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif n not in new and n != MANIFEST:
                p.unlink(missing_ok=True)
        if MANIFEST in j["owned"] and (build / MANIFEST).exists():
            (out / MANIFEST).unlink(missing_ok=True)   # the old manifest goes before any new shard
        for n in j["new"]:
            if n != MANIFEST and (build / n).exists():
                os.replace(build / n, out / n)
        if (build / MANIFEST).exists():
            os.replace(build / MANIFEST, out / MANIFEST)    # last: the folder is valid again
        journal.unlink()
    for stale in out.parent.glob(f"{_build_prefix(out)}*"):
        if stale.is_dir() and not stale.is_symlink() and stale.name[len(_build_prefix(out)):].isdigit():
            shutil.rmtree(stale, ignore_errors=True)


# ----- existing shards ----------------------------------------------------------------------


def _looks_like_uint32(arr: np.ndarray, sample: int = 1 << 20) -> bool:
    """Whether 16-bit values are the halves of little-endian 32-bit ids below 65536: every odd position
    0 and the even ones not (checked on the first ``sample`` values; at least 64 needed)."""
    head = np.asarray(arr[: sample - sample % 2])
    if head.size < 64:
        return False
    odd, even = head[1::2], head[0::2]
    return not odd.any() and np.count_nonzero(even) > even.size // 2


def index_existing(
    folder: Path | str,
    dtype: str,
    vocab_size: int,
    *,
    tokenizer: str | None = None,
    bos_id: int | None = None,
    eos_id: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict:
    """Write ``manifest.json`` for a folder of token files made elsewhere (no copy, no re-tokenizing).

    nanoGPT's ``train.bin``/``val.bin`` and OLMo-style ``*.npy`` (raw memmaps or real .npy with a
    header): files whose name starts with ``val`` (``val``, ``valid``, ``validation``) form the
    validation split, the others the training split, each in name order. With a ``tokenizer``,
    its hash is recorded and bytes per token measured by decoding the validation split;
    otherwise bits per byte are unknown.
    """
    folder = Path(folder)
    if dtype not in DTYPES:
        raise UserError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if not 0 < vocab_size <= np.iinfo(DTYPES[dtype]).max + 1:
        raise UserError(f"vocabulary size {vocab_size} does not fit dtype {dtype}")
    for name, v in (("--bos-id", bos_id), ("--eos-id", eos_id)):
        if v is not None and not 0 <= v < vocab_size:  # what the shard reader will demand
            raise UserError(f"{name} {v} is not an id below the vocabulary size {vocab_size}")
    if not folder.is_dir():
        raise UserError(f"shard folder {folder} does not exist")
    if (folder / MANIFEST).exists():
        raise UserError(f"{folder} already has a {MANIFEST}")
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in (".bin", ".npy"))
    if not files:
        raise UserError(f"{folder} holds no .bin or .npy token files")
    total = sum(p.stat().st_size for p in files)
    shards, done = [], 0
    want = DTYPES[dtype]
    for p in files:
        head = npy_header(p)
        offset = 0
        if head is not None:
            offset, got, _ = head
            if got.newbyteorder("<") != want and got != want:
                raise UserError(f"{p} holds {got}, not the stated {dtype}")
        size = p.stat().st_size - offset
        if size % want.itemsize:
            raise UserError(f"{p} is {size} bytes, not a whole number of {dtype} tokens")
        tokens = size // want.itemsize
        arr = np.memmap(p, dtype=want, mode="r", offset=offset, shape=(tokens,)) if tokens else np.empty(0)
        top = int(arr.max()) if tokens else 0
        if top >= vocab_size:
            raise UserError(f"{p} holds token id {top}, outside the stated vocabulary of {vocab_size}")
        if dtype == "uint16" and _looks_like_uint32(arr):
            raise UserError(f"{p} looks like uint32 tokens read as uint16 (every second 16-bit value is 0, "
                            "the high halves of 32-bit ids); pass --dtype uint32")
        split = "val" if p.name.lower().startswith("val") else "train"
        shards.append({"path": p.name, "split": split, "tokens": tokens, "sha256": sha256_file(p, offset),
                       "offset": offset})
        done += p.stat().st_size
        if progress:
            progress("indexing shards", done, total)
    if not any(s["split"] == "val" for s in shards):
        raise UserError(f"{folder} has no validation file (a name starting with 'val', e.g. val.bin)")
    tok_info, bpt = None, None
    if tokenizer is not None:
        tok = _load_tokenizer(tokenizer)
        if tok.get_vocab_size(with_added_tokens=True) > vocab_size:
            raise UserError(f"the tokenizer's vocabulary ({tok.get_vocab_size(with_added_tokens=True)}) "
                            f"exceeds the stated {vocab_size}")
        tok_info = {"path": str(Path(tokenizer).resolve()), "sha256": sha256_file(tokenizer),
                    "vocab_size": tok.get_vocab_size(with_added_tokens=True), "kind": "given"}
        nbytes = ntok = 0
        seps = {i for i in (bos_id, eos_id) if i is not None}
        for s in shards:
            if s["split"] != "val":
                continue
            arr = np.memmap(folder / s["path"], dtype=want, mode="r", offset=s["offset"],
                            shape=(s["tokens"],))
            for lo in range(0, len(arr), 1 << 20):
                ids = [int(i) for i in arr[lo:lo + (1 << 20)] if int(i) not in seps]
                ntok += len(ids)
                nbytes += len(tok.decode(ids, skip_special_tokens=False).encode())
        bpt = nbytes / ntok if ntok else None
    counts = {sp: sum(s["tokens"] for s in shards if s["split"] == sp) for sp in ("train", "val")}
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "dtype": dtype,
        "byte_order": "little",
        "vocab_size": vocab_size,
        "bos_id": bos_id,
        "eos_id": eos_id,
        "document_layout": "as made by the tool that wrote the files (stated separators only)",
        "tokenizer": tok_info,
        "shard_tokens": None,
        "shards": shards,
        "splits": {sp: {"tokens": counts[sp], "documents": None, "bytes": None} for sp in counts},
        "documents": None,
        "bytes": None,
        "val_sources": [],
        "val_bytes_per_token": bpt,
        "sources": [],
        "split_rule": {"rule": "files named val* are the validation split (made elsewhere)"},
        "created_by": {"tool": "smelt-scale prepare-data (indexed existing shards)"},
    }
    write_json(folder / MANIFEST, manifest)
    return manifest
