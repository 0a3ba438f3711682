"""A folder or table that holds an lr sweep: each configuration is fitted at its best peak lr.

Planted truth: a Chinchilla law (Besiroglu et al. 2024's refit) at the tuned lr, and a loss penalty
that grows with the distance from it in octaves (the bowl of a real lr sweep), two seeds apart by
0.2% noise. Fitted through every lr the law is wrong; at the best lr of each configuration it is
the planted one.
"""

import json

import numpy as np
import pandas as pd
import pytest

from scaling.common.errors import UserError
from scaling.fitting.fit import fit_law
from scaling.fitting.laws import get_law
from scaling.fitting.tables import Columns, canonicalize_table, load_table

TRUTH = {"E": 1.82, "A": 482.0, "alpha": 0.3478, "B": 2085.0, "beta": 0.3658}
OCTAVES = (-2, -1, 0, 1)       # lr = tuned x 2^octave; 0 is the tuned one
PENALTY = 0.04                 # relative loss per squared octave off the tuned lr


def sweep_table(seed: int = 0) -> pd.DataFrame:
    law = get_law("chinchilla")
    rng = np.random.default_rng(seed)
    rows = []
    for N in np.logspace(6.5, 8.5, 5):
        tuned = 3e-3 * (N / 1e7) ** -0.3
        for D in np.logspace(8.0, 10.0, 5):
            true = float(law.predict(law.theta_array(TRUTH), N=np.array([N]), D=np.array([D]))[0])
            for o in OCTAVES:
                for s in (0, 1):
                    loss = true * (1 + PENALTY * o * o) * (1 + 0.002 * rng.standard_normal())
                    rows.append({"run": f"n{N:.3g}-o{o}-s{s}", "arch": "baseline", "N": N, "D": D,
                                 "loss": loss, "seed": s, "lr": tuned * 2.0 ** o, "octave": o})
    return pd.DataFrame(rows)


def test_each_configuration_keeps_its_best_lr_and_the_law_is_the_planted_one():
    raw = sweep_table()
    table = canonicalize_table(raw)
    pts = table.points
    # the tuned lr of every (N, D) is kept, with both seeds, and nothing else
    assert len(pts) == 25 * 2
    merged = pts.merge(raw[["run", "D", "octave"]], on=["run", "D"])
    assert (merged["octave"] == 0).all()
    assert table.settings["lr_left_out"] == 150
    assert any("5 sizes (group, N) were trained at several peak lrs (4 each" in n and
               "150 of 200 points are left out" in n for n in table.notes)
    tuned = fit_law(pts, "chinchilla", n_bootstrap=0)
    swept = fit_law(canonicalize_table(raw, Columns(lr="none")).points, "chinchilla", n_bootstrap=0)
    for name in ("alpha", "beta"):
        assert tuned.params[name] == pytest.approx(TRUTH[name], abs=0.03)
    # through every lr the law misses the truth: the mistuned runs (mean penalty 6%) lift it by 4.0%
    law = get_law("chinchilla")
    N, D = pts["N"].to_numpy(), pts["D"].to_numpy()
    truth = law.predict(law.theta_array(TRUTH), N=N, D=D)

    def error(fit):
        return float(np.mean(law.predict(law.theta_array(fit.params), N=N, D=D) / truth - 1))

    assert abs(error(tuned)) < 0.002
    assert error(swept) > 0.035 and swept.params["E"] > TRUTH["E"] + 0.05


def test_without_an_lr_column_the_shared_seeds_are_named():
    raw = sweep_table().drop(columns=["lr"])
    table = canonicalize_table(raw)
    assert len(table.points) == 200 and table.settings["lr_left_out"] == 0
    assert any("25 configurations (group, N, D) hold two or more runs with one seed" in n
               for n in table.notes)
    # distinct seeds of one configuration are seeds, not a sweep: no note
    one_lr = canonicalize_table(sweep_table().query("octave == 0"))
    assert not [n for n in one_lr.notes if "lr" in n]


def test_a_runs_folder_reads_each_runs_peak_lr_from_its_config(tmp_path):
    def run(name, lr, loss, config=True):
        d = tmp_path / name
        d.mkdir()
        if config:
            (d / "config.json").write_text(json.dumps({"tier": "t", "train": {"lr": lr}}))
        point = {"run": name, "arch": "baseline", "tier": "t", "N": 1e6, "D": 1e8, "loss": loss, "seed": 0}
        (d / "final.json").write_text(json.dumps({"run": name, "arch": "baseline", "tier": "t",
                                                  "complete": True, "points": [point]}))

    run("lo", 1e-3, 3.2)
    run("hi", 4e-3, 3.0)
    run("mid", 2e-3, 3.1)
    table = load_table(tmp_path)
    assert table.points["run"].tolist() == ["hi"] and table.points["lr"].tolist() == [4e-3]
    assert table.mapping["lr"] == "'lr'"
    # a run without a readable config keeps its points, its lr unknown (kept beside the best lr)
    run("noconf", None, 2.9, config=False)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    (tmp_path / "broken" / "final.json").write_text((tmp_path / "noconf" / "final.json").read_text())
    pts = load_table(tmp_path).points
    assert len(pts) == 3 and np.isnan(pts["lr"]).sum() == 2 and sorted(pts["loss"]) == [2.9, 2.9, 3.0]
    assert len(load_table(tmp_path, Columns(lr="none")).points) == 5


