"""Mechanism analyses on tiny randomly initialised runs saved in the trainer's run-folder format."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from scaling import analysis as an
from scaling.accounting.tiers import get_config
from scaling.analysis.dyck import DyckTask
from scaling.common.errors import UserError
from scaling.training import runlog
from scaling.training.data.corpus import BOS_ID, DataSpec, load_corpus
from scaling.training.model.transformer import MoETransformer

SPEC = DataSpec(vocab_size=512, max_bytes=65536)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Two threads on a loaded 2-core box made a tiny forward pass ~100x slower (spinning).
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("smelt-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SMELT_CACHE", str(path))
        yield path


def write_run(runs_dir, name, arch, seed=0, weights=True, seq_len=None):
    """A run folder as the trainer writes it (config.json keys model/data_spec/data, safetensors)."""
    corpus = load_corpus(SPEC)
    cfg = get_config("proxy-tiny", arch)
    if seq_len is not None:
        cfg = dataclasses.replace(cfg, seq_len=seq_len)
    run_dir = runs_dir / name
    run_dir.mkdir(parents=True)
    meta = {"run": name, "tier": "proxy-tiny", "arch": arch, "model": cfg.to_dict(),
            "data_spec": SPEC.to_dict(), "data": corpus.provenance, "seed": seed}
    runlog.write_json(run_dir / runlog.CONFIG, meta)
    if weights:
        runlog.save_weights(run_dir / runlog.WEIGHTS, MoETransformer(cfg, seed=seed))
    return run_dir


@pytest.fixture(scope="module")
def runs(cache, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return {"baseline": write_run(root, "tiny-baseline", "baseline", seed=1),
            "smelt": write_run(root, "tiny-smelt", "smelt", seed=2),
            "baseline2": write_run(root, "tiny-baseline-2", "baseline", seed=3),
            "noweights": write_run(root, "tiny-noweights", "smelt", weights=False),
            "root": root}


@pytest.fixture(scope="module")
def loaded(runs):
    return {k: an.load_run(runs[k]) for k in ("baseline", "smelt")}


# ----- loading ----------------------------------------------------------------------------

def test_load_run_restores_the_saved_weights(runs, loaded):
    run = loaded["smelt"]
    assert run.arch == "smelt" and run.name == "tiny-smelt" and run.seq_len == 64
    ref = MoETransformer(run.config, seed=2)
    for (k, a), (_, b) in zip(run.model.state_dict().items(), ref.state_dict().items()):
        assert torch.equal(a, b), k
    assert not run.model.training


def test_load_run_errors(runs, tmp_path):
    with pytest.raises(UserError, match="no run folder"):
        an.load_run(tmp_path / "absent")
    with pytest.raises(UserError, match="not a run folder"):
        an.load_run(tmp_path)
    with pytest.raises(UserError, match="has no weights"):
        an.load_run(runs["noweights"])
    # weights of another architecture
    bad = tmp_path / "mixed"
    shutil.copytree(runs["baseline"], bad)
    shutil.copy(runs["smelt"] / runlog.WEIGHTS, bad / runlog.WEIGHTS)
    with pytest.raises(UserError, match="do not fit its config"):
        an.load_run(bad)
    with pytest.raises(UserError, match="needs a smelt run"):
        an.load_run(runs["baseline"]).require("smelt")


def test_a_tokenizer_mismatch_is_a_user_error(runs, tmp_path):
    bad = tmp_path / "othertok"
    shutil.copytree(runs["baseline"], bad)
    meta = json.loads((bad / runlog.CONFIG).read_text())
    meta["data"]["tokenizer"]["sha256"] = "0" * 64
    runlog.write_json(bad / runlog.CONFIG, meta)
    with pytest.raises(UserError, match="trained with tokenizer 000000000000"):
        an.load_run(bad).corpus


def test_eval_data_snapshot_replaces_the_corpus(cli, runs, tmp_path, monkeypatch):
    shipped = tmp_path / "shipped"
    shutil.copytree(runs["smelt"], shipped)
    res = cli("snapshot-data", shipped, "--json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["runs"][0]["bytes"] < 1_000_000
    assert list(json.loads(res.stdout)) == ["schema", "runs"]  # docs/json.md
    ref = an.loss_by_length(an.load_run(runs["smelt"]), n_windows=2)
    an.runs._corpus.cache_clear()
    monkeypatch.setenv("SMELT_CACHE", str(tmp_path / "empty-cache"))  # a fresh machine: no corpus built
    run = an.load_run(shipped)
    assert run.corpus.path == shipped / an.EVAL_DATA
    got = an.loss_by_length(run, n_windows=2)
    assert got.buckets == ref.buckets
    assert not (tmp_path / "empty-cache").exists()


@pytest.mark.parametrize("missing", ["val.npy", "tokenizer.json", "val_offsets.npy", "val_names.json",
                                     "train.npy", "provenance.json", "spec", "sha256"])
def test_a_damaged_snapshot_is_an_error_and_is_kept(cli, runs, tmp_path, missing):
    """Before the fix snapshot-data reported success over such a snapshot (it stopped at provenance.json),
    sink ran without tokenizer.json, and a provenance.json without 'spec' was a KeyError traceback."""
    run = tmp_path / "damaged"
    shutil.copytree(runs["smelt"], run)
    assert cli("snapshot-data", run).exit_code == 0
    snap = run / an.EVAL_DATA
    prov = json.loads((snap / "provenance.json").read_text())
    if missing == "spec":
        del prov["spec"]
    elif missing == "sha256":
        del prov["tokenizer"]["sha256"]
    if missing in ("spec", "sha256"):
        (snap / "provenance.json").write_text(json.dumps(prov))
    else:
        (snap / missing).unlink()
    before = sorted((p.name, p.stat().st_size) for p in snap.iterdir())
    for args in (("snapshot-data", run), ("sink", run, "--sequences", 1, "--no-save")):
        res = cli(*args)
        assert res.exit_code == 2, (args, res.stdout, res.stderr)
        assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1 and res.stdout == ""
        assert missing in res.stderr and "damaged" in res.stderr and "snapshot-data" in res.stderr
    assert sorted((p.name, p.stat().st_size) for p in snap.iterdir()) == before  # nothing deleted


def test_a_snapshot_with_another_tokenizer_file_is_an_error(runs, tmp_path):
    run = tmp_path / "swapped"
    shutil.copytree(runs["smelt"], run)
    an.save_eval_data(run)
    with open(run / an.EVAL_DATA / "tokenizer.json", "a") as fh:
        fh.write(" ")
    with pytest.raises(UserError, match="tokenizer.json has SHA-256"):
        an.save_eval_data(run)


def test_cli_lengths_of_runs_with_different_contexts(cli, runs, tmp_path):
    """Each number under its own bucket: one pair of tables per context (before the fix the T = 128 run's
    [0, 4) position loss sat in the T = 64 row 0-1 and both tables said context 64)."""
    wide = write_run(tmp_path, "tiny-baseline-128", "baseline", seed=4, seq_len=128)
    args = ("lengths", runs["baseline"], wide, "--windows", 2, "--no-save", "--no-gain")
    doc = json.loads(cli(*args, "--json").stdout)
    res = cli(*args)
    assert res.exit_code == 0, res.stderr
    tables = res.stdout.split("Validation loss (nats/token) by ")[1:]
    assert [t.split("\n")[0].rsplit(" ", 1)[1] for t in tables] == ["64", "64", "128", "128"]
    for r in doc["runs"]:
        for b in r["buckets"]:
            if b["loss"] is None:
                continue
            label = an.LossBucket(b["by"], b["lo"], b["hi"], 0, 0, None).label
            table = tables[(0 if r["seq_len"] == 64 else 2) + (b["by"] == "position")]
            row = next(line for line in table.splitlines()
                       if line.count("│") > 1 and line.split("│")[1].strip() == label)
            assert f"{b['loss']:.4f}" in row
    res = cli(*args, "--plot", tmp_path / "mixed.png")
    assert res.exit_code == 2 and "one context" in res.stderr and res.stderr.count("\n") == 1


def test_pair_runs(loaded):
    b, s = an.pair_runs([loaded["smelt"], loaded["baseline"]])
    assert (b.arch, s.arch) == ("baseline", "smelt")
    with pytest.raises(UserError, match="one baseline and one smelt"):
        an.pair_runs([loaded["baseline"], loaded["baseline"]])
    with pytest.raises(UserError, match="one baseline and one smelt"):
        an.pair_runs([loaded["smelt"]])


# ----- attention sink ---------------------------------------------------------------------

def test_attention_rows_sum_to_one_and_looped_layers_have_two_passes(loaded):
    for arch, run in loaded.items():
        ids = torch.randint(3, run.config.vocab_size, (2, 40))
        out = run.model(ids, return_attn=True)
        sched = [(e["layer"], e["pass"]) for e in out.attn]
        assert sched == run.config.schedule()
        for e in out.attn:
            assert torch.allclose(e["probs"].sum(-1), torch.ones(2, run.config.n_heads, 40), atol=1e-5)
        passes = {layer: [p for l2, p in sched if l2 == layer] for layer in range(run.config.n_layers)}
        for layer, ps in passes.items():
            looped = run.config.is_looped and run.config.loop_start <= layer < run.config.loop_end
            assert ps == ([1, 2] if looped else [1]), (arch, layer)
    assert loaded["smelt"].config.is_looped and not loaded["baseline"].config.is_looped


def test_attention_masses_match_a_direct_computation(loaded):
    run = loaded["smelt"]
    torch.manual_seed(0)
    ids = torch.randint(3, 512, (2, 24))
    ids[:, 0] = BOS_ID
    queries = torch.zeros(2, 24, dtype=torch.bool)
    queries[:, 5:9] = True
    bos = torch.zeros_like(queries)
    bos[:, 0] = True
    mid = torch.zeros_like(queries)
    mid[:, 2:4] = True
    sched, sums, n = an.attention_masses(run.model, ids, queries, {"bos": bos, "mid": mid})
    assert n == 8 and sched == run.config.schedule()
    out = run.model(ids, return_attn=True)
    for i, e in enumerate(out.attn):
        p = e["probs"].double().mean(1)[:, 5:9]  # [B, 4 queries, T]
        assert sums["bos"][i] == pytest.approx(float(p[..., 0].sum()), rel=1e-9)
        assert sums["mid"][i] == pytest.approx(float(p[..., 2:4].sum()), rel=1e-9)
        assert sums["other"][i] == pytest.approx(float(p[..., 1].sum() + p[..., 4:].sum()), rel=1e-9)


def test_sink_masses_sum_to_one(loaded):
    for run in loaded.values():
        r = an.attention_sink(run, n_sequences=2, seed=0)
        assert len(r.passes) == run.config.n_layer_passes and r.n_sequences == 2
        for p in r.passes:
            assert 0 <= p.bos_mass <= 1 and p.answer_mass is None
            assert p.bos_mass + p.other_mass == pytest.approx(1.0, abs=1e-6)
        d = an.dyck_sink(run, n_sequences=3, seed=0)
        assert d.probe == "dyck" and d.shots >= 1 and d.result_kind == "sink_dyck"
        for p in d.passes:
            assert p.bos_mass + p.answer_mass + p.other_mass == pytest.approx(1.0, abs=1e-6)
            assert p.answer_mass > 0
    assert [(p.layer, p.pass_) for p in r.passes] == run.config.schedule()


def test_pass_order_aligns_runs_on_layer_and_pass():
    mk = lambda arch, sched: an.SinkResult(arch, arch, "bos", 1, 1, 0,  # noqa: E731
                                           tuple(an.PassMass(l, p, 0.5, 0.5) for l, p in sched))
    base = mk("baseline", [(0, 1), (1, 1), (2, 1), (3, 1)])
    smelt = mk("smelt", [(0, 1), (1, 1), (2, 1), (1, 2), (2, 2), (3, 1)])
    order = [(0, 1), (1, 1), (2, 1), (1, 2), (2, 2), (3, 1)]
    assert an.pass_order([base, smelt]) == an.pass_order([smelt, base]) == order


# ----- loss by length ---------------------------------------------------------------------

def test_bucket_edges_adapt_to_the_context():
    assert an.length_edges(4096) == [1, 256, 512, 1024, 2048, 4097]
    assert an.position_edges(4096) == [0, 128, 256, 512, 1024, 2048, 4096]
    assert an.length_edges(64) == [1, 4, 8, 16, 32, 65]
    assert an.position_edges(64) == [0, 2, 4, 8, 16, 32, 64]
    assert an.position_edges(8) == [0, 1, 2, 4, 8]


def test_position_buckets_average_to_the_window_loss(loaded):
    run = loaded["baseline"]
    r = an.loss_by_length(run, n_windows=4)
    x, y = run.corpus.val_windows(run.seq_len, 4)
    with torch.no_grad():
        ref = float(run.model(torch.as_tensor(x), torch.as_tensor(y)).loss)
    pos = [b for b in r.buckets if b.by == "position"]
    assert sum(b.n_tokens for b in pos) == x.size
    assert sum(b.loss * b.n_tokens for b in pos) / x.size == pytest.approx(ref, rel=1e-5)
    docs = [t for _, t in run.corpus.val_documents() if len(t) >= 2]
    lengths = [b for b in r.buckets if b.by == "length"]
    assert sum(b.n_sequences for b in lengths) == len(docs) == r.n_documents
    assert sum(b.n_tokens for b in lengths) == sum(min(len(t) - 1, run.seq_len) for t in docs)
    assert lengths[-1].hi is None and lengths[0].lo == 1


def _lr(run, arch, losses, tokens):
    b = an.LossBucket("length", 1, None, len(losses), sum(tokens),
                      sum(l * n for l, n in zip(losses, tokens)) / sum(tokens), tuple(losses), tuple(tokens))
    return an.LengthsResult(run, arch, 64, len(losses), 0, (b,))


def test_length_gain_is_paired_and_token_weighted():
    base = _lr("b", "baseline", [3.0, 2.0, 4.0], [10, 30, 60])
    smelt = _lr("s", "smelt", [2.5, 2.0, 3.0], [10, 30, 60])
    g = an.length_gain(base, smelt)
    (gb,) = g.buckets
    assert gb.gain == pytest.approx((10 * 0.5 + 0 + 60 * 1.0) / 100)
    w, d = np.array([10, 30, 60.0]), np.array([0.5, 0.0, 1.0])
    se = math.sqrt((w ** 2 * (d - gb.gain) ** 2).sum() * 3 / 2) / w.sum()
    assert gb.gain_se == pytest.approx(se)
    assert gb.rel_gain == pytest.approx(gb.gain / base.buckets[0].loss)
    assert g.long_from == 8  # T / 8 for T = 64; the bucket [1, inf) starts below it, so it counts as short
    assert g.short_gain == pytest.approx(gb.gain) and g.long_gain is None and g.long_short_ratio is None
    with pytest.raises(UserError, match="baseline and a smelt"):
        an.length_gain(smelt, base)
    with pytest.raises(UserError, match="different sequences"):
        an.length_gain(base, _lr("s", "smelt", [2.5, 2.0, 3.0], [10, 30, 61]))


# ----- ICL --------------------------------------------------------------------------------

def test_wilson_interval_known_values():
    lo, hi = an.wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(1.96 ** 2 / (10 + 1.96 ** 2), abs=1e-4)
    lo, hi = an.wilson_interval(5, 10)
    assert (lo, hi) == (pytest.approx(0.2366, abs=1e-4), pytest.approx(0.7634, abs=1e-4))
    lo, hi = an.wilson_interval(10, 10)
    assert hi == 1.0 and lo == pytest.approx(1 - 1.96 ** 2 / (10 + 1.96 ** 2), abs=1e-4)


def test_batched_greedy_decoding_equals_one_at_a_time(loaded):
    model = loaded["smelt"].model
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(3, 512, size=n)) for n in (5, 17, 9, 30)]
    stop = lambda ids: 7 in ids  # noqa: E731
    batched = an.greedy_decode(model, prompts, 6, stop, batch_size=4)
    single = [an.greedy_decode(model, [p], 6, stop)[0] for p in prompts]
    assert batched == single and all(1 <= len(o) <= 6 for o in batched)
    with torch.no_grad():
        first = [int(model(torch.as_tensor([p])).logits[0, -1].argmax()) for p in prompts]
    assert [o[0] for o in batched] == first


def test_icl_accuracy_caps_shots_to_the_context(loaded):
    run = loaded["baseline"]
    r = an.icl_accuracy(run, shots=[0, 1, 32], n_trials=6, seed=1, task=DyckTask(3, 2, 4))
    assert [s.k for s in r.shots] == [0, 1] and r.skipped == (32,)
    for s in r.shots:
        assert s.n == 6 and 0 <= s.correct <= 6 and s.ci_low <= s.accuracy <= s.ci_high
        assert s.mean_prompt_tokens + 5 <= run.seq_len
    with pytest.raises(UserError, match="no requested shot count fits"):
        an.icl_accuracy(run, shots=[64], n_trials=2)


# ----- saved results and the CLI ----------------------------------------------------------

def test_results_round_trip_through_the_analysis_folder(loaded, tmp_path):
    run = loaded["smelt"]
    for result in (an.attention_sink(run, 1), an.loss_by_length(run, n_windows=2),
                   an.icl_accuracy(run, [0], 2)):
        path = an.save_result(result, tmp_path)
        assert path == tmp_path / "analysis" / f"{result.result_kind}.json"
        assert an.load_result(tmp_path, result.result_kind) == result
        assert len(result.to_frame()) > 0 and result.summary()
    with pytest.raises(UserError, match="no saved icl_x|unknown analysis kind"):
        an.load_result(tmp_path, "icl_x")


@pytest.fixture(scope="module")
def cli():
    from cli import app

    runner = CliRunner()
    return lambda *args: runner.invoke(app, ["analyze", *map(str, args)])


def test_cli_sink_json_shape_and_saved_file(cli, runs):
    res = cli("sink", runs["baseline"], runs["smelt"], "--sequences", 2, "--json")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert [r["run"] for r in doc["runs"]] == ["tiny-baseline", "tiny-smelt"]
    assert [r["arch"] for r in doc["runs"]] == ["baseline", "smelt"]
    smelt = doc["runs"][1]["passes"]
    assert [(p["layer"], p["pass"]) for p in smelt] == [(0, 1), (1, 1), (2, 1), (1, 2), (2, 2), (3, 1)]
    assert set(smelt[0]) == {"layer", "pass", "bos_mass", "other_mass"}
    saved = json.loads((runs["smelt"] / "analysis" / "sink.json").read_text())
    assert saved["kind"] == "sink" and saved["result"]["passes"] == smelt
    res = cli("sink", runs["smelt"], "--probe", "dyck", "--sequences", 2, "--json", "--no-save")
    assert res.exit_code == 0, res.stderr
    assert "answer_mass" in json.loads(res.stdout)["runs"][0]["passes"][0]
    assert not (runs["smelt"] / "analysis" / "sink_dyck.json").exists()


def test_cli_lengths_gain_and_plot(cli, runs, tmp_path):
    fig = tmp_path / "lengths.png"
    res = cli("lengths", runs["smelt"], runs["baseline"], "--windows", 2, "--json", "--plot", fig)
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert {r["arch"] for r in doc["runs"]} == {"baseline", "smelt"}
    b = doc["runs"][0]["buckets"]
    assert {x["by"] for x in b} == {"length", "position"} and "seq_loss" not in b[0]
    g = doc["gain"]
    assert g["baseline"] == "tiny-baseline" and g["smelt"] == "tiny-smelt" and len(g["buckets"]) == len(b)
    assert fig.stat().st_size > 10_000
    for name in ("baseline", "smelt"):
        assert (runs[name] / "analysis" / "lengths_gain.json").exists()
    # each saved analysis names the weights it was computed on: the hash of the weights file read
    sha = {n: hashlib.sha256((runs[n] / runlog.WEIGHTS).read_bytes()).hexdigest()
           for n in ("baseline", "smelt")}
    assert sha["baseline"] != sha["smelt"]
    for name in ("baseline", "smelt"):
        own = json.loads((runs[name] / "analysis" / "lengths.json").read_text())["weights"]
        assert own == [{"run": runs[name].name, "file": runlog.WEIGHTS, "sha256": sha[name]}]
        gain = json.loads((runs[name] / "analysis" / "lengths_gain.json").read_text())["weights"]
        assert {w["run"]: w["sha256"] for w in gain} == {runs[n].name: sha[n] for n in ("baseline", "smelt")}
    res = cli("lengths", runs["baseline"], "--windows", 2, "--json", "--no-save")
    assert res.exit_code == 0 and json.loads(res.stdout)["gain"] is None


def test_analyses_that_save_hold_the_run_folders_lock(cli, runs):
    """One process writes a run folder at a time: `analyze --save` writes analysis/ (and snapshot-data
    eval_data/), so it is refused while a training holds the folder, and a training is refused while
    it runs (a review saved an ICL result a second after `train --overwrite` took the folder)."""
    from scaling.training.loop.lock import RunLock, held

    lock = RunLock()
    lock.acquire(runs["smelt"])     # another open file description: flock conflicts as across processes
    try:
        before = sorted(p.name for p in (runs["smelt"] / "analysis").glob("*")) \
            if (runs["smelt"] / "analysis").exists() else []
        for args in (("sink", runs["smelt"], "--sequences", 1), ("snapshot-data", runs["smelt"])):
            res = cli(*args)
            assert res.exit_code == 2 and "is in use by" in res.stderr, res.output
        after = sorted(p.name for p in (runs["smelt"] / "analysis").glob("*")) \
            if (runs["smelt"] / "analysis").exists() else []
        assert after == before and not (runs["smelt"] / "eval_data").exists()
        # reading without saving needs no lock
        res = cli("sink", runs["smelt"], "--sequences", 1, "--no-save", "--json")
        assert res.exit_code == 0, res.stderr
    finally:
        lock.release()
    with held([runs["baseline"]]):
        with pytest.raises(UserError, match="is in use by"):
            RunLock().acquire(runs["baseline"])    # what a trainer's start meets meanwhile
    RunLock().acquire(runs["baseline"])             # and released after


def test_cli_icl_table_and_json(cli, runs):
    res = cli("icl", runs["baseline"], runs["smelt"], "--trials", 3, "--shots", "0,2,64", "--max-pairs", 4,
              "--json", "--no-save")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    for r in doc["runs"]:
        assert [s["k"] for s in r["shots"]] == [0, 2] and r["skipped"] == [64]
        assert set(r["shots"][0]) >= {"k", "n", "correct", "accuracy", "ci_low", "ci_high"}
    res = cli("icl", runs["smelt"], "--trials", 2, "--shots", "0", "--no-save")
    assert res.exit_code == 0 and "Dyck completion accuracy" in res.stdout


@pytest.mark.parametrize(
    "case",
    ["missing", "noweights", "gain-two-baselines", "gain-three-runs", "bad-probe", "bad-shots", "bad-plot"],
)
def test_cli_errors_are_one_line_exit_2(cli, runs, case):
    args = {
        "missing": ("sink", runs["root"] / "absent"),
        "noweights": ("icl", runs["noweights"]),
        "gain-two-baselines": ("lengths", runs["baseline"], runs["baseline2"], "--gain"),
        "gain-three-runs": ("lengths", runs["baseline"], runs["baseline2"], runs["smelt"]),
        "bad-probe": ("sink", runs["smelt"], "--probe", "xyz"),
        "bad-shots": ("icl", runs["smelt"], "--shots", "1,two"),
        "bad-plot": ("sink", runs["smelt"], "--sequences", 1, "--no-save", "--plot", runs["root"] / "x.txt"),
    }[case]
    res = cli(*args)
    assert res.exit_code == 2, (res.stdout, res.stderr)
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1
    assert "Traceback" not in res.stderr and res.stdout == ""


def test_a_trainer_run_loads(cache, tmp_path):
    from scaling.training.loop.trainer import TrainConfig, train

    cfg = get_config("proxy-tiny", "smelt")
    tc = TrainConfig(
        tokens=(256,), batch_size=2, eval_every=0, data_max_bytes=SPEC.max_bytes, device="cpu", threads=1
    )
    train(
        cfg,
        tc,
        tier="proxy-tiny",
        run_name="trained",
        runs_dir=tmp_path,
        ckpt_dir=tmp_path / "ck",
        save_final_weights=True,
    )
    run = an.load_run(tmp_path / "trained")
    assert run.arch == "smelt" and run.corpus.spec == SPEC
    r = an.attention_sink(run, n_sequences=1)
    assert len(r.passes) == cfg.n_layer_passes
