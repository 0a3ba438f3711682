"""Export and downstream evaluation (issue 28): weights at every budget, the exact unrolled-Mixtral
export, the native lm-eval model against lm-eval's hf backend, offline tasks end to end, local
pass@k and the loss->accuracy calibration.

Two proxy-tiny runs (Baseline and SMELT, two budgets each, ~100 kB corpus) are trained once for
the module. lm-eval, transformers and accelerate are test dependencies, so nothing here skips.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from scaling.accounting.tiers import get_config
from scaling.cli import app
from scaling.common.errors import UserError
from scaling.evaluation.code_eval import pass_at_k, pass_at_k_estimate, run_program
from scaling.evaluation.export import export_run, write_hf_folder
from scaling.evaluation.weights import available_budgets, load_weights, resolve_weights
from scaling.fitting.calibration import acc_sigmoid, calibrate, fit_acc_sigmoid
from scaling.training import runlog
from scaling.training.loop.trainer import TrainConfig, train

STEP = 8 * 64  # batch 8 x seq_len 64 of proxy-tiny
runner = CliRunner()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{arch: run folder} of two tiny runs with weights at both budgets (the SMELT one also with
    its final weights)."""
    root = tmp_path_factory.mktemp("eval")
    old_threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:    # SMELT_CACHE back as it was after the module
        mp.setenv("SMELT_CACHE", str(tmp_path_factory.getbasetemp() / "smelt-cache"))
        try:
            for arch in ("baseline", "smelt"):
                cfg = TrainConfig(tokens=(4 * STEP, 8 * STEP), batch_size=8, data_max_bytes=100_000,
                                  eval_every=0, ckpt_every=100, threads=1, val_windows=8, warmup=2)
                train(get_config("proxy-tiny", arch), cfg, tier="proxy-tiny", run_name=arch, runs_dir=root,
                      save_budget_weights=True, save_final_weights=arch == "smelt")
            torch.set_num_threads(1)  # tiny tensors: more threads only contend (2 shared cores)
            yield {arch: root / arch for arch in ("baseline", "smelt")}
        finally:
            torch.set_num_threads(old_threads)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Hand-written items in the Hub layouts: ARC (multiple choice), HumanEval (generation) and a
    text task (one document longer than the 64-token context, so rolling windows are exercised)."""
    d = tmp_path_factory.mktemp("tasks")
    arc = [
        {
            "id": "q1",
            "question": "Which of these is a colour?",
            "choices": {"text": ["red", "seven", "quickly"], "label": ["A", "B", "C"]},
            "answerKey": "A",
        },
        {
            "id": "q2",
            "question": "What do plants need to grow?",
            "choices": {"text": ["plastic", "sunlight", "noise", "iron"], "label": ["A", "B", "C", "D"]},
            "answerKey": "B",
        },
        {
            "id": "q3",
            "question": "How many legs has a spider?",
            "choices": {"text": ["two", "six", "eight"], "label": ["1", "2", "3"]},
            "answerKey": "3",
        },
    ]
    humaneval = [
        {
            "task_id": "t/0",
            "prompt": "def add(a, b):\n",
            "canonical_solution": "    return a + b\n",
            "test": "def check(f):\n    assert f(2, 3) == 5\n",
            "entry_point": "add",
        },
        {
            "task_id": "t/1",
            "prompt": "def double(x):\n",
            "canonical_solution": "    return 2 * x\n",
            "test": "def check(f):\n    assert f(4) == 8\n",
            "entry_point": "double",
        },
    ]
    prose = [
        {
            "text": "To be, or not to be, that is the question: whether 'tis nobler in the mind to "
            "suffer the slings and arrows of outrageous fortune, or to take arms against a sea "
            "of troubles, and by opposing end them."
        },
        {"text": "def add(a, b):\n    return a + b\n"},
    ]
    for name, rows in (("arc_easy", arc), ("humaneval", humaneval), ("prose", prose)):
        (d / name).mkdir()
        (d / name / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


# ----- weights at every budget --------------------------------------------------------------


def test_budget_weights_are_written_and_resolved(runs):
    smelt = runs["smelt"]
    assert available_budgets(smelt) == [0, 1]
    b0, b1 = (load_weights(resolve_weights(smelt, i)) for i in (0, 1))
    final = (smelt / runlog.WEIGHTS).read_bytes()
    from safetensors.torch import load

    # the largest budget's weights are the final weights; the smaller budget's differ
    for k, v in load(final).items():
        assert torch.equal(b1.model.state_dict()[k], v)
    assert not torch.equal(b0.model.layers[0].attn.wqkv.weight, b1.model.layers[0].attn.wqkv.weight)
    points = {p["budget_index"]: p for p in json.loads((smelt / runlog.FINAL).read_text())["points"]}
    assert b0.facts()["D"] == points[0]["D"] and b0.facts()["val_loss"] == points[0]["loss"]
    with pytest.raises(UserError, match="budgets 0..1"):
        resolve_weights(smelt, 2)


# ----- export -----------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["baseline", "smelt"])
def test_export_reloads_as_plain_mixtral(runs, tmp_path, arch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "hf"
    block = export_run(runs[arch], out, budget=0)
    cfg = json.loads((out / "config.json").read_text())
    ours = load_weights(resolve_weights(runs[arch], 0))
    assert cfg["model_type"] == "mixtral" and cfg["num_hidden_layers"] == ours.config.n_layer_passes
    assert (
        cfg["smelt_scale"]["arch"] == arch and cfg["smelt_scale"]["source_weights"]["sha256"] == ours.sha256
    )
    assert cfg.get("experts_implementation") == ("eager" if arch == "smelt" else None)  # d=27 vs d=32
    assert block["loop"]["n_loops"] == ours.config.n_loops
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(out)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 1, 2)
    ids = torch.tensor([tok("def add(a, b):\n    return a + b  # the sum")["input_ids"]])
    assert ids.shape[1] > 8
    with torch.no_grad():
        a, b = ours.model(ids).logits, model(ids).logits
    assert a.abs().max() > 0.1
    assert (a - b).abs().max() <= 1e-5
    # the same model with large random weights (routing and attention far from uniform, logits ~10)
    gen = torch.Generator().manual_seed(5)
    state = {k: v + 0.3 * torch.randn(v.shape, generator=gen) for k, v in ours.model.state_dict().items()}
    ours.model.load_state_dict(state)
    write_hf_folder(tmp_path / "rand", ours.config, state, tokenizer_json=None)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "rand", dtype=torch.float32).eval()
    with torch.no_grad():
        a, b = ours.model(ids).logits, model(ids).logits
    assert a.abs().max() > 2.0
    assert (a - b).abs().max() <= 5e-6 * a.abs().max()  # fp32 rounding, relative to logits of this size


def test_export_from_a_checkpoint_and_bf16(runs, tmp_path):
    from transformers import AutoModelForCausalLM

    ckpt = sorted((runs["smelt"] / "checkpoints").glob("iter-*"))[-1]
    block = export_run(runs["smelt"], tmp_path / "c", checkpoint=ckpt)
    assert block["source_weights"]["kind"] == "checkpoint" and block["D"] == 8 * STEP
    export_run(runs["smelt"], tmp_path / "f")
    from safetensors.torch import load_file

    a, b = load_file(tmp_path / "c" / "model.safetensors"), load_file(tmp_path / "f" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    export_run(runs["smelt"], tmp_path / "h", dtype="bf16")
    m = AutoModelForCausalLM.from_pretrained(tmp_path / "h")
    assert m.dtype == torch.bfloat16


def test_another_runs_checkpoint_is_refused_naming_the_tensor(runs, tmp_path):
    # the twins differ in width: DCP alone says only "CheckpointException ranks:dict_keys([0])"
    ckpt = sorted((runs["smelt"] / "checkpoints").glob("iter-*"))[-1]
    res = runner.invoke(app, ["export", str(runs["baseline"]), "--checkpoint", str(ckpt),
                              "--out", str(tmp_path / "x")])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "does not hold run baseline's model: embed.weight is" in res.stderr
    assert not (tmp_path / "x").exists()


def test_export_refuses_odd_heads_and_bad_input_in_one_line(runs, tmp_path):
    odd = tmp_path / "odd"
    odd.mkdir()
    meta = json.loads((runs["baseline"] / runlog.CONFIG).read_text())
    meta["model"]["head_dim"] = 15  # the paper's SMELT twins have odd heads: partial rotary
    (odd / runlog.CONFIG).write_text(json.dumps(meta))
    res = runner.invoke(app, ["export", str(odd), "--out", str(tmp_path / "x")])
    assert res.exit_code == 2 and "eval --backend native" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "x").exists()
    res = runner.invoke(
        app, ["export", str(runs["baseline"]), "--out", str(tmp_path / "y"), "--budget", "7"]
    )
    assert res.exit_code == 2 and "budgets 0..1" in res.stderr
    (tmp_path / "z").mkdir()
    (tmp_path / "z" / "keep").write_text("x")
    res = runner.invoke(app, ["export", str(runs["baseline"]), "--out", str(tmp_path / "z")])
    assert res.exit_code == 2 and (tmp_path / "z" / "keep").exists()
    res = runner.invoke(app, ["export", str(runs["baseline"]), "--out", str(tmp_path / "ok"), "--json"])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)  # docs/json.md
    assert list(doc) == ["schema", "out", "smelt_scale"] and doc["schema"] == "smelt-scale.export/1"


def test_export_overwrite_replaces_only_a_previous_export(runs, tmp_path):
    """--overwrite never deletes what export did not write: the run itself, the runs root, a folder
    with a user's file; it does replace a previous export, keeping one complete export throughout."""
    run = runs["baseline"]
    before = sorted(p.relative_to(run.parent) for p in run.parent.rglob("*"))
    for target in (run, run.parent):
        res = runner.invoke(app, ["export", str(run), "--out", str(target), "--overwrite"])
        assert res.exit_code == 2 and "not a previous export" in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1
    assert sorted(p.relative_to(run.parent) for p in run.parent.rglob("*")) == before
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text('{"my": "model"}')  # a config.json, but not an export's
    res = runner.invoke(app, ["export", str(run), "--out", str(mine), "--overwrite"])
    assert res.exit_code == 2 and (mine / "config.json").read_text() == '{"my": "model"}'
    out = tmp_path / "hf"
    export_run(run, out, budget=0)
    first = json.loads((out / "config.json").read_text())["smelt_scale"]["budget"]
    res = runner.invoke(app, ["export", str(run), "--out", str(out)])
    assert res.exit_code == 2 and "--overwrite" in res.stderr
    res = runner.invoke(app, ["export", str(run), "--out", str(out), "--overwrite"])
    assert res.exit_code == 0, res.stderr
    assert (first, json.loads((out / "config.json").read_text())["smelt_scale"]["budget"]) == (0, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "mine"]  # no temporary left over
    (out / "model.safetensors").unlink()
    (out / "model.safetensors").mkdir()            # a folder of an export file's name: not an export's
    (out / "model.safetensors" / "mine").write_text("x")
    res = runner.invoke(app, ["export", str(run), "--out", str(out), "--overwrite"])
    assert res.exit_code == 2 and (out / "model.safetensors" / "mine").exists()
    res = runner.invoke(app, ["export", str(run), "--out", str(run / "hf")])   # read as a run by fit
    assert res.exit_code == 2 and "inside the run folder" in res.stderr and not (run / "hf").exists()


