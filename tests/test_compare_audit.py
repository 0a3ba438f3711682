"""`smelt-scale compare` against the audit's planted cases: run folders nested, renamed or linked in
(the validation-data check and the length buckets must still find them), the length-bucket s.e.
(the ratio estimator of the printed token-weighted difference), length buckets of other sequences
or of left-out pairs, a t(G - 1) interval on every row, and bad per-source losses.

Every run folder here is written from scratch in tmp_path with planted losses."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import t as student_t
from typer.testing import CliRunner

from cli import app
from scaling.common.errors import UserError
from scaling.fitting.compare import compare, pair_stats
from scaling.fitting.tables import read_runs_dir

RUNS = Path(__file__).resolve().parents[1] / "runs"
runner = CliRunner()


def _write_run(root: Path, folder: str, arch: str, tier: str, seed: int, points, *, name: str | None = None,
               val: tuple | None = ("K", "T", 200, 256), extra=None) -> Path:
    """A run folder ``root/folder`` whose final.json records the run as ``name`` (default: the
    folder's last part), one point per (D, loss, flops), and a config.json with its validation data."""
    d = root / folder
    d.mkdir(parents=True, exist_ok=True)
    name = name or d.name
    pts = []
    for b, (D, loss, flops) in enumerate(points):
        p = {"run": name, "arch": arch, "tier": tier, "proxy": True, "N": 1000, "D": D, "loss": loss,
             "flops": flops, "seed": seed, "budget_index": b, "requested_tokens": float(D)}
        p.update(extra(b) if extra else {})
        pts.append(p)
    (d / "final.json").write_text(json.dumps({"run": name, "arch": arch, "tier": tier, "complete": True,
                                              "points": pts}))
    if val is not None:
        key, tok, windows, seq_len = val
        (d / "config.json").write_text(json.dumps({
            "run": name, "data": {"key": key, "tokenizer": {"sha256": tok}},
            "resolved": {"val_windows": windows}, "model": {"seq_len": seq_len}}))
    return d


def _bucket(by: str, lo: int, hi: int | None, seq_loss, seq_tokens) -> dict:
    w, s = np.asarray(seq_tokens, float), np.asarray(seq_loss, float)
    return {"by": by, "lo": lo, "hi": hi, "n_sequences": int(w.size), "n_tokens": int(w.sum()),
            "loss": float((w * s).sum() / w.sum()), "seq_loss": [float(x) for x in s],
            "seq_tokens": [int(x) for x in seq_tokens]}


def _write_lengths(run: Path, arch: str, buckets: list[dict], weights: list | None = None) -> None:
    (run / "analysis").mkdir(exist_ok=True)
    doc = {"kind": "lengths", "result": {"run": run.name, "arch": arch, "seq_len": 256, "n_documents": 2,
                                         "n_windows": 2, "buckets": buckets}}
    if weights is not None:
        doc["weights"] = weights
    (run / "analysis" / "lengths.json").write_text(json.dumps(doc))


def _compare_json(root: Path, *args: str) -> dict:
    res = runner.invoke(app, ["compare", str(root), "--json", *args])
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout)


def _valset_study(root: Path, nest: str = "", rename: str = "") -> None:
    """Two seeds of one tier; seed 0's SMELT run was evaluated on other validation data (100 held-out
    windows instead of 200), so only seed 1 may pair. Both pairs hold analysis/lengths.json."""
    for s in (0, 1):
        for arch, loss in (("baseline", 4.0), ("smelt", 3.9)):
            windows = 100 if (s == 0 and arch == "smelt") else 200
            run = _write_run(root, os.path.join(nest, f"t-{arch}-s{s}{rename}"), arch, "t", s,
                             [(100_000, loss, 1e8)], name=f"t-{arch}-s{s}",
                             val=("K", "T", windows, 256))
            _write_lengths(run, arch, [_bucket("position", 0, 64, [loss, loss], [64, 64])])


