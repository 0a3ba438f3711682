"""What a ``gpu_check.py --out`` JSON says about issue 31, as markdown (or ``--json``): per run the
throughput, MFU and memory; the A/B pairs measured in the same run; the issue's targets.

    python benchmarks/gpu_report.py gpu.json [more.json ...]     # markdown for the README
    python benchmarks/gpu_report.py benchmarks/results/gpu-h200-2026-12-04a.json --json

``read_results`` is the one reader of that JSON (``memory_calibration.py`` uses it too). Files
written before 2026-12-05 lack the keys saying what ran; their values then were: a 1-rank FSDP2
mesh (``layout`` "fsdp"), FSDP2's own gradient reduction (``loop_grad`` "fsdp"), no head padding
(``head_padding`` "never") and the exact CPU-drawn init. A partial file (a run cut off by a time
limit: ``"partial": true``) is read the same way.

The ``kernels`` extra check (gpu_check_kernels.py) gets its own table: the router GEMM and the
dispatch, each against what it replaced, timed in the same run.

A/B pairs (``AB_PAIRS``): a configuration against its reference in the same file, per
architecture both ran: tokens/s of the first over the second. Targets (issue 31, one H200, 100M
tier, bf16, the planner's chosen layout): MFU >= 0.35 (Baseline) and >= 0.30 (SMELT), and SMELT's
tokens/s >= 0.9 x the Baseline's in the same configuration; checked on ``TARGET_CONFIG`` when it
ran, else on every timed configuration (labelled as such; the speed ratio only where both
architectures ran). Pure JSON, no
torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# (configuration, its reference, what the ratio measures)
AB_PAIRS = (
    ("mb8-unwrapped", "mb8", "one GPU unwrapped (the trainer's layout) / a 1-rank FSDP2 mesh"),
    ("mb8-nopad", "mb8", "SDPA at the model's head size (FA2) / padded to 8 (cuDNN eligible)"),
    ("mb8-fsdpgrad", "mb8", "FSDP2's own gradient reduction / per-pass"),
    ("mb16-compiled", "mb8-compiled", "micro-batch 16 / 8, compiled"),
)
TARGET_CONFIG = "mb16x4-compiled-unwrapped"
TARGET_MFU = {"baseline": 0.35, "smelt": 0.30}
TARGET_SPEED_RATIO = 0.9
# what ran before the JSON said so (gpu_check before 2026-12-05)
OLD_DEFAULTS = {"layout": "fsdp", "loop_grad": "fsdp", "head_padding": "never", "init": "exact"}


def _load(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def read_results(*paths: Path) -> list[dict]:
    """One row per (file, configuration, architecture) that trained (errors left out): the
    architecture's measurements plus ``file``, ``tier``, ``device``, ``torch``, ``world`` (1 when
    a partial file does not say), ``config``."""
    rows = []
    for path in paths:
        doc = _load(path)
        for config in doc.get("configs", []):
            archs = config.get("archs") or [a for a in doc.get("archs", [])
                                            if a.get("config") == config["name"]]
            for a in archs:
                if "error" in a:
                    continue
                rows.append({**OLD_DEFAULTS, **a, "file": Path(path).name, "tier": doc.get("tier"),
                             "device": doc.get("device"), "torch": doc.get("torch"),
                             "world": doc.get("world", 1), "config": config["name"]})
    return rows


def kernel_checks(*paths: Path) -> list[dict]:
    """One row per (file, architecture) of the ``kernels`` extra check (gpu_check_kernels.py; files
    before 2026-12-05 have none): the router GEMM's and the dispatch's forward + backward times
    against what they replaced, and whether they equal their definitions."""
    rows = []
    for path in paths:
        doc = _load(path).get("kernels") or {}
        for arch in ("baseline", "smelt"):
            if arch in doc:
                router, disp = doc[arch]["router"], doc[arch]["dispatch"]
                rows.append({"file": Path(path).name, "arch": arch, "timing": doc.get("timing"),
                             "tensor_core_path": router["tensor_core_path"],
                             "router_ms": router["ms_fwd_bwd"], "router_ms_fp32": router["ms_fwd_bwd_fp32"],
                             "dispatch_ms": disp["ms_fwd_bwd"],
                             "dispatch_ms_gather_first": disp["ms_fwd_bwd_gather_first"],
                             "ok": router["ok"] and disp["ok"]})
    return rows


def ab_ratios(rows: list[dict]) -> list[dict]:
    """Tokens/s of each A/B configuration over its reference, per file and architecture."""
    by = {(r["file"], r["config"], r["arch"]): r for r in rows if r.get("tokens_per_s")}
    out = []
    for config, reference, what in AB_PAIRS:
        for (file, name, arch), r in sorted(by.items()):
            ref = by.get((file, reference, arch))
            if name == config and ref is not None:
                out.append({"file": file, "arch": arch, "config": config, "reference": reference,
                            "what": what, "ratio": r["tokens_per_s"] / ref["tokens_per_s"]})
    return out


def targets(rows: list[dict]) -> list[dict]:
    """Issue 31's targets on TARGET_CONFIG (else every configuration both architectures ran)."""
    timed = [r for r in rows if r.get("tokens_per_s") and r.get("mfu")]
    pool = [r for r in timed if r["config"] == TARGET_CONFIG] or timed
    out = []
    for file, config in sorted({(r["file"], r["config"]) for r in pool}):
        pair = {r["arch"]: r for r in pool if (r["file"], r["config"]) == (file, config)}
        row = {"file": file, "config": config, "target_config": config == TARGET_CONFIG}
        for arch, need in TARGET_MFU.items():
            if arch in pair:
                row[f"mfu_{arch}"] = pair[arch]["mfu"]
                row[f"mfu_{arch}_met"] = pair[arch]["mfu"] >= need
        if {"baseline", "smelt"} <= set(pair):
            ratio = pair["smelt"]["tokens_per_s"] / pair["baseline"]["tokens_per_s"]
            row["smelt_over_baseline"] = ratio
            row["speed_met"] = ratio >= TARGET_SPEED_RATIO
        out.append(row)
    return out


