"""IsoFLOP design (`scaling.design`) and `smelt-scale plan`: sizes bracket N*(C), configs the matcher
builds, tokens D = C/F, the emitted plan parses and rebuilds the same configs, JSON shape, exit-2 errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import tomli_w
from typer.testing import CliRunner

from cli import app
from scaling.accounting.costs import costs
from scaling.accounting.matching import smelt_twin
from scaling.accounting.tiers import get_config
from scaling.common.errors import UserError
from scaling.design.output import sweep_plan_document
from scaling.design.points import isoflop_design, points_of_sweep_plan
from scaling.design.proposal import MIN_SIZES, Proposal, propose
from scaling.design.sizing import baseline_for_size, experts_for_sparsity, measure, pair_for_size
from scaling.fitting.laws import get_law
from scaling.fitting.reference_laws import load_law_set
from scaling.fitting.savings import FittedLaw, frontier
from scaling.training.sweep.plan import load_plan

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]

# A Chinchilla-like truth at CPU-proxy scale (k = F/(N D) of the proxies is 10-30, not 6): the
# candidate has a smaller A (better) and spends more FLOPs per parameter-token.
CH = {"E": 1.82, "alpha": 0.3478, "B": 2085.0, "beta": 0.3658}
CH_GROUPS = {"baseline": (482.0, 16.0), "smelt": (400.0, 20.0)}


def chinchilla_laws(n_samples: int = 40, seed: int = 0) -> dict[str, FittedLaw]:
    law = get_law("chinchilla")
    rng = np.random.default_rng(seed)
    out = {}
    for g, (A, k) in CH_GROUPS.items():
        theta = law.theta_array({**CH, "A": A})
        samples = theta * np.exp(0.02 * rng.standard_normal((n_samples, theta.size)))
        out[g] = FittedLaw(
            g, law, theta, samples=samples, cost=k, compute_min=1e11, compute_max=1e13
        )
    return out


def write_fits(path: Path, laws: dict[str, FittedLaw]) -> Path:
    """A fits file in the format `smelt-scale fit --out` writes."""
    fits = {}
    for g, fl in laws.items():
        fits[g] = {
            "law": "chinchilla",
            **fl.params,
            "n_points": 30,
            "group": g,
            "bootstrap_params": list(fl.law.params),
            "bootstrap": fl.samples.tolist(),
            "diagnostics": {"rmse_log": 0.002},
            "data_summary": {
                "compute_min": fl.compute_min,
                "compute_max": fl.compute_max,
                **fl.cost.summary(),
            },
        }
    path.write_text(json.dumps({"fits": fits}))
    return path


@pytest.fixture(scope="module")
def paper_laws() -> dict[str, FittedLaw]:
    ls = load_law_set("paper")
    return {g: ls.fitted(g) for g in ("baseline", "smelt")}


@pytest.fixture(scope="module")
def paper_proposal(paper_laws) -> Proposal:
    return propose(paper_laws, [1e20, 1e21], sparsities=(0.95,), n_sizes=5)


@pytest.fixture(scope="module")
def proxy_proposal() -> Proposal:
    return propose(chinchilla_laws(), [1e14], n_sizes=6)


# -- size -> config rule ---------------------------------------------------------------------------
def test_baseline_for_size_hits_targets_within_width_rounding():
    shape = get_config("proxy-m", "baseline")
    for target in (1e5, 3e5, 1e6, 3e6):
        cfg = baseline_for_size(shape, target, size="N", width_multiple=1)
        # width steps of 1 at d ~ 40-250: N moves ~2/d per step, so within 3%
        assert abs(math.log(measure(cfg, "N") / target)) < 0.03, (target, measure(cfg, "N"))
        assert (cfg.n_layers, cfg.n_heads, cfg.head_dim, cfg.n_experts) == (
            shape.n_layers,
            shape.n_heads,
            shape.head_dim,
            shape.n_experts,
        )
    big = baseline_for_size(shape, 1e6, size="N", width_multiple=1)
    small = baseline_for_size(shape, 1e5, size="N", width_multiple=1)
    assert small.d_model < shape.d_model < big.d_model


def test_sparsity_is_solved_with_the_expert_count():
    shape = get_config("100M", "baseline")
    for S in (0.85, 0.95, 0.97):
        cfg = baseline_for_size(shape, 2e9, size="F", width_multiple=8, sparsity=S)
        assert abs(costs(cfg).sparsity - S) < 0.005
        assert abs(math.log(costs(cfg).flops_per_token / 2e9)) < 0.03
        assert cfg.d_model % 8 == 0 and cfg.expert_hidden % 8 == 0
    assert experts_for_sparsity(shape, 0.97) > experts_for_sparsity(shape, 0.85)


def test_smelt_arch_target_is_the_twins_size():
    shape = get_config("proxy-m", "baseline")
    pair = pair_for_size(shape, 3e5, arch="smelt", size="N", width_multiple=1)
    assert abs(math.log(measure(pair.smelt, "N") / 3e5)) < 0.03
    assert measure(pair.baseline, "N") > measure(pair.smelt, "N")  # a twin has fewer active params
    assert pair.smelt == smelt_twin(pair.baseline, width_multiple=1).smelt
    assert max(abs(v) for v in pair.mismatch.values()) <= 0.01


def test_sizes_the_shape_cannot_build_are_errors():
    with pytest.raises(UserError, match="below the smallest config"):
        baseline_for_size(get_config("1.6B", "baseline"), 1e5, size="N", width_multiple=8)
    with pytest.raises(UserError, match="positive"):
        baseline_for_size(get_config("proxy-m", "baseline"), -1.0, size="N", width_multiple=1)


# -- proposals -------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["paper", "proxy"])
def test_proposed_sizes_bracket_each_optimum(which, paper_proposal, proxy_proposal, paper_laws):
    prop = paper_proposal if which == "paper" else proxy_proposal
    laws = paper_laws if which == "paper" else chinchilla_laws()
    for s in prop.sets:
        for arch in ("baseline", "smelt"):
            pts = s.arch_points(arch)
            assert len(pts) >= MIN_SIZES
            sizes = [p.N if s.size_name == "N" else p.F for p in pts]
            opt = frontier(
                laws[arch].law, laws[arch].theta, s.budget, cost=laws[arch].cost, S=s.sparsity
            )
            assert s.optima[arch]["size"] == pytest.approx(float(opt.size))
            assert min(sizes) < opt.size < max(sizes), (arch, sizes, opt.size)
            assert s.bracketed[arch]
            assert sizes == sorted(sizes)
            offsets = [p.offset_decades for p in pts]
            # the grid spans at least +-spread around each optimum (it covers both optima)
            assert min(offsets) <= -prop.spread_decades + 0.05 and max(offsets) >= prop.spread_decades - 0.05
            # every run spends the budget: D = C / F of the Baseline, the twin within its 1% match
            for p in pts:
                assert p.compute == pytest.approx(s.budget, rel=0.011)
            # the expected losses dip inside the set (an identifiable minimum) by the reported depth
            L = np.array([p.expected_loss for p in pts])
            assert 0 < int(np.argmin(L)) < len(L) - 1
            assert s.profile_depth[arch] == pytest.approx(min(L[0], L[-1]) / L.min() - 1)
            assert s.profile_depth[arch] > 0.005


def test_pairs_are_matched_twins_on_the_same_tokens(paper_proposal):
    for s in paper_proposal.sets:
        for b, m in zip(s.arch_points("baseline"), s.arch_points("smelt")):
            assert b.tier == m.tier and b.D == m.D
            assert m.config == smelt_twin(b.config, width_multiple=paper_proposal.width_multiple).smelt
            assert abs(b.S - 0.95) < 0.005


def test_expected_loss_interval_from_the_bootstrap(proxy_proposal, paper_proposal):
    for p in proxy_proposal.sets[0].points:
        lo, hi = p.loss_ci
        assert lo < p.expected_loss < hi
    assert all(p.loss_ci is None for p in paper_proposal.sets[0].points)  # published laws: no samples


def test_emitted_plan_parses_and_rebuilds_the_configs(tmp_path, proxy_proposal):
    doc = sweep_plan_document(
        proxy_proposal,
        name="next", runs_dir=str(tmp_path / "runs"), template={"train": {"batch_size": 16, "lr": 3e-3}}
    )
    path = tmp_path / "next.toml"
    path.write_text(tomli_w.dumps(doc))
    plan = load_plan(path)
    want = {(p.tier, p.arch): p for p in proxy_proposal.sets[0].points}
    assert len(plan.runs) == len(want) == proxy_proposal.n_runs
    for run in plan.runs:
        p = want[(run.tier, run.arch)]
        assert run.model == p.config and run.budgets == (p.D,) and run.train["batch_size"] == 16
    # the plan trains whole updates of 16 x seq_len tokens: each run's D rounded to them
    for run in plan.runs:
        p = want[(run.tier, run.arch)]
        step = 16 * run.model.seq_len
        assert run.tokens_trained() == round(p.D / step) * step
    assert sum(r.flops() for r in plan.runs) == pytest.approx(proxy_proposal.total_flops, rel=0.02)
    # the plan's points are what a simulation of it uses
    pts = points_of_sweep_plan(plan)
    assert len(pts) == len(plan.runs) and set(pts["group"]) == {"baseline", "smelt"}
    assert sorted(pts["flops"]) == pytest.approx(sorted(p.compute for p in proxy_proposal.sets[0].points))


def test_proposal_json_round_trip(paper_proposal):
    again = Proposal.from_dict(json.loads(json.dumps(paper_proposal.to_dict())))
    assert again.to_dict() == paper_proposal.to_dict()
    assert "IsoFLOP plan" in paper_proposal.summary()


@pytest.mark.parametrize(
    "kwargs, msg",
    [
        ({"n_sizes": 4}, "at least 5"),
        ({"spread": 0.0}, "spread"),
        ({"sparsities": (0.9,)}, "only to smelt-form"),
        ({"tier": "nope"}, "unknown tier"),
        ({"tier": "1.6B"}, "below the smallest"),
    ],
)
def test_bad_proposals_are_user_errors(kwargs, msg):
    with pytest.raises(UserError, match=msg):
        propose(chinchilla_laws(), [1e14], **kwargs)


def test_smelt_form_needs_a_sparsity(paper_laws):
    with pytest.raises(UserError, match="sparsity"):
        propose(paper_laws, [1e20])
    with pytest.raises(UserError, match="missing smelt"):
        propose({"baseline": paper_laws["baseline"]}, [1e20], sparsities=(0.95,))


def test_isoflop_design_is_centred_on_each_optimum(paper_laws):
    pts = isoflop_design(paper_laws, [1e20, 1e21], n_sizes=5, sparsities=(0.85, 0.95))
    assert len(pts) == 2 * 2 * 2 * 5
    for (g, s, c), sub in pts.assign(c=pts["flops"].round(-15)).groupby(["group", "sparsity", "c"]):
        opt = frontier(paper_laws[g].law, paper_laws[g].theta, c, S=s)
        F = sub["flops_per_token"].to_numpy()
        assert np.exp(np.mean(np.log(F))) == pytest.approx(float(opt.size), rel=1e-9)
        assert np.allclose(F * sub["D"].to_numpy(), c)
        assert np.log10(F.max() / F.min()) == pytest.approx(1.0)


# -- CLI -------------------------------------------------------------------------------------------
def assert_one_line_exit_2(res, fragment: str) -> None:
    assert res.exit_code == 2, (res.exit_code, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0], res.stderr
    assert "Traceback" not in res.stderr


def test_plan_cli_json_writes_a_runnable_plan(tmp_path):
    out = tmp_path / "plans" / "next.toml"
    res = runner.invoke(
        app,
        [
            "plan",
            "--law-set",
            "paper",
            "--budget",
            "1e20",
            "--sparsity",
            "0.95",
            "--runs-per-budget",
            "5",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.stderr
    d = json.loads(res.stdout)
    assert {
        "law",
        "shape",
        "sets",
        "total_flops",
        "n_runs",
        "plan_file",
        "runs_dir",
        "warnings",
        "sweep_command",
    } <= set(d)
    assert d["law"] == "smelt" and d["n_runs"] == 10 and d["plan_file"] == str(out)
    s = d["sets"][0]
    assert {
        "budget",
        "sparsity",
        "optima",
        "points",
        "bracketed",
        "profile_depth",
        "vertex_offset_decades",
        "flops",
    } <= set(s)
    assert set(s["optima"]) == {"baseline", "smelt"}
    p = s["points"][0]
    assert {
        "tier",
        "arch",
        "N",
        "F",
        "S",
        "D",
        "compute",
        "expected_loss",
        "loss_ci",
        "offset_decades",
        "config",
    } <= set(p)
    plan = load_plan(out)
    assert len(plan.runs) == 10
    dry = runner.invoke(app, ["sweep", str(out), "--dry-run", "--no-probe", "--json"])
    # the estimates are printed; the plan's [data] folder (a paper-scale corpus) is not on this machine,
    # which the dry run refuses as the real sweep would
    assert dry.exit_code == 2 and "[data] path" in dry.stderr and "does not exist" in dry.stderr, dry.stderr
    # the dry run counts the whole updates the trainer takes: 3.5e-6 off the planned compute here
    assert json.loads(dry.stdout)["total"]["flops"] == pytest.approx(d["total_flops"], rel=1e-5)


def test_plan_cli_from_a_fits_file_table_and_dry_run(tmp_path):
    fits = write_fits(tmp_path / "fits.json", chinchilla_laws())
    out = tmp_path / "next.toml"
    res = runner.invoke(
        app, ["plan", "--fits", str(fits), "--budget", "1e14", "--out", str(out), "--dry-run"]
    )
    assert res.exit_code == 0, res.stderr
    assert "iso1e14-1" in res.stdout and "dry run" in res.stdout and "95% CI" in res.stdout
    assert not out.exists()


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--law-set", "paper", "--budget", "-1"], "positive"),
        (["--law-set", "paper", "--budget", "1e20", "--runs-per-budget", "3"], "at least 5"),
        (["--law-set", "nope", "--budget", "1e20"], "unknown law set"),
        (["--law-set", "paper", "--budget", "1e20", "--tier", "nope"], "unknown tier"),
        (["--law-set", "paper", "--budget", "1e20", "--sparsity", "1.5"], "sparsity must lie in"),
        (["--fits", "missing.json", "--budget", "1e14"], "no such fits file"),
    ],
)
def test_plan_cli_errors_exit_2(tmp_path, args, fragment):
    assert_one_line_exit_2(runner.invoke(app, ["plan", *args, "--out", str(tmp_path / "x.toml")]), fragment)


def test_plan_cli_unbuildable_sizes_exit_2(tmp_path):
    fits = write_fits(tmp_path / "fits.json", chinchilla_laws())
    res = runner.invoke(
        app,
        [
            "plan",
            "--fits",
            str(fits),
            "--budget",
            "1e14",
            "--tier",
            "1.6B",
            "--out",
            str(tmp_path / "x.toml"),
        ],
    )
    assert_one_line_exit_2(res, "below the smallest config")
    assert not (tmp_path / "x.toml").exists()


def test_plan_cli_from_a_runs_folder_sends_new_runs_there(tmp_path):
    """Fitting a trainer-style runs folder on the fly; the plan's runs_dir is that folder, so the next
    `smelt-scale fit` sees old and new runs together."""
    laws = chinchilla_laws()
    rng = np.random.default_rng(1)
    root = tmp_path / "runs"
    for g, fl in laws.items():
        for i, N in enumerate(np.logspace(5, 6.3, 5)):
            run = root / f"{g}-{i}"
            run.mkdir(parents=True)
            pts = []
            for D in np.logspace(6, 7.5, 4):
                loss = float(fl.law.predict(fl.theta, N=np.array([N]), D=np.array([D]))[0]) * np.exp(
                    1e-3 * rng.standard_normal()
                )
                pts.append({"N": N, "D": D, "loss": loss, "flops": float(fl.cost(N)) * D})
            (run / "config.json").write_text("{}")
            (run / "final.json").write_text(
                json.dumps({"run": run.name, "arch": g, "complete": True, "points": pts})
            )
    out = tmp_path / "next.toml"
    res = runner.invoke(
        app,
        [
            "plan",
            "--runs",
            str(root),
            "--budget",
            "1e14",
            "--bootstrap",
            "0",
            "--runs-per-budget",
            "5",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.stderr
    d = json.loads(res.stdout)
    assert Path(d["runs_dir"]).resolve() == root.resolve()
    assert load_plan(out).runs_dir.resolve() == root.resolve()
    assert all(p["loss_ci"] is None for p in d["sets"][0]["points"])  # --bootstrap 0: no interval


def test_plan_cli_refuses_a_template_whose_tables_are_not_tables(tmp_path):
    """A template with `train = 5` was silently dropped (a plan with default training settings)."""
    fits = write_fits(tmp_path / "fits.json", chinchilla_laws())
    tpl = tmp_path / "t.toml"
    tpl.write_text('train = 5\nexecutor = "slurm"\n')
    out = tmp_path / "next.toml"
    res = runner.invoke(app, ["plan", "--fits", str(fits), "--budget", "1e14", "--template", str(tpl),
                              "--out", str(out)])
    assert_one_line_exit_2(res, "[train] must be a table, got int")
    assert not out.exists()


def test_fits_and_plan_files_are_replaced_atomically_never_through_a_link(tmp_path):
    """--out --force writes a temporary file and renames it: a link at --out is replaced, its target
    (a user's file) untouched, and the new file is complete."""
    from scaling.fitting.result import FitSet

    fits = write_fits(tmp_path / "fits.json", chinchilla_laws())
    notes = tmp_path / "notes.txt"
    notes.write_text("important")
    link = tmp_path / "link.json"
    link.symlink_to(notes)
    FitSet.load(fits).save(tmp_path / "new" / "sub" / "fits.json")   # a missing folder is made
    assert FitSet.load(tmp_path / "new" / "sub" / "fits.json").to_dict() == FitSet.load(fits).to_dict()
    FitSet.load(fits).save(link)
    assert notes.read_text() == "important" and not link.is_symlink()
    assert FitSet.load(link).to_dict() == FitSet.load(fits).to_dict()
    plan_link = tmp_path / "plan.toml"
    plan_link.symlink_to(notes)
    res = runner.invoke(app, ["plan", "--fits", str(fits), "--budget", "1e14", "--out", str(plan_link),
                              "--force"])
    assert res.exit_code == 0, res.stderr
    assert notes.read_text() == "important" and not plan_link.is_symlink()
    load_plan(plan_link)


# -- plan for proxy shapes: the study's settings and lr rule (design audit, 2026-12-06) ------------------
def _proxy_plan(tmp_path, *extra: str, bootstrap: int = 0,
                budgets: str = "3.56e11,1.12e12") -> tuple[dict, dict]:
    """`plan` on the shipped study (its fits): the JSON and the written plan document."""
    import tomllib

    out = tmp_path / "next.toml"
    res = runner.invoke(app, ["plan", str(ROOT / "runs"), "--budgets", budgets, "--bootstrap",
                              str(bootstrap), "--out", str(out), "--json", *extra])
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout), tomllib.loads(out.read_text())