def _assert_only_seed_1_pairs(d: dict) -> None:
    assert d["overall"]["n_pairs"] == 1
    assert {(x["arch"], x["seed"]) for x in d["dropped"]} == {("baseline", 0), ("smelt", 0)}
    assert all("validation data" in x["reason"] for x in d["dropped"])
    assert [(b["tier"], b["seed"]) for b in d["by_length"]] == [("t", "1")]
    assert d["by_length"][0]["diff"] == pytest.approx(-0.1)
    assert not any("no run pair holds" in n for n in d["notes"])


# -- 1: run folders found by their own path -----------------------------------------------------------
@pytest.mark.parametrize("layout", ["flat", "nested", "renamed"])
def test_validation_check_and_length_buckets_follow_the_run_folder(tmp_path, layout):
    """Nested (runs/<sweep>/<run>) or renamed folders: final.json's run name is not where the run
    lies. Without the fix both seeds paired (2 pairs, none dropped) and no length bucket was found."""
    _valset_study(tmp_path, nest="sweepA" if layout == "nested" else "",
                  rename="-copy" if layout == "renamed" else "")
    d = _compare_json(tmp_path)
    _assert_only_seed_1_pairs(d)
    if layout == "nested":
        assert {x["run_dir"] for x in d["dropped"]} == {"sweepA/t-baseline-s0", "sweepA/t-smelt-s0"}


def test_validation_check_follows_linked_run_folders(tmp_path):
    store, root = tmp_path / "store", tmp_path / "study"
    _valset_study(store)
    root.mkdir()
    for n in sorted(os.listdir(store)):
        os.symlink(store / n, root / f"study-{n}")
    _assert_only_seed_1_pairs(_compare_json(root))


def test_read_runs_dir_keeps_the_folder_path_beside_the_recorded_name(tmp_path):
    _write_run(tmp_path, "sweepA/renamed", "baseline", "t", 0, [(1e5, 4.0, 1e8)], name="original")
    pts = read_runs_dir(tmp_path)
    assert pts["run"].tolist() == ["original"] and pts["run_dir"].tolist() == ["sweepA/renamed"]


def test_a_run_without_a_readable_config_is_named(tmp_path):
    """Its pairs are made without the validation-data check: that must be said, not silently off."""
    for s in (0, 1):
        _write_run(tmp_path, f"b{s}", "baseline", "t", s, [(1e5, 4.0, 1e8)])
        _write_run(tmp_path, f"s{s}", "smelt", "t", s, [(1e5, 3.9, 1e8)],
                   val=None if s == 0 else ("K", "T", 200, 256))   # s0: no config.json at all
    (tmp_path / "b1" / "config.json").write_text("{not json")
    d = _compare_json(tmp_path)
    note = next(n for n in d["notes"] if n.startswith("validation data not checked"))
    assert "2 runs" in note
    assert "s0 (no readable config.json" in note and "b1 (no readable config.json" in note
    shipped = _compare_json(RUNS)   # every shipped run has its config: no such note
    assert not any("validation data not checked" in n for n in shipped["notes"])


# -- 2: the length-bucket s.e. belongs to the printed difference ---------------------------------------
def _planted_lengths(rng: np.random.Generator, n: int = 40):
    w = rng.integers(2, 256, n)
    base = 4 + rng.normal(0, 1, n) / np.sqrt(w)
    smelt = base - 0.05 + rng.normal(0, 1, n) / np.sqrt(w)
    return w, base, smelt


def _lengths_study(root: Path, w, base, smelt, cand_tokens=None, cand_buckets=None) -> None:
    for s in (0, 1):
        b = _write_run(root, f"t-baseline-s{s}", "baseline", "t", s, [(1e5, 4.0, 1e8)])
        c = _write_run(root, f"t-smelt-s{s}", "smelt", "t", s, [(1e5, 3.95, 1e8)])
        _write_lengths(b, "baseline", [_bucket("length", 1, 256, base, w)])
        _write_lengths(c, "smelt", cand_buckets if cand_buckets is not None else
                       [_bucket("length", 1, 256, smelt, w if cand_tokens is None else cand_tokens)])


