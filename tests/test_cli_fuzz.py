"""Bad values at every numeric option of every command (issue 19).

For each command (found by walking the typer app, so a new command or option is covered without
editing this file; a new command needs an entry in ``BASE``) hypothesis throws generated bad values
— negative, zero, NaN, infinities, overflowing and huge numbers, non-numbers — at one numeric option
on top of arguments that make the command quick and valid, and asserts: exit code 0 or 2, no
traceback, an answer within ``LIMIT_S`` seconds, and no file changed outside the test's folder.
"""

from __future__ import annotations

import json
import os
import shutil
import typing
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cli_timeout import invoke_within
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.main import get_command
from typer.testing import CliRunner

from scaling.cli import app
from scaling.common.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
LIMIT_S = 60
runner = CliRunner()

# Options given as text that hold numbers (budgets, token counts, lists of them).
NUMERIC_TEXT = {"--budget", "--budgets", "--tokens", "--sparsity", "--shots"}

BAD_TEXT = ["-1", "0", "-0.5", "nan", "NaN", "inf", "-inf", "1e400", "-1e400", "1e308", str(10**30),
            "9" * 40, "abc", "", " ", "1e-400", "0x10", "1_000", "2.5", "1,2,", ":", "1e18:1e24:100000000",
            "a:b:c", "[red]x[/red]", ":b:"]
bad_values = (st.sampled_from(BAD_TEXT)
              | st.integers(-10**15, 10**15).map(str)
              | st.floats(allow_nan=True, allow_infinity=True).map(repr))


def _commands() -> dict[str, object]:
    found: dict[str, object] = {}

    def walk(cmd, path, ctx):
        if hasattr(cmd, "list_commands"):  # a group; the top-level one loads its commands lazily
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                walk(sub, path + [name], sub.make_context(name, [], parent=ctx, resilient_parsing=True))
        else:
            found[" ".join(path)] = cmd

    root = get_command(app)
    walk(root, [], root.make_context("smelt-scale", [], resilient_parsing=True))
    return found


def _annotation(param) -> set:
    """The Python types an option accepts (Optional[int] -> {int, NoneType})."""
    try:
        ann = param.get_runtime_param().annotation
    except AttributeError:  # older typer: click types
        return {getattr(param.type, "name", None) == "integer" and int or float} if getattr(
            param.type, "name", None) in ("integer", "float") else set()
    return set(typing.get_args(ann)) or {ann}


