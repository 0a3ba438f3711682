"""Reading points: runs directories and tables, canonical columns, one-line validation errors."""

import json

import numpy as np
import pandas as pd
import pytest

from scaling.common.errors import UserError
from scaling.fitting import tables
from scaling.fitting.tables import (
    CANONICAL,
    Columns,
    canonicalize,
    law_inputs,
    load_points,
    token_cost,
    total_flops,
)


def point(run, N, D, loss, arch="baseline", **extra):
    return {"run": run, "arch": arch, "tier": "proxy-xs", "N": N, "D": D, "loss": loss, "flops": 6.5 * N * D,
            "flops_per_token": 6.5 * N, "sparsity": 0.5, "non_embedding_params": 4 * N, "total_params": 5 * N,
            **extra}


def write_run(root, name, final=None, config=True):
    d = root / name
    d.mkdir(parents=True)
    if config:
        (d / "config.json").write_text(json.dumps({"tier": "proxy-xs"}))
    if final is not None:
        (d / "final.json").write_text(final if isinstance(final, str) else json.dumps(final))
    return d


def test_runs_directory_points_unfinished_and_corrupt(tmp_path):
    write_run(tmp_path, "b1", {"run": "b1", "arch": "baseline", "tier": "proxy-xs", "complete": True,
                               "points": [point("b1", 1e6, 1e7, 4.0), point("b1", 1e6, 2e7, 3.8)]})
    write_run(tmp_path, "s1", point("s1", 2e6, 1e7, 3.9, arch="smelt"))           # single point object
    write_run(tmp_path, "pending")                                                  # no final.json yet
    write_run(tmp_path, "broken", "{not json")
    write_run(tmp_path, "badpoints", {"run": "x", "points": "nope"})
    warnings = []
    df = load_points(tmp_path, warn=warnings.append)
    assert list(df.columns) == list(CANONICAL)
    assert len(df) == 3
    assert sorted(df["group"].unique()) == ["baseline", "smelt"]     # the arch column groups by default
    assert df.loc[df["run"] == "b1", "D"].tolist() == [1e7, 2e7]
    assert df["flops"].tolist()[0] == pytest.approx(6.5e13)
    assert len(warnings) == 3                                       # every skipped run, with its reason
    assert any("broken" in w and "unreadable" in w for w in warnings)
    assert any("badpoints" in w for w in warnings)
    assert any("pending" in w and "no final.json" in w for w in warnings)


def test_runs_directory_without_finished_runs_is_an_error(tmp_path):
    write_run(tmp_path, "a")
    write_run(tmp_path, "b")
    with pytest.raises(UserError, match="no finished runs.*2 unfinished"):
        load_points(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match="no finished runs"):
        load_points(empty)


def test_csv_with_compute_column_derives_tokens(tmp_path):
    p = tmp_path / "t.csv"
    pd.DataFrame({"Model Size": [1e8, 2e8, 4e8], "Training FLOP": [6e18, 1.2e19, 4.8e19],
                  "loss": [3.0, 2.9, 2.8]}).to_csv(p, index=False)
    df = load_points(p, Columns(n="Model Size", c="Training FLOP"))
    np.testing.assert_allclose(df["D"], [1e10, 1e10, 2e10])      # D = C / (6 N)
    np.testing.assert_allclose(df["flops"], [6e18, 1.2e19, 4.8e19])
    assert (df["group"] == "default").all() and df["run"].nunique() == 3
    assert token_cost(df).k == pytest.approx(6.0)


def test_jsonl_keeps_timestamp_like_fields_numeric_and_names_bad_lines(tmp_path):
    p = tmp_path / "t.jsonl"
    rows = [{"N": 1e6 * (i + 1), "D": 1e8, "loss": 3.0 - 0.1 * i, "time": 1700000000 + i, "grp": "x"}
            for i in range(3)]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    df = load_points(p, Columns(group="grp"))
    assert df["N"].dtype == float and (df["group"] == "x").all()
    p.write_text(json.dumps(rows[0]) + "\n{oops\n")
    with pytest.raises(UserError, match=r"t.jsonl:2"):
        load_points(p)


