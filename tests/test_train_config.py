"""`train --config FILE` (issues 29, 30): the [train]/[data]/[parallel] tables of a plan, checked
by the plan's schema; a flag given on the command line overrides the file, the file overrides
the defaults."""

from __future__ import annotations

import json

from test_sweep import MINI
from typer.testing import CliRunner

from cli import app

runner = CliRunner()

CONFIG = """
[train]
tokens = [1024]
batch_size = 4
lr = 1e-3
warmup = 1
val_windows = 4
eval_every = 0
threads = 1
seed = 3

[data]
max_bytes = 100000

[parallel]
mode = "none"
"""


def _train(tmp_path, *extra):
    return runner.invoke(app, ["train", "--tier", "proxy-tiny", "--arch", "baseline", "--runs-dir",
                               str(tmp_path / "runs"), "--run-name", "r", "--json", *extra])


def test_flags_override_the_file_and_the_file_overrides_defaults(tmp_path, env):
    path = tmp_path / "train.toml"
    path.write_text(CONFIG)
    res = _train(tmp_path, "--config", str(path), "--lr", "2e-3", "--seed", "0")
    assert res.exit_code == 0, res.output
    recorded = json.loads((tmp_path / "runs" / "r" / "config.json").read_text())["train"]
    assert recorded["lr"] == 2e-3 and recorded["seed"] == 0  # the command line wins
    assert recorded["batch_size"] == 4 and recorded["data_max_bytes"] == 100000  # then the file
    assert recorded["tokens"] == [1024.0] and recorded["val_windows"] == 4 and recorded["warmup"] == 1
    assert recorded["weight_decay"] == 0.1 and recorded["parallel"] == "none"  # then the defaults


def test_bad_config_files_are_one_line_errors(tmp_path):
    cases = [
        (CONFIG.replace("lr = 1e-3", 'lr = "3e-3"'), "[train] lr must be a number"),
        (CONFIG.replace("batch_size = 4", "batch_size = 16.5"), "[train] batch_size must be an integer"),
        (CONFIG.replace("[data]", "[dta]"), "unknown tables: dta"),
        (CONFIG.replace("max_bytes = 100000", "max_bytes = true"), "[data] max_bytes must be an integer"),
        (CONFIG.replace('mode = "none"', 'mode = "ddp"\ngpus_per_node = 0'),
         "[parallel] gpus_per_node must be a positive integer"),
        (CONFIG.replace("lr = 1e-3", 'lr = 1e-3\nparallel = "fsdp"'), "contradicts [parallel] mode"),
        (CONFIG.replace("tokens = [1024]", ""), "give the token budget(s)"),
        ("[train\n", "is not valid TOML"),
    ]
    for text, message in cases:
        path = tmp_path / "bad.toml"
        path.write_text(text)
        res = _train(tmp_path, "--config", str(path))
        assert res.exit_code == 2 and message in res.stderr, (message, res.output)
        assert res.stderr.count("\n") == 1
    assert not (tmp_path / "runs").exists()
    res = _train(tmp_path, "--config", str(tmp_path / "missing.toml"))
    assert res.exit_code == 2 and "config file not found" in res.stderr


def test_a_plan_file_is_a_train_config(tmp_path):
    """A sweep plan's [train] table types are checked by `train --config` exactly as by `sweep`."""
    path = tmp_path / "plan.toml"
    path.write_text(MINI.format(runs=tmp_path / "runs").replace("batch_size = 4", "batch_size = true"))
    train = ["train", "--tier", "proxy-tiny", "--arch", "smelt", "--tokens", "1024", "--config", str(path)]
    for args in (["sweep", str(path), "--dry-run", "--no-probe"], train):
        res = runner.invoke(app, args)
        assert res.exit_code == 2, res.output
        assert "[train] batch_size must be an integer, got True" in res.stderr


# --- issue 30 item 4: one TrainConfig, composed of small configs --------------------------------
# Every option of `smelt-scale train --help` (the names users and scripts know; a test keeps them).
TRAIN_OPTIONS = {
    "--tier", "--arch", "--tokens", "--config", "--run-name", "--runs-dir", "--batch-size",
    "--micro-batch-size", "--lr", "--warmup", "--schedule", "--decay-fraction", "--weight-decay",
    "--grad-clip", "--seed", "--eval-every", "--val-windows", "--ckpt-every", "--ckpt-dir", "--async-ckpt",
    "--log-every", "--progress-every", "--log-to", "--peak-flops", "--mfu", "--val-by-source", "--parallel",
    "--activation-checkpointing", "--compile", "--no-compile", "--grad-sync", "--replicate", "--ep",
    "--loop-grad", "--head-padding", "--resume", "--overwrite", "--device", "--threads",
    "--save-final-weights", "--save-budget-weights",
    "--data", "--data-tokenizer", "--data-max-bytes", "--verify-data", "--quiet", "--json", "--help",
}


