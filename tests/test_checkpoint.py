"""Checkpoints and run logs that must never lose or mix up data (issue 19), on proxy-tiny.

The run-name collision and the corrupt metrics line run end to end through the CLI; the kills
use tests/killing_cli.py (the trainer's after_update hook SIGKILLs the process right after an
update's metrics line, before its checkpoint).
"""

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from killing_cli import KILLING_CLI
from typer.testing import CliRunner

from cli import app
from scaling.accounting.tiers import get_config
from scaling.common.errors import UserError
from scaling.common.files import read_jsonl
from scaling.training import runlog
from scaling.training.loop.checkpoint import Checkpointer, latest_iter
from scaling.training.loop.state import TrainState
from scaling.training.loop.trainer import TrainConfig, train

TIER = "proxy-tiny"
STEP_TOKENS = 8 * 64
TIMING = {"tokens_per_s", "wall_s", "data_wait_s", "peak_mem_bytes", "mfu"}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli_args(runs, name="r", lr="0.003", tokens=12 * STEP_TOKENS, *extra):
    return ["train", "--tier", TIER, "--arch", "smelt", "--tokens", str(tokens), "--batch-size", "8",
            "--data-max-bytes", "100000", "--eval-every", "5", "--ckpt-every", "4", "--threads", "1",
            "--val-windows", "8", "--warmup", "2", "--device", "cpu", "--lr", lr, "--run-name", name,
            "--runs-dir", str(runs), "--json", *extra]


def cli(args):
    res = CliRunner().invoke(app, args)
    return res.exit_code, res.stdout, res.stderr


