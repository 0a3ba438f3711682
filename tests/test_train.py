"""The trainer in-process on proxy-tiny and a ~100 kB corpus (each run ~1-3 s), plus CLI errors."""

import json

import pytest
import torch
from typer.testing import CliRunner

from scaling.accounting.costs import costs
from scaling.accounting.tiers import get_config
from scaling.common.errors import UserError
from scaling.common.files import read_jsonl
from scaling.training import runlog
from scaling.training.loop.trainer import TrainConfig, param_groups, train


def read_jsonl_rows(path):
    return read_jsonl(path).rows

TIER = "proxy-tiny"
STEP_TOKENS = 8 * 64  # batch 8 x seq_len 64
TIMING = {"tokens_per_s", "wall_s", "data_wait_s", "peak_mem_bytes"}


@pytest.fixture(autouse=True)
def _env(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SMELT_CACHE", str(tmp_path_factory.getbasetemp() / "smelt-cache"))
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def tiny(**kw) -> TrainConfig:
    base = dict(tokens=(10 * STEP_TOKENS, 20 * STEP_TOKENS), batch_size=8, data_max_bytes=100_000,
                eval_every=5, ckpt_every=4, threads=1, val_windows=16, warmup=2)
    return TrainConfig(**{**base, **kw})


def run(tmp_path, arch="smelt", name="r", **kw):
    return train(get_config(TIER, arch), tiny(**kw), tier=TIER, run_name=name, runs_dir=tmp_path / "runs")


def strip(records):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in records]


def test_run_folder_contents(tmp_path):
    doc = run(tmp_path)
    rd = tmp_path / "runs" / "r"
    final = runlog.read_json(rd / "final.json")
    assert final["complete"] and final["run"] == "r" and final["arch"] == "smelt" and final["tier"] == TIER
    cfg = get_config(TIER, "smelt")
    acc = costs(cfg)
    assert [p["D"] for p in final["points"]] == [10 * STEP_TOKENS, 20 * STEP_TOKENS]
    for p in final["points"]:
        assert p["N"] == acc.active_params and p["proxy"] is True
        assert p["flops"] == acc.flops_per_token * p["D"]
        assert p["non_embedding_params"] == acc.non_embedding_params and p["total_params"] == acc.total_params
        assert 0 < p["loss"] < 7 and p["val_bpb"] > 0
    assert final["points"][1]["loss"] < final["points"][0]["loss"]
    assert doc["points"] == final["points"]

    meta = runlog.read_json(rd / "config.json")
    assert meta["model"] == cfg.to_dict() and meta["accounting"] == acc.to_dict()
    assert meta["seed"] == 0 and meta["env"]["threads"] == 1 and "torch" in meta["env"]
    assert {s["name"] for s in meta["data"]["sources"]} == {"shakespeare", "stdlib"}
    assert meta["code"]["version"] and "git_commit" in meta["code"]

    lines = read_jsonl_rows(rd / "metrics.jsonl")
    # trunk 20 steps + the 10-step budget's 2-step cooldown branch
    assert [r["iter"] for r in lines] == list(range(1, 23))
    branch = [r for r in lines if r["branch"] == 0]
    assert [r["step"] for r in branch] == [9, 10] and branch[-1]["budget_index"] == 0
    assert [r["step"] for r in lines if r["branch"] is None] == list(range(1, 21))
    assert all(r["lr"] < 3e-3 for r in branch)
    # periodic evals at trunk steps 5, 10, 15 and at both budget ends
    evals = [(r["branch"], r["step"]) for r in lines if "val_loss" in r]
    assert evals == [(None, 5), (0, 10), (None, 10), (None, 15), (None, 20)]
    for key in ("train_loss", "aux_loss", "z_loss", "lr", "tokens", "tokens_per_s"):
        assert all(key in r for r in lines)
    # the run is finished: its last checkpoint lives with the run, the branch point was cleaned up
    assert sorted(p.name for p in (rd / "checkpoints").iterdir()) == [f"iter-{22:09d}"]


def test_branch_equals_standalone_run_and_runs_reproduce(tmp_path):
    """A cooldown branch is exactly the run a single-budget job would make (CPU, 1 thread)."""
    both = run(tmp_path, name="both")
    alone = run(tmp_path, name="alone", tokens=(10 * STEP_TOKENS,))
    assert alone["points"][0]["loss"] == both["points"][0]["loss"]
    assert alone["points"][0]["train_loss"] == both["points"][0]["train_loss"]
    run(tmp_path, name="again")
    a = strip(read_jsonl_rows(tmp_path / "runs" / "both" / "metrics.jsonl"))
    b = strip(read_jsonl_rows(tmp_path / "runs" / "again" / "metrics.jsonl"))
    assert a == b