def _attention(r: dict) -> str:
    """The attention kernel the profile saw (files before 2026-12-05: its top kernels)."""
    prof = r.get("profile") or {}
    names = prof.get("attention_kernels") or [t["name"] for t in prof.get("top", [])
                                               if t.get("kind") == "attention"]
    if any("cudnn" in n.lower() for n in names):
        return "cuDNN"
    if any("flash" in n.lower() for n in names):
        return "FA2"
    return "-"


def markdown(rows: list[dict], kernels: list[dict] = ()) -> str:
    lines = ["| file | config | layout | arch | micro x accum | compiled | head | tokens/s | MFU | "
             "peak GB (planned then) | sync-free | attention |", "|" + "---|" * 12]
    for r in rows:
        tps = f"{r['tokens_per_s']:,.0f}" if r.get("tokens_per_s") else "-"
        mfu = f"{r['mfu']:.3f}" if r.get("mfu") else "-"
        peak = (f"{r['peak_memory_gb']:.1f} ({r['planned_memory_gb']:.1f})"
                if r.get("peak_memory_gb") and r.get("planned_memory_gb") else "-")
        sync = (r.get("sync_check") or {}).get("sync_free")
        lines.append(f"| {r['file']} | {r['config']} | {r['layout']} | {r['arch']} | "
                     f"{r.get('micro_batch_size')} x {r.get('grad_accum_steps')} | "
                     f"{'yes' if r.get('compile') else 'no'} | "
                     f"{r.get('sdpa_head_size', r['head_padding'])} | "
                     f"{tps} | {mfu} | {peak} | {sync} | {_attention(r)} |")
    ab = ab_ratios(rows)
    if ab:
        lines += ["", "| A/B (same run) | arch | tokens/s ratio |", "|---|---|---|"]
        lines += [f"| {a['config']} / {a['reference']}: {a['what']} | {a['arch']} | {a['ratio']:.3f} |"
                  for a in ab]
    if kernels:
        lines += ["", "| kernel check (N = 8 x 4096) | arch | router fwd+bwd ms (fp32 GEMM before) | "
                  "tensor cores | dispatch fwd+bwd ms (gather then cast before) | equal |", "|" + "---|" * 6]
        lines += [f"| {k['file']} | {k['arch']} | {k['router_ms']:.2f} ({k['router_ms_fp32']:.2f}) | "
                  f"{k['tensor_core_path']} | {k['dispatch_ms']:.2f} ({k['dispatch_ms_gather_first']:.2f}) | "
                  f"{k['ok']} |" for k in kernels]
    lines += ["", "| targets on | MFU B (>= 0.35) | MFU S (>= 0.30) | S / B tokens/s (>= 0.9) |",
              "|---|---|---|---|"]
    for t in targets(rows):
        where = t["config"] + ("" if t["target_config"] else f" ({TARGET_CONFIG} did not run)")

        def cell(value_key: str, met_key: str, fmt: str = ".3f") -> str:
            if value_key not in t:
                return "-"
            return f"{t[value_key]:{fmt}} ({'met' if t[met_key] else 'not met'})"
        lines.append(f"| {t['file']}: {where} | {cell('mfu_baseline', 'mfu_baseline_met')} | "
                     f"{cell('mfu_smelt', 'mfu_smelt_met')} | "
                     f"{cell('smelt_over_baseline', 'speed_met', '.2f')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", type=Path, help="gpu_check.py --out JSON files")
    ap.add_argument("--json", action="store_true", help="rows, A/B ratios and targets as JSON")
    args = ap.parse_args(argv)
    missing = [str(p) for p in args.files if not p.is_file()]
    if missing:
        print(f"error: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        rows, kernels = read_results(*args.files), kernel_checks(*args.files)
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        print(f"error: not a gpu_check.py JSON: {exc}", file=sys.stderr)
        return 2
    if args.json:
        slim = [{k: v for k, v in r.items() if k != "profile"} for r in rows]
        print(json.dumps({"rows": slim, "ab": ab_ratios(rows), "targets": targets(rows),
                          "kernels": kernels}))
    else:
        print(markdown(rows, kernels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