def test_json_table_forms(tmp_path):
    pts = [point("r1", 1e6, 1e7, 4.0), point("r2", 2e6, 1e7, 3.9)]
    for obj in (pts, {"points": pts}):
        p = tmp_path / "t.json"
        p.write_text(json.dumps(obj))
        assert len(load_points(p)) == 2


def test_parquet_needs_pyarrow(tmp_path):
    p = tmp_path / "t.parquet"
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        p.write_bytes(b"PAR1")
        with pytest.raises(UserError, match=r"smelt-scale\[parquet\]"):
            load_points(p)
    else:
        pd.DataFrame({"N": [1e6, 2e6], "D": [1e8, 1e8], "loss": [3.0, 2.9]}).to_parquet(p)
        assert len(load_points(p)) == 2


@pytest.mark.parametrize("table, cols, message", [
    ({"N": [1e6], "loss": [3.0]}, Columns(), "no token column 'D'.*compute C to derive D"),
    ({"D": [1e6], "loss": [3.0]}, Columns(), "no parameter column 'N'"),
    ({"N": [1e6], "D": [1e8], "loss": [3.0]}, Columns(group="arch"), "no group column 'arch'"),
    ({"N": [1e6], "D": [1e8], "loss": [3.0]}, Columns(run="id"), "no run column 'id'"),
    ({"N": [1e6], "D": [1e8], "loss": [3.0]}, Columns(c="C"), "no compute column 'C'"),
    ({"N": [1e6, "abc"], "D": [1e8, 1e8], "loss": [3.0, 2.9]}, Columns(),
     "'N' has a value that is not a finite number: row 2 reads 'abc'"),
    ({"N": [1e6, 2e6], "D": [1e8, 1e8], "loss": [3.0, "n/a"]}, Columns(),
     "'loss' has a value that is not a finite number: row 2 reads 'n/a'"),
    ({"N": [1e6, np.nan], "D": [1e8, 1e8], "loss": [3.0, 2.9]}, Columns(),
     "N is missing .* in 1 rows .*row 2"),
    ({"N": [1e6, 2e6], "D": [1e8, np.inf], "loss": [3.0, 2.9]}, Columns(),
     "'D' has a value that is not a finite number"),
    ({"N": [1e6, 2e6], "D": [1e8, 1e8], "loss": [3.0, 2.9]}, Columns(n="N:X"), "unknown unit 'X'"),
    ({"N": [1e6, 2e6], "D": [1e8, 1e8], "loss": [3.0, 2.9]}, Columns(where=("nope > 1",)),
     "the row filter .nope > 1. names no column"),
    ({"N": [1e6, 2e6], "D": [1e8, 1e8], "loss": [3.0, 2.9]}, Columns(where=("N > 1e9",)),
     "no rows left after the row filters"),
    ({"N": [1e6, 2e6], "D": [1e8, 1e8], "loss": [3.0, -1.0]}, Columns(), "loss must be > 0.*row 2"),
    ({"N": [0.0, 2e6], "D": [1e8, 1e8], "loss": [3.0, 2.0]}, Columns(), "N must be > 0"),
])
def test_validation_errors_are_one_line(tmp_path, table, cols, message):
    p = tmp_path / "t.csv"
    pd.DataFrame(table).to_csv(p, index=False)
    with pytest.raises(UserError, match=message) as exc:
        load_points(p, cols)
    assert "\n" not in str(exc.value)


def test_unknown_format_and_missing_path(tmp_path):
    p = tmp_path / "t.xlsx"
    p.write_text("x")
    with pytest.raises(UserError, match="unknown table format"):
        load_points(p)
    with pytest.raises(UserError, match="no such file"):
        load_points(tmp_path / "nope.csv")


