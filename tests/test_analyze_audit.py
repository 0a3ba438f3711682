"""Findings of the analysis audit, checked on planted data: the long/short gain ratio's interval and
the lengths tables of runs with different contexts (no model needed)."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from rich.console import Console

from scaling import analysis as an
from scaling.analysis.lengths import LengthGain, fieller_interval
from scaling.cli.analyze import _lengths_tables, _print_lengths

Z95 = 1.959963984540054


def _pair(rng, short_gain, long_gain, sd_short=0.05, sd_long=0.02, n=30):
    """A Baseline/SMELT pair at T = 4096 with n short (100-token) and n long (2000-token) documents
    whose paired differences have means ``short_gain`` and ``long_gain``."""
    def mk(arch, ls, ll):
        bs = (an.LossBucket("length", 1, 512, n, n * 100, float(np.mean(ls)), tuple(ls), (100,) * n),
              an.LossBucket("length", 512, 4097, n, n * 2000, float(np.mean(ll)), tuple(ll), (2000,) * n))
        return an.LengthsResult(arch[0], arch, 4096, 2 * n, 0, bs)

    base_s, base_l = 4 + rng.normal(0, .05, n), 3.5 + rng.normal(0, .02, n)
    sm_s = base_s - short_gain + rng.normal(0, sd_short, n)
    sm_l = base_l - long_gain + rng.normal(0, sd_long, n)
    return an.length_gain(mk("baseline", base_s, base_l), mk("smelt", sm_s, sm_l))


def test_no_point_ratio_when_the_short_gain_may_be_zero(capsys):
    """The audit's case: planted short gain 0.001, long 0.020 (ratio 20x); the tool printed 2.02x."""
    g = _pair(np.random.default_rng(5), 0.001, 0.020)
    assert g.short_gain == pytest.approx(0.0109, abs=1e-4)
    assert g.short_gain_se == pytest.approx(0.0072, abs=1e-4)
    assert abs(g.short_gain) < Z95 * g.short_gain_se
    assert g.long_short_ratio is None and g.ratio_low is None and g.ratio_high is None
    assert "includes 0" in g.ratio_note and "unbounded" in g.ratio_note
    assert "2.02x" not in g.summary() and "long/short - (" in g.summary()
    _print_lengths([], g)
    out = capsys.readouterr().out
    assert "long/short - (" in out and "2.02" not in out
    d = g.to_dict()
    assert d["long_short_ratio"] is None and d["ratio_note"] and "short_gain_se" in d


def test_fieller_interval_solves_its_equation():
    a, sa, b, sb = 2.0, 0.3, 1.0, 0.2
    lo, hi = fieller_interval(a, sa, b, sb, 0.95)
    for rho in (lo, hi):  # the boundary: (a - rho b)^2 = z^2 (v_a + rho^2 v_b)
        assert (a - rho * b) ** 2 == pytest.approx(Z95 ** 2 * (sa ** 2 + rho ** 2 * sb ** 2))
    assert lo < a / b < hi and hi - a / b > a / b - lo  # skewed to the right, as a ratio's should be
    assert fieller_interval(a, sa, 0.3, 0.2, 0.95) is None  # 0.3 +- 0.39 includes 0
    # sb -> 0: the interval tends to a / b +- z se_a / b
    lo, hi = fieller_interval(a, sa, b, 1e-9, 0.95)
    assert (lo, hi) == (pytest.approx(a - Z95 * sa), pytest.approx(a + Z95 * sa))


def test_the_ratio_interval_covers_the_planted_ratio():
    """Planted short gain 0.02, long 0.04 (ratio 2): the 95% interval holds 2 in about 95% of datasets."""
    rng = np.random.default_rng(11)
    hits, bounded = 0, 0
    for _ in range(400):
        g = _pair(rng, 0.02, 0.04, sd_short=0.02, sd_long=0.02)
        if g.long_short_ratio is None:
            continue
        bounded += 1
        assert g.ratio_low < g.long_short_ratio < g.ratio_high
        hits += g.ratio_low <= 2.0 <= g.ratio_high
    assert bounded >= 390
    assert 0.92 <= hits / bounded <= 0.98