def test_length_bucket_se_is_the_ratio_estimator_of_the_weighted_difference(tmp_path):
    w, base, smelt = _planted_lengths(np.random.default_rng(0))
    _lengths_study(tmp_path, w, base, smelt)
    row = _compare_json(tmp_path)["by_length"][0]
    # the printed difference: token-weighted bucket losses, i.e. the token-weighted mean of d_i
    d, W = smelt - base, w.astype(float)
    m = (W * d).sum() / W.sum()
    assert row["diff"] == pytest.approx(m, abs=1e-12)
    # its s.e. (Cochran's ratio estimator), written out by hand; the old sd(d)/sqrt(n) was 0.0306
    n = d.size
    se = math.sqrt((W ** 2 * (d - m) ** 2).sum() * n / (n - 1)) / W.sum()
    assert row["se"] == pytest.approx(se, rel=1e-12)
    assert abs(row["se"] - d.std(ddof=1) / math.sqrt(n)) > 0.01


def test_weighted_paired_mean_special_cases():
    from scaling.common.stats import weighted_paired_mean

    d = np.random.default_rng(1).standard_normal(9)
    m, se = weighted_paired_mean(d, np.full(9, 3.0))   # equal weights: the plain mean and s.e.
    assert m == pytest.approx(d.mean()) and se == pytest.approx(d.std(ddof=1) / 3.0)
    assert weighted_paired_mean([0.5], [10]) == (0.5, None)
    assert weighted_paired_mean([], []) == (None, None)
    with pytest.raises(ValueError):
        weighted_paired_mean([1.0, 2.0], [1.0])


# -- 3: both sides on the same sequences ---------------------------------------------------------------
def test_length_buckets_of_other_sequences_are_left_out_and_named(tmp_path):
    rng = np.random.default_rng(0)
    w, base, smelt = _planted_lengths(rng)
    _lengths_study(tmp_path, w, base, smelt, cand_tokens=rng.integers(2, 256, w.size))
    d = _compare_json(tmp_path)
    assert d["by_length"] == []
    assert sum("evaluated on other sequences" in n for n in d["notes"]) == 2


def test_length_buckets_with_other_bucket_definitions_are_named_not_skipped(tmp_path):
    w, base, smelt = _planted_lengths(np.random.default_rng(0))
    other = [_bucket("length", 1, 128, smelt, w)]    # other edges: another context or options
    _lengths_study(tmp_path, w, base, smelt, cand_buckets=other)
    d = _compare_json(tmp_path)
    assert d["by_length"] == [] and sum("different buckets" in n for n in d["notes"]) == 2


# -- 4: only the pairs the comparison keeps ----------------------------------------------------------
def test_length_buckets_only_of_pairs_the_comparison_keeps(tmp_path):
    for s in (0, 1):
        b = _write_run(tmp_path, f"t-baseline-s{s}", "baseline", "t", s, [(1e5, 4.0, 1e8)])
        c = _write_run(tmp_path, f"t-smelt-s{s}", "smelt", "t", s, [(1e5, 3.9, 1e8)],
                       val=("K", "T", 100 if s == 0 else 200, 256))   # seed 0: other validation data
        _write_lengths(b, "baseline", [_bucket("position", 0, 64, [4.0, 4.0], [64, 64])])
        loss = 3.0 if s == 0 else 3.9
        _write_lengths(c, "smelt", [_bucket("position", 0, 64, [loss, loss], [64, 64])])
    d = _compare_json(tmp_path)
    assert [(b["seed"], round(b["diff"], 6)) for b in d["by_length"]] == [("1", -0.1)]
    assert any("length buckets left out" in n and "t seed 0" in n for n in d["notes"])