def test_law_inputs_checks_sparsity_and_flops(tmp_path):
    p = tmp_path / "t.csv"
    base = {"N": [1e6, 2e6], "D": [1e8, 1e8], "loss": [3.0, 2.9], "flops_per_token": [6e6, 1.2e7]}
    pd.DataFrame(base).to_csv(p, index=False)
    df = load_points(p)
    with pytest.raises(UserError, match="needs sparsity.*sparsity column"):
        law_inputs(df, ("F", "S", "D"))
    pd.DataFrame({**base, "S": [0.5, 1.0]}).to_csv(p, index=False)
    with pytest.raises(UserError, match=r"sparsity must lie in \[0, 1\)"):
        law_inputs(load_points(p, Columns(sparsity="S")), ("F", "S", "D"))
    pd.DataFrame({**base, "S": [0.5, 0.9]}).to_csv(p, index=False)
    X = law_inputs(load_points(p, Columns(sparsity="S")), ("F", "S", "D"))
    np.testing.assert_allclose(X["S"], [0.5, 0.9])
    pd.DataFrame({k: v for k, v in base.items() if k != "flops_per_token"} | {"sparsity": [0.1, 0.2]}).to_csv(
        p, index=False)
    with pytest.raises(UserError, match="needs flops_per_token.*FLOPs-per-token column"):
        law_inputs(load_points(p), ("F", "S", "D"))


def test_total_flops_fallbacks():
    df = pd.DataFrame({"N": [1e6, 1e6, 1e6], "D": [1e8, 1e8, 1e8], "flops": [7e14, np.nan, np.nan],
                       "flops_per_token": [np.nan, 8e6, np.nan]})
    np.testing.assert_allclose(total_flops(df), [7e14, 8e14, 6e14])
    assert token_cost(df).k == pytest.approx(7.5)  # one size: the median of F/N over F = 7e6 and 8e6


# -- issue 18 traps: units, derived columns, guessed columns, filters, runs -----------------------
def law_table(n=40, seed=0):
    """A synthetic table from a known chinchilla law (N, D, C = 6ND, loss)."""
    rng = np.random.default_rng(seed)
    N = np.geomspace(2e7, 2e9, n)
    D = N * rng.uniform(5, 80, n)
    L = 1.8 + 480 * N ** -0.35 + 2100 * D ** -0.37
    return pd.DataFrame({"N": N, "D": D, "C": 6 * N * D, "loss": L})


def test_units_give_identical_points(tmp_path):
    t = law_table()
    ref = load_points_df(t, tmp_path, Columns())
    scaled = t.assign(params=t["N"] / 1e6, tokens=t["D"] / 1e9)
    for n, d in (("params:M", "tokens:B"), ("params:1e6", "tokens:G"), ("params:m", "tokens:b")):
        got = load_points_df(scaled, tmp_path, Columns(n=n, d=d))
        np.testing.assert_allclose(got[["N", "D", "loss"]], ref[["N", "D", "loss"]], rtol=1e-12)
    # the same table without units is implausible, and says so
    table = load_table_df(scaled, tmp_path, Columns(n="params", d="tokens"))
    assert any("implausible parameter counts" in m for m in table.notes)
    assert not load_table_df(t, tmp_path, Columns()).notes


def test_derive_n_or_d_from_compute(tmp_path):
    t = law_table()
    got = load_table_df(t.drop(columns=["N"]), tmp_path, Columns(c="C"))
    np.testing.assert_allclose(got.points["N"], t["N"], rtol=1e-12)
    assert got.mapping["N"] == "derived: C / (6 D)" and not got.notes
    got = load_points_df(t.drop(columns=["D"]), tmp_path, Columns(c="C"))
    np.testing.assert_allclose(got["D"], t["D"], rtol=1e-12)
    # another k: C = 8 N D
    t8 = t.assign(C=8 * t["N"] * t["D"]).drop(columns=["N"])
    got = load_points_df(t8, tmp_path, Columns(c="C", flops_per_nd=8))
    np.testing.assert_allclose(got["N"], t["N"], rtol=1e-12)
    assert token_cost(got).k == pytest.approx(8.0)
    # without a compute column k still sets the recorded compute (and so the fitter's k)
    got = load_points_df(t.drop(columns=["C"]), tmp_path, Columns(flops_per_nd=7))
    assert token_cost(got).k == pytest.approx(7.0)
    with pytest.raises(UserError, match="must be > 0"):
        load_points_df(t, tmp_path, Columns(flops_per_nd=0))


