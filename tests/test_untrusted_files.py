"""Files the toolkit reads, written by someone else (issue 25): one-line errors, never a traceback or a
hang, and nothing silently accepted."""

from __future__ import annotations

import json
import os
import signal
from contextlib import contextmanager

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from scaling.cli import app
from scaling.common.errors import UserError
from scaling.common.files import MAX_NESTING, read_config, read_jsonl
from scaling.fitting.fit import FitSet
from scaling.fitting.tables import load_table

runner = CliRunner()
DEEP_JSON = "[" * 100_000 + "]" * 100_000
DEEP_TOML = "a = " + "[" * 5000 + "]" * 5000 + "\n"


@contextmanager
def deadline(seconds=30):
    """Fail (rather than hang the suite) if the body blocks, as reading a FIFO would."""
    def boom(*_):
        raise TimeoutError("blocked")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def one_line(res, pattern=""):
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and pattern in lines[0], res.stderr
    assert "Traceback" not in res.output


def table(path, n=12, **cols):
    N = np.geomspace(2e7, 2e9, n)
    D = N * np.linspace(5, 80, n)
    df = pd.DataFrame({"N": N, "D": D, "loss": 1.8 + 480 * N ** -0.35 + 2100 * D ** -0.37, **cols})
    df.to_csv(path, index=False)
    return df


@pytest.mark.parametrize("name, text", [("deep.json", DEEP_JSON), ("deep.toml", DEEP_TOML),
                                        ("nested.json", "[" * (MAX_NESTING + 1) + "]" * (MAX_NESTING + 1))])
