"""The memory planner against the peak memory measured on one H200 (issue 31), one table.

    python benchmarks/memory_calibration.py          # markdown table (docs/gpu-memory.md)

Measured: ``torch.cuda.max_memory_allocated`` of ``benchmarks/gpu_check.py`` (torch 2.11.0+cu130,
world size 1, FSDP2 bf16, seq_len 4096, grad_sync every) with the MoE layer *before* issue 31
(bincount + index_add_ combine, explicit fp32 RMSNorm). "old planner" is the planner those runs
printed. "new planner" is this planner for the current layer; "new planner, old layer" adds back
what the old layer stored and the current one does not (per token and layer pass: the gated
expert output k*c*d' kept by the index_add_ combine; its fp32 norm copies 2*(4-c)*d; less the
current router's fp32 input copy 4*d), so that it can be compared with those measurements.
Pure arithmetic: no GPU, no torch.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scaling.accounting.memory import Layout, _expert_dims, estimate_memory  # noqa: E402
from scaling.accounting.tiers import get_config  # noqa: E402

# (tier, arch, micro-batch, accumulation, compiled, measured GB, old planner GB): issue 31's table
H200 = (
    ("100M", "baseline", 2, 2, False, 70.7, 74.8),
    ("100M", "smelt", 2, 2, False, 87.4, 76.5),
    ("100M", "baseline", 8, 1, False, 87.7, 108.1),
    ("100M", "baseline", 8, 1, True, 80.2, 108.1),
    ("100M", "smelt", 8, 1, True, 84.8, 115.6),
    ("200M", "baseline", 4, 1, False, 79.2, 100.6),
    ("200M", "smelt", 4, 1, False, 100.6, 106.2),
)


def rows() -> list[dict]:
    out = []
    for tier, arch, mb, acc, compiled, measured, old in H200:
        cfg = get_config(tier, arch)
        layout = Layout(mode="fsdp", gpus_per_node=1, micro_batch_size=mb, grad_accum_steps=acc,
                        compute_dtype="bf16", seq_len=4096)
        m = estimate_memory(cfg, layout)
        c, N, d = 2, mb * 4096, cfg.d_model
        dp, _ = _expert_dims(cfg, c)
        old_layer_extra = N * (cfg.top_k * c * dp + 2 * (4 - c) * d - 4 * d)
        # every moment of the walk holds the stored passes; the peak is at the head in every row
        stored_passes = cfg.n_layer_passes if m.peak_at == "head" else None
        old_layer = m.total + old_layer_extra * stored_passes if stored_passes else None
        out.append({"tier": tier, "arch": arch, "micro": mb, "accum": acc, "compiled": compiled,
                    "measured": measured, "old": old, "new": m.total / 1e9,
                    "new_old_layer": old_layer / 1e9 if old_layer else None, "peak_at": m.peak_at})
    return out


def main() -> int:
    print("| tier | arch | micro-batch x accum | compiled | measured GB | old planner | "
          "new planner, old layer | new planner (current layer) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows():
        def pct(v):
            return f"{v:.1f} ({(v / r['measured'] - 1) * 100:+.0f}%)"
        compiled = "yes" if r["compiled"] else "no"
        print(f"| {r['tier']} | {r['arch']} | {r['micro']} x {r['accum']} | {compiled} | "
              f"{r['measured']:.1f} | {pct(r['old'])} | {pct(r['new_old_layer'])} | {r['new']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