# -- 4b: only analyses of the runs' present weights ---------------------------------------------------
def _weights_pair(root: Path) -> dict[str, Path]:
    """One run pair with final weights (any bytes: only their hash matters) and analysis/lengths.json
    recording the hash of the weights it was computed on, as `analyze lengths` saves it."""
    runs = {}
    for arch, loss in (("baseline", 4.0), ("smelt", 3.9)):
        run = _write_run(root, f"t-{arch}-s0", arch, "t", 0, [(1e5, loss, 1e8)])
        (run / "final_weights.safetensors").write_bytes(f"weights of {arch}".encode())
        sha = hashlib.sha256((run / "final_weights.safetensors").read_bytes()).hexdigest()
        _write_lengths(run, arch, [_bucket("position", 0, 64, [loss, loss], [64, 64])],
                       weights=[{"run": run.name, "file": "final_weights.safetensors", "sha256": sha}])
        runs[arch] = run
    return runs


def test_length_buckets_of_weights_changed_since_are_left_out(tmp_path):
    """A run extended to a larger budget (or retrained) after `analyze lengths`: its lengths.json is of
    older weights than its final point's. Without the check the pair's stale buckets were printed as
    the final weights' difference."""
    runs = _weights_pair(tmp_path)
    d = _compare_json(tmp_path)
    assert [round(b["diff"], 6) for b in d["by_length"]] == [-0.1]
    assert not any("weights" in n for n in d["notes"])
    (runs["smelt"] / "final_weights.safetensors").write_bytes(b"weights after more training")
    d = _compare_json(tmp_path)
    assert d["by_length"] == []
    assert any("t seed 0 left out" in n and "smelt run's analysis/lengths.json is not of its present "
               "weights" in n for n in d["notes"])
    # a run shipped without its weights cannot be checked: its analysis is taken as it is
    (runs["smelt"] / "final_weights.safetensors").unlink()
    assert [round(b["diff"], 6) for b in _compare_json(tmp_path)["by_length"]] == [-0.1]


def test_length_buckets_saved_without_a_hash_are_kept_and_said(tmp_path):
    runs = _weights_pair(tmp_path)
    _write_lengths(runs["baseline"], "baseline", [_bucket("position", 0, 64, [4.0, 4.0], [64, 64])])
    d = _compare_json(tmp_path)
    assert [round(b["diff"], 6) for b in d["by_length"]] == [-0.1]
    assert any("baseline run's analysis/lengths.json records no weights hash" in n for n in d["notes"])


# -- 5: a t(G - 1) interval on every row ---------------------------------------------------------------
def test_every_row_has_a_t_interval_from_its_clusters():
    rng = np.random.default_rng(2)
    pairs = pd.DataFrame({"tier": np.repeat(["a", "b", "c"], 4), "seed": np.tile([0, 1], 6),
                          "budget_index": np.tile([0, 0, 1, 1], 3), "diff": rng.normal(-0.1, 0.05, 12)})
    s = pair_stats(pairs, "x", "run")            # 6 (tier, seed) clusters: df 5
    q = student_t.ppf(0.975, 5)
    assert (s.n_clusters, s.df) == (6, 5)
    assert (s.ci_lo, s.ci_hi) == pytest.approx((s.mean - q * s.se, s.mean + q * s.se))
    assert not s.few_clusters
    two = pair_stats(pairs[pairs["tier"] == "a"], "a", "run")     # 2 clusters: t(1) = 12.71
    assert two.df == 1 and two.few_clusters
    assert two.ci_hi - two.ci_lo == pytest.approx(2 * student_t.ppf(0.975, 1) * two.se)
    one = pair_stats(pairs[(pairs["tier"] == "a") & (pairs["seed"] == 0)], "a0", "run")
    assert one.se is None and (one.df, one.ci_lo, one.ci_hi) == (None, None, None)
    d = one.to_dict()
    assert {"df", "ci_level", "ci_lo", "ci_hi", "few_clusters"} <= set(d) and d["ci_level"] == 0.95