def test_cosine_and_accumulation(tmp_path):
    doc = run(tmp_path, arch="baseline", name="cos", tokens=(12 * STEP_TOKENS,), schedule="cosine",
              micro_batch_size=4, eval_every=0)
    lines = read_jsonl_rows(tmp_path / "runs" / "cos" / "metrics.jsonl")
    assert len(lines) == 12 and all(r["branch"] is None for r in lines)
    assert lines[-1]["lr"] == pytest.approx(3e-3 * (0.1 + 0.9 * 0.5 * (1 + __import__("math").cos(
        __import__("math").pi * 9 / 10))))
    meta = runlog.read_json(tmp_path / "runs" / "cos" / "config.json")
    assert meta["resolved"]["grad_accum_steps"] == 2
    assert doc["complete"] and len(doc["points"]) == 1


def test_resume_guards_and_final_weights(tmp_path):
    run(tmp_path, name="w", tokens=(6 * STEP_TOKENS,))
    with pytest.raises(UserError, match="already holds a run"):
        run(tmp_path, name="w", tokens=(6 * STEP_TOKENS,))
    # resuming a complete run returns its result without training
    kw = dict(tier=TIER, run_name="w", runs_dir=tmp_path / "runs")
    cfg = get_config(TIER, "smelt")
    before = read_jsonl_rows(tmp_path / "runs" / "w" / "metrics.jsonl")
    doc = train(cfg, tiny(tokens=(6 * STEP_TOKENS,)), resume=True, save_final_weights=True, **kw)
    assert doc["complete"] and read_jsonl_rows(tmp_path / "runs" / "w" / "metrics.jsonl") == before
    from safetensors.torch import load_file

    from scaling.training.model.transformer import MoETransformer

    weights = load_file(tmp_path / "runs" / "w" / "final_weights.safetensors")
    model = MoETransformer(cfg)
    model.load_state_dict(weights)
    assert set(weights) == set(model.state_dict())
    with pytest.raises(UserError, match="different configuration"):
        train(cfg, tiny(tokens=(6 * STEP_TOKENS,), lr=1e-3), resume=True, **kw)
    with pytest.raises(UserError, match="exclude each other"):
        train(cfg, tiny(tokens=(6 * STEP_TOKENS,)), resume=True, overwrite=True, **kw)
    doc = train(cfg, tiny(tokens=(6 * STEP_TOKENS,), lr=1e-3), overwrite=True, **kw)
    assert runlog.read_json(tmp_path / "runs" / "w" / "config.json")["train"]["lr"] == 1e-3


def test_overwrite_deletes_only_the_old_runs_own_checkpoints(tmp_path):
    """config.json is user data: a run id edited into a path, or a checkpoint folder that holds a
    user's file, must not make --overwrite delete anything outside the run's own checkpoints."""
    cfg = get_config(TIER, "baseline")
    kw = dict(tier=TIER, run_name="o", runs_dir=tmp_path / "runs", ckpt_dir=tmp_path / "ckpt")
    short = tiny(tokens=(4 * STEP_TOKENS,), ckpt_every=2)
    doc = train(cfg, short, **kw)
    config = tmp_path / "runs" / "o" / "config.json"
    victim = tmp_path / "victim"
    (victim / "iter-000000001").mkdir(parents=True)
    (victim / "iter-000000001" / "precious").write_text("x")
    meta = runlog.read_json(config)
    meta["run_id"] = "x/../../victim"  # <ckpt>/o-x/../../victim is <tmp>/victim
    (tmp_path / "ckpt" / "o-x").mkdir()
    runlog.write_json(config, meta)
    with pytest.raises(UserError, match="run id"):
        train(cfg, short, resume=True, **kw)
    train(cfg, short, overwrite=True, **kw)
    assert (victim / "iter-000000001" / "precious").read_text() == "x"
    again = train(cfg, short, overwrite=True, **kw)
    assert (tmp_path / "ckpt").is_dir() and doc["ckpt_dir"] != again["ckpt_dir"]
    # the previous run's folder with a user's file in it: kept; a clean one: deleted
    ckpt = runlog.read_json(config)["ckpt_dir"]
    (tmp_path / "ckpt" / ckpt.rsplit("/", 1)[-1] / "notes.txt").write_text("mine")
    train(cfg, short, overwrite=True, **kw)
    assert (tmp_path / "ckpt" / ckpt.rsplit("/", 1)[-1] / "notes.txt").read_text() == "mine"
    last = runlog.read_json(config)["ckpt_dir"]
    train(cfg, short, overwrite=True, **kw)
    assert not (tmp_path / "ckpt" / last.rsplit("/", 1)[-1]).exists()


