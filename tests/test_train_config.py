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
