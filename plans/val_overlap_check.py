"""Which evaluated validation windows of a run on the built-in corpus occur verbatim in its training
stream, and what they do to its validation loss (docs/proxy-study.md, "Validation text that
training also holds").

    python plans/val_overlap_check.py [RUN] [--json]   # RUN: a run folder (runs/iso-d14-baseline-s0)
    python plans/val_overlap_check.py --weights FOLDER  # every run in FOLDER with budget weights
    python plans/val_overlap_check.py RUN --no-codec-tables  # the same setting on today's corpus

Rebuilds (or reads from the cache) the run's corpus from ``data_spec`` in its ``config.json``, takes
the validation windows the trainer evaluates (``window_index`` with the run's ``seq_len`` and
``val_windows``) and looks each (seq_len + 1)-token window up among every window of the training
stream: a rolling hash to find candidates, then an exact comparison. Prints the count, the target
tokens they hold, and which validation document overlaps which training document. A window counted
here is a full copy; shorter shared runs are not counted, so this is a lower bound on the leak.

With ``--weights``, each run's model at every budget whose weights it saved
(``save_budget_weights``) is evaluated on the same windows: the loss over all of them (which must
equal the run's recorded validation loss), over the copied ones and over the rest, and, for each
(tier, seed, budget) with both architectures, SMELT - Baseline on all windows and on the clean ones.
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


def overlap(run: Path, with_windows: bool = False, codec_tables: bool | None = None) -> dict:
    """``codec_tables``: None for the run's own corpus, else its spec with that DataSpec.codec_tables."""
    meta = json.loads((run / "config.json").read_text())
    spec = DataSpec.from_dict(meta["data_spec"])
    if codec_tables is not None:
        spec = DataSpec.from_dict({**spec.to_dict(), "codec_tables": codec_tables})
    corpus = load_corpus(spec)
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
                hits.append((val_doc, train_names[int(np.searchsorted(starts, pos, side="right")) - 1],
                             int(i)))
                break
            k += 1
    out = {"run": str(run), "corpus_key": corpus.provenance["key"], "seq_len": seq_len,
           "windows": len(idx), "copied_windows": len(hits), "copied_target_tokens": len(hits) * seq_len,
           "target_tokens": len(idx) * seq_len,
           "pairs": [{"val": v, "train": t, "windows": c}
                     for (v, t), c in collections.Counter(h[:2] for h in hits).most_common()]}
    if with_windows:
        out["copied"] = np.isin(idx, [h[2] for h in hits])
        out["tokens"] = np.stack([np.asarray(corpus.val_tokens[int(i) * length:(int(i) + 1) * length])
                                  for i in idx]).astype(np.int64)
    return out


def budget_losses(run: Path, copied: np.ndarray, windows: np.ndarray) -> list[dict]:
    """Validation loss of the run at each budget with saved weights: all windows, copied, clean."""
    import torch

    from scaling.evaluation.weights import available_budgets, load_weights, resolve_weights

    rows = []
    for b in available_budgets(run):
        w = load_weights(resolve_weights(run, b))
        per_window = []
        with torch.no_grad():
            for i in range(0, len(windows), 32):
                x = torch.from_numpy(windows[i:i + 32])
                out = w.model(x[:, :-1], x[:, 1:], return_per_token_loss=True)
                per_window.append(out.per_token_loss.double().mean(dim=1).numpy())
        loss = np.concatenate(per_window)
        facts = w.facts()
        rows.append({"run": run.name, "arch": facts["arch"], "tier": facts["tier"], "seed": facts["seed"],
                     "budget": b, "D": facts["D"], "recorded": facts["val_loss"], "all": float(loss.mean()),
                     "copied": float(loss[copied].mean()), "clean": float(loss[~copied].mean())})
    return rows


def weights_table(folder: Path) -> dict:
    runs = sorted(p for p in folder.iterdir() if (p / "config.json").is_file())
    if not runs:
        raise SystemExit(f"error: no run folders in {folder}")
    ov = overlap(runs[0], with_windows=True)     # one corpus, seq_len and window set for the study
    rows = []
    for run in runs:
        check = overlap(run)
        if (check["corpus_key"], check["seq_len"], check["windows"]) != \
                (ov["corpus_key"], ov["seq_len"], ov["windows"]):
            raise SystemExit(f"error: {run} was evaluated on other windows than {runs[0]}")
        rows += budget_losses(run, ov["copied"], ov["tokens"])
    by = {(r["tier"], r["seed"], r["budget"], r["arch"]): r for r in rows}
    pairs = []
    for (tier, seed, b, arch), s in sorted(by.items()):
        base = by.get((tier, seed, b, "baseline"))
        if arch == "smelt" and base is not None:
            pairs.append({"tier": tier, "seed": seed, "budget": b, "D": s["D"],
                          "diff_all": s["all"] - base["all"], "diff_clean": s["clean"] - base["clean"],
                          "diff_copied": s["copied"] - base["copied"]})
    return {"copied_windows": ov["copied_windows"], "windows": ov["windows"], "rows": rows, "pairs": pairs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", default="runs/iso-d14-baseline-s0", type=Path)
    ap.add_argument("--weights", action="store_true", help="RUN is a folder of runs with budget weights")
    ap.add_argument("--codec-tables", action=argparse.BooleanOptionalAction, default=None,
                    help="override the run's DataSpec.codec_tables (the corpus is built if not cached)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.weights:
        t = weights_table(args.run)
        if args.json:
            print(json.dumps(t, indent=1))
            return
        print(f"{t['copied_windows']} of {t['windows']} windows copied in training; loss (nats/token):")
        print(f"{'run':24s} {'budget':>6s} {'recorded':>9s} {'all':>9s} {'copied':>9s} {'clean':>9s}")
        for r in t["rows"]:
            print(f"{r['run']:24s} {r['budget']:6d} {r['recorded']:9.4f} {r['all']:9.4f} {r['copied']:9.4f} "
                  f"{r['clean']:9.4f}")
        print("SMELT - Baseline:")
        for p in t["pairs"]:
            print(f"  {p['tier']} seed {p['seed']} budget {p['budget']}: all {p['diff_all']:+.4f}, "
                  f"clean {p['diff_clean']:+.4f}, copied {p['diff_copied']:+.4f}")
        if t["pairs"]:
            d_all = np.array([p["diff_all"] for p in t["pairs"]])
            d_clean = np.array([p["diff_clean"] for p in t["pairs"]])
            shift = d_clean - d_all
            print(f"  mean over {len(d_all)} pairs: all {d_all.mean():+.4f}, clean {d_clean.mean():+.4f}; "
                  f"clean minus all {shift.mean():+.4f} (largest |shift| {np.abs(shift).max():.4f})")
        return
    r = overlap(args.run, codec_tables=args.codec_tables)
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
