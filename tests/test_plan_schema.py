"""Issue 25, "dry run = real run" and "one typed schema": every plan the issue found passing
`sweep --dry-run` and then failing (or silently misbehaving) in the real sweep is refused by both
with the same one-line error and exit 2, before anything is written."""

from __future__ import annotations

import pytest
from test_sweep import MINI
from typer.testing import CliRunner

from cli import app
from scaling.common.errors import UserError
from scaling.training.loop.trainer import TrainConfig

runner = CliRunner()

LONG = "t" * 300

# (description, edit of the MINI plan text, extra sweep arguments, expected error fragment)
CASES = [
    ("decay_fraction = 2", ("lr = 3e-3", "lr = 3e-3\ndecay_fraction = 2"), [],
     "decay_fraction must be in (0, 1]"),
    ("schedule = 1", ("lr = 3e-3", "lr = 3e-3\nschedule = 1"), [], "schedule must be a string"),
    ("val_windows = 0", ("val_windows = 8", "val_windows = 0"), [], "val_windows must be >= 1"),
    ("seeds = [-1]", ("seeds = [0]", "seeds = [-1]"), [],
     "seeds must be a non-empty list of integers in [0, 2^63 - 1]"),
    ("batch_size = 16.5", ("batch_size = 4", "batch_size = 16.5"), [], "batch_size must be an integer"),
    ("batch_size = true", ("batch_size = 4", "batch_size = true"), [], "batch_size must be an integer"),
    ('batch_size = "16"', ("batch_size = 4", 'batch_size = "16"'), [], "batch_size must be an integer"),
    ('lr = "3e-3"', ("lr = 3e-3", 'lr = "3e-3"'), [], "lr must be a number"),
    ("budgets = [inf]", ("budgets = [1024, 2048, 4096]", "budgets = [inf]"), [],
     "budgets must be a list of numbers"),
    ("runs_dir = 5", ('runs_dir = "{runs}"', "runs_dir = 5"), [], "runs_dir must be a string"),
    ("mfu = 0", ("concurrency = 2", "concurrency = 2\nmfu = 0"), [], "mfu must be in (0, 1]"),
    ('mem_gb = "lots"', ("concurrency = 2", 'concurrency = 2\nmem_gb = "lots"'), [],
     "mem_gb must be a number"),
    ("tier ../../escape", ('"tiny-a", "tiny-b"', '"../../escape"'), [], "is not a valid name"),
    ("custom tier ../../escape", ('[model."tiny-a"]', '[model."../../escape"]'), [], "is not a valid name"),
    ("tier name of 300 characters", ('"tiny-a", "tiny-b"', f'"{LONG}"'), [], "is not a valid name"),
    ("seeds = [0, 0]", ("seeds = [0]", "seeds = [0, 0]"), [], "seeds lists 0 twice"),
    ("duplicate tiers", ('"tiny-a", "tiny-b"', '"tiny-a", "tiny-a"'), [], "tiers lists 'tiny-a' twice"),
    ("duplicate archs", ('archs = ["baseline", "smelt"]', 'archs = ["smelt", "smelt"]'), [],
     "archs lists 'smelt' twice"),
    ("archs = []", ('archs = ["baseline", "smelt"]', "archs = []"), [], "archs must be a non-empty list"),
    ("[train] seed", ("lr = 3e-3", "lr = 3e-3\nseed = 3"), [], "[train] seed is set by [sweep] seeds"),
    ("[train] tokens", ("lr = 3e-3", "lr = 3e-3\ntokens = [4096]"), [],
     "[train] tokens is set by [sweep] budgets"),
    ("custom tier shadowing a built-in", ('[model."tiny-a"]', '[model."proxy-xs"]'), [],
     "would shadow the built-in tier proxy-xs"),
    ("missing [data] path", ("[executor]", '[data]\npath = "{runs}-no-such-data"\n\n[executor]'), [],
     "does not exist"),
    ("more than --max-epochs passes", ("budgets = [1024, 2048, 4096]", "budgets = [1024, 2048, 4096000]"),
     [], "pass(es) over the training split"),
    ("[tier] override of the wrong type", ("[executor]", '[tier."tiny-a"]\nlr = "fast"\n\n[executor]'), [],
     "lr must be a number"),
    ("[tier] per-arch override of the wrong type",
     ("[executor]", '[tier."tiny-a".smelt]\nlr = "fast"\n\n[executor]'), [],
     '[tier."tiny-a".smelt] lr must be a number'),
    ("[tier] per-arch seed", ("[executor]", '[tier."tiny-a".smelt]\nseed = 2\n\n[executor]'), [],
     '[tier."tiny-a".smelt] seed is set by [sweep]'),
    ("[tier] per-arch layout", ("[executor]", '[tier."tiny-a".smelt]\nparallel = "ddp"\n\n[executor]'), [],
     '[tier."tiny-a".smelt] parallel is the parallel layout: set it as mode in [parallel]'),
    ("[tier] per-arch layout table",
     ("[executor]", '[tier."tiny-a".smelt.parallel]\nmode = "ddp"\n\n[executor]'), [],
     '[tier."tiny-a".smelt] parallel is the parallel layout'),
    ("[train] layout key", ("lr = 3e-3", "lr = 3e-3\nep = 2"), [], "[train] ep is the parallel layout"),
    ("[tier] misspelt arch", ("[executor]", '[tier."tiny-a".smlet]\nlr = 1e-3\n\n[executor]'), [],
     'unknown [tier."tiny-a"] keys: smlet'),
    ("misspelt table", ("[executor]", "[trian]\nlr = 1\n\n[executor]"), [], "unknown tables: trian"),
    ("cosine with several budgets", ("lr = 3e-3", 'lr = 3e-3\nschedule = "cosine"'), [],
     "one budget per run"),
]


