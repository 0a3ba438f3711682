"""The row-filter language (``fit --where``): nothing in a filter can run code (issue 25).

The four payloads below each wrote a file through ``DataFrame.query``; now each is a one-line error
with exit 2 and no file appears. Legitimate filters keep exactly the rows pandas would.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from scaling.cli import app
from scaling.common.errors import UserError
from scaling.common.filter import MAX_DEPTH, MAX_LENGTH, filter_mask, parse_filter

runner = CliRunner()

PAYLOADS = [
    "@pd.io.common.os.system('touch x') == 0",
    "@Path('x').touch() != 1",
    "loss.to_csv('x') != 1",
    "loss.__class__.__init__.__globals__['np'].save('x', 1) != 1",
    "__import__('os').system('touch x') == 0",
    "(lambda: open('x', 'w'))() != 1",
    "[open('x', 'w') for _ in [1]] != 1",
    "loss.__class__ != 1",
    "loss[0] != 1",
    "`a` @ `b`",
    "f'{loss}' == 'x'",
    "loss if N else D",
    "(y := loss) > 1",
]


def _table(tmp_path):
    rng = np.random.default_rng(0)
    n = np.geomspace(2e7, 2e9, 30)
    df = pd.DataFrame({"N": n, "D": n * rng.uniform(5, 80, 30), "arch": ["baseline", "smelt", "moe"] * 10,
                       "Model Size": np.arange(30.0)})
    df["loss"] = 1.8 + 480 * df["N"] ** -0.35 + 2100 * df["D"] ** -0.37
    p = tmp_path / "pts.csv"
    df.to_csv(p, index=False)
    return p, df


@pytest.mark.parametrize("command", ["fit", "savings"])
@pytest.mark.parametrize("payload", PAYLOADS)
def test_payloads_are_one_line_errors_and_write_nothing(tmp_path, monkeypatch, payload, command):
    src, _ = _table(tmp_path)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    before = sorted(os.listdir(tmp_path))
    args = ["--budget", "1e20"] if command == "savings" else []
    res = runner.invoke(app, [command, str(src), "--bootstrap", "0", *args, "--where", payload])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "row filter" in lines[0], res.stderr
    assert "Traceback" not in res.output
    assert os.listdir(work) == [] and sorted(os.listdir(tmp_path)) == before
    assert not (src.parent / "x").exists() and not (src.parent / "x.npy").exists()


@pytest.mark.parametrize("payload, construct", [
    ("@pd.io.common.os.system('touch x') == 0", "'@'"), ("loss.to_csv('x') != 1", "calls"),
    ("loss.__class__ != 1", "attribute"), ("loss[0] != 1", "subscripts"), ("lambda: 1", "lambda"),
    ("[x for x in loss]", "comprehensions"), ("__class__ > 1", "double underscores"),
    ("loss % 2 == 0", "'%'"), ("loss is None", "'is'"), ("loss in N", "literal list"),
    ("loss in [open]", "not a number or string literal"),
])
def test_refusals_name_the_construct(payload, construct):
    with pytest.raises(UserError, match="not allowed") as exc:
        parse_filter(payload)
    assert construct in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("expr", [
    "loss < 3.1", "1e8 < N <= 1e9", "N >= 1e8 and arch == 'smelt'", "arch in ['smelt', 'moe']",
    "arch not in ['smelt']", "not loss < 3", "(loss > 3) | (N < 5e7)", "~(loss > 3) & (D > 1e10)",
    "-loss < -3", "N * 2 > 1e9", "N / D < 0.05", "loss ** 2 > 9", "D - N * 20 > 0", "N != N",
    "`Model Size` in [1, 2, 3.0]", "`Model Size` + 1 > 10 or arch == \"moe\"", "arch > 'b'",
    "loss == loss and not (arch == 'moe' or N > 1e9)", "+N > 1e8",
])
def test_filters_keep_the_rows_pandas_keeps(tmp_path, expr):
    _, df = _table(tmp_path)
    want = df.query(expr).index.to_numpy()
    data = {c: df[c].to_numpy() for c in df.columns}
    got = np.flatnonzero(filter_mask(expr, data, len(df)))
    np.testing.assert_array_equal(got, want)


def test_fit_where_gives_the_pandas_rows(tmp_path):
    import json

    src, df = _table(tmp_path)
    expr = "arch in ['baseline', 'smelt'] and N > 5e7"
    res = runner.invoke(app, ["fit", str(src), "--bootstrap", "0", "--group-col", "none", "--json",
                              "--where", expr])
    assert res.exit_code == 0, res.output
    fit = json.loads(res.stdout)["fits"]["default"]
    assert fit["n_points"] == len(df.query(expr))


@pytest.mark.parametrize("text, message", [
    ("", "empty"), ("x" * (MAX_LENGTH + 1), "characters long"),
    ("(" * 300 + "loss" + ")" * 300 + " > 1", "nested"),
    ("-" * (MAX_DEPTH + 5) + "loss > 1", "nested more than"), ("loss >", "not an expression"),
    ("`loss > 1", "unclosed backtick"),
])
def test_bounds_and_syntax(text, message):
    with pytest.raises(UserError, match=message):
        parse_filter(text)


@pytest.mark.parametrize("expr, message", [
    ("nope > 1", "names no column 'nope'"), ("loss", "not a condition on rows"),
    ("1 < 2", "does not depend on any column"), ("loss and N > 1", "joins conditions"),
    ("arch < 3", "incompatible types"),
])
def test_evaluation_errors(tmp_path, expr, message):
    _, df = _table(tmp_path)
    with pytest.raises(UserError, match=message):
        filter_mask(expr, {c: df[c].to_numpy() for c in df.columns}, len(df))


def test_huge_literals_are_floats_not_big_integers():
    mask = filter_mask("10**10**10 > N", {"N": np.array([1.0, np.inf])}, 2)
    assert mask.tolist() == [True, False]