def test_per_token_flops_column_is_not_taken_as_compute(tmp_path):
    t = law_table().drop(columns=["C"])
    per_token = t.assign(flops=6 * t["N"])                     # FLOPs per token, named "flops"
    table = load_table_df(per_token, tmp_path, Columns())
    assert table.points["flops"].isna().all() and "C" not in table.mapping
    assert any("'flops' is not total training compute" in m for m in table.notes)
    total = t.assign(flops=6 * t["N"] * t["D"])                # a real total-compute column is guessed
    table = load_table_df(total, tmp_path, Columns())
    assert "guessed" in table.mapping["C"]
    table = load_table_df(total, tmp_path, Columns(c="none"))  # and the guess can be switched off
    assert table.points["flops"].isna().all()


def test_group_and_run_guesses_reported_and_switchable(tmp_path):
    t = law_table().assign(arch=["a", "b"] * 20, run=[f"r{i // 2}" for i in range(40)])
    table = load_table_df(t, tmp_path, Columns())
    assert "guessed" in table.mapping["group"] and table.points["group"].nunique() == 2
    assert "guessed" in table.mapping["run"] and table.points["run"].nunique() == 20
    table = load_table_df(t, tmp_path, Columns(group="none", run="none"))
    assert (table.points["group"] == "default").all()
    assert table.points["run"].nunique() == 40 and "independent" in table.mapping["run"]


def test_where_filters_like_pandas_and_keeps_file_row_numbers(tmp_path):
    t = law_table()
    expr = ("loss < 3.1 or D > 1e11", "N > 3e7")
    got = load_table_df(t, tmp_path, Columns(where=expr))
    want = t.query(expr[0]).query(expr[1])
    np.testing.assert_allclose(got.points["N"], want["N"])
    assert got.rows_read == 40 and got.rows_kept == len(want) and got.settings["where"] == list(expr)
    bad = t.astype({"loss": object})
    bad.loc[30, "loss"] = "n/a"
    with pytest.raises(UserError, match="row 31 reads 'n/a'"):
        load_points_df(bad, tmp_path, Columns(where=("N > 3e7",)))


def load_table_df(df, tmp_path, cols):
    from scaling.fitting.tables import load_table

    p = tmp_path / "t.csv"
    df.to_csv(p, index=False)
    return load_table(p, cols)


def load_points_df(df, tmp_path, cols):
    return load_table_df(df, tmp_path, cols).points


def test_point_is_the_seam_of_trainer_and_fitter():
    """Issue 30: the final.json points of the shipped runs are Point records (same keys, same order),
    the fitter's default columns are Point fields, and a Point's dict is what final.json holds."""
    import dataclasses
    from pathlib import Path

    from scaling.common.run_folder import FINAL, Point
    from scaling.fitting.tables import DEFAULT_D, DEFAULT_N, GUESS_C, GUESS_GROUP, GUESS_RUN, Columns

    names = [f.name for f in dataclasses.fields(Point)]
    assert len(names) == 19
    cols = Columns()
    assert {DEFAULT_N, DEFAULT_D, cols.loss, cols.flops_per_token, cols.sparsity, GUESS_C, GUESS_GROUP,
            GUESS_RUN} <= set(names)
    root = Path(__file__).resolve().parents[1]
    finals = sorted(root.glob(f"runs*/**/{FINAL}"))
    assert finals
    for f in finals:
        for p in json.loads(f.read_text())["points"]:
            assert list(p) == names, f
            assert Point.from_dict(p).to_dict() == p
    with pytest.raises(KeyError):
        Point.key("params")


def test_a_named_size_or_token_column_must_exist_not_be_derived():
    """--n-col nope once derived N = C/(6 D) silently; a named column that is absent is an error,
    the default N/D is still derived from the compute when the table has none."""
    raw = pd.DataFrame({"D": [1e8, 2e8], "flops": [6e14, 2.4e15], "loss": [3.0, 2.9]})
    with pytest.raises(UserError, match="no parameter column 'nope'"):
        canonicalize(raw, Columns(n="nope"))
    with pytest.raises(UserError, match="no token column 'tokens'"):
        canonicalize(raw.rename(columns={"D": "N"}).assign(N=[1e6, 2e6]), Columns(d="tokens"))
    assert canonicalize(raw, Columns())["N"].tolist() == pytest.approx([1e6, 2e6])