def test_deeply_nested_documents_are_one_line_errors(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(UserError, match="nested") as exc:
        read_config(p)
    assert "\n" not in str(exc.value)


def test_deep_documents_through_the_commands(tmp_path):
    fits = tmp_path / "fits.json"
    fits.write_text(DEEP_JSON)
    one_line(runner.invoke(app, ["savings", "--fits", str(fits), "--budget", "1e21"]), "nested")
    plan = tmp_path / "plan.toml"
    plan.write_text(DEEP_TOML)
    one_line(runner.invoke(app, ["sweep", str(plan), "--dry-run"]), "nested")
    log = tmp_path / "m.jsonl"
    log.write_text('{"a": 1}\n' + '{"x": ' + "[" * 5000 + "]" * 5000 + "}\n" + '{"a": 2}\n')
    with pytest.raises(UserError, match="nested"):
        read_jsonl(log)


def test_a_corrupt_final_json_skips_that_run_only(tmp_path):
    runs = tmp_path / "runs"
    N = np.geomspace(2e7, 2e9, 10)
    for i, n in enumerate(N):
        d = n * 20
        (runs / f"r{i}").mkdir(parents=True)
        (runs / f"r{i}" / "final.json").write_text(json.dumps(
            {"points": [{"N": n, "D": d, "loss": 1.8 + 480 * n ** -0.35 + 2100 * d ** -0.37}]}))
    (runs / "bad").mkdir()
    (runs / "bad" / "final.json").write_text(DEEP_JSON)
    t = load_table(runs)
    assert len(t.points) == 10 and [s.folder for s in t.skipped] == ["bad"]
    assert "unreadable" in t.skipped[0].reason and "nested" in t.skipped[0].reason


@pytest.mark.parametrize("kind", ["fifo", "devzero"])
def test_non_regular_files_are_refused_at_once(tmp_path, kind):
    if kind == "fifo":
        path = tmp_path / "pts.csv"
        os.mkfifo(path)
    else:
        path = "/dev/zero"
        if not os.path.exists(path):
            pytest.skip("no /dev/zero")
    with deadline():
        one_line(runner.invoke(app, ["fit", str(path)]), "not a regular file")
        one_line(runner.invoke(app, ["savings", "--fits", str(path), "--budget", "1e21"]),
                 "not a regular file")
        one_line(runner.invoke(app, ["match", str(path)]), "not a regular file")
        one_line(runner.invoke(app, ["sweep", str(path), "--dry-run"]), "not a regular file")
        one_line(runner.invoke(app, ["prepare-data", str(path), "--out", str(tmp_path / "o"),
                                     "--vocab-size", "300"]), "not a regular file")


def test_silently_accepted_tables_are_refused_or_said(tmp_path):
    p = tmp_path / "t.csv"
    table(p).assign(loss=[True, False] * 6).to_csv(p, index=False)
    with pytest.raises(UserError, match="booleans"):
        load_table(p)
    df = table(p)
    pd.DataFrame({"N": df.N, "D": df.D, "loss": pd.date_range("2020-01-01", periods=12)}).to_parquet(
        tmp_path / "t.parquet") if _has_pyarrow() else None
    if _has_pyarrow():
        with pytest.raises(UserError, match="dates"):
            load_table(tmp_path / "t.parquet")
    p.write_text("N,D,loss,loss\n" + "".join(f"{a},{b},3,4\n" for a, b in zip(df.N, df.D)))
    with pytest.raises(UserError, match="names column 'loss' twice"):
        load_table(p)
    df.assign(N=df.N * 1e150, D=df.D * 1e150).to_csv(p, index=False)
    with pytest.raises(UserError, match="overflows"):
        load_table(p)
    pd.concat([df, df]).to_csv(p, index=False)
    t = load_table(p)
    assert any("every row appears twice" in n for n in t.notes)


def _has_pyarrow():
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def test_fix_constraints_that_leave_nothing_or_conflict(tmp_path):
    p = tmp_path / "t.csv"
    table(p)
    one_line(runner.invoke(app, ["fit", str(p), "--fix", "E=1", "--fix", "E=2"]), "fixed twice")
    fixes = [a for kv in ("E=1.8", "A=480", "alpha=0.35", "B=2100", "beta=0.37") for a in ("--fix", kv)]
    one_line(runner.invoke(app, ["fit", str(p), *fixes]), "nothing is left to fit")


@pytest.fixture(scope="module")
def fits_text(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fits")
    table(tmp / "t.csv")
    res = runner.invoke(app, ["fit", str(tmp / "t.csv"), "--bootstrap", "5", "--out", str(tmp / "fits.json")])
    assert res.exit_code == 0, res.output
    return (tmp / "fits.json").read_text()


@pytest.fixture()
def fits_file(tmp_path, fits_text):
    out = tmp_path / "fits.json"
    out.write_text(fits_text)
    return out


@pytest.mark.parametrize("field, value, message", [
    ("E", float("nan"), "finite"), ("alpha", -0.3, "bounds"),
    ("A", -5.0, "bounds"), ("B", 0.0, "bounds"), ("A", True, "finite number"),
    ("n_points", "12", "positive integer"), ("bootstrap", [[1, 2]], "reshape"),
    ("ci", {"E": [2, 1]}, "low"), ("diagnostics", [], "not an object"),
    ("data_summary", {"flops_per_param_k": -6}, "positive finite"),
    ("diagnostics", {"on_bound": 5}, "list of strings"),
    ("diagnostics", {"warnings": "x"}, "list of strings"),
    ("diagnostics", {"identified": "yes"}, "true or false"),
    ("diagnostics", {"bootstrap_on_bound_fraction": "all"}, "finite number"),
    ("diagnostics", {"bootstrap_on_bound_upper": -0.1}, "finite number"),
    ("diagnostics", {"identified_at_observed_share": 1}, "true or false"),
])
def test_tampered_fits_files_are_refused(fits_file, field, value, message):
    out = fits_file
    doc = json.loads(out.read_text())
    entry = doc["fits"]["default"]
    # fits files of schema version 2 hold the law's parameters under "params"
    (entry["params"] if field in entry.get("params", {}) else entry)[field] = value
    out.write_text(json.dumps(doc))
    with pytest.raises(UserError, match=message):
        FitSet.load(out)


def test_derived_values_come_from_the_parameters_not_the_file(fits_file):
    out = fits_file
    want = FitSet.load(out).get().derived
    doc = json.loads(out.read_text())
    doc["fits"]["default"]["derived"]["a"] = -5.0
    out.write_text(json.dumps(doc))
    assert FitSet.load(out).get().derived == want


def test_manifest_field_types(tmp_path):
    from scaling.training.data.shards import read_manifest

    base = {"format": "smelt-scale token shards", "format_version": 1, "dtype": "uint16", "vocab_size": 300,
            "shards": [{"path": "train-00000.bin", "split": "train", "tokens": 10, "sha256": "0" * 64},
                       {"path": "val-00000.bin", "split": "val", "tokens": 10, "sha256": "0" * 64}]}
    for key, value, message in (("vocab_size", True, "vocab_size"), ("vocab_size", "300", "vocab_size"),
                                ("bos_id", 300, "bos_id"), ("bos_id", False, "bos_id"),
                                # 2026-12-07 review: these crashed `train` (AttributeError, KeyError,
                                # TypeError) instead of a one-line error
                                ("tokenizer", "x", "tokenizer must be"),
                                ("tokenizer", {"path": 3}, "tokenizer must be"),
                                ("val_sources", "x", "val_sources must be a list"),
                                ("val_sources", [{"name": "a"}], "each of val_sources"),
                                ("val_sources", [{"name": "a", "start": 5, "stop": 2}], "each of val_"),
                                ("val_sources", [{"name": "a", "start": 0, "stop": 11}], "each of val_"),
                                ("val_bytes_per_token", "x", "val_bytes_per_token"),
                                ("val_bytes_per_token", -1.0, "val_bytes_per_token")):
        (tmp_path / "manifest.json").write_text(json.dumps({**base, key: value}))
        with pytest.raises(UserError, match=message):
            read_manifest(tmp_path)
    ok = {**base, "tokenizer": {"path": "tokenizer.json", "sha256": "0" * 64}, "val_bytes_per_token": 3.5,
          "val_sources": [{"name": "a", "start": 0, "stop": 4}, {"name": "b", "start": 4, "stop": 10}]}
    (tmp_path / "manifest.json").write_text(json.dumps(ok))
    assert read_manifest(tmp_path)[0]["val_sources"][1]["name"] == "b"
    bad = json.loads(json.dumps(base))
    bad["shards"][0]["tokens"] = True
    (tmp_path / "manifest.json").write_text(json.dumps(bad))
    with pytest.raises(UserError, match="tokens"):
        read_manifest(tmp_path)


def test_uint32_tokens_indexed_as_uint16_are_detected(tmp_path):
    from scaling.training.data.prepare import index_existing

    ids = np.random.default_rng(0).integers(1, 300, size=4096).astype("<u4")
    ids.tofile(tmp_path / "train.bin")
    ids[:1024].tofile(tmp_path / "val.bin")
    with pytest.raises(UserError, match="looks like uint32"):
        index_existing(tmp_path, "uint16", 300)
    assert index_existing(tmp_path, "uint32", 300)["dtype"] == "uint32"


def test_plan_sizes_per_budget_are_bounded():
    with deadline(60):
        one_line(runner.invoke(app, ["plan", "--law-set", "paper", "--budget", "1e20", "--runs-per-budget",
                                     "100000", "--dry-run"]), "<= 50")