def killed(args, env, at):
    """Run the CLI in a subprocess that SIGKILLs itself after update ``at``."""
    proc = subprocess.run([sys.executable, KILLING_CLI, str(at), *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == -9, proc.stderr[-2000:]


def logs(run_dir):
    lines = read_jsonl(run_dir / "metrics.jsonl", missing_ok=True).rows
    metrics = [{k: v for k, v in r.items() if k not in TIMING} for r in lines]
    final = runlog.read_json(run_dir / "final.json")
    points = [{k: v for k, v in p.items() if k != "wall_s"} for p in final["points"]]
    return metrics, points, final["complete"]


def snapshot(folder):
    # .lock records who last held the run folder (the refused resume held it while it checked)
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".lock"}


def test_same_run_name_in_two_runs_folders_never_share_checkpoints(tmp_path, env):
    """Issue 19: kill A, train B (same name, other folder, other lr) to the end, resume A: A's own
    result, equal to an uninterrupted A; also with one shared checkpoint parent folder."""
    code, out, err = cli(cli_args(tmp_path / "ref", "run"))
    assert code == 0, err
    reference = logs(tmp_path / "ref" / "run")
    for extra in ([], ["--ckpt-dir", str(tmp_path / "shared-ckpt")]):
        a, b = tmp_path / f"A{len(extra)}", tmp_path / f"B{len(extra)}"
        killed(cli_args(a, "run", "0.003", 12 * STEP_TOKENS, *extra), env, at=7)
        code, _, err = cli(cli_args(b, "run", "0.001", 12 * STEP_TOKENS, *extra))
        assert code == 0, err
        code, out, err = cli(cli_args(a, "run", "0.003", 12 * STEP_TOKENS, *extra, "--resume"))
        assert code == 0, err
        assert logs(a / "run") == reference
        assert runlog.read_json(a / "run" / "config.json")["train"]["lr"] == 0.003
        assert logs(b / "run")[1] != reference[1]


def test_resume_refuses_a_checkpoint_of_another_identity(tmp_path, env):
    args = cli_args(tmp_path / "runs")
    killed(args, env, at=6)
    ckpt = tmp_path / "runs" / "r" / "checkpoints" / f"iter-{4:09d}"
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["identity"]["code"]["git_commit"] = "0" * 40  # as if saved by another version of the code
    meta["identity_hash"] = "0" * 16
    (ckpt / "meta.json").write_text(json.dumps(meta))
    before = snapshot(tmp_path / "runs")
    code, _, err = cli(args + ["--resume"])
    assert code == 2 and err.startswith("error:") and "\n" not in err.strip(), err
    assert "code.git_commit" in err and "refusing" in err
    assert snapshot(tmp_path / "runs") == before


def test_checkpointer_identity_and_run_id_units(tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    ident = {"model": {"d": 3}, "train": {"lr": 1e-3}}
    ck = Checkpointer(tmp_path, ident, "run-a", every=1)
    ck.prepare()
    ck.save_latest(model, opt, TrainState(iter=1))
    path = ck.latest()
    assert path.name == f"iter-{1:09d}" and latest_iter(tmp_path) == 1
    assert Checkpointer(tmp_path, ident, "run-a").load(path, model, opt).iter == 1
    with pytest.raises(UserError, match=r"different train\.lr"):
        Checkpointer(tmp_path, {**ident, "train": {"lr": 2e-3}}, "run-a").load(path, model, opt)
    with pytest.raises(UserError, match="belongs to another run"):
        Checkpointer(tmp_path, ident, "run-b").load(path, model, opt)
    with pytest.raises(UserError, match="already holds checkpoints"):
        Checkpointer(tmp_path, ident, "run-b").check_empty()
    # a code change refuses an unfinished run's checkpoint, not a finished one's (nothing to train)
    code_b = {**ident, "code": {"git_commit": "b"}}
    ck = Checkpointer(tmp_path, {**ident, "code": {"git_commit": "a"}}, "run-a")
    ck.save_latest(model, opt, TrainState(iter=2))
    with pytest.raises(UserError, match=r"different code\.git_commit"):
        Checkpointer(tmp_path, code_b, "run-a").load(ck.latest(), model, opt)
    done = TrainState(iter=3)
    done.position = dataclasses.replace(done.position, done=True)
    ck.save_latest(model, opt, done)
    assert Checkpointer(tmp_path, code_b, "run-a").load(ck.latest(), model, opt).done


def _edit_meta(path, edit):
    meta = json.loads((path / "meta.json").read_text())
    edit(meta)
    (path / "meta.json").write_text(json.dumps(meta))


def _rewrite_rng(path, obj):
    """rng.pt replaced and its checksum in meta.json with it: a tamper the checksums cannot see."""
    from scaling.training.loop.checkpoint import _crc32

    torch.save(obj, path / "rng.pt")
    _edit_meta(path, lambda m: m["digests"].update({"rng.pt": _crc32(path / "rng.pt")}))


@pytest.mark.parametrize("damage", [
    lambda p: _rewrite_rng(p, {}),
    lambda p: _rewrite_rng(p, {"torch": torch.zeros(3), "numpy": 5, "python": "x"}),
    lambda p: _edit_meta(p, lambda m: m.pop("run_id")),
    lambda p: _edit_meta(p, lambda m: m.pop("state")),
    lambda p: _edit_meta(p, lambda m: m["state"].pop("position")),
    lambda p: _edit_meta(p, lambda m: m["state"].update(points=5)),
    lambda p: _edit_meta(p, lambda m: m["state"].update(iter="x")),
    lambda p: _edit_meta(p, lambda m: m["state"]["position"].update(trunk_step=-1)),
    lambda p: _edit_meta(p, lambda m: m.update(world_size="2")),
], ids=["rng-empty", "rng-wrong-types", "no-run-id", "no-state", "no-position", "points-int", "iter-str",
        "negative-step", "world-str"])
def test_a_tampered_checkpoint_is_refused_in_one_line(tmp_path, damage):
    """Each of these gave a KeyError or TypeError traceback on resume (an adversarial review)."""
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    ident = {"model": {"d": 3}}
    ck = Checkpointer(tmp_path, ident, "run-a", every=1)
    ck.prepare()
    ck.save_latest(model, opt, TrainState(iter=1))
    path = ck.latest()
    damage(path)
    with pytest.raises(UserError, match=f"checkpoint {path} is unreadable") as err:
        Checkpointer(tmp_path, ident, "run-a").load(path, model, opt)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("damage", ["truncate-data", "garbage-meta"])
def test_corrupt_checkpoint_is_a_one_line_error(tmp_path, env, damage):
    args = cli_args(tmp_path / "runs")
    killed(args, env, at=6)
    ckpt = tmp_path / "runs" / "r" / "checkpoints" / f"iter-{4:09d}"
    if damage == "truncate-data":
        data = next(ckpt.glob("*.distcp"))
        data.write_bytes(data.read_bytes()[:100])
    else:
        (ckpt / "meta.json").write_text('{"format": 2, "iter"')
    code, _, err = cli(args + ["--resume"])
    assert code == 2 and err.startswith("error:") and "\n" not in err.strip(), err
    # a truncated tensor file fails its checksum before DCP reads it
    assert ("is corrupt" if damage == "truncate-data" else "unreadable") in err and str(ckpt) in err


def test_killed_save_leaves_previous_checkpoint_usable(tmp_path, env):
    """A save killed before its rename leaves .tmp-<name>: the next start deletes it and resumes
    from the previous checkpoint, to the uninterrupted result."""
    code, _, err = cli(cli_args(tmp_path / "ref"))
    assert code == 0, err
    args = cli_args(tmp_path / "runs")
    killed(args, env, at=10)
    folder = tmp_path / "runs" / "r" / "checkpoints"
    half = folder / f".tmp-iter-{12:09d}"
    shutil.copytree(folder / f"iter-{8:09d}", half)
    next(half.glob("*.distcp")).write_bytes(b"\0" * 10)  # half-written data, no rename yet
    code, _, err = cli(args + ["--resume"])
    assert code == 0, err
    assert not half.exists() and logs(tmp_path / "runs" / "r") == logs(tmp_path / "ref" / "r")


def test_corrupt_metrics_line_mid_file_is_refused_and_changes_nothing(tmp_path, env):
    args = cli_args(tmp_path / "runs")
    killed(args, env, at=10)
    path = tmp_path / "runs" / "r" / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[3] = '{"iter": 4, "train_lo\n'
    path.write_text("".join(lines))
    before = snapshot(tmp_path / "runs")
    code, _, err = cli(args + ["--resume"])
    assert code == 2 and err.startswith("error:") and "\n" not in err.strip(), err
    assert f"{path}:4: not JSON" in err
    assert snapshot(tmp_path / "runs") == before


def test_a_repeated_metrics_line_is_refused_and_changes_nothing(tmp_path, env):
    """The resume audit: a duplicated line (outside damage) was kept, the log then holding iter 6
    twice. The trainer logs each update once and in order, so resume refuses such a log."""
    args = cli_args(tmp_path / "runs")
    killed(args, env, at=10)
    path = tmp_path / "runs" / "r" / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:6] + [lines[5]] + lines[6:]))
    before = snapshot(tmp_path / "runs")
    code, _, err = cli(args + ["--resume"])
    assert code == 2 and err.startswith("error:") and "\n" not in err.strip(), err
    assert "a line repeated or out of order" in err and str(path) in err
    assert snapshot(tmp_path / "runs") == before