def test_plan_gives_each_proxy_size_the_lr_rule_and_the_study_settings(tmp_path):
    """Every size trained at the template's one lr (3e-3, batch 16, warm-up 20: the first sweep's), which
    docs/proxy-study.md blames for that sweep's misfit: 41x below the rule at the smallest size."""
    from scaling.design.grid import PROXY_LR_RULE, PROXY_SMELT_LR_RULE

    d, doc = _proxy_plan(tmp_path)
    assert doc["train"]["batch_size"] == 8 and doc["train"]["warmup"] == 10
    tiers = doc["tier"]
    assert len(tiers) == len(doc["model"]) >= 10
    for name, t in tiers.items():
        assert t["lr"] == PROXY_LR_RULE(doc["model"][name]["d_model"])
        assert t["smelt"]["lr"] == PROXY_SMELT_LR_RULE(doc["model"][name]["d_model"])
    lrs = sorted(t["lr"] for t in tiers.values())
    assert lrs[-1] / lrs[0] > 3          # sizes a decade apart get lrs the rule sets apart
    # the plan reads back as sweep runs at those lrs, each architecture at its own
    runs = load_plan(tmp_path / "next.toml").runs
    assert {r.train["lr"] for r in runs if r.arch == "baseline"} == set(lrs)
    assert {r.train["lr"] for r in runs if r.arch == "smelt"} == {t["smelt"]["lr"] for t in tiers.values()}
    # an explicit rule (the twins then train at it too, unless given their own), or none (the
    # template's one lr)
    _, doc = _proxy_plan(tmp_path, "--lr-rule", "0.01,1", "--force")
    assert all(t["lr"] == float(f"{0.01 * (doc['model'][n]['d_model'] / 6) ** -1:.3g}") and "smelt" not in t
               for n, t in doc["tier"].items())
    _, doc = _proxy_plan(tmp_path, "--lr-rule", "0.01,1", "--smelt-lr-rule", "0.02,0.5", "--force")
    assert all(t["smelt"]["lr"] == float(f"{0.02 * (doc['model'][n]['d_model'] / 6) ** -0.5:.3g}")
               for n, t in doc["tier"].items())
    _, doc = _proxy_plan(tmp_path, "--lr-rule", "none", "--smelt-lr-rule", "none", "--force")
    assert all("lr" not in t and "smelt" not in t for t in doc["tier"].values())


