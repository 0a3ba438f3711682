"""`smelt-scale tiers` / `match`: JSON shape, table, one-line errors with exit 2."""

import json

import pytest
from typer.testing import CliRunner

from cli import app

runner = CliRunner()


def test_tiers_json_shape():
    res = runner.invoke(app, ["tiers", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert list(data) == ["schema", "tiers"] and data["schema"] == "smelt-scale.tiers/1"
    names = [t["name"] for t in data["tiers"]]
    assert names[:4] == ["100M", "200M", "600M", "1.6B"]
    assert any(t["proxy"] for t in data["tiers"]) and not data["tiers"][0]["proxy"]
    for t in data["tiers"]:
        for arch in ("baseline", "smelt"):
            entry = t[arch]
            for key, kind in (("active_params", int), ("non_embedding_params", int), ("total_params", int),
                              ("flops_per_token", float), ("kv_cache_per_token", int), ("config", dict)):
                assert isinstance(entry[key], kind), (key, entry[key])
        mm = t["mismatch"]
        assert set(mm) == {"flops_per_token", "non_embedding_params", "kv_cache_per_token"}
        expect = t["smelt"]["flops_per_token"] / t["baseline"]["flops_per_token"] - 1
        assert abs(mm["flops_per_token"] - expect) < 1e-12
        assert all(abs(v) <= 0.01 for v in mm.values())


def test_tiers_table_and_filter():
    res = runner.invoke(app, ["tiers", "--tier", "100M"])
    assert res.exit_code == 0
    assert "100M" in res.stdout and "smelt" in res.stdout and "proxy-s" not in res.stdout


def test_unknown_tier_is_one_line_exit_2():
    res = runner.invoke(app, ["tiers", "--tier", "7B"])
    assert res.exit_code == 2
    assert res.stderr.strip().count("\n") == 0 and "unknown tier '7B'" in res.stderr
    assert "Traceback" not in res.output


def test_match_from_options_and_file(tmp_path):
    args = ["--vocab-size", "32000", "--d-model", "1024", "--n-layers", "16", "--n-heads", "16",
            "--n-kv-heads", "4", "--head-dim", "64", "--n-experts", "64", "--top-k", "8",
            "--expert-hidden", "512"]
    res = runner.invoke(app, ["match", *args, "--json"])
    assert res.exit_code == 0, res.output
    twin = json.loads(res.stdout)["tiers"][0]
    assert twin["smelt"]["config"]["n_loops"] == 2
    assert twin["smelt"]["config"]["loop_start"] == 4 and twin["smelt"]["config"]["loop_end"] == 12
    cfg = tmp_path / "base.toml"
    cfg.write_text("[model]\nvocab_size = 32000\nd_model = 1024\nn_layers = 16\nn_heads = 16\n"
                   "n_kv_heads = 4\nhead_dim = 64\nn_experts = 64\ntop_k = 8\nexpert_hidden = 512\n")
    res2 = runner.invoke(app, ["match", str(cfg), "--json"])
    assert json.loads(res2.stdout) == json.loads(res.stdout) | {"tiers": [twin]}


def test_match_impossible_config_exit_2(tmp_path):
    res = runner.invoke(app, ["match", "--vocab-size", "100", "--d-model", "64", "--n-layers", "4",
                              "--n-heads", "3", "--n-kv-heads", "2", "--head-dim", "16", "--n-experts", "8",
                              "--top-k", "2", "--expert-hidden", "64"])
    assert res.exit_code == 2 and "must divide" in res.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    res = runner.invoke(app, ["match", str(bad)])
    assert res.exit_code == 2 and "not valid JSON" in res.stderr
    res = runner.invoke(app, ["match", "--d-model", "64"])
    assert res.exit_code == 2 and "incomplete model config" in res.stderr


def test_every_command_has_help():
    for cmd in ([], ["tiers"], ["match"]):
        res = runner.invoke(app, [*cmd, "--help"])
        assert res.exit_code == 0 and "Usage" in res.stdout


@pytest.mark.parametrize("doc, message", [
    ({"model": 5}, "'model' must be an object"),
    ({"name": {"a": 1}}, "name must be text"),
    ({"rope_theta": "abc"}, "rope_theta must be a finite number > 0"),
    ({"norm_eps": -1.0}, "norm_eps must be a finite number > 0"),
    ({"tie_embeddings": 1}, "tie_embeddings must be true or false"),
    ({"loop_start": 1.5}, "loop_start must be an integer"),
])
def test_match_refuses_config_fields_of_the_wrong_type(tmp_path, doc, message):
    """Every ModelConfig field is checked (a plan's [model] table and `match CONFIG` alike): once a
    string rope_theta passed a sweep's dry run and failed mid-run, a dict name gave a traceback."""
    import json

    from scaling.accounting.tiers import get_config

    base = get_config("proxy-tiny", "baseline").to_dict()
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc if "model" in doc else {**base, **doc}))
    res = CliRunner().invoke(app, ["match", str(path)])
    assert res.exit_code == 2 and message in res.stderr, res.output
    assert len(res.stderr.strip().splitlines()) == 1


def test_match_of_a_tier_is_the_twin_tiers_and_train_build():
    # the proxies' twins are derived at width multiple 1, the paper tiers' at 8: `match --tier`
    # used 8 for every tier, so its proxy twins were other models than the ones trained
    import json

    from scaling.accounting.tiers import get_config, tier_names

    for tier in tier_names(include_test=True):
        res = runner.invoke(app, ["match", "--tier", tier, "--json"])
        assert res.exit_code == 0, res.output
        got = json.loads(res.stdout)["tiers"][0]["smelt"]["config"]
        want = {k: v for k, v in get_config(tier, "smelt").to_dict().items() if k != "name"}
        assert {k: got[k] for k in want} == want, tier