# ----- evaluation -------------------------------------------------------------------------


def _rows(rows, **match):
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def test_native_and_hf_backends_agree_on_bits_per_byte(runs, data):
    from scaling.evaluation.run import EvalSettings, evaluate_runs

    got = {}
    for backend in ("native", "hf"):
        s = EvalSettings(tasks=("prose",), data=data, backend=backend, budgets=(0,), device="cpu")
        got[backend] = {r["metric"]: r["value"] for r in evaluate_runs([runs["smelt"]], s)}
    bpb = got["native"]["bits_per_byte"]
    assert 1.0 < bpb < 20.0
    assert abs(bpb - got["hf"]["bits_per_byte"]) <= 1e-6
    assert abs(got["native"]["bpb_gold"] - bpb) <= 1e-9  # the gold answer of a text task is its text


def test_eval_cli_multiple_choice_and_generation_offline(runs, data, tmp_path):
    out = tmp_path / "table.csv"
    args = [
        "eval",
        str(runs["baseline"]),
        str(runs["smelt"]),
        "--tasks",
        "arc_easy,humaneval",
        "--data",
        str(data),
        "--budget",
        "all",
        "--device",
        "cpu",
        "--out",
        str(out),
        "--json",
    ]
    res = runner.invoke(app, args[:-3])  # without --allow-code-execution: refused before any work
    assert res.exit_code == 2 and "--allow-code-execution" in res.stderr
    res = runner.invoke(app, [*args, "--allow-code-execution"])
    assert res.exit_code == 0, res.stderr
    assert res.stderr == ""  # --json: nothing besides the document; no third-party progress bars
    doc = json.loads(res.stdout)
    assert list(doc) == ["schema", "rows"] and doc["schema"] == "smelt-scale.eval/1"
    rows = doc["rows"]
    import pandas as pd

    table = pd.read_csv(out)
    assert len(table) == len(rows)
    for arch, run in runs.items():
        points = {p["budget_index"]: p for p in json.loads((run / runlog.FINAL).read_text())["points"]}
        for b in (0, 1):
            mine = _rows(rows, run=arch, budget_index=b)
            metrics = {(r["task"], r["metric"]) for r in mine}
            assert metrics == {
                ("arc_easy", "acc"),
                ("arc_easy", "acc_norm"),
                ("arc_easy", "bpb_gold"),
                ("humaneval", "pass@1"),
                ("humaneval", "bpb_gold"),
            }
            for r in mine:
                assert (r["N"], r["D"], r["loss"]) == (points[b]["N"], points[b]["D"], points[b]["loss"])
                assert r["n"] == (3 if r["task"] == "arc_easy" else 2)
            assert _rows(mine, metric="pass@1")[0]["value"] == 0.0  # a 100-step proxy writes no programs
    # the gold answer's bits per byte, recomputed here from the model's own forward
    loaded = load_weights(resolve_weights(runs["smelt"], 1))
    from tokenizers import Tokenizer

    from scaling.evaluation.weights import tokenizer_file

    tok = Tokenizer.from_file(str(tokenizer_file(runs["smelt"], loaded.meta, loaded.model)))
    items = [
        ("Which of these is a colour?", "red"),
        ("What do plants need to grow?", "sunlight"),
        ("How many legs has a spider?", "eight"),
    ]
    bits = nbytes = 0.0
    for q, a in items:
        ctx = tok.encode(f"Question: {q}\nAnswer:").ids
        whole = tok.encode(f"Question: {q}\nAnswer: {a}").ids
        cont = whole[len(ctx) :]
        with torch.no_grad():
            logp = torch.log_softmax(loaded.model(torch.tensor([whole[:-1]])).logits[0].float(), -1)
        bits -= sum(float(logp[len(ctx) - 1 + i, t]) for i, t in enumerate(cont)) / math.log(2)
        nbytes += len(f" {a}".encode())
    got = _rows(rows, run="smelt", budget_index=1, task="arc_easy", metric="bpb_gold")[0]["value"]
    assert abs(got - bits / nbytes) < 1e-5


