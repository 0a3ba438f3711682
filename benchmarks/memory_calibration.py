"""The memory planner against the peak memory measured on one H200 (issue 31), one table.

    python benchmarks/memory_calibration.py          # markdown table (docs/gpu-memory.md)

The current, sync-free MoE layer measured on one H200 on 2026-12-04
(``benchmarks/results/gpu-h200-2026-12-04*.json``, written by ``gpu_check.py --configs ...
--profile --out``: torch 2.11.0+cu130, world size 1 with a 1-rank FSDP2 mesh, bf16, seq_len 4096),
against this planner with ``compiled`` set as each run was; tests/test_memory.py asserts every row
within +-10%. Pure arithmetic: no GPU, no torch. (The first measurements, of the layer before
issue 31, are kept as history in docs/gpu-memory.md.)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_report import read_results  # noqa: E402

from scaling.accounting.memory import Layout, estimate_memory  # noqa: E402
from scaling.accounting.tiers import get_config  # noqa: E402


def measured_rows(results: Path | None = None) -> list[dict]:
    """The current layer on the H200: one row per (file, configuration, architecture) measured,
    planned in the layout that ran (``gpu_report.read_results``: a 1-rank FSDP2 mesh before
    2026-12-05, with FSDP2's own gradient reduction; ``layout`` and ``loop_grad`` since)."""
    results = results or Path(__file__).resolve().parent / "results"
    out = []
    for a in read_results(*sorted(results.glob("gpu-h200-*.json"))):
        if a.get("peak_memory_gb") is None or a.get("world", 1) != 1:
            continue
        cfg = get_config(a["tier"], a["arch"])
        sharded = a["layout"] in ("fsdp", "hsdp")
        m = estimate_memory(cfg, Layout(
            mode=a["layout"], gpus_per_node=1, micro_batch_size=a["micro_batch_size"],
            grad_accum_steps=a["grad_accum_steps"], compute_dtype="bf16", seq_len=cfg.seq_len,
            compiled=a["compile"], loop_grad=a["loop_grad"] if sharded else None))
        out.append({"file": a["file"], "tier": a["tier"], "arch": a["arch"], "layout": a["layout"],
                    "micro": a["micro_batch_size"], "accum": a["grad_accum_steps"],
                    "compiled": a["compile"], "measured": a["peak_memory_gb"],
                    "planned": m.total / 1e9, "stored": a["stored_after_forward_gb"],
                    "planned_stored": m.activations_stored / 1e9})
    return out


def main() -> int:
    print("| run file | tier | arch | micro-batch x accum | compiled | peak GB measured | planned | "
          "stored by a forward, GB measured | planned |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in measured_rows():
        compiled = "yes" if r["compiled"] else "no"
        err = (r["planned"] / r["measured"] - 1) * 100
        print(f"| {r['file']} | {r['tier']} | {r['arch']} | {r['micro']} x {r['accum']} | {compiled} | "
              f"{r['measured']:.1f} | {r['planned']:.1f} ({err:+.1f}%) | "
              f"{r['stored']:.2f} | {r['planned_stored']:.2f} "
              f"({(r['planned_stored'] / r['stored'] - 1) * 100:+.1f}%) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
