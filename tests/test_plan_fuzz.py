"""Generated TOML plans through `sweep --dry-run` (issue 25): a valid plan mutated by hypothesis —
values of every type at any key (strings, huge and negative integers, inf/nan, booleans, lists,
nested tables), tables replaced by scalars, keys removed or added, deeply nested arrays — must give
exit 0 or 2, one `error:` line and no traceback, within ``LIMIT_S`` seconds, and change no file
outside the test's folder."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import numpy as np
from cli_timeout import invoke_within
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cli_fuzz import _tree_state
from test_sweep import MINI
from typer.testing import CliRunner

from cli import app

ROOT = Path(__file__).resolve().parents[1]
LIMIT_S = 30
runner = CliRunner()

KEYS = ["batch_size", "lr", "tiers", "archs", "seeds", "budgets", "runs_dir", "kind", "mfu", "mem_gb",
        "path", "mode", "nodes", "gpu_memory_gb", "decay_fraction", "schedule", "val_windows", "vocab_size",
        "d_model", "seq_len", "n_experts", "top_k", "width_multiple", "proxy", "tokens", "seed", "x", "",
        "a b", "é"]
TABLES = ["sweep", "train", "data", "parallel", "executor", "tier", "model", "model.tiny-a", "tier.tiny-a",
          "tier.tiny-a.parallel", "other"]

scalars = (st.integers(-(2**63), 2**63 - 1) | st.sampled_from([0, 1, -1, 2, 16, 10**6, 2**40])
           | st.floats(allow_nan=True, allow_infinity=True) | st.booleans()
           | st.text(max_size=12) | st.sampled_from(["tiny-a", "baseline", "smelt", "../../x", "x" * 300,
                                                    "fsdp", "cpu", "cosine", "debug", "inf", ""]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.sampled_from(KEYS), inner, max_size=3), max_leaves=8)


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return {"inf": "inf", "-inf": "-inf", "nan": "nan"}.get(repr(v), repr(v))
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, _Raw):
        return v.text
    raise TypeError(type(v))


class _Raw:
    """Literal TOML text for a value (deeply nested arrays)."""

    def __init__(self, text: str):
        self.text = text


def _toml(doc: dict) -> str:
    """TOML text of a plan dict: scalars first, then each table as a [section] (dotted names)."""
    lines: list[str] = []

    def section(table: dict, name: list[str]) -> None:
        subs = {k: v for k, v in table.items() if isinstance(v, dict)}
        flat = {k: v for k, v in table.items() if not isinstance(v, dict)}
        if name and (flat or not subs):
            lines.append("[" + ".".join(json.dumps(n) for n in name) + "]")
        lines.extend(f"{json.dumps(k)} = {_value(v)}" for k, v in flat.items())
        for k, v in subs.items():
            section(v, [*name, k])

    section(doc, [])
    return "\n".join(lines) + "\n"


def _mutate(doc: dict, table: str, key: str, action: str, value) -> None:
    node = doc
    for part in table.split("."):
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    if action == "delete":
        node.pop(key, None)
    elif action == "table":  # a whole table replaced by the value
        parent = doc
        parts = table.split(".")
        for part in parts[:-1]:
            parent = parent[part]
        parent[parts[-1]] = value
    else:
        node[key] = value


mutation = st.tuples(st.sampled_from(TABLES), st.sampled_from(KEYS),
                     st.sampled_from(["set", "set", "set", "delete", "table"]),
                     values | st.integers(50, 3000).map(lambda n: _Raw("[" * n + "]" * n)))


def _invoke(args: list[str]):
    return invoke_within(args, LIMIT_S)


def test_generated_plans_through_the_dry_run(tmp_path, monkeypatch, env):
    # the plans read a small shard folder, not the built-in corpus: a dry run builds that corpus
    # (a BPE, ~20 s here) for every new vocabulary or subset, which is its job but not this test's
    shards = tmp_path.parent / f"{tmp_path.name}-shards"
    shards.mkdir()
    rng = np.random.default_rng(0)
    rng.integers(0, 512, 20_000, dtype=np.uint16).tofile(shards / "train.bin")
    rng.integers(0, 512, 2_000, dtype=np.uint16).tofile(shards / "val.bin")
    res = runner.invoke(app, ["prepare-data", str(shards), "--dtype", "uint16", "--vocab-size", "512"])
    assert res.exit_code == 0, res.output
    monkeypatch.chdir(tmp_path)
    base = tomllib.loads(MINI.format(runs=tmp_path / "runs").replace("data_max_bytes = 120000\n", ""))
    base["data"] = {"path": str(shards)}
    before = _tree_state(ROOT)
    codes: dict[int, int] = {}

    @settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.lists(mutation, min_size=1, max_size=3))
    def check(mutations):
        doc = json.loads(json.dumps(base))
        for m in mutations:
            _mutate(doc, *m)
        plan = tmp_path / "plan.toml"
        plan.write_text(_toml(doc))
        res = _invoke(["sweep", str(plan), "--dry-run", "--no-probe", "--json"])
        assert "Traceback" not in res.output, res.output[-2000:]
        if res.exception is not None and not isinstance(res.exception, SystemExit):
            raise AssertionError(f"{mutations!r:.500} raised {res.exception!r}")
        assert res.exit_code in (0, 2), (res.exit_code, res.output[-2000:])
        if res.exit_code == 2:
            errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
            assert len(errors) == 1 and len(res.stderr.strip().splitlines()) == 1, res.stderr[-2000:]
        codes[res.exit_code] = codes.get(res.exit_code, 0) + 1

    check()
    assert codes.get(2, 0) > 0 and codes.get(0, 0) > 0, codes  # refusals and valid plans both
    assert _tree_state(ROOT) == before, "a dry run changed files outside the test's folder"
    assert sorted(os.listdir(tmp_path)) == ["plan.toml"]  # no runs folder, nothing else