def test_overwrite_interrupted_while_deleting_is_finished_by_the_same_command(tmp_path, monkeypatch):
    """Killed inside --overwrite's deletions (here: an error raised from the checkpoint deletion), the
    folder still holds the old run's config.json, so the same --overwrite command finishes; before,
    config.json went first and the leftover checkpoints made a folder that no command accepted."""
    import shutil

    cfg = get_config(TIER, "baseline")
    kw = dict(tier=TIER, run_name="k", runs_dir=tmp_path / "runs")
    short = tiny(tokens=(4 * STEP_TOKENS,), ckpt_every=2)
    train(cfg, short, **kw)
    real = shutil.rmtree

    def dies(path, *a, **k):
        if "checkpoints" in str(path) or "iter-" in str(path):
            raise KeyboardInterrupt("killed")
        return real(path, *a, **k)

    monkeypatch.setattr(shutil, "rmtree", dies)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, short, overwrite=True, **kw)
    monkeypatch.setattr(shutil, "rmtree", real)
    assert (tmp_path / "runs" / "k" / "config.json").exists()
    doc = train(cfg, short, overwrite=True, **kw)
    assert doc["complete"]


def test_param_groups_skip_embedding_and_gains():
    from scaling.training.model.transformer import MoETransformer

    model = MoETransformer(get_config(TIER, "baseline"))
    decay, no_decay = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    no = {names[id(p)] for p in no_decay["params"]}
    assert "embed.weight" in no and all(n == "embed.weight" or n.endswith("norm.weight") for n in no)
    assert "lm_head.weight" in {names[id(p)] for p in decay["params"]}
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


@pytest.mark.parametrize("args, message", [
    (["--tier", "proxy-huge", "--arch", "smelt", "--tokens", "1e4"], "'proxy-huge' is not one of"),
    (["--tier", TIER, "--arch", "dense", "--tokens", "1e4"], "'dense' is not one of 'baseline', 'smelt'"),
    (["--tier", TIER, "--arch", "smelt", "--tokens", "100"], "below one optimizer step"),
    (["--tier", TIER, "--arch", "smelt", "--tokens", "1e4", "--runs-dir", "/proc/nope"], "not writable"),
    (["--tier", TIER, "--arch", "smelt", "--tokens", "1e4,x"], "comma-separated"),
])
def test_cli_errors_are_one_line_exit_2(args, message, tmp_path):
    from cli import app

    res = CliRunner().invoke(app, ["train", *args, "--data-max-bytes", "100000"])
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert err.startswith("error:") and message in err and "\n" not in err