@pytest.mark.parametrize("damage", ["deleted", "cut"])
def test_a_lost_metrics_line_is_refused_and_changes_nothing(tmp_path, env, damage):
    """The resume audit (F7): a deleted middle line, or a file cut to its first line and half of
    the second (the half line then looks like a torn last line), resumed with exit 0 and the
    finished log kept the gap. The checkpoint now holds how many lines the run wrote
    (``TrainState.metrics_lines``), and a resume that finds fewer up to its update refuses."""
    args = cli_args(tmp_path / "runs")
    killed(args, env, at=10)
    path = tmp_path / "runs" / "r" / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:5] + lines[6:]) if damage == "deleted" else lines[0] + lines[1][:20])
    before = snapshot(tmp_path / "runs")
    code, _, err = cli(args + ["--resume"])
    assert code == 2 and err.startswith("error:") and "\n" not in err.strip(), err
    assert "a line lost, or the file cut short" in err and str(path) in err
    assert snapshot(tmp_path / "runs") == before


def test_a_checkpoint_from_before_the_line_count_takes_the_logs_count(tmp_path, env):
    """A checkpoint written before ``metrics_lines`` existed (its state lacks the key) resumes, its
    count seeded from the log it finds, and is checked from then on: killed again, a deleted
    line is refused. The resumed run's log equals an uninterrupted run's."""
    code, _, err = cli(cli_args(tmp_path / "ref"))
    assert code == 0, err
    args = cli_args(tmp_path / "runs")
    killed(args, env, at=5)
    metas = sorted((tmp_path / "runs" / "r" / "checkpoints").glob("iter-*/meta.json"))
    assert metas
    for meta in metas:
        doc = json.loads(meta.read_text())
        assert doc["state"].pop("metrics_lines") == 4
        meta.write_text(json.dumps(doc))
    killed(args + ["--resume"], env, at=10)
    path = tmp_path / "runs" / "r" / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:2] + lines[3:]))
    code, _, err = cli(args + ["--resume"])
    assert code == 2 and "a line lost, or the file cut short" in err, err
    path.write_text("".join(lines))
    code, _, err = cli(args + ["--resume"])
    assert code == 0, err
    assert logs(tmp_path / "runs" / "r") == logs(tmp_path / "ref" / "r")