def test_shipped_tier_rows_carry_their_few_cluster_intervals(tmp_path):
    # seeds 0-2 of the shipped study, d_model 4 at seed 0 alone: 3 seeds per tier but one at d_model 4
    for run in RUNS.iterdir():
        seed = int(run.name.rsplit("-s", 1)[1]) if run.is_dir() else 99
        if seed <= 2 and not (run.name.startswith("iso-d04-") and seed > 0):
            (tmp_path / run.name).symlink_to(run, target_is_directory=True)
    d = _compare_json(tmp_path)
    d28 = next(r for r in d["by_tier"] if r["label"] == "iso-d28")
    # +0.044 +- 0.129 from 3 clusters: t(2) makes the interval [-0.510, +0.599], across zero
    assert d28["n_clusters"] == 3 and d28["df"] == 2 and d28["few_clusters"]
    assert (round(d28["ci_lo"], 3), round(d28["ci_hi"], 3)) == (-0.510, 0.599)
    d04 = next(r for r in d["by_tier"] if r["label"] == "iso-d04")
    assert d04["ci_lo"] is None and d04["df"] is None
    assert any("few clusters" in n and "iso-d28 (3)" in n for n in d["notes"])
    assert any("fewer than 2 clusters" in n and "iso-d04" in n for n in d["notes"])
    o = d["overall"]
    assert o["df"] == 24 and not o["few_clusters"] and o["ci_lo"] < o["mean"] < o["ci_hi"]
    table = runner.invoke(app, ["compare", str(tmp_path)]).stdout
    assert "df 2*" in table and "fewer than 5 clusters" in table
    # the whole study: the 7-seed tiers have 7 clusters, d_model 4 and 80 (5 seeds) 5, none flagged
    full = _compare_json(RUNS)
    tiers = {r["label"]: (r["n_clusters"], r["df"], r["few_clusters"]) for r in full["by_tier"]}
    assert {k for k, v in tiers.items() if v == (5, 4, False)} == {"iso-d04", "iso-d80"}
    assert {v for k, v in tiers.items() if k not in ("iso-d04", "iso-d80")} == {(7, 6, False)}
    assert not any("few clusters" in n and "iso-d04" in n for n in full["notes"])


# -- 6, 7: per-source losses ---------------------------------------------------------------------------
def _source_study(root: Path, ref_source, cand_source) -> None:
    for s in (0, 1):
        _write_run(root, f"b{s}", "baseline", "t", s, [(1e5, 4.0, 1e8), (2e5, 3.9, 2e8)],
                   extra=None if ref_source is None else lambda b: {"val_loss/code": ref_source})
        _write_run(root, f"s{s}", "smelt", "t", s, [(1e5, 3.9, 1e8), (2e5, 3.8, 2e8)],
                   extra=None if cand_source is None else lambda b: {"val_loss/code": cand_source})


def test_a_non_numeric_source_loss_is_named_never_a_traceback(tmp_path):
    _source_study(tmp_path, "abc", 3.0)
    res = runner.invoke(app, ["compare", str(tmp_path), "--json"])
    assert res.exit_code == 2 and "Traceback" not in res.stderr
    assert "b0: unreadable final.json (val_loss/code 'abc' is not a number)" in res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith("error:")


@pytest.mark.parametrize("reference_side", ["absent", "null"])
def test_a_source_without_pairs_is_left_out_with_a_note(tmp_path, reference_side):
    _source_study(tmp_path, None, 3.0)      # logged by the candidate only
    if reference_side == "null":   # logged as null on the reference side
        for s in (0, 1):
            f = tmp_path / f"b{s}" / "final.json"
            doc = json.loads(f.read_text())
            for p in doc["points"]:
                p["val_loss/code"] = None
            f.write_text(json.dumps(doc))
    d = _compare_json(tmp_path)
    assert d["by_source"] == {}
    assert any("source code: no pair" in n for n in d["notes"])
    out = runner.invoke(app, ["compare", str(tmp_path)]).stdout
    assert "nan" not in out


def test_a_source_on_some_pairs_says_how_many(tmp_path):
    _source_study(tmp_path, 3.1, 3.0)
    f = tmp_path / "b0" / "final.json"
    doc = json.loads(f.read_text())
    doc["points"][0]["val_loss/code"] = None
    f.write_text(json.dumps(doc))
    res = compare(read_runs_dir(tmp_path))
    assert res.by_source["code"].n_pairs == 3 and res.by_source["code"].mean == pytest.approx(-0.1)
    assert any("only 3 of 4 pairs" in n for n in res.notes)


