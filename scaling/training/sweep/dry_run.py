"""What ``sweep --dry-run`` reports: one row per run (FLOPs, time or GPU-hours, memory per GPU by
part, predicted step time), the plan's totals, and the table's columns and cells as text.

The numbers come from :func:`scaling.training.sweep.submit.estimate` and the data use of
:func:`scaling.training.data.loader.plan_data_use`; the fastest fitting layout of a run (``--choose-layout``)
from :func:`scaling.accounting.steptime.choose_layout`.
"""

from __future__ import annotations

from typing import Any, Sequence

from scaling.accounting.steptime import choose_layout
from scaling.common.format import duration
from scaling.training.sweep.plan import PlannedRun, SweepPlan
from scaling.training.sweep.submit import DEFAULT_GPU_PEAK_FLOPS, DEFAULT_MFU, RunEstimate

# (header, left-justified) of the estimate table, one row per run: estimate_cells gives the cells
ESTIMATE_COLUMNS: tuple[tuple[str, bool], ...] = (
    ("run", True), ("budgets (tokens)", True), ("status", True), ("train tokens", False),
    ("data tokens", False), ("epochs", False), ("FLOPs", False), ("tok/s", False), ("est. time", False),
    ("GPU-h", False), ("mem/GPU GB", False), ("params+grads+optim", False), ("activ+work", False),
    ("buffers", False), ("fits", False), ("step s", False), ("MFU", False), ("binds", False),
)
NOT_FITTING = "NO"  # the "fits" cell of a run over the plan's gpu_memory_gb


def mfu(plan: SweepPlan) -> float:
    return float(plan.executor.get("mfu", DEFAULT_MFU))


def gpu_peak_flops(plan: SweepPlan) -> float:
    return float(plan.executor.get("gpu_peak_flops", DEFAULT_GPU_PEAK_FLOPS))


def chosen_layout(plan: SweepPlan, run: PlannedRun) -> dict[str, Any]:
    """The fastest predicted layout of ``run`` that fits, and how many were tried and fit."""
    best, tried, fitting = choose_layout(run.model, run.layout(), run.gpu_memory_gb, gpu_peak_flops(plan),
                                         mfu(plan), run.links())
    return {"tried": tried, "fitting": fitting, "best": None if best is None else best.to_dict()}


def dry_run_rows(plan: SweepPlan, estimates: Sequence[RunEstimate], uses: Sequence[Any],
                 choose: bool = False) -> list[dict[str, Any]]:
    """One dict per run: its estimate and its data use (and, with ``choose``, its chosen layout)."""
    rows = [{**e.to_dict(), **u.to_dict()} for e, u in zip(estimates, uses)]
    if choose:
        for row, e in zip(rows, estimates):
            row["chosen_layout"] = chosen_layout(plan, e.run)
    return rows


def dry_run_total(plan: SweepPlan, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """FLOPs, serial seconds (proxy tiers) and GPU-hours (paper tiers) summed over the runs."""
    return {
        "runs": len(rows),
        "flops": sum(r["flops"] for r in rows),
        "est_seconds_serial": sum(r["est_seconds"] or 0 for r in rows) or None,
        "gpu_hours": sum(r["gpu_hours"] or 0 for r in rows) or None,
        "mfu": mfu(plan),
        "gpu_peak_flops": gpu_peak_flops(plan),
    }


def _memory_cells(row: dict[str, Any]) -> list[str]:
    mem = row.get("memory_gb_per_gpu")
    if not mem:
        return ["-"] * 5
    fits = {True: "yes", False: NOT_FITTING, None: "-"}[row["fits"]]
    return [
        f"{mem['total']:.1f}",
        f"{mem['params'] + mem['grads'] + mem['optimizer']:.1f}",
        f"{mem['activations'] + mem['working']:.1f}",
        f"{mem['buffers']:.1f}",
        fits,
    ]


def _step_cells(row: dict[str, Any]) -> list[str]:
    """Predicted step time, MFU and binding resource (scaling/accounting/steptime.py)."""
    if "predicted_step_s" not in row:
        return ["-"] * 3
    return [f"{row['predicted_step_s']:.3g}", f"{row['predicted_mfu']:.1%}", row["binding_resource"]]


def estimate_cells(r: dict[str, Any]) -> list[str]:
    """The cells of one row of :func:`dry_run_rows`, in the order of :data:`ESTIMATE_COLUMNS`."""
    return [
        r["run"],
        ", ".join(f"{b:.3g}" for b in r["budgets"]),
        r["status"],
        f"{r['tokens']:.3g}",
        f"{r['data_tokens']:.3g}",
        "-" if r["epochs"] is None else f"{r['epochs']:.3g}",
        f"{r['flops']:.3g}",
        f"{r['tokens_per_s']:.0f}" if r["tokens_per_s"] else "-",
        duration(r["est_seconds"]),
        f"{r['gpu_hours']:.0f}" if r["gpu_hours"] else "-",
        *_memory_cells(r),
        *_step_cells(r),
    ]
