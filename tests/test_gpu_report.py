"""benchmarks/gpu_report.py: the one reader of gpu_check's JSON, the A/B ratios and issue 31's
targets, on the shipped H200 measurements and on a planted run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def test_the_h200_measurements_of_2026_12_04(bench):
    rep = bench("gpu_report")
    rows = rep.read_results(RESULTS / "gpu-h200-2026-12-04a.json", RESULTS / "gpu-h200-2026-12-04b.json")
    assert len(rows) == 8 and {r["layout"] for r in rows} == {"fsdp"}      # what ran then
    assert {r["head_padding"] for r in rows} == {"never"} and {r["loop_grad"] for r in rows} == {"fsdp"}
    mb16 = {r["arch"]: r for r in rows if r["config"] == "mb16-compiled"}
    assert mb16["baseline"]["tokens_per_s"] == pytest.approx(177600, rel=1e-3)
    assert rep._attention(mb16["baseline"]) == "cuDNN" and rep._attention(mb16["smelt"]) == "FA2"
    (ab_b, ab_s) = rep.ab_ratios(rows)
    assert (ab_b["arch"], ab_s["arch"]) == ("baseline", "smelt")
    assert ab_b["ratio"] == pytest.approx(177600 / 141875, rel=1e-3)
    t = {(x["file"], x["config"]): x for x in rep.targets(rows)}
    best = t[("gpu-h200-2026-12-04a.json", "mb16-compiled")]
    assert not best["target_config"] and not best["mfu_baseline_met"] and not best["mfu_smelt_met"]
    assert best["smelt_over_baseline"] == pytest.approx(0.736, abs=1e-3) and not best["speed_met"]


def _arch(arch, config, tps, mfu, **kw):
    return {"arch": arch, "config": config, "tokens_per_s": tps, "mfu": mfu, "micro_batch_size": 8,
            "grad_accum_steps": 1, "compile": False, "peak_memory_gb": 70.0, "planned_memory_gb": 72.0,
            "sync_check": {"sync_free": True}, **kw}


def test_a_planted_issue31_run(tmp_path, capsys, bench):
    """The preset's configurations with planted speeds: the ratios and the verdicts are those planted."""
    rep = bench("gpu_report")
    configs = [
        ("mb16x4-compiled-unwrapped", [_arch("baseline", "x", 330000, 0.36, layout="none"),
                                        _arch("smelt", "x", 290000, 0.31, layout="none")]),
        ("mb8", [_arch("baseline", "x", 100000, 0.11), _arch("smelt", "x", 80000, 0.09)]),
        ("mb8-unwrapped", [_arch("baseline", "x", 120000, 0.13, layout="none"),
                           {"arch": "smelt", "error": "OutOfMemoryError"}]),
        ("mb8-nopad", [_arch("smelt", "x", 72000, 0.08, head_padding="never")]),
    ]
    doc = {"partial": True, "tier": "100M", "torch": "2.11", "world": 1,
           "configs": [{"name": n, "archs": a} for n, a in configs]}
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(doc))
    rows = rep.read_results(path)
    assert len(rows) == 6 and [r["layout"] for r in rows][:2] == ["none", "none"]
    ab = {(a["config"], a["arch"]): a["ratio"] for a in rep.ab_ratios(rows)}
    assert ab == {("mb8-unwrapped", "baseline"): pytest.approx(1.2),
                  ("mb8-nopad", "smelt"): pytest.approx(0.9)}
    (t,) = rep.targets(rows)                       # only the target configuration is judged
    assert t["config"] == "mb16x4-compiled-unwrapped" and t["target_config"]
    assert t["mfu_baseline_met"] and t["mfu_smelt_met"]
    assert t["smelt_over_baseline"] == pytest.approx(290 / 330) and not t["speed_met"]
    assert rep.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "| 0.88 (not met) |" in out and "0.360 (met)" in out
    assert rep.main([str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["targets"][0]["speed_met"] is False


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, bench):
    rep = bench("gpu_report")
    assert rep.main([str(tmp_path / "absent.json")]) == 2
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert rep.main([str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(e.startswith("error: ") for e in err)


def test_the_kernel_check_table_reads_what_gpu_check_kernels_writes(tmp_path, capsys, bench):
    """The ``kernels`` block as gpu_check_kernels.py writes it (its CPU run): one row per
    architecture, the times and the verdict carried over; the old files have no such block."""
    import argparse

    block = bench("gpu_check_kernels").run_checks(argparse.Namespace(device="cpu"))
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"configs": [], "kernels": block}))
    rep = bench("gpu_report")
    rows = rep.kernel_checks(path)
    assert [r["arch"] for r in rows] == ["baseline", "smelt"] and all(r["ok"] for r in rows)
    assert rows[1]["router_ms"] == block["smelt"]["router"]["ms_fwd_bwd"]
    assert rows[0]["dispatch_ms_gather_first"] == block["baseline"]["dispatch"]["ms_fwd_bwd_gather_first"]
    assert rep.main([str(path)]) == 0
    assert "| kernel check (N = 8 x 4096) |" in capsys.readouterr().out
    assert rep.kernel_checks(RESULTS / "gpu-h200-2026-12-04a.json") == []
