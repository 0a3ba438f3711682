"""Which evaluated validation windows of a run on the built-in corpus occur verbatim in its training
stream (docs/proxy-study.md section 5).

    python plans/val_overlap_check.py [RUN] [--json]   # RUN: a run folder (runs/iso-d14-baseline-s0)

Rebuilds (or reads from the cache) the run's corpus from ``data_spec`` in its ``config.json``, takes
the validation windows the trainer evaluates (``window_index`` with the run's ``seq_len`` and
``val_windows``) and looks each (seq_len + 1)-token window up among every window of the training
stream: a rolling hash to find candidates, then an exact comparison. Prints the count, the target
tokens they hold, and which validation document overlaps which training document. A window counted
here is a full copy; shorter shared runs are not counted, so this is a lower bound on the leak.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import numpy as np

from scaling.training.data.corpus import DataSpec, load_corpus
from scaling.training.data.shards import window_index


def _hashes(a: np.ndarray, length: int) -> np.ndarray:
    """Polynomial hash (mod 2**64) of every ``length``-token window of ``a``."""
    a = a.astype(np.uint64)
    m = len(a) - length + 1
    h = np.zeros(m, np.uint64)
    with np.errstate(over="ignore"):
        for j in range(length):
            h = h * np.uint64(1_000_003) + a[j:j + m]
    return h


def overlap(run: Path) -> dict:
    meta = json.loads((run / "config.json").read_text())
    corpus = load_corpus(DataSpec.from_dict(meta["data_spec"]))
    seq_len, n = meta["model"]["seq_len"], meta["train"]["val_windows"]
    length = seq_len + 1
    idx = window_index(len(corpus.val_tokens), seq_len, n, "validation stream")
    train = np.asarray(corpus.train_tokens).astype(np.int64)
    th = _hashes(train, length)
    order = np.argsort(th, kind="stable")
    sorted_h = th[order]
    docs = [json.loads(line) for line in (corpus.path / "documents.jsonl").read_text().splitlines()]
    train_names = [d["name"] for d in docs if d["split"] == "train"]
    starts = np.flatnonzero(train == 0)        # BOS opens every training document
    hits = []
    for i in idx:
        w = np.asarray(corpus.val_tokens[int(i) * length:(int(i) + 1) * length]).astype(np.int64)
        h = _hashes(w, length)[0]
        k = int(np.searchsorted(sorted_h, h))
        while k < len(sorted_h) and sorted_h[k] == h:
            pos = int(order[k])
            if np.array_equal(train[pos:pos + length], w):
                val_doc = corpus.val_names[int(np.searchsorted(corpus.val_offsets, int(i) * length,
                                                               side="right")) - 1]
                hits.append((val_doc, train_names[int(np.searchsorted(starts, pos, side="right")) - 1]))
                break
            k += 1
    return {"run": str(run), "corpus_key": corpus.provenance["key"], "seq_len": seq_len,
            "windows": len(idx), "copied_windows": len(hits), "copied_target_tokens": len(hits) * seq_len,
            "target_tokens": len(idx) * seq_len,
            "pairs": [{"val": v, "train": t, "windows": c}
                      for (v, t), c in collections.Counter(hits).most_common()]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", default="runs/iso-d14-baseline-s0", type=Path)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = overlap(args.run)
    if args.json:
        print(json.dumps(r, indent=1))
        return
    print(f"{r['run']} (corpus {r['corpus_key']}, seq_len {r['seq_len']}): {r['copied_windows']} of "
          f"{r['windows']} validation windows ({r['copied_target_tokens']:,} of {r['target_tokens']:,} "
          "target tokens) occur verbatim in the training stream")
    for p in r["pairs"]:
        print(f"  {p['val']}  ~  {p['train']}: {p['windows']}")


if __name__ == "__main__":
    main()