def test_packaged_proxy_template_is_the_studys():
    import tomllib

    from scaling.cli.plan import TEMPLATES

    packaged = tomllib.loads(TEMPLATES[True].read_text())
    study = tomllib.loads((ROOT / "plans" / "isoflop-template.toml").read_text())
    assert {k: v for k, v in packaged["train"].items() if k != "lr"} == study["train"]
    assert packaged["executor"] == study["executor"]


def test_plan_says_its_laws_are_not_identified_and_flags_plateau_runs(tmp_path):
    # identification needs the bootstrap (fit's rule); 2e11 FLOPs makes runs shorter than 150k tokens
    d, _ = _proxy_plan(tmp_path, bootstrap=20, budgets="2e11,1.12e12")
    said = " ".join(d["warnings"])
    assert "the baseline law is not identified" in said and "the smelt law is not identified" in said
    short = [w for w in d["warnings"] if w.startswith("short run")]
    pts = [p for s in d["sets"] for p in s["points"] if p["arch"] == "baseline" and p["D"] < 150_000]
    assert pts and len(short) == len(pts)
    assert all("early loss plateau" in w for w in short)


@pytest.mark.parametrize("flag", ["--lr-rule", "--smelt-lr-rule"])
def test_bad_lr_rule_is_refused_before_fitting(tmp_path, flag):
    assert_one_line_exit_2(runner.invoke(app, ["plan", str(ROOT / "runs"), "--budget", "1e12", flag,
                                               "fast", "--out", str(tmp_path / "x.toml")]), flag)


@pytest.mark.parametrize("target", [2.30e6, 2.40e6, 2.50e6])
def test_size_rule_with_a_sparsity_takes_the_nearest_config(target):
    """At S = 0.5102 the widths d_model 35-38 of proxy-xxs reach no expert count near S, and the
    bisection stopped beside that gap: F = 2.85e6 (+24%, inside the 25% tolerance, so silent) where
    d_model 28-32 builds within 0.4% (design audit). Now the nearest config, checked by brute force."""
    from scaling.accounting.tiers import TIERS
    from scaling.design.sizing import scaled_baseline

    shape, S = TIERS["proxy-xxs"].baseline, 0.5102
    got = baseline_for_size(shape, target, size="F", width_multiple=1, sparsity=S)
    best = None
    for scale in np.linspace(0.5, 3.0, 4000):   # steps of 0.0006 x 48 (expert_hidden): every config
        cfg = scaled_baseline(shape, float(scale), 1)
        try:
            cfg = cfg.replace(n_experts=experts_for_sparsity(cfg, S))
        except UserError:
            continue
        err = abs(math.log(measure(cfg, "F") / target))
        best = err if best is None else min(best, err)
    assert abs(math.log(measure(got, "F") / target)) <= best + 1e-12
    assert best < 0.005