def test_train_options_come_from_the_config_fields():
    """`train --help` lists the same options as before the configs were split, each TrainConfig field
    that is an option carries its help text there, and the others are plan/--config keys only."""
    import re

    from scaling.training.loop.config import TrainConfig, option_fields

    out = runner.invoke(app, ["train", "--help"], terminal_width=200).stdout
    assert set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", out)) >= TRAIN_OPTIONS
    listed = set(re.findall(r"^\s+(--[a-z][a-z-]*)", out, flags=re.M))
    assert listed | {"--no-compile"} == TRAIN_OPTIONS
    flat = " ".join(out.split())
    for f in option_fields():
        assert " ".join(f.metadata["help"].split())[:40] in flat, f.name
    plan_only = set(TrainConfig.field_names()) - {f.name for f in option_fields()}
    assert plan_only == {"tokens", "min_lr_ratio", "beta1", "beta2", "eps", "aux_coef", "z_coef",
                         "eval_batch_size", "data_val_fraction", "data_codec_tables"}


def test_the_parts_make_the_same_config():
    from scaling.training.loop.config import (
        PARTS,
        DataConfig,
        LogConfig,
        OptimConfig,
        ParallelConfig,
        TrainConfig,
    )

    cfg = TrainConfig(tokens=(2e5, 4e5), lr=1e-3, log_every=5, data_max_bytes=1000, threads=2)
    parts = [cfg.part(p) for p in PARTS]
    assert TrainConfig.from_parts(cfg.tokens, *parts) == cfg
    assert cfg.part(OptimConfig).lr == 1e-3 and cfg.part(LogConfig).log_every == 5
    assert cfg.part(DataConfig).data_max_bytes == 1000 and cfg.part(ParallelConfig).threads == 2
    # data_codec_tables only when true: runs recorded before the field are the same config as false
    assert list(cfg.to_dict()) == [n for n in TrainConfig.field_names() if n != "data_codec_tables"]
    old_corpus = TrainConfig(tokens=(2e5,), data_codec_tables=True)
    assert list(old_corpus.to_dict()) == TrainConfig.field_names()
    assert TrainConfig.from_dict(old_corpus.to_dict()) == old_corpus
    # each part checks its own fields and rules
    for bad, message in ((lambda: OptimConfig(lr=0), "lr must be in (0, 100]"),
                         (lambda: LogConfig(mfu=True), "MFU needs peak_flops"),
                         (lambda: DataConfig(data_verify="some"), "data_verify must be cheap or full"),
                         (lambda: ParallelConfig(ep=2), "needs parallel fsdp or hsdp")):
        try:
            bad()
        except Exception as exc:  # noqa: BLE001 - UserError, checked by its text
            assert message in str(exc)
        else:
            raise AssertionError(message)


def test_shipped_config_json_files_still_load():
    """Resume reads the recorded [train] table back: every shipped run's loads, and gives back the
    same values (a file from before a field existed takes that field's default)."""
    from pathlib import Path

    from scaling.training.loop.config import TrainConfig

    root = Path(__file__).resolve().parents[1]
    files = sorted(root.glob("runs*/*/config.json"))
    assert files
    for path in files:
        recorded = json.loads(path.read_text())["train"]
        again = TrainConfig.from_dict(recorded).to_dict()
        assert {k: again[k] for k in recorded if k in again} == {k: v for k, v in recorded.items()
                                                                  if k in again}, path


def test_a_config_file_may_set_fields_that_are_not_options(tmp_path, env):
    """[train] beta1 (a TrainConfig field without a command-line option) in --config is trained with
    (it was a KeyError before the options came from the fields)."""
    path = tmp_path / "train.toml"
    path.write_text(CONFIG.replace("seed = 3", "seed = 3\nbeta1 = 0.8\neval_batch_size = 8"))
    res = _train(tmp_path, "--config", str(path))
    assert res.exit_code == 0, res.output
    recorded = json.loads((tmp_path / "runs" / "r" / "config.json").read_text())["train"]
    assert recorded["beta1"] == 0.8 and recorded["eval_batch_size"] == 8 and recorded["seed"] == 3


def test_thread_counts_torch_cannot_use_are_refused_before_any_write(tmp_path):
    """torch.set_num_threads(100000) segfaulted (exit 139, no error line) after the run folder was
    made; every command that takes --threads refuses counts outside 1..1024 in one line first."""
    res = runner.invoke(app, ["train", "--tier", "proxy-tiny", "--arch", "baseline", "--tokens", "1024",
                              "--runs-dir", str(tmp_path / "runs"), "--run-name", "t", "--threads", "100000"])
    assert res.exit_code == 2 and "threads must be 1 to 1024, got 100000" in res.stderr
    assert not (tmp_path / "runs").exists()
    cfg = tmp_path / "c.toml"
    cfg.write_text("[train]\nthreads = 5000\n")
    res = runner.invoke(app, ["train", "--config", str(cfg), "--tier", "proxy-tiny", "--arch", "baseline",
                              "--tokens", "1024", "--runs-dir", str(tmp_path / "runs")])
    assert res.exit_code == 2 and "1 to 1024" in res.stderr and not (tmp_path / "runs").exists()
    for cmd in (["analyze", "sink", "runs/iso-d04-baseline-s0"],
                ["eval", "x", "--tasks", "a", "--data", "."]):
        res = runner.invoke(app, [*cmd, "--threads", "0"])
        assert res.exit_code == 2 and res.stderr.strip() == "error: --threads must be 1 to 1024, got 0"