def test_pooled_standard_errors_are_the_stratified_ones():
    g = _pair(np.random.default_rng(3), 0.02, 0.04)
    (short, long_) = [b for b in g.buckets if b.by == "length"]
    assert g.short_gain == pytest.approx(short.gain) and g.short_gain_se == pytest.approx(short.gain_se)
    # two long buckets pool as sqrt(sum (n_b / N)^2 se_b^2)
    two = LengthGain("b", "s", (short, long_, an.GainBucket("length", 5000, None, 6000, 3.0, 2.9, 0.1, 0.05,
                                                             0.03)), long_from=512)
    n = long_.n_tokens + 6000
    assert two.long_gain == pytest.approx((long_.n_tokens * long_.gain + 6000 * 0.1) / n)
    assert two.long_gain_se == pytest.approx(math.hypot(long_.n_tokens / n * long_.gain_se, 6000 / n * 0.05))


def test_a_result_saved_with_a_bare_ratio_reads_back_without_it():
    """lengths_gain.json written before the interval (the shipped proxy-s pair's: -3.12x from one short
    document) must not show its unsupported point ratio again."""
    g = _pair(np.random.default_rng(5), 0.001, 0.020)
    d = g.to_dict()
    for key in ("long_gain_se", "short_gain_se", "ratio_low", "ratio_high", "ratio_level", "ratio_note"):
        d.pop(key)
    d["long_short_ratio"] = 2.02
    back = LengthGain.from_dict(d)
    assert back.long_short_ratio is None and back == g
    one = an.GainBucket("length", 1, 512, 26, 5.0, 5.04, -0.035, None, -0.007)
    old = LengthGain("b", "s", (one, an.GainBucket("length", 512, None, 4608, 4.0, 3.9, 0.1, 0.01, 0.03)),
                     long_short_ratio=-3.12, long_from=512)
    assert old.long_short_ratio is None and "single document" in old.ratio_note


def _planted_lengths(run, T):
    """A LengthsResult whose every loss encodes its bucket: loss = 1 + lo / 1000 + T / 1e6."""
    edges_l, edges_p = an.length_edges(T), an.position_edges(T)
    buckets = [an.LossBucket("length", lo, hi, 1, 10, 1 + lo / 1000 + T / 1e6)
               for lo, hi in zip(edges_l, [*edges_l[1:], None])]
    buckets += [an.LossBucket("position", lo, hi, 1, 10, 1 + lo / 1000 + T / 1e6)
                for lo, hi in zip(edges_p[:-1], edges_p[1:])]
    return an.LengthsResult(run, "baseline", T, 1, 1, tuple(buckets))


def test_each_number_sits_under_its_own_bucket_for_mixed_contexts():
    """Before the fix the T = 256 run's [0, 8) position loss was printed in the T = 64 table's row 0-1."""
    results = [_planted_lengths("b64", 64), _planted_lengths("b256", 256)]
    tables = _lengths_tables(results, None)
    assert len(tables) == 4
    console = Console(file=io.StringIO(), width=200)
    seen = 0
    for table in tables:
        T = int(table.title.rsplit(" ", 1)[1])
        assert [c.header.split(" (")[0] for c in table.columns[1::2]] == [f"b{T}"]  # one context per table
        labels = table.columns[0]._cells
        for r in results:
            for b in r.buckets:
                if b.label in labels and r.seq_len == T and (b.by == "length") == ("length" in table.title):
                    row = labels.index(b.label)
                    assert table.columns[1]._cells[row] == f"{b.loss:.4f}"
                    seen += 1
        console.print(table)
    assert seen == sum(len(r.buckets) for r in results)