def test_runs_linked_into_a_study_folder_are_read_once(tmp_path):
    """Run folders linked in from elsewhere are runs of the study (once missed without a word: a
    whole architecture vanished from a fit); a link cycle is walked once."""
    from pathlib import Path

    from scaling.fitting.tables import read_runs_dir

    shipped = Path(__file__).resolve().parents[1] / "runs"
    study = tmp_path / "study"
    study.mkdir()
    for run in sorted(shipped.glob("iso-d04-*")):
        (study / run.name).symlink_to(run)
    (study / "again").symlink_to(study)
    df = read_runs_dir(study)
    assert sorted(df["arch"].unique()) == ["baseline", "smelt"]
    assert len(df) == sum(len(json.loads((r / "final.json").read_text())["points"])
                          for r in shipped.glob("iso-d04-*"))


def test_seed_is_read_as_a_label_and_can_be_switched_off(tmp_path):
    pts = [point("b1", 1e6, 1e7, 4.0, seed=3), point("b1", 1e6, 2e7, 3.8, seed=3)]
    write_run(tmp_path, "b1", {"run": "b1", "arch": "baseline", "tier": "proxy-xs", "complete": True,
                               "points": pts})
    write_run(tmp_path, "s1", point("s1", 2e6, 1e7, 3.9, arch="smelt"))          # an older point: no seed
    table = tables.load_table(tmp_path)
    assert table.points["seed"].tolist() == ["3", "3", ""] and table.mapping["seed"] == "'seed'"
    t = law_table().assign(seed=["a", None] * 20)                               # any label; empty is unknown
    assert load_points_df(t, tmp_path, Columns())["seed"].tolist() == ["a", ""] * 20
    off = load_table_df(t, tmp_path, Columns(seed="none"))
    assert (off.points["seed"] == "").all() and "seed" not in off.mapping
    assert (load_points_df(law_table(), tmp_path, Columns())["seed"] == "").all()


def test_seed_replicates_edge_cases(tmp_path):
    base = {"group": "g", "N": 1e6, "D": 1e8}
    pts = lambda rows: pd.DataFrame([{**base, **r} for r in rows])   # noqa: E731
    # 64-bit seeds one apart are two seeds, not a repeat
    seeds = [1234567890123456, 1234567890123457]
    big = load_points_df(pd.DataFrame({"N": [1e6, 1e6], "D": [1e8, 1e8], "loss": [3.0, 3.1],
                                       "run": ["a", "b"], "seed": seeds}), tmp_path, Columns())
    assert big["seed"].tolist() == ["1234567890123456", "1234567890123457"]
    assert tables.seed_replicates(big, tables.config_keys(big), unknown_together=False).tolist() == [0, 0]
    # run a holds seeds 1 and 2, run b seed 2: seed 2 repeats, so the runs stay apart
    two = pts([{"run": "a", "seed": "1"}, {"run": "a", "seed": "2"}, {"run": "b", "seed": "2"}])
    labels = tables.seed_replicates(two, tables.config_keys(two), unknown_together=True)
    assert labels[0] == labels[1] != labels[2]
    # a missing run or group cell is a label of its own, never dropped (NaN labels)
    gap = pts([{"run": "a", "seed": "1"}, {"run": np.nan, "seed": "1"},
               {"run": "c", "seed": "2", "group": None}])
    labels = tables.seed_replicates(gap, tables.config_keys(gap), unknown_together=True)
    assert labels.dtype.kind == "i" and labels[0] != labels[1]
    # numbers a few ulps apart are one configuration; a subnormal or zero is itself, not NaN
    x = np.array([8886.0, 8886.000000000002, 0.0, 5e-324, np.inf, np.nan])
    r = tables._significant(x)
    assert r[0] == r[1] and r[2] == 0.0 and r[3] == 5e-324 and r[4] == np.inf and np.isnan(r[5])