NOT_FINITE = "'lr' has a value that is not a finite number: row 4 reads"


@pytest.mark.parametrize("value, message", [("fast", f"{NOT_FINITE} 'fast'"), (-1e-3, "lr must be > 0"),
                                            (float("inf"), f"{NOT_FINITE} inf")])
def test_a_bad_lr_cell_is_a_one_line_error(value, message):
    raw = sweep_table().head(8).astype({"lr": object})
    raw.loc[3, "lr"] = value
    with pytest.raises(UserError, match=message) as exc:
        canonicalize_table(raw)
    assert "\n" not in str(exc.value)
    # an empty cell is an unknown lr (kept beside the best lr), not an error
    raw.loc[3, "lr"] = None
    pts = canonicalize_table(raw.astype({"lr": float})).points
    assert len(pts) == 3 and np.isnan(pts["lr"]).sum() == 1
    assert (pts["lr"].dropna() == raw["lr"].iloc[4]).all()


@pytest.mark.parametrize("role", ["lr", "seed"])
def test_a_named_seed_or_lr_column_must_exist(role):
    # a typo in --lr-col or --seed-col must not quietly fit every point as if none were named
    with pytest.raises(UserError, match=f"no {role} column 'peak_{role}'"):
        canonicalize_table(sweep_table(), Columns(**{role: f"peak_{role}"}))
    renamed = sweep_table().rename(columns={role: f"peak_{role}"})
    named = canonicalize_table(renamed, Columns(**{role: f"peak_{role}"}))
    assert named.mapping[role] == f"'peak_{role}'" and role not in canonicalize_table(renamed).mapping


def frame(rows):
    return pd.DataFrame([dict(zip(("arch", "N", "D", "loss", "seed", "lr", "run"), r)) for r in rows])


def test_one_lr_per_size_keeps_curves_whole_and_groups_apart():
    # lr 1e-3 wins at the small D, 2e-3 at the large one; over both 2e-3 is better on average: the
    # size keeps 2e-3 at both D (one curve per seed), not a mix. The other group's best is 1e-3.
    rows = []
    for s in (0, 1):
        rows += [("a", 1e6, 1e8, 3.00, s, 1e-3, f"a1-{s}"), ("a", 1e6, 1e9, 2.80, s, 1e-3, f"a1-{s}"),
                 ("a", 1e6, 1e8, 3.01, s, 2e-3, f"a2-{s}"), ("a", 1e6, 1e9, 2.60, s, 2e-3, f"a2-{s}"),
                 ("b", 1e6, 1e8, 3.00, s, 1e-3, f"b1-{s}"), ("b", 1e6, 1e9, 2.60, s, 1e-3, f"b1-{s}"),
                 ("b", 1e6, 1e8, 3.10, s, 2e-3, f"b2-{s}"), ("b", 1e6, 1e9, 2.70, s, 2e-3, f"b2-{s}")]
    pts = canonicalize_table(frame(rows)).points
    kept = pts.groupby("group")["lr"].unique().to_dict()
    assert kept["a"].tolist() == [2e-3] and kept["b"].tolist() == [1e-3]
    assert len(pts) == 8 and sorted(pts["run"].unique()) == ["a2-0", "a2-1", "b1-0", "b1-1"]


def test_unknown_lrs_are_kept_and_lrs_without_a_shared_budget_choose_per_budget():
    rows = [("a", 1e6, 1e8, 3.0, 0, 1e-3, "k1"), ("a", 1e6, 1e8, 2.9, 0, 2e-3, "k2"),
            ("a", 1e6, 1e8, 3.5, 1, None, "unknown"),
            # a size whose two lrs never reached one token count: each count keeps its own
            ("a", 4e6, 1e8, 2.8, 0, 1e-3, "d1"), ("a", 4e6, 2e8, 2.7, 0, 2e-3, "d2"),
            ("a", 4e6, 2e8, 2.9, 0, 4e-3, "d3")]
    table = canonicalize_table(frame(rows))
    assert sorted(table.points["run"]) == ["d1", "d2", "k2", "unknown"]
    note = next(n for n in table.notes if "peak lrs" in n)
    assert "2 sizes (group, N) were trained at several peak lrs (2 to 3 each" in note
    assert "(1 with no such count choose per token count)" in note
    assert "(1 points of unknown lr are kept)" in note
    assert "2 of 6 points are left out" in note