@pytest.mark.parametrize("what, edit, args, message", CASES, ids=[c[0] for c in CASES])
def test_dry_run_and_real_run_refuse_alike(tmp_path, monkeypatch, what, edit, args, message):
    monkeypatch.setenv("SMELT_CACHE", str(tmp_path.parent / "plan-schema-cache"))
    text = MINI
    if edit is not None:
        assert edit[0] in text, what
        text = text.replace(edit[0], edit[1], 1)
    runs = tmp_path / "runs"
    plan = tmp_path / "plan.toml"
    plan.write_text(text.replace("{runs}", str(runs)))
    results = [runner.invoke(app, ["sweep", str(plan), "--no-probe", *args, *extra])
               for extra in (["--dry-run"], [])]
    for res in results:
        assert res.exit_code == 2, (what, res.output)
        assert "Traceback" not in res.output and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert res.stderr.startswith("error: ") and message in res.stderr, (what, res.stderr)
    assert results[0].stderr == results[1].stderr
    assert not runs.exists()  # nothing written


def test_per_architecture_overrides():
    """[tier."x".smelt] keys reach the SMELT run only; a table for an architecture the sweep does not
    train is refused (it would silently do nothing)."""
    import tomllib

    from scaling.training.sweep.plan import parse_plan

    doc = tomllib.loads(MINI.replace("{runs}", "runs") + '\n[tier."tiny-a"]\nlr = 2e-3\n'
                        '\n[tier."tiny-a".smelt]\nlr = 1e-3\nweight_decay = 0.05\n')
    runs = {(r.tier, r.arch): r.train for r in parse_plan(doc).runs}
    assert runs[("tiny-a", "smelt")]["lr"] == 1e-3 and runs[("tiny-a", "smelt")]["weight_decay"] == 0.05
    assert runs[("tiny-a", "baseline")]["lr"] == 2e-3 and "weight_decay" not in runs[("tiny-a", "baseline")]
    assert runs[("tiny-b", "smelt")]["lr"] == 3e-3
    doc["sweep"]["archs"] = ["baseline"]
    with pytest.raises(UserError, match="overrides an architecture the sweep does not train"):
        parse_plan(doc)


@pytest.mark.parametrize("kw, message", [
    ({"batch_size": True}, "batch_size must be an integer"),
    ({"batch_size": 16.5}, "batch_size must be an integer"),
    ({"lr": "3e-3"}, "lr must be a number"),
    ({"lr": float("nan")}, "lr must be a number"),
    ({"tokens": ["2e5"]}, "tokens must be a list of numbers"),
    ({"log_to": "jsonl"}, "log_to must be a list of strings"),
    ({"val_by_source": 1}, "val_by_source must be true or false"),
    ({"device": 0}, "device must be a string"),
    ({"peak_flops": [1]}, "peak_flops must be a number or a string"),
])
def test_train_config_types(kw, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TrainConfig(**{"tokens": (1024.0,), **kw})


def test_old_config_json_still_loads():
    """A run's config.json written before the schema (ints where floats are meant, lists for
    tuples, unknown keys of other versions) still loads: fit/compare read runs/ through it."""
    doc = {"tokens": [250000.0, 500000.0], "batch_size": 16, "lr": 0.003, "weight_decay": 0,
           "log_to": ["jsonl"], "peak_flops": None, "removed_key": 1}
    cfg = TrainConfig.from_dict(doc)
    assert cfg.tokens == (250000.0, 500000.0) and cfg.weight_decay == 0


def test_every_shipped_run_config_loads():
    import json
    from pathlib import Path

    configs = sorted((Path(__file__).resolve().parents[1] / "runs").rglob("config.json"))
    if not configs:
        pytest.skip("no shipped runs/ in this checkout")
    for path in configs:
        TrainConfig.from_dict(json.loads(path.read_text())["train"])