def test_torn_final_metrics_line_is_dropped_on_resume(tmp_path, env):
    code, _, err = cli(cli_args(tmp_path / "ref"))
    assert code == 0, err
    args = cli_args(tmp_path / "runs")
    killed(args, env, at=6)
    with open(tmp_path / "runs" / "r" / "metrics.jsonl", "a") as fh:
        fh.write('{"iter": 7, "step": 7, "tra')  # a write cut short by the kill
    code, _, err = cli(args + ["--resume"])
    assert code == 0, err
    assert logs(tmp_path / "runs" / "r") == logs(tmp_path / "ref" / "r")


@pytest.mark.parametrize("extra, message", [
    (["--resume"], "no run to resume"),
    (["--tokens", "1e400"], "finite"),
    (["--device", "tpu"], "device must be"),
    (["--tokens", "100"], "below one optimizer step"),
    (["--batch-size", "6", "--micro-batch-size", "4"], "does not divide"),
    (["--mfu"], "MFU needs peak_flops"),
    (["--peak-flops", "h300"], "unknown peak_flops"),
    (["--log-to", "jsonl,csv"], "log_to"),
])
def test_rejected_train_is_one_line_and_leaves_no_folder(tmp_path, env, extra, message):
    code, _, err = cli(cli_args(tmp_path / "runs") + extra)
    assert code == 2 and err.startswith("error:") and "\n" not in err.strip(), err
    assert message in err
    assert not (tmp_path / "runs").exists()


def test_metrics_mfu_memory_data_wait_per_source_and_tensorboard(tmp_path, env):
    pytest.importorskip("tensorboard")
    cfg = TrainConfig(tokens=(6 * STEP_TOKENS,), batch_size=8, data_max_bytes=100_000, eval_every=0,
                      threads=1, val_windows=8, warmup=2, peak_flops="h100-sxm-bf16", mfu=True,
                      val_by_source=True, log_to=("jsonl", "tensorboard"))
    train(get_config(TIER, "smelt"), cfg, tier=TIER, run_name="m", runs_dir=tmp_path / "runs")
    lines = read_jsonl(tmp_path / "runs" / "m" / "metrics.jsonl", missing_ok=True).rows
    assert len(lines) == 6
    for r in lines:
        assert 0 < r["mfu"] < 1e-3  # a CPU against an H100's peak
        assert r["peak_mem_bytes"] > 10e6 and r["data_wait_s"] >= 0
    assert set(lines[-1]) >= {"val_loss", "val_loss/shakespeare", "val_loss/stdlib"}
    assert list((tmp_path / "runs" / "m" / "tensorboard").glob("events.out.tfevents.*"))