def test_cli_json_and_existing_run(tmp_path):
    from cli import app

    args = [
        "train",
        "--tier",
        TIER,
        "--arch",
        "baseline",
        "--tokens",
        str(4 * STEP_TOKENS),
        "--batch-size",
        "8",
        "--data-max-bytes",
        "100000",
        "--runs-dir",
        str(tmp_path / "runs"),
        "--ckpt-dir",
        str(tmp_path / "ckpt"),
        "--threads",
        "1",
        "--val-windows",
        "8",
        "--json",
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["complete"] and doc["run"] == f"{TIER}-baseline-2.048k-s0" and len(doc["points"]) == 1
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and "--resume" in res.stderr and "--overwrite" in res.stderr
    res = CliRunner().invoke(app, args + ["--resume"])
    assert res.exit_code == 0 and json.loads(res.stdout)["points"] == doc["points"]


def test_a_refused_checkpoint_folder_leaves_no_run_behind(tmp_path):
    """A --ckpt-dir that is a file, or whose run folder holds another run's checkpoints, is refused
    before config.json is written: the same command with a good folder then starts, no --overwrite."""
    cfg = get_config(TIER, "baseline")
    short = tiny(tokens=(4 * STEP_TOKENS,))
    (tmp_path / "file").write_text("x")
    kw = dict(tier=TIER, run_name="c", runs_dir=tmp_path / "runs")
    with pytest.raises(UserError, match="not writable"):
        train(cfg, short, ckpt_dir=tmp_path / "file", **kw)
    assert not (tmp_path / "runs" / "c" / "config.json").exists()
    other = tmp_path / "runs" / "c" / "checkpoints" / "iter-000000002"
    other.mkdir(parents=True)          # another run's checkpoint where this run's default would go
    with pytest.raises(UserError, match="already holds checkpoints"):
        train(cfg, short, **kw)
    assert not (tmp_path / "runs" / "c" / "config.json").exists()
    assert train(cfg, short, ckpt_dir=tmp_path / "ckpt", **kw)["complete"]


def test_overwrite_in_the_run_folder_keeps_what_it_did_not_write(tmp_path):
    """Default layout (<run>/checkpoints): --overwrite replaces the run's own files, checkpoints and
    analyses, keeps a user's files (also inside weights/ and checkpoints/), and refuses before
    deleting anything when a checkpoint of another run sits where this run's would go."""
    cfg = get_config(TIER, "baseline")
    kw = dict(tier=TIER, run_name="o", runs_dir=tmp_path / "runs")
    short = tiny(tokens=(4 * STEP_TOKENS,), ckpt_every=2)
    rd = tmp_path / "runs" / "o"
    train(cfg, short, save_budget_weights=True, **kw)
    (rd / "checkpoints" / ".DS_Store").write_text("x")
    (rd / "checkpoints" / "notes.txt").write_text("mine")
    (rd / "weights" / "model_v1.bin").write_text("mine")
    (rd / "analysis").mkdir()
    (rd / "analysis" / "lengths.json").write_text("{}")       # an analysis of the replaced model
    first_id = runlog.read_json(rd / "config.json")["run_id"]
    train(cfg, short, overwrite=True, **kw)
    assert runlog.read_json(rd / "config.json")["run_id"] != first_id
    assert (rd / "checkpoints" / "notes.txt").read_text() == "mine"
    assert (rd / "checkpoints" / ".DS_Store").exists()
    assert (rd / "weights" / "model_v1.bin").read_text() == "mine"
    assert not (rd / "analysis").exists() and not (rd / "weights" / "budget-0.safetensors").exists()
    foreign = rd / "checkpoints" / "iter-000000099"
    foreign.mkdir()
    (foreign / "meta.json").write_text(json.dumps({"run_id": "0123456789ab"}))
    before = sorted(p.relative_to(rd) for p in rd.rglob("*"))
    with pytest.raises(UserError, match="not the overwritten run's \\(iter-000000099\\)"):
        train(cfg, short, overwrite=True, **kw)
    assert sorted(p.relative_to(rd) for p in rd.rglob("*")) == before


def test_results_without_a_config_are_not_a_run_to_replace(tmp_path):
    """A folder holding final.json or weights but no config.json was not made by this trainer:
    neither a plain start nor --overwrite writes over or deletes them."""
    cfg = get_config(TIER, "baseline")
    rd = tmp_path / "runs" / "photos"
    (rd / "weights").mkdir(parents=True)
    (rd / "weights" / "budget-0.safetensors").write_text("precious")
    (rd / "final.json").write_text('{"mine": 1}')
    for flags in ({}, {"overwrite": True}):
        with pytest.raises(UserError, match="holds final.json, weights but no config.json"):
            train(cfg, tiny(tokens=(4 * STEP_TOKENS,)), tier=TIER, run_name="photos",
                  runs_dir=tmp_path / "runs", save_budget_weights=True, **flags)
    assert (rd / "final.json").read_text() == '{"mine": 1}'
    assert (rd / "weights" / "budget-0.safetensors").read_text() == "precious"


def test_run_files_of_the_wrong_shape_are_one_line_errors(tmp_path):
    """config.json and metrics.jsonl are user data: a list for a config, a list for its train table
    or a text iter is refused in one line on resume (never a traceback); --overwrite replaces them."""
    cfg = get_config(TIER, "baseline")
    kw = dict(tier=TIER, run_name="w", runs_dir=tmp_path / "runs")
    short = tiny(tokens=(4 * STEP_TOKENS,), ckpt_every=2)
    rd = tmp_path / "runs" / "w"
    train(cfg, short, **kw)
    good = (rd / "config.json").read_text()
    wrong_train = good.replace('"train": {', '"train": [1], "x": {', 1)
    for text, message in (("[1, 2]", "the whole file"), (wrong_train, "wrong type: train")):
        (rd / "config.json").write_text(text)
        with pytest.raises(UserError, match=message):
            train(cfg, short, resume=True, **kw)
    (rd / "config.json").write_text("[1, 2]")
    # with no readable run id nothing proves the checkpoints are the overwritten run's: kept, refused
    with pytest.raises(UserError, match="not the overwritten run's"):
        train(cfg, short, overwrite=True, **kw)
    import shutil

    shutil.rmtree(rd / "checkpoints")
    assert train(cfg, short, overwrite=True, **kw)["complete"]
    from scaling.training.loop.metrics import resume_metrics

    (rd / "metrics.jsonl").write_text('{"iter": 1, "tokens": 512}\n{"iter": "x", "tokens": 512}\n')
    with pytest.raises(UserError, match="record 2 holds iter = 'x', not a number"):
        resume_metrics(rd / "metrics.jsonl", 1)