def _numeric_options(cmd) -> list[str]:
    out = []
    for p in cmd.params:
        if p.param_type_name != "option" or not p.opts or p.opts[0] == "--help":
            continue
        if _annotation(p) & {int, float} or p.opts[0] in NUMERIC_TEXT:
            out.append(p.opts[0])
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Inputs for every command inside one temporary folder."""
    tmp = tmp_path_factory.mktemp("fuzz")
    rng = np.random.default_rng(0)
    N = np.repeat([1e6, 3e6, 1e7, 3e7], 4)
    D = np.tile([1e8, 3e8, 1e9, 3e9], 4)
    loss = (1.8 + 400 / N**0.34 + 2000 / D**0.37) * np.exp(rng.normal(0, 0.005, N.size))
    pd.DataFrame({"N": N, "D": D, "loss": loss}).to_csv(tmp / "points.csv", index=False)
    docs = [{"id": str(i), "text": f"document {i}: " + " ".join(f"word{j % 37}" for j in range(i, i + 60))}
            for i in range(40)]
    (tmp / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    runs = tmp / "runs"
    runs.mkdir()
    for name in ("proxy-xxs-baseline-s0", "proxy-xxs-smelt-s0", "proxy-xs-baseline-s0", "proxy-xs-smelt-s0"):
        shutil.copytree(ROOT / "runs-cpu-proxy-2026-12-02" / name, runs / name)
    pair = tmp / "pair"
    pair.mkdir()
    for name in ("proxy-s-baseline-s0", "proxy-s-smelt-s0"):
        shutil.copytree(ROOT / "runs-cpu-proxy-2026-12-02" / name, pair / name,
                        ignore=shutil.ignore_patterns("analysis"))
    task = tmp / "tasks" / "corpus_val"  # a text task (records with "text") for `eval`
    task.mkdir(parents=True)
    (task / "test.jsonl").write_text("".join(json.dumps({"text": d["text"]}) + "\n" for d in docs[:3]))
    shutil.copy(ROOT / "examples" / "eval-pair" / "eval.csv", tmp / "eval.csv")
    (tmp / "plan.toml").write_text(
        '[sweep]\nname = "fuzz"\ntiers = ["proxy-tiny"]\narchs = ["baseline", "smelt"]\nseeds = [0]\n'
        'budgets = [2048]\n\n[train]\nbatch_size = 2\nval_windows = 2\ndevice = "cpu"\n\n'
        '[executor]\nkind = "local"\nconcurrency = 1\nthreads_per_job = 1\n')
    return tmp


def _base(world: Path) -> dict[str, list[str]]:
    b = str(world)
    small_model = ["--vocab-size", "32000", "--d-model", "1024", "--n-layers", "16", "--n-heads", "16",
                   "--n-kv-heads", "4", "--head-dim", "64", "--n-experts", "64", "--top-k", "8",
                   "--expert-hidden", "512"]
    one_run = [f"{b}/pair/proxy-s-baseline-s0", "--no-save", "--device", "cpu", "--threads", "1"]
    return {
        "tiers": [],
        "match": small_model,
        "sweep": [f"{b}/plan.toml", "--dry-run", "--no-probe", "--runs-dir", f"{b}/sweep-runs"],
        "fit": [f"{b}/points.csv", "--bootstrap", "0"],
        "savings": ["--law-set", "paper", "--budget", "1e21"],
        "compare": [f"{b}/runs"],
        "prepare-data": [f"{b}/docs.jsonl", "--out", f"{b}/shards", "--vocab-size", "300", "--overwrite",
                         "--val-fraction", "0.2", "--shard-tokens", "4096", "--quiet"],
        "train": ["--tier", "proxy-tiny", "--arch", "smelt", "--tokens", "1024", "--batch-size", "2",
                  "--runs-dir", f"{b}/train-runs", "--ckpt-dir", f"{b}/ckpt", "--data-max-bytes", "100000",
                  "--val-windows", "2", "--threads", "1", "--device", "cpu", "--overwrite"],
        "plot": ["fits", "--out", f"{b}/figs", "--runs", f"{b}/runs", "--bootstrap", "0", "--force"],
        "plan": ["--law-set", "paper", "--budget", "1e20", "--dry-run", "--out", f"{b}/next.toml"],
        "simulate": ["--law-set", "paper", "--budget", "1e20", "--trials", "2", "--bootstrap", "0"],
        "plan-grid": ["--grid", "6,10,14", "--budgets", "3.56e11,6.32e11", "--lr-rule", "0.05,1.27",
                      "--template", str(Path(__file__).resolve().parents[1] / "plans/isoflop-template.toml"),
                      "--dry-run"],
        "analyze sink": [*one_run, "--sequences", "2"],
        "analyze lengths": [*one_run, "--windows", "2", "--documents", "2", "--no-gain"],
        "analyze icl": [*one_run, "--shots", "0,1", "--trials", "2"],
        "analyze snapshot-data": [f"{b}/pair/proxy-s-baseline-s0"],
        "export": [f"{b}/pair/proxy-s-baseline-s0", "--out", f"{b}/export", "--overwrite"],
        "eval": [f"{b}/pair/proxy-s-baseline-s0", "--tasks", "corpus_val", "--data", f"{b}/tasks",
                 "--device", "cpu", "--threads", "1", "--limit", "2"],
        "calibrate": [f"{b}/eval.csv", "--task", "arc_easy", "--floor", "0.25", "--bootstrap", "20"],
    }


def _tree_state(root: Path) -> dict[str, tuple[int, int]]:
    skip = {".git", ".venv", "__pycache__", ".hypothesis", ".pytest_cache"}
    state = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in skip]
        for f in filenames:
            p = Path(dirpath) / f
            st_ = p.stat()
            state[str(p)] = (st_.st_mtime_ns, st_.st_size)
    return state


def _invoke(args: list[str]):
    return invoke_within(args, LIMIT_S)


def test_every_command_has_base_arguments(world):
    missing = set(_commands()) - set(_base(world))
    assert not missing, f"add quick valid arguments for {sorted(missing)} to BASE in this test"


@pytest.mark.parametrize("command", sorted(_commands()))
def test_base_arguments_succeed(command, world, monkeypatch):
    # the bad values below are only meaningful on top of arguments that work
    monkeypatch.chdir(world)
    monkeypatch.setenv("SMELT_CACHE", str(world / "cache"))
    res = _invoke([*command.split(), *_base(world)[command]])
    assert res.exit_code == 0, res.output[-2000:]


SLOW = {"prepare-data", "train", "analyze sink", "analyze lengths", "analyze icl", "sweep", "plot", "eval",
        "export"}


@pytest.mark.parametrize("command", sorted(_commands()))
def test_bad_numeric_values(command, world, monkeypatch):
    cmd = _commands()[command]
    options = _numeric_options(cmd)
    if not options:
        pytest.skip(f"{command} has no numeric option")
    base = _base(world)[command]
    monkeypatch.chdir(world)
    monkeypatch.setenv("SMELT_CACHE", str(world / "cache"))
    before = _tree_state(ROOT)

    @settings(max_examples=6 if command in SLOW else 30, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(option=st.sampled_from(options), value=bad_values)
    def check(option, value):
        args = [*command.split(), *_replace(base, option, value)]
        res = _invoke(args)
        out = res.output
        assert "Traceback" not in out, out
        if res.exception is not None and not isinstance(res.exception, SystemExit):
            raise AssertionError(f"smelt-scale {' '.join(args)} raised {res.exception!r}")
        assert res.exit_code in (0, 2), (args, res.exit_code, out[-2000:])
        if res.exit_code == 2:
            errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
            assert len(errors) == 1, (args, res.stderr[-2000:])

    check()
    assert _tree_state(ROOT) == before, "a command changed files outside the test's folder"


@pytest.mark.parametrize("command, option, value", [
    ("fit", "--bootstrap", "1000000000"), ("savings", "--bootstrap", "100001"), ("plot", "--bootstrap", "-1"),
    ("plan", "--bootstrap", "10000000"), ("simulate", "--trials", "1000000000000"),
    ("simulate", "--bootstrap", "1000000"), ("simulate", "--trials", "0"), ("plot", "--dpi", "100000"),
    ("plot", "--dpi", "0"), ("analyze icl", "--trials", "99999999999999"),
    ("compare", "--min-tokens", "nan"), ("analyze lengths", "--documents", "0"),
    ("analyze lengths", "--documents", "-1"), ("analyze lengths", "--windows", "0"),
])
def test_counts_a_typo_would_run_for_days_are_refused_at_once(command, option, value, world, monkeypatch):
    monkeypatch.chdir(world)
    args = [*command.split(), *_replace(_base(world)[command], option, value)]
    res = _invoke(args)
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert res.exit_code == 2 and len(errors) == 1 and option in errors[0], (args, res.output[-1000:])


def _replace(base: list[str], option: str, value: str) -> list[str]:
    args = list(base)
    if option in args:
        i = args.index(option)
        args[i + 1] = value
    else:
        args += [option, value]
    return args


# -- generated documents (issue 25): fits files and shard manifests ------------------------------
json_scalars = (st.none() | st.booleans() | st.integers(-10**20, 10**20)
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=20)


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


@st.composite
def fits_documents(draw):
    """Fits files: a real one with fields replaced by generated values, or generated JSON, or deep."""
    kind = draw(st.sampled_from(["mutate", "mutate", "random", "deep"]))
    if kind == "deep":
        return _deep(draw(st.sampled_from([65, 1000, 100_000])))
    if kind == "random":
        return json.dumps(draw(json_values))
    doc = json.loads(draw(st.just(_FITS["text"])))
    entry = doc["fits"]["baseline"]
    field = draw(st.sampled_from(sorted(entry)))
    entry[field] = draw(json_values)
    return json.dumps(doc)


@st.composite
def manifests(draw):
    kind = draw(st.sampled_from(["mutate", "mutate", "random", "deep"]))
    if kind == "deep":
        return _deep(draw(st.sampled_from([65, 100_000])))
    if kind == "random":
        return json.dumps(draw(json_values))
    doc = json.loads(_MANIFEST["text"])
    target = doc if draw(st.booleans()) else doc["shards"][0]
    target[draw(st.sampled_from(sorted(target)))] = draw(json_values)
    return json.dumps(doc)


_FITS: dict[str, str] = {}
_MANIFEST: dict[str, str] = {}


def _check_document_command(args, world, before):
    res = _invoke(args)
    assert "Traceback" not in res.output, res.output[-2000:]
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise AssertionError(f"smelt-scale {' '.join(args)} raised {res.exception!r}")
    assert res.exit_code in (0, 2), (args, res.exit_code, res.output[-2000:])
    if res.exit_code == 2:
        assert len([ln for ln in res.stderr.splitlines() if ln.startswith("error:")]) == 1, res.stderr
    assert _tree_state(ROOT) == before, "a command changed files outside the test's folder"


def test_generated_fits_files(world, monkeypatch):
    monkeypatch.chdir(world)
    src = world / "fits-src.json"
    if not _FITS:
        two = pd.read_csv(world / "points.csv")
        both = pd.concat([two.assign(arch="baseline"), two.assign(arch="smelt")])
        both.to_csv(world / "two.csv", index=False)
        res = _invoke(["fit", str(world / "two.csv"), "--bootstrap", "4", "--out", str(src), "--force"])
        assert res.exit_code == 0, res.output
        _FITS["text"] = src.read_text()
    before = _tree_state(ROOT)
    fits = world / "fuzz-fits.json"

    @settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(text=fits_documents())
    def check(text):
        fits.write_text(text)
        _check_document_command(["savings", "--fits", str(fits), "--budget", "1e21", "--json"], world, before)

    check()


def test_generated_manifests(world, monkeypatch):
    monkeypatch.chdir(world)
    monkeypatch.setenv("SMELT_CACHE", str(world / "cache"))
    shards = world / "doc-shards"
    if not _MANIFEST:
        res = _invoke(["prepare-data", str(world / "docs.jsonl"), "--out", str(shards), "--vocab-size", "300",
                       "--val-fraction", "0.2", "--shard-tokens", "4096", "--quiet", "--overwrite"])
        assert res.exit_code == 0, res.output
        _MANIFEST["text"] = (shards / "manifest.json").read_text()
    from scaling.training.data.shards import load_shards

    before = _tree_state(ROOT)

    @settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(text=manifests())
    def check(text):
        (shards / "manifest.json").write_text(text)
        try:
            load_shards(shards)
        except UserError as exc:
            assert "\n" not in str(exc)
        assert _tree_state(ROOT) == before

    check()
