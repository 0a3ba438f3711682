"""The shared helpers of scaling.common and the one default-sparsity rule of scaling.fitting.sources."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np
import pytest

from scaling.common import format as fmt
from scaling.common.errors import UserError
from scaling.common.files import read_config, read_jsonl
from scaling.common.run_folder import RunFolder, find_run_folders
from scaling.common.serialize import Record, from_dict, to_dict
from scaling.common.stats import percentile_interval
from scaling.fitting.sources import default_sparsity


# -- JSONL: only a torn final line may be dropped ------------------------------------------------
def test_jsonl_drops_only_a_torn_final_line(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"a": 1}\n\n{"a": 2}\n{"a": 3, "b"')
    got = read_jsonl(p)
    assert got.rows == [{"a": 1}, {"a": 2}] and got.skipped == 1
    p.write_text('{"a": 1}\n{"a": 2}')  # complete object without its newline: kept
    assert read_jsonl(p).rows == [{"a": 1}, {"a": 2}] and read_jsonl(p).skipped == 0


def test_jsonl_corrupt_line_mid_file_is_an_error_naming_it(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"a": 1}\n{"a": \n{"a": 3}\n')
    with pytest.raises(UserError, match=r"m.jsonl:2: not JSON"):
        read_jsonl(p)
    p.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(UserError, match=r"m.jsonl:2: expected a JSON object"):
        read_jsonl(p)
    assert read_jsonl(tmp_path / "absent.jsonl", missing_ok=True).rows == []
    with pytest.raises(UserError, match="no such file"):
        read_jsonl(tmp_path / "absent.jsonl")


# -- config files and run folders ----------------------------------------------------------------
def test_read_config_toml_json_and_errors(tmp_path):
    (tmp_path / "a.toml").write_text('[model]\nd_model = 64\n')
    (tmp_path / "a.json").write_text('{"d_model": 64}')
    assert read_config(tmp_path / "a.toml") == {"model": {"d_model": 64}}
    assert read_config(tmp_path / "a.json") == {"d_model": 64}
    (tmp_path / "t.txt").write_text('x = 1\n')
    assert read_config(tmp_path / "t.txt", fmt="toml") == {"x": 1}
    for name, text, msg in [("b.toml", "x = ", "not valid TOML"), ("b.json", "{", "not valid JSON"),
                            ("c.json", "[1]", "must hold one")]:
        (tmp_path / name).write_text(text)
        with pytest.raises(UserError, match=msg):
            read_config(tmp_path / name)
    with pytest.raises(UserError, match="plan file not found"):
        read_config(tmp_path / "none.toml", "plan")


def test_run_folders_status(tmp_path):
    with pytest.raises(UserError, match="no such runs folder"):
        find_run_folders(tmp_path / "absent")
    done = {"complete": True, "points": [{"D": 1}]}
    for name, final in (("a", done), ("b", {"complete": False}), ("c", None)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
        if final is not None:
            (tmp_path / name / "final.json").write_text(json.dumps(final))
    (tmp_path / "c" / "metrics.jsonl").write_text('{"step": 1}\n{"st')
    runs = find_run_folders(tmp_path)
    assert [r.name for r in runs] == ["a", "b", "c"]
    assert [r.status() for r in runs] == ["done", "partial", "partial"]
    assert runs[2].metrics().rows == [{"step": 1}] and runs[2].metrics().skipped == 1
    assert RunFolder(tmp_path / "d").status() == "new"


def test_run_status_is_one_rule(tmp_path):
    """Issue 30: RunFolder.status is the sweep's rule. An incomplete or unreadable final.json is never
    'done'; without config.json the trainer cannot resume, so a final.json alone is 'new'."""
    from scaling.training.sweep.submit import run_status

    done = {"complete": True, "points": [{"D": 1}]}
    cases = {"done": (done, True), "incomplete": ({"complete": False}, True),
             "torn": ("{\"comp", True), "final-only": ({"complete": False}, False),
             "torn-only": ("{\"comp", False), "config-only": (None, True), "metrics-only": (None, False),
             # a final.json that says complete but cannot show its points, or stands without the
             # config.json the trainer writes first, is no finished run (2026-12-07 review: the sweep
             # skipped such a folder as done, and `sweep --status` crashed on its points)
             "no-points": ({"complete": True}, True),
             "points-text": ({"complete": True, "points": "x"}, True),
             "points-empty": ({"complete": True, "points": []}, True),
             "complete-text": ({"complete": "yes", "points": [{"D": 1}]}, True),
             "done-final-only": (done, False)}
    for name, (final, config) in cases.items():
        (tmp_path / name).mkdir()
        if config:
            (tmp_path / name / "config.json").write_text("{}")
        if final is not None:
            text = final if isinstance(final, str) else json.dumps(final)
            (tmp_path / name / "final.json").write_text(text)
    (tmp_path / "metrics-only" / "metrics.jsonl").write_text('{"iter": 1}\n')
    want = {"done": "done", "incomplete": "partial", "torn": "partial", "final-only": "new",
            "torn-only": "new", "config-only": "partial", "metrics-only": "new", "absent": "new",
            "no-points": "partial", "points-text": "partial", "points-empty": "partial",
            "complete-text": "partial", "done-final-only": "new"}
    for name, status in want.items():
        assert RunFolder(tmp_path / name).status() == status, name
        assert run_status(tmp_path, name) == status, name


# -- statistics and formats ----------------------------------------------------------------------
def test_percentile_interval_leaves_out_failed_resamples():
    x = np.arange(101, dtype=float)
    assert percentile_interval(x, 0.9) == pytest.approx((5.0, 95.0))
    assert percentile_interval(np.r_[x, np.nan, np.inf], 0.9) == pytest.approx((5.0, 95.0))
    lo, hi = percentile_interval(np.full(3, np.nan))
    assert math.isnan(lo) and math.isnan(hi)
    cols = np.stack([x, 2 * x], axis=1)
    lo, hi = percentile_interval(cols, 0.9, axis=0)
    np.testing.assert_allclose(lo, [5.0, 10.0])
    np.testing.assert_allclose(hi, [95.0, 190.0])


def test_number_formats():
    assert fmt.si(273_000) == "273k" and fmt.si(1.2e6) == "1.2M" and fmt.si(3.4e12) == "3.4e+12"
    assert fmt.si(float("nan")) == "-" and fmt.number(None) == "-" and fmt.number(1.23456, ".3f") == "1.235"
    assert fmt.percent(0.1234, 2) == "12.34%" and fmt.percent(float("inf"), missing="—") == "—"
    assert fmt.count(27648) == "27,648" and fmt.count(1.23e7) == "1.23e+07"
    assert fmt.duration(42) == "42 s" and fmt.duration(210) == "3.5 min" and fmt.duration(4320) == "1.2 h"


# -- the generic dataclass serializer ------------------------------------------------------------
@dataclass(frozen=True)
class _Inner:
    k: int
    pass_: int = field(metadata={"key": "pass"})
    extra: float | None = field(default=None, metadata={"omit_none": True})


@dataclass(frozen=True)
class _Outer(Record):
    name: str
    items: tuple[_Inner, ...]
    by_group: dict[str, float]
    interval: tuple[float, float] | None = None
    tags: tuple[str, ...] = ()

    _computed = ("n_items",)

    @property
    def n_items(self) -> int:
        return len(self.items)


def test_serializer_round_trip_keys_and_computed():
    obj = _Outer("x", (_Inner(1, 2), _Inner(3, 1, 0.5)), {"a": 1.0}, (0.1, 0.2), ("t",))
    d = obj.to_dict()
    assert d["items"] == [{"k": 1, "pass": 2}, {"k": 3, "pass": 1, "extra": 0.5}]
    assert d["interval"] == [0.1, 0.2] and d["tags"] == ["t"] and d["n_items"] == 2
    back = _Outer.from_dict(json.loads(json.dumps(d)))
    assert back == obj and isinstance(back.items[0], _Inner) and isinstance(back.interval, tuple)
    assert from_dict(_Outer, {"name": "y", "items": [], "by_group": {}}) == _Outer("y", (), {})
    assert to_dict(_Inner(1, 2)) == {"k": 1, "pass": 2}


# -- the one default-sparsity rule ---------------------------------------------------------------
def test_default_sparsity_is_the_median_of_distinct_recorded_values():
    # both groups' recorded sparsities together, duplicates counted once
    assert default_sparsity([0.5, 0.7, 0.7, 0.9, 0.6]) == pytest.approx(0.65)
    assert default_sparsity([0.123456]) == 0.1235
    with pytest.raises(UserError, match="record none"):
        default_sparsity([])


def test_user_error_hint_is_for_the_command_line(tmp_path):
    """Issue 30: a library error keeps CLI words out of its message; the CLI shows them."""
    from typer.testing import CliRunner

    from scaling.cli import app
    from scaling.training.data.shards import read_manifest

    exc = UserError("no manifest.json in d", hint="make one with `smelt-scale prepare-data`", sep=": ")
    assert str(exc) == "no manifest.json in d"
    assert exc.with_hint() == "no manifest.json in d: make one with `smelt-scale prepare-data`"
    assert UserError("plain").with_hint() == "plain"

    (tmp_path / "data").mkdir()
    with pytest.raises(UserError) as refused:
        read_manifest(tmp_path / "data")
    assert str(refused.value) == f"no manifest.json in {tmp_path / 'data'}"
    res = CliRunner().invoke(app, ["train", "--tier", "proxy-tiny", "--arch", "smelt", "--tokens", "1e4",
                                   "--data", str(tmp_path / "data"), "--device", "cpu",
                                   "--runs-dir", str(tmp_path / "runs"), "--json"])
    assert res.exit_code == 2
    assert " ".join(res.stderr.split()) == (
        f"error: no manifest.json in {tmp_path / 'data'}: make one with `smelt-scale prepare-data` (which "
        "also indexes existing nanoGPT/OLMo-style shards when told their dtype and vocabulary)")


def test_decimals_tell_distinct_values_apart():
    from scaling.common.format import decimals

    assert decimals(0.5138837, 0.5138853) == 5          # [0.51388, 0.51389], not [0.514, 0.514]
    assert decimals(0.41, 0.52) == 3 and decimals(0.5, 0.5) == 3      # equal values need no more
    assert decimals(1.0, 1.0 + 1e-12) == 9                            # capped
    from scaling.cli.fit import _ci_text
    from scaling.fitting.approaches import COLLAPSED_REL

    # every interval wider than the collapse threshold prints two ends (the review of 2026-12-08:
    # widths of 1e-9 to 5e-9 printed [a, a] when the threshold was 1e-9 and the cap 8 decimals)
    for a in (0.51388888, 0.05, 1.3, 9.7):
        for w in (1.01, 1.5, 3.0, 10.0):
            lo, hi = a, a + w * COLLAPSED_REL * max(1.0, a)
            text = _ci_text([lo, hi])
            ends = text.strip(" []").split(", ")
            assert len(ends) == 2 and ends[0] != ends[1], (a, w, text)
        assert "zero width" in _ci_text([a, a + 0.5 * COLLAPSED_REL * max(1.0, a)])