def test_eval_outside_a_git_checkout_prints_no_git_error(runs, data, tmp_path, monkeypatch, capfd):
    """lm-eval runs `git describe` in the working directory; outside a checkout git wrote
    "fatal: not a git repository" straight to file descriptor 2. The probe is skipped."""
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["eval", str(runs["baseline"]), "--tasks", "arc_easy", "--data", str(data),
                              "--device", "cpu"])
    assert res.exit_code == 0, res.stderr
    assert "fatal" not in capfd.readouterr().err


def test_held_lm_eval_output_is_shown_when_evaluation_fails(capsys):
    from scaling.evaluation.run import _quiet_lm_eval

    with pytest.raises(RuntimeError), _quiet_lm_eval():
        print("lm-eval said why", file=sys.stderr)
        raise RuntimeError("boom")
    assert "lm-eval said why" in capsys.readouterr().err
    with pytest.raises(UserError), _quiet_lm_eval():
        print("progress bar", file=sys.stderr)
        raise UserError("one line")
    assert "progress bar" not in capsys.readouterr().err


def test_eval_errors_are_one_line(runs, data, tmp_path):
    base = ["eval", str(runs["smelt"]), "--data", str(data), "--device", "cpu"]
    for extra, message in (
        (["--tasks", "nope"], "no folder"),
        (["--tasks", "prose", "--backend", "x"], "backend"),
        (["--tasks", "prose", "--budget", "a,b"], "--budget"),
        (["--tasks", "prose", "--out", str(tmp_path / "t.txt")], ".csv"),
        (["--tasks", "prose", "--out", str(runs["smelt"] / "config.json"), "--force"], "is an input"),
        (["--tasks", "prose", "--out", str(data / "prose" / "test.jsonl"), "--force"], "is an input"),
    ):
        res = runner.invoke(app, base + extra)
        assert res.exit_code == 2 and message in res.stderr and len(res.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("task, record, message", [
    ("humaneval", {"task_id": "t/0", "prompt": "def f():\n", "canonical_solution": "  return 1\n",
                   "test": "def check(f): pass\n"}, "needs field 'entry_point' (str); missing"),
    ("mbpp", {"text": "x", "code": "y", "test_list": ["assert 1"]}, "needs 3 tests"),
    ("arc_easy", {"question": "q", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, "answerKey": "C"},
     "answerKey 'C' is not one of the choice labels"),
    ("mmlu_anatomy", {"question": "q", "choices": ["a", "b"], "answer": 0}, "needs 4 choices"),
    ("arc_easy", {"question": "q", "choices": ["a", "b"], "answerKey": "A"}, "needs field 'choices' (dict)"),
    ("prose", {"text": 5}, "needs field 'text' (str); int"),
    ("prose", ["not", "an", "object"], "must be a JSON object"),
])
def test_task_data_that_does_not_fit_the_task_is_one_line(runs, tmp_path, task, record, message):
    """Bad task data is refused when the task is resolved, naming file and line: never an exception
    from inside lm-eval's templates (and before any model is loaded)."""
    (tmp_path / task).mkdir()
    good = {"prose": {"text": "fine"}}.get(task)
    lines = [json.dumps(good)] if good else []
    (tmp_path / task / "test.jsonl").write_text("\n".join([*lines, json.dumps(record)]) + "\n")
    res = runner.invoke(app, ["eval", str(runs["smelt"]), "--data", str(tmp_path), "--tasks", task,
                              "--device", "cpu"])
    assert res.exit_code == 2 and message in res.stderr, res.output
    assert len(res.stderr.strip().splitlines()) == 1
    assert f"test.jsonl:{len(lines) + 1}" in res.stderr


def test_eval_and_export_help_import_no_lm_eval():
    probe = (
        "import sys\nfrom scaling.cli import app\n"
        "for args in (['eval', '--help'], ['export', '--help'], ['calibrate', '--help']):\n"
        "    try:\n        app(args)\n    except SystemExit:\n        pass\n"
        "heavy = ('lm_eval', 'transformers', 'datasets', 'torch')\n"
        "print('imported:', *[m for m in heavy if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "imported:"


# ----- pass@k -----------------------------------------------------------------------------


def test_pass_at_k_on_known_programs():
    assert pass_at_k_estimate(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k_estimate(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k_estimate(3, 3, 2) == 1.0
    good, bad = "def add(a, b):\n    return a + b\n", "def add(a, b):\n    return a - b\n"
    test = "assert add(2, 3) == 5"
    assert run_program(good + test) and not run_program(bad + test)
    assert not run_program("while True:\n    pass\n", timeout=1.0)  # killed at its timeout
    assert not run_program("import sys\nsys.exit(3)\n")
    res = pass_at_k([test, test], [[good, bad], [bad, bad]], k=(1, 2))
    assert res == {"pass@1": pytest.approx((0.5 + 0.0) / 2), "pass@2": pytest.approx((1.0 + 0.0) / 2)}


# ----- calibration ------------------------------------------------------------------------


def test_acc_sigmoid_recovers_a_known_sigmoid():
    rng = np.random.default_rng(0)
    L = np.linspace(2.0, 5.0, 24)
    truth = dict(floor=0.25, k=3.0, L0=3.2)
    acc = acc_sigmoid(L, **truth) + rng.normal(0, 0.003, L.size)
    fixed = fit_acc_sigmoid(L, acc, floor=0.25)
    assert (
        fixed.identified
        and fixed.k == pytest.approx(3.0, rel=0.05)
        and fixed.L0 == pytest.approx(3.2, abs=0.02)
    )
    free = fit_acc_sigmoid(L, acc)
    assert free.floor == pytest.approx(0.25, abs=0.01) and free.k == pytest.approx(3.0, rel=0.08)
    # a candidate 0.04 above the curve at its own losses: the residual and an interval around it
    Lc = np.linspace(2.3, 4.5, 10)
    res = calibrate(
        L, acc, Lc, acc_sigmoid(Lc, **truth) + 0.04 + rng.normal(0, 0.003, Lc.size), floor=0.25, n_boot=200
    )
    assert res.residual == pytest.approx(0.04, abs=0.005) and res.residual_lo < 0.04 < res.residual_hi
    assert res.residual_lo > 0.02
    # everything at chance (a proxy): said to be unidentified
    flat = calibrate(L, np.full(L.size, 0.25), Lc, np.full(Lc.size, 0.25), floor=0.25, n_boot=20)
    assert not flat.fit.identified and flat.notes


def test_calibrate_cli_reads_an_eval_table(tmp_path):
    L = np.linspace(2.7, 5.0, 12)  # accuracies below 0.9, so +0.02 stays an accuracy
    rows = [
        {
            "run": f"b{i}",
            "arch": "baseline",
            "budget_index": 0,
            "loss": x,
            "task": "mmlu_x",
            "metric": "acc",
            "value": float(acc_sigmoid(x, 0.25, 3.0, 3.2)),
        }
        for i, x in enumerate(L)
    ]
    rows += [
        {
            "run": f"s{i}",
            "arch": "smelt",
            "budget_index": 0,
            "loss": x,
            "task": "mmlu_x",
            "metric": "acc",
            "value": float(acc_sigmoid(x, 0.25, 3.0, 3.2)) + 0.02,
        }
        for i, x in enumerate(L[::3])
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = runner.invoke(
        app, ["calibrate", str(path), "--task", "mmlu_x", "--floor", "0.25", "--bootstrap", "50", "--json"]
    )
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["residual"] == pytest.approx(0.02, abs=1e-4) and doc["fit"]["identified"]
    assert list(doc) == ["schema", "task", "metric", "reference", "candidate", "fit", "residual",
                         "residual_lo", "residual_hi", "level", "n_boot", "n_reference", "n_candidate",
                         "points", "notes"]
    res = runner.invoke(app, ["calibrate", str(path), "--task", "nope"])
    assert res.exit_code == 2 and "no rows" in res.stderr
    res = runner.invoke(app, ["calibrate", str(path), "--task", "mmlu_x", "--floor", "0.25",
                              "--reference", "nope"])
    assert res.exit_code == 2 and "no rows of architecture 'nope'" in res.stderr
    assert "baseline, smelt" in res.stderr
    res = runner.invoke(app, ["calibrate", str(path), "--task", "mmlu_x", "--floor", "0.25",
                              "--x", "run"])
    assert res.exit_code == 2
    assert "column 'run' of the evaluation table holds 'b0', not a number" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_task_files_are_read_as_datasets_reads_them(tmp_path):
    """JSON Lines with raw U+2028/U+0085 inside strings, and JSON Lines in a .json file, are valid
    (datasets reads both); a corrupt parquet file is a one-line error."""
    from scaling.evaluation.tasks import resolve_task

    (tmp_path / "prose").mkdir()
    lines = [json.dumps({"text": t}, ensure_ascii=False) for t in ("a\u2028b", "c\x85d")]
    (tmp_path / "prose" / "test.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert resolve_task("prose", tmp_path).kind == "text"
    (tmp_path / "prose" / "test.jsonl").unlink()
    (tmp_path / "prose" / "test.json").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert resolve_task("prose", tmp_path).kind == "text"
    (tmp_path / "prose" / "test.json").unlink()
    (tmp_path / "prose" / "test.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(UserError, match="not a readable Parquet file"):
        resolve_task("prose", tmp_path)


@pytest.mark.parametrize("task, split, record, message", [
    ("hellaswag", "validation", {"label": 7}, "label 7 is not the index of one of its 4 endings"),
    ("hellaswag", "validation", {"label": ""}, "label '' is not the index"),
    ("hellaswag", "train", {"label": "\u00b2"}, "is not the index"),      # str.isdigit() is True for it
    ("hellaswag", "validation", {"endings": ["only one"]}, "at least two strings"),
    ("hellaswag", "test", {"label": ""}, None),                          # the Hub's unlabelled test split
    ("hellaswag", "validation", {"label": "3"}, None),
    ("piqa", "validation", {"label": 2}, "label 2 must be 0 (sol1) or 1 (sol2)"),
    ("piqa", "validation", {"label": -1}, "must be 0"),
    ("piqa", "test", {"label": -1}, None),
    ("piqa", "train", {"label": 1}, None),
])
def test_gold_labels_outside_the_choices_are_refused(tmp_path, task, split, record, message):
    """lm-eval scores a record whose gold label is not one of its choices as wrong (HellaSwag label 7
    of 4 endings, PIQA -1 in a scored split): a silently lowered accuracy, refused here by value."""
    from scaling.evaluation.tasks import resolve_task

    base = {"hellaswag": {"ctx_a": "a", "ctx_b": "b", "activity_label": "x", "endings": list("wxyz"),
                          "label": 0},
            "piqa": {"goal": "g", "sol1": "s1", "sol2": "s2", "label": 0}}[task]
    (tmp_path / task).mkdir()
    lines = [json.dumps(base), json.dumps({**base, **record})]
    (tmp_path / task / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    if message is None:
        assert resolve_task(task, tmp_path).files[split]
        return
    with pytest.raises(UserError, match=re.escape(message)) as err:
        resolve_task(task, tmp_path)
    assert f"{split}.jsonl:2" in str(err.value)


# ----- audit fixes ------------------------------------------------------------------------


def test_shard_tokenizer_is_checked_against_the_runs_record(tmp_path):
    """A run trained on token shards: the shard folder's tokenizer.json must be the one the run
    and the manifest record (a folder re-prepared, or another BPE copied over, is refused)."""
    from scaling.common.files import sha256_file
    from scaling.evaluation.weights import tokenizer_file
    from scaling.training.data.prepare import PrepareOptions, prepare

    docs = [{"id": f"d{i}", "text": f"def f{i}(x):\n    return x * {i} + {i * i}\n" * 20} for i in range(40)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    man = prepare([str(tmp_path / "in.jsonl")], tmp_path / "shards",
                  PrepareOptions(vocab_size=300, val_fraction=0.2, shard_tokens=5000))
    tok = tmp_path / "shards" / man["tokenizer"]["path"]
    sha = sha256_file(tok)
    meta = {"train": {"data": str(tmp_path / "shards")}, "data_identity": {"tokenizer_sha256": sha}}
    assert tokenizer_file(tmp_path, meta) == tok
    # the run recorded another tokenizer (the folder was re-prepared since): both hashes named
    other = "0" * 64
    with pytest.raises(UserError, match=f"SHA-256 {sha}.*records {other}"):
        tokenizer_file(tmp_path, {**meta, "data_identity": {"tokenizer_sha256": other}})
    # another tokenizer copied over the folder's: differs from the manifest's record
    tok.write_bytes(tok.read_bytes() + b"\n")
    with pytest.raises(UserError, match=f"records {sha}"):
        tokenizer_file(tmp_path, meta)


def test_calibration_at_one_loss_is_not_identified(tmp_path):
    """Six reference points at one loss fix only the curve's height there: not identified, and no
    residual interval is given as a result."""
    L = np.full(6, 3.0)
    acc = np.array([0.40, 0.42, 0.44, 0.46, 0.48, 0.50])
    fit = fit_acc_sigmoid(L, acc, floor=0.25)
    assert not fit.identified and "1 distinct loss value for 2 free parameters" in fit.reason
    # a free floor needs 3 distinct losses: 2 are not enough
    two = fit_acc_sigmoid(np.array([3.0, 3.0, 3.0, 3.5, 3.5, 3.5]), acc)
    assert not two.identified and "2 distinct loss values for 3 free parameters" in two.reason
    res = calibrate(L, acc, np.array([2.5, 2.7]), np.array([0.5, 0.5]), floor=0.25, n_boot=20)
    assert not res.fit.identified and math.isnan(res.residual_lo) and math.isnan(res.residual_hi)
    rows = [{"run": f"b{i}", "arch": "baseline", "budget_index": 0, "loss": 3.0, "task": "t", "metric": "acc",
             "value": v, "stderr": 0.02} for i, v in enumerate(acc)]
    rows += [{"run": f"s{i}", "arch": "smelt", "budget_index": 0, "loss": x, "task": "t", "metric": "acc",
              "value": 0.5, "stderr": 0.02} for i, x in enumerate([2.5, 2.7])]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = runner.invoke(app, ["calibrate", str(path), "--task", "t", "--floor", "0.25", "--bootstrap", "20"])
    assert res.exit_code == 0, res.stderr
    assert "identified: no" in res.stdout and "residual at matched loss: not determined" in res.stdout
    doc = json.loads(runner.invoke(app, ["calibrate", str(path), "--task", "t", "--floor", "0.25",
                                         "--bootstrap", "20", "--json"]).stdout)
    assert doc["residual_lo"] is None and doc["residual_hi"] is None and not doc["fit"]["identified"]


def test_continuations_longer_than_the_context_are_scored_in_pieces(runs, tmp_path):
    """A PIQA solution longer than the 64-token context: both backends score it (in pieces) and
    agree, where lm-eval's hf asserted and the native backend raised."""
    (tmp_path / "piqa").mkdir()
    long_sol = " ".join(f"Turn the lid {i} times, then tap it on the table." for i in range(12))
    recs = [{"goal": "How do I boil water?", "sol1": "Put it in a pot on the stove.",
             "sol2": "Put it in the freezer.", "label": 0},
            {"goal": "How to open a jar?", "sol1": long_sol, "sol2": "Twist the lid.", "label": 1}]
    (tmp_path / "piqa" / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    got = {}
    for backend in ("native", "hf"):
        res = runner.invoke(app, ["eval", str(runs["smelt"]), "--tasks", "piqa", "--data", str(tmp_path),
                                  "--device", "cpu", "--backend", backend, "--json"])
        assert res.exit_code == 0, res.output
        got[backend] = {r["metric"]: r["value"] for r in json.loads(res.stdout)["rows"]}
    assert got["native"]["bpb_gold"] == pytest.approx(got["hf"]["bpb_gold"], rel=1e-4)
    assert got["native"]["acc"] == got["hf"]["acc"]


def test_loglikelihood_in_pieces_sums_the_pieces():
    from scaling.evaluation.lm import continuation_pieces, loglikelihood_in_pieces

    seen = []

    def score(reqs):
        seen.extend(reqs)
        assert all(len(c) <= 8 for _, _, c in reqs)
        return [(-float(len(c)), len(c) != 3) for _, _, c in reqs]

    ctx, cont = list(range(5)), list(range(100, 119))  # 19 tokens, max_length 8: pieces of 4
    out = loglikelihood_in_pieces(score, [("k", ctx, [7, 8]), ("l", ctx, cont)], max_length=8)
    assert out == [(-2.0, True), (-19.0, False)]  # the last piece has 3 tokens: not greedy
    pieces = continuation_pieces(ctx, cont, 8)
    assert [p for _, p in pieces] == [cont[i:i + 4] for i in range(0, 19, 4)]
    assert all(len(c) <= 9 and c[-1] == (ctx + cont)[len(ctx) + 4 * i - 1] for i, (c, _) in enumerate(pieces))


def test_code_bpb_gold_counts_the_bytes_it_scores():
    """lm-eval moves the prompt's trailing newline into the continuation: the bytes must count it.
    Byte tokens each scored ln 2 nats (one bit): the bits per byte is exactly 1."""
    from lm_eval.api.model import TemplateLM

    from scaling.evaluation.run import gold_bpb
    from scaling.evaluation.tasks import LocalTask

    class ByteLM:
        backend = "causal"
        max_length = 64
        prefix_token_id = 0
        _encode_pair = TemplateLM._encode_pair

        def tok_encode(self, s, **kw):
            return list(s.encode())

        def _loglikelihood_tokens(self, reqs, disable_tqdm=False):
            return [(-math.log(2) * len(c), False) for _, _, c in reqs]

    samples = [{"arguments": [[p, {}]], "resps": [[""]], "doc": {"canonical_solution": s}}
               for p, s in (("def add(a, b):\n", "    return a + b\n"),
                            ('def double(x):\n    """Twice x."""\n', "    return 2 * x\n"))]
    task = LocalTask("humaneval", "code", {})
    assert gold_bpb(ByteLM(), task, samples)["value"] == pytest.approx(1.0)


def test_empty_text_duplicate_tasks_and_bad_final_json_are_one_line(runs, tmp_path):
    import shutil

    (tmp_path / "d" / "prose").mkdir(parents=True)
    (tmp_path / "d" / "prose" / "test.jsonl").write_text(json.dumps({"text": ""}) + "\n")
    base = ["eval", str(runs["smelt"]), "--data", str(tmp_path / "d"), "--device", "cpu"]
    res = runner.invoke(app, base + ["--tasks", "prose"])
    assert res.exit_code == 2 and "test.jsonl:1" in res.stderr and 'empty "text"' in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    res = runner.invoke(app, base + ["--tasks", "prose,prose"])
    assert res.exit_code == 2 and "prose more than once" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    bad = tmp_path / "bad"
    shutil.copytree(runs["smelt"], bad, ignore=shutil.ignore_patterns("checkpoints"))
    (bad / "final.json").write_text(json.dumps({"points": [{"budget_index": "x"}]}))
    (tmp_path / "ok" / "prose").mkdir(parents=True)
    (tmp_path / "ok" / "prose" / "test.jsonl").write_text(json.dumps({"text": "fine"}) + "\n")
    for args in (["export", str(bad), "--out", str(tmp_path / "e")],
                 ["eval", str(bad), "--tasks", "prose", "--data", str(tmp_path / "ok"), "--device", "cpu"]):
        res = runner.invoke(app, args)
        assert res.exit_code == 2 and "final.json: point 1 has budget_index 'x'" in res.stderr, res.output
        assert len(res.stderr.strip().splitlines()) == 1


def test_calibrate_refuses_a_table_holding_one_models_score_twice(tmp_path):
    """A table concatenated with itself was fitted as twice the points (6 instead of 3)."""
    import pandas as pd

    table = pd.read_csv("examples/eval-pair/eval.csv")
    pd.concat([table, table]).to_csv(tmp_path / "dup.csv", index=False)
    res = runner.invoke(app, ["calibrate", str(tmp_path / "dup.csv"), "--task", "arc_easy",
                              "--bootstrap", "10"])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "holds arc_easy/acc of run 'proxy-xs-baseline-s0' at budget 0 more than once" in res.stderr