def test_missing_tracking_package_is_a_clear_error(tmp_path, env, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    cfg = TrainConfig(tokens=(2 * STEP_TOKENS,), batch_size=8, data_max_bytes=100_000, threads=1,
                      val_windows=8, log_to=("jsonl", "wandb"))
    with pytest.raises(UserError, match=r"needs the wandb package .*smelt-scale\[track\]"):
        train(get_config(TIER, "smelt"), cfg, tier=TIER, run_name="w", runs_dir=tmp_path / "runs")
    assert not (tmp_path / "runs").exists()


def test_async_checkpoints_resume_exactly(tmp_path, env):
    code, _, err = cli(cli_args(tmp_path / "ref"))
    assert code == 0, err
    args = cli_args(tmp_path / "runs") + ["--async-ckpt"]
    killed(args, env, at=10)
    # the save of 8 is renamed into place at the next save (12): the kill at 10 leaves 4
    assert latest_iter(tmp_path / "runs" / "r" / "checkpoints") == 4
    code, _, err = cli(args + ["--resume"])
    assert code == 0, err
    assert logs(tmp_path / "runs" / "r") == logs(tmp_path / "ref" / "r")


def test_wandb_offline_mirror(tmp_path, env, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = TrainConfig(tokens=(3 * STEP_TOKENS,), batch_size=8, data_max_bytes=100_000, threads=1,
                      val_windows=8, log_to=("jsonl", "wandb"))
    train(get_config(TIER, "smelt"), cfg, tier=TIER, run_name="w", runs_dir=tmp_path / "runs")
    assert len(read_jsonl(tmp_path / "runs" / "w" / "metrics.jsonl", missing_ok=True).rows) == 3
    assert list((tmp_path / "runs" / "w" / "wandb").glob("offline-run-*"))


def test_a_resume_that_finds_no_checkpoint_never_starts_a_run_over_that_had_one(tmp_path, env):
    """The resume audit (2026-12-07): a run trained with --ckpt-dir and resumed without it found no
    checkpoint, started over and dropped its 9 metrics lines and its finished budget. Refused now,
    in one line naming the folder to pass, with the run folder untouched; with the --ckpt-dir it was
    trained with, it resumes to the uninterrupted run's result. A run killed before its first
    checkpoint (update 3 of --ckpt-every 4) still starts over, as it must."""
    code, _, err = cli(cli_args(tmp_path / "ref", "r", "0.003", 12 * STEP_TOKENS, "--tokens", "6144,3072"))
    assert code == 0, err
    ck = tmp_path / "ck"
    args = cli_args(tmp_path / "runs", "r", "0.003", 12 * STEP_TOKENS, "--tokens", "6144,3072",
                    "--ckpt-dir", str(ck))
    killed(args, env, 9)
    run = tmp_path / "runs" / "r"
    before = snapshot(run)
    code, out, err = cli([a for a in args if a not in ("--ckpt-dir", str(ck))] + ["--resume"])
    assert code == 2 and err.strip().count("\n") == 0, err
    assert "9 logged updates and finished budgets but no checkpoint" in err and f"--ckpt-dir {ck}" in err
    assert snapshot(run) == before
    code, out, err = cli(args + ["--resume"])
    assert code == 0, err
    assert logs(run) == logs(tmp_path / "ref" / "r")
    early = cli_args(tmp_path / "early", "e")
    killed(early, env, 3)
    code, out, err = cli(early + ["--resume"])
    assert code == 0 and json.loads(out)["complete"], err


def test_a_resume_removes_what_a_killed_atomic_write_left(tmp_path, env):
    """The resume audit: a SIGKILL between atomic_write's mkstemp and its replace left a temporary
    (a whole weights file at the paper tiers) that no resume or --overwrite removed. The resume
    removes such files under the run lock, in the run folder and one level down, and nothing else."""
    args = cli_args(tmp_path / "runs", "t")
    killed(args, env, 6)
    run = tmp_path / "runs" / "t"
    (run / "weights").mkdir(exist_ok=True)
    stale = [run / ".final.json.k2j4_x9a.tmp", run / "weights" / ".budget-0.safetensors.abcd1234.tmp"]
    kept = [run / ".notes.tmp", run / "weights" / "mine.tmp", run / ".final.json.TOOLONGNAME.tmp"]
    for p in stale + kept:
        p.write_bytes(b"x" * 100)
    code, out, err = cli(args + ["--resume"])
    assert code == 0, err
    assert not any(p.exists() for p in stale) and all(p.exists() for p in kept)


def test_a_flipped_byte_in_a_checkpoint_is_refused_not_loaded(tmp_path, env):
    """The resume audit: one byte flipped in a .distcp tensor file resumed with exit 0 and drifted
    from the flip on (DCP keeps no checksums). meta.json records each file's CRC-32 now, and the
    resume refuses the checkpoint in one line, leaving the run folder as it was."""
    args = cli_args(tmp_path / "runs", "c")
    killed(args, env, 9)
    run = tmp_path / "runs" / "c"
    ckpt = sorted((run / "checkpoints").glob("iter-*"))[-1]
    digests = json.loads((ckpt / "meta.json").read_text())["digests"]
    assert set(digests) >= {"__0_0.distcp", ".metadata", "rng.pt"}
    target = ckpt / "__0_0.distcp"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    before = snapshot(run)
    code, out, err = cli(args + ["--resume"])
    assert code == 2 and err.strip().count("\n") == 0, err
    assert "is corrupt: __0_0.distcp does not match the checksum" in err
    assert snapshot(run) == before


def test_the_same_weights_give_the_same_bytes_in_every_process(tmp_path):
    """safetensors writes its metadata in a hash map's order, new in every process: the same
    weights had another sha256 in every run, and analyses saved against them read as stale (the
    resume audit). save_weights sorts them; the file still loads, with its metadata."""
    from safetensors import safe_open

    code = ("import sys, torch; from scaling.training.runlog import save_weights; "
            "save_weights(sys.argv[1], {'a': torch.arange(3.0), 'b': torch.ones(2)}, "
            "{k: str(i) for i, k in enumerate('qwertyuiop')})")
    files = [tmp_path / f"w{i}.safetensors" for i in range(3)]
    for f in files:
        subprocess.run([sys.executable, "-c", code, str(f)], check=True, cwd=ROOT, timeout=120)
    assert len({f.read_bytes() for f in files}) == 1
    with safe_open(str(files[0]), "pt") as fh:
        assert fh.metadata() == {k: str(i) for i, k in enumerate("qwertyuiop")}
        assert fh.get_tensor("a").tolist() == [0.0, 1.0, 2.0]


def test_a_file_where_the_budget_weights_go_is_refused_at_the_start(tmp_path, env):
    """The resume audit: a file named weights was reported only when the first budget's weights
    were written, after the training up to it. Now at the start, in one line, changing nothing."""
    args = cli_args(tmp_path / "runs", "w") + ["--save-budget-weights"]
    killed(args, env, 3)
    run = tmp_path / "runs" / "w"
    (run / "weights").write_text("mine")
    before = snapshot(run)
    code, out, err = cli(args + ["--resume"])
    assert code == 2 and err.strip().count("\n") == 0, err
    assert "weights is a file, where the budget weights go" in err
    assert snapshot(run) == before