# -- plans/lr_rule_gap.py: two trainings of one design, the gain's change between lr rules ---------------
def test_lr_rule_gap_recovers_a_planted_change_of_the_gain(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("lr_rule_gap", Path(__file__).resolve().parents[1]
                                                  / "plans" / "lr_rule_gap.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rng = np.random.default_rng(4)
    budgets = [(100_352, 1e11), (200_704, 2e11)]
    for tier in ("t1", "t2", "t3"):
        for seed in range(4):
            luck = rng.normal(0, 0.2)            # a seed's luck, shared by both lr rules
            for folder, gain in (("a", -0.15), ("b", -0.05)):
                base = [(D, 5.0 + luck + rng.normal(0, 0.01), C) for D, C in budgets]
                _write_run(tmp_path / folder, f"{tier}-baseline-s{seed}", "baseline", tier, seed, base)
                _write_run(tmp_path / folder, f"{tier}-smelt-s{seed}", "smelt", tier, seed,
                           [(D, L + gain + rng.normal(0, 0.02), C) for D, L, C in base])
    # B holds one more cell than A: left out, and counted
    _write_run(tmp_path / "b", "t4-baseline-s0", "baseline", "t4", 0, [(100_352, 5.0, 1e11)])
    _write_run(tmp_path / "b", "t4-smelt-s0", "smelt", "t4", 0, [(100_352, 4.9, 1e11)])
    res = mod.lr_rule_gap(tmp_path / "a", tmp_path / "b")
    assert (res["cells"], res["cells_only_a"], res["cells_only_b"]) == (24, 0, 1)
    assert res["diff_a"]["mean"] == pytest.approx(-0.15, abs=0.02)
    assert res["diff_b"]["mean"] == pytest.approx(-0.05, abs=0.02)
    dd = res["dd"]
    assert dd["mean"] == pytest.approx(-0.10, abs=0.02) and dd["n_clusters"] == 12 and dd["df"] == 11
    assert dd["ci"][0] < -0.10 < dd["ci"][1] and dd["ci"][1] < 0
    _write_run(tmp_path / "c", "t9-baseline-s0", "baseline", "t9", 0, [(100_352, 5.0, 1e11)])
    _write_run(tmp_path / "c", "t9-smelt-s0", "smelt", "t9", 0, [(100_352, 4.9, 1e11)])
    with pytest.raises(UserError, match="share no"):
        mod.lr_rule_gap(tmp_path / "a", tmp_path / "c")
    # A retrains only the twins (B's Baseline lr): its pairs borrow B's Baselines, and the one Baseline
    # A trained anyway is checked against B's (equal here)
    for tier in ("t1", "t2", "t3"):
        for seed in range(4):
            src = tmp_path / "b" / f"{tier}-smelt-s{seed}" / "final.json"
            pts = [(p["D"], p["loss"] - 0.10, p["flops"]) for p in json.loads(src.read_text())["points"]]
            _write_run(tmp_path / "s", f"{tier}-smelt-s{seed}", "smelt", tier, seed, pts)
    shutil.copytree(tmp_path / "b" / "t1-baseline-s0", tmp_path / "s" / "t1-baseline-s0")
    res = mod.lr_rule_gap(tmp_path / "s", tmp_path / "b", baseline_from_b=True)
    assert (res["cells"], res["cells_only_a"], res["cells_only_b"]) == (24, 0, 1)
    assert res["dd"]["mean"] == pytest.approx(-0.10, abs=1e-9) and res["dd"]["se"] < 1e-9
    assert res["baseline_check"] == {"cells": 2, "max_abs_diff": 0.0}
    assert mod.lr_rule_gap(tmp_path / "s", tmp_path / "b")["cells"] == 2   # without: A's own pairs only
