"""Throughput of `smelt-scale prepare-data` against Hugging Face `datasets.map(batched=True)`.

Builds a JSONL corpus of at least ``--mb`` MB from text already on this machine (the Python
standard library and site-packages sources, then /usr/share/doc), trains one byte-level BPE on
its first 4 MB, and tokenizes the whole corpus with that same tokenizer.json twice, in one run:

- ours: ``scaling.training.data.prepare.prepare`` (reading, hashing, encode_batch on every core,
  shards, manifest), one process whose Rust threads use ``--procs`` cores
  (RAYON_NUM_THREADS);
- datasets: ``load_dataset("json")`` then ``.map(batched=True, num_proc=--procs)`` calling the
  same tokenizer's ``encode_batch`` (no shard file is written afterwards, which favours it).

MB/s = UTF-8 bytes of document text / wall seconds. Needs the ``bench`` extra (datasets).

    python benchmarks/prepare_throughput.py [--mb 50] [--procs 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import site
import sys
import sysconfig
import tempfile
import time
from pathlib import Path


def build_corpus(path: Path, target_bytes: int) -> tuple[int, int]:
    """(documents, text bytes) of a JSONL of whole files from this machine, in sorted path order."""
    roots = [Path(sysconfig.get_paths()["stdlib"]), *map(Path, site.getsitepackages()),
             Path("/usr/share/doc")]
    docs = size = 0
    seen = set()
    with open(path, "w", encoding="utf-8") as out:
        for root in roots:
            if not root.is_dir():
                continue
            for p in sorted(root.rglob("*")):
                if size >= target_bytes:
                    return docs, size
                if p.suffix not in (".py", ".txt", ".md", ".rst") or not p.is_file() or p in seen:
                    continue
                seen.add(p)
                try:
                    text = p.read_text(encoding="utf-8")
                except (UnicodeDecodeError, OSError):
                    continue
                if not text.strip():
                    continue
                out.write(json.dumps({"id": str(p), "text": text}) + "\n")
                docs += 1
                size += len(text.encode())
    if size < target_bytes:
        sys.exit(f"only {size / 1e6:.1f} MB of text found on this machine, below --mb")
    return docs, size


def train_tok(corpus: Path, out: Path, vocab: int) -> None:
    from scaling.training.data.corpus import train_tokenizer

    texts, size = [], 0
    with open(corpus, encoding="utf-8") as fh:
        for line in fh:
            texts.append(json.loads(line)["text"])
            size += len(texts[-1])
            if size > 4e6:
                break
    train_tokenizer(texts, vocab).save(str(out))


def run_ours(corpus: Path, tok: Path, out: Path) -> tuple[float, int]:
    from scaling.training.data.prepare import PrepareOptions, prepare

    t0 = time.perf_counter()
    m = prepare([str(corpus)], out, PrepareOptions(tokenizer=str(tok), val_fraction=0.05))
    return time.perf_counter() - t0, m["splits"]["train"]["tokens"] + m["splits"]["val"]["tokens"]


def run_datasets(corpus: Path, tok: Path, cache: Path, procs: int) -> tuple[float, int]:
    import datasets
    from tokenizers import Tokenizer

    datasets.disable_progress_bars()
    tokenizer = Tokenizer.from_file(str(tok))

    def encode(batch):
        return {"ids": [e.ids for e in tokenizer.encode_batch(batch["text"], add_special_tokens=False)]}

    t0 = time.perf_counter()
    ds = datasets.load_dataset("json", data_files=str(corpus), split="train", cache_dir=str(cache))
    ds = ds.map(encode, batched=True, num_proc=procs, remove_columns=ds.column_names,
                load_from_cache_file=False, cache_file_name=str(cache / "tokenized.arrow"))
    n = sum(len(x) for x in ds.with_format("numpy")["ids"])
    return time.perf_counter() - t0, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=50.0, help="corpus size in MB of text (>= 50 for the report)")
    ap.add_argument("--procs", type=int, default=2, help="processes for datasets = threads for ours")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    os.environ["RAYON_NUM_THREADS"] = str(args.procs)
    work = Path(tempfile.mkdtemp(prefix="prepare-bench-"))
    try:
        corpus = work / "corpus.jsonl"
        docs, nbytes = build_corpus(corpus, int(args.mb * 1e6))
        tok = work / "tokenizer.json"
        train_tok(corpus, tok, args.vocab)
        t_ours, tokens_ours = run_ours(corpus, tok, work / "shards")
        t_ds, tokens_ds = run_datasets(corpus, tok, work / "hf-cache", args.procs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "documents": docs,
        "text_mb": nbytes / 1e6,
        "procs": args.procs,
        "cpu_count": os.cpu_count(),
        "vocab": args.vocab,
        "ours_s": t_ours,
        "ours_mb_per_s": nbytes / 1e6 / t_ours,
        "ours_tokens": tokens_ours,
        "datasets_s": t_ds,
        "datasets_mb_per_s": nbytes / 1e6 / t_ds,
        "datasets_tokens": tokens_ds,
        "ratio_ours_over_datasets": t_ds / t_ours,
        # ours adds one <|bos|> per document; otherwise the same ids
        "same_tokens": tokens_ours - docs == tokens_ds,
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"corpus: {docs:,} documents, {result['text_mb']:.1f} MB of text; {args.procs} processes/threads")
    for name, t, key, n in (("prepare-data", t_ours, "ours_mb_per_s", tokens_ours),
                            ("datasets.map", t_ds, "datasets_mb_per_s", tokens_ds)):
        print(f"{name:<14} {t:7.1f} s  {result[key]:6.2f} MB/s  ({n:,} tokens)")
    print(f"ratio (ours / datasets throughput): {result['ratio_ours_over_datasets']:.2f}")


if __name__ == "__main__":
    main()
