"""Living with it on a cluster (issue 29): progress lines off a terminal, file modes under the
umask, the default runs folder."""

import json
import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from scaling.training import runlog
from scaling.training.loop.progress import Progress, ProgressLog, eta_text, format_line

ROOT = Path(__file__).resolve().parents[1]


def test_format_line_and_eta():
    p = Progress("r", 3_300_000, 31_900_000, 5120.4, 4.1234, 4.2, iter=200, total_iters=1950, budget=1,
                 n_budgets=4, branch=None, mfu=0.312, peak_mem_bytes=41_200_000_000)
    line = format_line(p, 4320)
    assert line == ("iter 200/1,950 tokens 3.3M/31.9M budget 2/4 trunk loss 4.123 val 4.200 tok/s 5,120 "
                    "mfu 0.31 mem 41.2GB eta 1h12m")
    assert "cooldown 3" in format_line(Progress("r", 1, 2, iter=1, total_iters=2, budget=2, n_budgets=4,
                                                branch=2), None)
    assert eta_text(None) == "-" and eta_text(65) == "1m05s" and eta_text(7) == "7s"


def test_progress_log_every_n_updates_or_interval():
    now = [0.0]
    records = []

    class Grab(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger = logging.getLogger("test-progress")
    logger.addHandler(Grab())
    logger.setLevel(logging.INFO)
    plog = ProgressLog(every=10, interval_s=60, clock=lambda: now[0], logger=logger)
    plog(Progress("r", 0, 1000, iter=0, total_iters=100, n_budgets=1, budget=0))
    for i in range(1, 101):
        now[0] += 1.0 if i < 50 else 100.0  # slow updates after 50: the interval takes over
        plog(Progress("r", i * 10, 1000, iter=i, total_iters=100, n_budgets=1, budget=0))
    iters = [int(m.split()[1].split("/")[0]) for m in records[1:]]
    assert records[0].startswith("r: starting")
    assert iters[:4] == [10, 20, 30, 40] and iters[-1] == 100
    assert 51 in iters and 52 in iters  # every update is past the 60 s interval there
    # ETA from the measured rate: at iter 10, 10 s for 100 tokens, 900 tokens left -> 90 s
    assert records[1].endswith("eta 1m30s")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_atomic_write_follows_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        runlog.write_json(tmp_path / "a.json", {"x": 1})
        runlog.append_jsonl(tmp_path / "m.jsonl", {"x": 1})
        runlog.rewrite_jsonl(tmp_path / "r.jsonl", [{"x": 1}])
    finally:
        os.umask(old)
    for name in ("a.json", "m.jsonl", "r.jsonl"):
        assert _mode(tmp_path / name) == 0o666 & ~umask, name


def test_train_off_a_terminal_logs_progress_lines_and_files_follow_umask(tmp_path):
    """A train run with stderr redirected to a file (as under Slurm) prints progress lines; every file
    of the run folder (atomically written ones too) is group-writable under umask 002."""
    err = tmp_path / "train.err"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SMELT_CACHE": str(tmp_path / "cache")}
    args = [sys.executable, str(ROOT / "cli.py"), "train", "--tier", "proxy-tiny", "--arch", "smelt",
            "--tokens", f"{12 * 512},{24 * 512}", "--batch-size", "8", "--data-max-bytes", "100000",
            "--runs-dir", str(tmp_path / "runs"), "--threads", "1", "--val-windows", "8",
            "--progress-every", "5", "--json"]
    with open(err, "w") as fh:
        res = subprocess.run(args, stdout=subprocess.PIPE, stderr=fh, env=env, cwd=tmp_path, timeout=300,
                             preexec_fn=lambda: os.umask(0o002))
    text = err.read_text()
    assert res.returncode == 0, text
    lines = [ln for ln in text.splitlines() if " iter " in ln]
    assert len(lines) >= 4, text
    assert any("cooldown 1" in ln for ln in lines) or any("budget 1/2" in ln for ln in lines), text
    assert lines[-1].split(" iter ")[1].startswith("26/26 ") and "eta 0s" in lines[-1]
    run = next((tmp_path / "runs").iterdir())
    for name in ("config.json", "final.json", "metrics.jsonl"):
        assert _mode(run / name) == 0o664, name
    # nothing was written into a runs/ folder of the working directory
    assert not (tmp_path / "runs-mine").exists()


def test_train_default_runs_dir_is_not_the_shipped_study():
    from scaling.cli.train import DEFAULT_RUNS_DIR

    assert Path(DEFAULT_RUNS_DIR) != Path("runs")


def test_extreme_laws_give_no_numpy_warnings():
    """A bootstrap fit of noisy data can reach extreme exponents (simulate --noise 1 did): the
    frontier over/underflows to inf/0 without numpy RuntimeWarnings reaching the user."""
    import warnings

    import numpy as np

    from scaling.fitting.laws import frontier, get_law

    law = get_law("chinchilla")
    theta = np.array([[1.0, 1e300, 1e-3, 1e-300, 50.0], [1.0, 400.0, 0.34, 410.0, 0.28]])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        f = frontier(law, theta, 1e20, cost=6.0)
    assert f.loss.shape == (2,) and np.isfinite(f.loss[1])


def test_cli_positional_runs_path(tmp_path):
    from typer.testing import CliRunner

    from cli import app

    res = CliRunner().invoke(app, ["savings", "a", "--runs", "b", "--budget", "1e20"])
    assert res.exit_code == 2 and "give the runs path once" in res.stderr


def test_choice_options_list_their_values_and_complete():
    """--help lists the values of a choice option, completion offers them, the CLI's copies of the
    library's choices stay equal to them, and the private typer._click import works (scaling/cli/_click)."""
    from typer.testing import CliRunner

    from cli import app
    from scaling.cli import _click, train
    from scaling.training.loop.branches import SCHEDULES

    assert train.SCHEDULES == SCHEDULES
    assert callable(_click.get_current_context) and issubclass(_click.exceptions.UsageError, Exception)
    out = CliRunner().invoke(app, ["train", "--help"]).stdout
    assert "<baseline|smelt>" in out and "<none|ddp|fsdp|hsdp>" in out and "proxy-xs" in out
    assert "huber-log|sq-log" in CliRunner().invoke(app, ["fit", "--help"]).stdout
    env = {**os.environ, "PYTHONPATH": str(ROOT), "_SMELT_SCALE_COMPLETE": "complete_bash",
           "COMP_WORDS": "smelt-scale train --parallel ", "COMP_CWORD": "3"}
    res = subprocess.run([sys.executable, "-c", "from scaling.cli import app; app(prog_name='smelt-scale')"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert res.stdout.split() == ["none", "ddp", "fsdp", "hsdp"], res.stderr


def test_match_tier():
    import json

    from typer.testing import CliRunner

    from cli import app

    res = CliRunner().invoke(app, ["match", "--tier", "proxy-xs", "--json"])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    tiers = json.loads(CliRunner().invoke(app, ["tiers", "--json"]).stdout)["tiers"]
    shipped = next(t for t in tiers if t["name"] == "proxy-xs")
    assert doc["tiers"][0]["baseline"] == shipped["baseline"]
    res = CliRunner().invoke(app, ["match", "--tier", "proxy-xs", "--d-model", "48", "--json"])
    assert json.loads(res.stdout)["tiers"][0]["baseline"] != shipped["baseline"]


def test_wilson_interval_is_scipys_and_the_closed_form():
    import math
    from statistics import NormalDist

    from scaling.analysis import wilson_interval

    for k, n, conf in [(0, 10, 0.95), (3, 10, 0.95), (29, 97, 0.9), (50, 50, 0.99), (1, 1000, 0.95)]:
        z = NormalDist().inv_cdf(0.5 + conf / 2)
        p = k / n
        d = 1 + z * z / n
        c, h = (p + z * z / (2 * n)) / d, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
        lo, hi = wilson_interval(k, n, conf)
        assert lo == pytest.approx(max(0.0, c - h), abs=1e-12)
        assert hi == pytest.approx(min(1.0, c + h), abs=1e-12)


def _tb_scalars(folder: Path) -> list[tuple[str, int, float]]:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    out = []
    for path in sorted(folder.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            for v in event.summary.value:  # every event, as tbparse reads them (no purge applied)
                value = (v.simple_value if v.HasField("simple_value")
                         else float(tensor_util.make_ndarray(v.tensor)))
                out.append((v.tag, event.step, value))
    return out


def test_tensorboard_trunk_against_tokens_branches_tagged_and_no_duplicates_after_resume(tmp_path):
    pytest.importorskip("tensorboard")
    from scaling.training.loop.metrics import MetricsSink

    def records(upto):
        # trunk updates 1-4, a cooldown branch of budget 0 (updates 5-6, steps 3-4), trunk again 7-10
        out = []
        for i in range(1, upto + 1):
            branch = 0 if i in (5, 6) else None
            step = i - 2 if branch is not None else (i if i <= 4 else i - 2)
            r = {"iter": i, "step": step, "tokens": step * 100, "branch": branch, "train_loss": 10.0 - i,
                 "lr": 0.1}
            if i == 6:
                r.update(budget_index=0, val_loss=5.0)
            out.append(r)
        return out

    run = tmp_path / "run"
    run.mkdir()
    sink = MetricsSink(run, enabled=True, log_to=("jsonl", "tensorboard"))
    for r in records(8):  # killed after update 8; the checkpoint is at update 6
        sink.log(r)
    sink.close()
    sink = MetricsSink(run, enabled=True, log_to=("jsonl", "tensorboard"), start_iter=6)
    for r in records(10)[6:]:
        sink.log(r)
    sink.close()
    scalars = _tb_scalars(run / "tensorboard")
    keys = [(tag, step) for tag, step, _ in scalars]
    assert len(keys) == len(set(keys)), "duplicate (tag, step) after a resume"
    tags = {tag for tag, _ in keys}
    assert tags == {"trunk/train_loss", "trunk/lr", "cooldown_1/train_loss", "cooldown_1/lr",
                    "cooldown_1/val_loss"}
    trunk = sorted((s, v) for t, s, v in scalars if t == "trunk/train_loss")
    assert [s for s, _ in trunk] == [100, 200, 300, 400, 500, 600, 700, 800]  # x = tokens, one curve
    assert sorted(s for t, s, _ in scalars if t == "cooldown_1/train_loss") == [300, 400]


def _wandb_records(path: Path):
    """The records of a W&B ``.wandb`` file (wandb ships no Python reader in 0.31): a 7-byte header
    (":W&B", magic, version) then LevelDB-log framing in 32 KiB blocks (4-byte checksum, 2-byte
    length, 1-byte type: full/first/middle/last), each payload one ``wandb_internal_pb2.Record``."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, buf, block = path.read_bytes(), 7, b"", 32768
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:          # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + n], pos + 7 + n
        if kind == 0:
            break
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            yield rec


def test_wandb_offline_tags_like_tensorboard_and_keeps_one_run_id_across_resumes(tmp_path, monkeypatch):
    """Read back from the offline run files: both sessions of a killed-and-resumed run carry the
    run's one id; history keys are trunk/<m> and cooldown_<k>/<m> with tokens, no bookkeeping."""
    pytest.importorskip("wandb", reason="wandb is not installed (extra [track])")
    from scaling.training.loop.metrics import MetricsSink

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    rows = [{"iter": i, "step": i, "tokens": 100 * i, "branch": 0 if i == 3 else None, "train_loss": 9.0 - i,
             "lr": 0.1} for i in range(1, 6)]
    rows[2].update(budget_index=0, val_loss=6.5)
    run = tmp_path / "run"
    run.mkdir()
    for start, part in ((0, rows[:4]), (3, rows[3:])):     # killed after update 4, checkpoint at 3
        sink = MetricsSink(run, enabled=True, log_to=("jsonl", "wandb"), start_iter=start, run_name="r",
                           run_id="abc123def456")
        for r in part:
            sink.log(r)
        sink.close()
    files = sorted(run.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 2 and all(f.name == "run-abc123def456.wandb" for f in files)
    ids, history = set(), []
    for f in files:
        for rec in _wandb_records(f):
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                ids.add(rec.run.run_id)
            elif kind == "history":
                history.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                                for i in rec.history.item})
    assert ids == {"abc123def456"}
    assert len(history) == 6                      # 4 + 2 (update 4 replayed after the resume)
    keys = {k for h in history for k in h if not k.startswith("_")}
    assert keys == {"tokens", "trunk/train_loss", "trunk/lr", "cooldown_1/train_loss", "cooldown_1/lr",
                    "cooldown_1/val_loss"}
    branch = [h for h in history if "cooldown_1/val_loss" in h]
    assert len(branch) == 1 and branch[0]["tokens"] == 300 and branch[0]["cooldown_1/val_loss"] == 6.5


def test_loss_curves_every_panel_has_tick_labels_and_starts_at_half_the_first_budget():
    """The shipped runs: every visible panel shows its own x and y tick labels once drawn, and the x
    axis starts at half the smallest budget (no warm-up plateau)."""
    if not (ROOT / "runs").is_dir():
        pytest.skip("the shipped runs/ folder is absent")
    from scaling import plots
    from scaling.fitting.curves import read_curves

    curves = read_curves(ROOT / "runs")
    fig = plots.loss_curves(curves, x="tokens")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    axes = [ax for ax in fig.axes if ax.get_visible()]
    first = curves[curves["budget_index"].notna()]["tokens"].min()
    for ax in axes:
        for axis in (ax.xaxis, ax.yaxis):
            labels = [t.get_text() for t in axis.get_ticklabels() if t.get_visible()]
            assert any(labels), (ax.get_title(), axis.axis_name)
        assert ax.get_xlim()[0] == pytest.approx(first / 2)


def test_savings_figure_withholds_what_the_command_withholds(tmp_path):
    """The budgets `smelt-scale savings --method law` withholds (unidentified laws far beyond the
    data) are the ones the figure draws dashed, without markers or a number; every axis has tick
    labels."""
    if not (ROOT / "runs").is_dir():
        pytest.skip("the shipped runs/ folder is absent")
    import json

    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from typer.testing import CliRunner

    from cli import app
    from scaling import plots
    from scaling.cli.plot import _Context

    budgets = "1e12:1e22:11"
    res = CliRunner().invoke(app, ["savings", str(ROOT / "runs"), "--budgets", budgets, "--method", "law",
                                   "--bootstrap", "0", "--json"])
    assert res.exit_code == 0, res.output
    withheld = {r["budget"] for r in json.loads(res.stdout)["rows"] if r["savings"] is None}
    assert any(np.isclose(b, 1e21) for b in withheld)
    ctx = _Context(ROOT / "runs", 0, 0, None, budgets, "baseline", "smelt", "chinchilla")
    result, data_range = ctx.savings()
    drawn_far = {r.budget for r in result.rows if r.extrapolated}
    key = lambda bs: {round(np.log10(b), 6) for b in bs}  # noqa: E731
    shown = {r.budget for r in result.rows if not r.extrapolated and r.savings is not None}
    # drawn dashed only where the command withholds; drawn as a result nowhere it withholds (a budget
    # no law answers is left out of the figure and withheld by the command)
    assert key(drawn_far) <= key(withheld) and not key(shown) & key(withheld)
    fig = plots.savings(result, data_range=data_range)
    FigureCanvasAgg(fig).draw()
    ax = fig.axes[0]
    if any(np.isclose(b, 1e21) for b in drawn_far):
        assert "withheld" in " ".join(t.get_text() for t in ax.texts)
    assert not any("%" in t.get_text() for t in ax.texts)  # no number at the withheld 1e21
    for line in ax.lines:
        xs = np.asarray(line.get_xdata(), dtype=float)
        if line.get_marker() not in (None, "None", "", " "):
            assert not any(np.isclose(x, b) for x in xs for b in withheld)
    solid = [ln for ln in ax.lines if ln.get_linestyle() == "-" and len(ln.get_xdata()) >= 2]
    assert solid and not any(np.isclose(x, b) for ln in solid for x in ln.get_xdata() for b in withheld)
    for a in fig.axes:
        for axis in (a.xaxis, a.yaxis):
            assert any(t.get_text() for t in axis.get_ticklabels() if t.get_visible())


def test_savings_figure_of_unidentified_laws_shows_the_envelope_not_the_law(tmp_path):
    """Where the laws are not identified (the shipped runs), inside the data the figure shows what
    `smelt-scale savings` answers there, the observed frontiers' savings with their intervals, equal
    to `savings --method envelope` at the same budgets; the law is only a dashed shape."""
    if not (ROOT / "runs").is_dir():
        pytest.skip("the shipped runs/ folder is absent")
    import json

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.container import ErrorbarContainer
    from typer.testing import CliRunner

    from cli import app
    from scaling import plots
    from scaling.cli.plot import _Context

    ctx = _Context(ROOT / "runs", 20, 0, None, "1e11:1e22:12", "baseline", "smelt", "chinchilla")
    result, data_range = ctx.savings()
    observed, identified = ctx.observed_savings()
    assert not identified
    got = [r for r in observed if r.savings is not None]
    assert len(got) >= 4 and all(data_range[0] <= r.budget <= data_range[1] for r in got)
    budgets = ",".join(repr(r.budget) for r in got)
    res = CliRunner().invoke(app, ["savings", str(ROOT / "runs"), "--budgets", budgets,
                                   "--method", "envelope", "--bootstrap", "20", "--json"])
    assert res.exit_code == 0, res.output
    cli = [r["savings"] for r in json.loads(res.stdout)["rows"] if r["savings"] is not None]
    assert cli == pytest.approx([r.savings for r in got], abs=1e-12)
    fig = plots.savings(result, data_range=data_range, observed=observed, laws_identified=identified)
    FigureCanvasAgg(fig).draw()
    ax = fig.axes[0]
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert bars and len(bars[0].lines[0].get_xdata()) == len(got)
    solid = [ln for ln in ax.lines if ln.get_linestyle() == "-" and len(ln.get_xdata()) >= 3]
    assert not solid   # no law curve drawn as a result (the zero line is the axes' own, 2 points)
    lo, hi = ax.get_ylim()
    assert lo <= 100 * min(r.savings for r in got) and 100 * max(r.savings for r in got) <= hi


def test_compare_figure_names_seeds_and_its_error_bars():
    if not (ROOT / "runs").is_dir():
        pytest.skip("the shipped runs/ folder is absent")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from scaling import plots
    from scaling.fitting.compare import compare
    from scaling.fitting.tables import read_runs_dir

    res = compare(read_runs_dir(ROOT / "runs"), "baseline", "smelt")
    fig = plots.compare(res)
    FigureCanvasAgg(fig).draw()
    left, right = fig.axes[:2]
    labels = [t.get_text() for t in left.get_legend().get_texts()]
    assert {"seed 0", "seed 1"} <= set(labels)
    tiers = {s.label for s in res.by_tier}
    tier_colours = {ln.get_color() for ln in left.lines if ln.get_label() in tiers}
    assert len(tier_colours) == len(res.by_tier)
    assert "± 1 s.e." in right.get_title() and "± 1 s.e." in right.get_xlabel()
    for a in (left, right):
        for axis in (a.xaxis, a.yaxis):
            assert any(t.get_text() for t in axis.get_ticklabels() if t.get_visible())


def test_compare_figure_draws_the_numbers_of_compare_json():
    """The right panel's means and ±1 s.e. bars are `compare --json`'s overall, by_tier and by_budget
    rows, in that order; the left panel's line per tier goes through its cells (mean, tokens)."""
    if not (ROOT / "runs").is_dir():
        pytest.skip("the shipped runs/ folder is absent")
    import json

    import numpy as np
    from typer.testing import CliRunner

    from cli import app
    from scaling import plots
    from scaling.fitting.compare import compare
    from scaling.fitting.tables import read_runs_dir

    res = CliRunner().invoke(app, ["compare", str(ROOT / "runs"), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    fig = plots.compare(compare(read_runs_dir(ROOT / "runs"), "baseline", "smelt"))
    left, right = fig.axes[:2]
    rows = [doc["overall"], *doc["by_tier"], *doc["by_budget"]]
    bars = right.containers
    assert len(bars) == len(rows)
    for bar, row in zip(bars, rows):
        (x,), (y,) = bar.lines[0].get_data()
        assert x == pytest.approx(row["mean"], rel=1e-12)
        (seg,) = bar.lines[2][0].get_segments()
        se = 0.0 if row["se"] is None else row["se"]
        np.testing.assert_allclose(seg[:, 0], [row["mean"] - se, row["mean"] + se], rtol=1e-12, atol=1e-15)
    ticks = [t.get_text() for t in right.get_yticklabels()]
    assert ticks[0] == "overall" and ticks[1:1 + len(doc["by_tier"])] == [r["label"] for r in doc["by_tier"]]
    for tier in doc["by_tier"]:
        cells = [c for c in doc["cells"] if c["label"].startswith(tier["label"] + " budget")]
        line = next(ln for ln in left.lines if ln.get_label() == tier["label"])
        np.testing.assert_allclose(line.get_ydata(), [c["mean"] for c in cells], rtol=1e-12)
        np.testing.assert_allclose(line.get_xdata(), [c["tokens"] for c in cells], rtol=1e-12)


def test_fits_figure_says_misfit_and_bound_as_the_command_does():
    if not (ROOT / "runs").is_dir():
        pytest.skip("the shipped runs/ folder is absent")
    import json

    from typer.testing import CliRunner

    from cli import app
    from scaling import plots
    from scaling.cli.plot import _Context

    res = CliRunner().invoke(app, ["fit", str(ROOT / "runs"), "--bootstrap", "0", "--json"])
    doc = json.loads(res.stdout)
    ctx = _Context(ROOT / "runs", 0, 0, None, None, "baseline", "smelt", "chinchilla")
    fig = plots.fits(ctx.points, ctx.fits)
    text = {ax.get_ylabel().split("\n")[0]: " ".join(t.get_text() for t in ax.texts) for ax in fig.axes
            if ax.texts}
    for group, entry in doc["fits"].items():
        shown = text["SMELT" if group == "smelt" else "Baseline"]
        assert ("MISFIT" in shown) == bool(entry["diagnostics"]["goodness_of_fit"].get("misfit"))
        for p in entry["diagnostics"].get("on_bound", []):
            assert f"{p} on its bound" in shown
    dotted = [ln for ax in fig.axes for ln in ax.lines if ln.get_linestyle() == ":"]
    assert dotted  # the law beyond the data is drawn in another style
