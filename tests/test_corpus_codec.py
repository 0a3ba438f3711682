"""The built-in corpus leaves out the standard library's character-map codec tables, which repeat one
another nearly verbatim and so put copies of validation text in training; a spec recorded before
that choice existed keeps its corpus (key, cache folder, and a resumed run's data)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scaling.accounting.tiers import get_config
from scaling.training import runlog
from scaling.training.data import corpus
from scaling.training.data.corpus import DataSpec, is_codec_table, stdlib_dir
from scaling.training.loop.config import TrainConfig
from scaling.training.loop.trainer import train


def test_codec_tables_are_recognised_and_left_out():
    root = stdlib_dir()

    def table(rel: str) -> bool:
        return is_codec_table(Path(rel), (root / rel).read_text(encoding="utf-8"))

    # the pairs the IsoFLOP study's validation windows shared with training, and non-tables
    assert all(table(f"encodings/{m}.py") for m in ("cp737", "cp1125", "koi8_r", "koi8_t", "mac_latin2",
                                                      "cp1006", "cp1250"))
    assert not any(table(rel) for rel in ("encodings/utf_8.py", "encodings/aliases.py", "encodings/idna.py",
                                          "codecs.py"))
    new = {n for n, _ in corpus._source_files("stdlib", codec_tables=False)}
    old = {n for n, _ in corpus._source_files("stdlib", codec_tables=True)}
    gone = old - new
    assert new < old and len(gone) >= 50
    assert all(n.startswith("stdlib/encodings/") for n in gone) and "stdlib/encodings/utf_8.py" in new


def test_a_spec_recorded_before_the_field_keeps_its_corpus():
    legacy = {"vocab_size": 4096, "sources": ["shakespeare", "stdlib"], "val_fraction": 0.025,
              "max_bytes": None}
    spec = DataSpec.from_dict(legacy)
    assert spec.codec_tables and spec.to_dict() == legacy          # so its corpus key is unchanged
    fresh = DataSpec(vocab_size=4096)
    assert not fresh.codec_tables and fresh.to_dict() == {**legacy, "codec_tables": False}
    assert DataSpec.from_dict(fresh.to_dict()) == fresh


def test_a_run_begun_on_the_old_corpus_resumes_on_it(tmp_path, monkeypatch):
    """A run started before the codec tables were left out (simulated: the trainer made to build the
    old spec) is resumed on that corpus, not refused as another configuration nor moved to another
    corpus."""
    monkeypatch.setenv("SMELT_CACHE", str(tmp_path / "cache"))
    import scaling.training.loop.trainer as trainer_mod

    cfg = TrainConfig(tokens=(4 * 512,), batch_size=8, data_max_bytes=100_000, eval_every=2, ckpt_every=2,
                      threads=1, val_windows=8, warmup=1)
    model = get_config("proxy-tiny", "baseline")
    kw = dict(tier="proxy-tiny", run_name="old", runs_dir=tmp_path / "runs")
    real_open = trainer_mod.open_data
    with monkeypatch.context() as m:   # the code before DataSpec.codec_tables: every spec held the tables
        m.setattr(TrainConfig, "data_spec", lambda self, vocab, codec_tables=False: DataSpec(
            vocab_size=vocab, max_bytes=self.data_max_bytes, val_fraction=self.data_val_fraction,
            codec_tables=True))
        m.setattr(trainer_mod, "open_data", lambda *a, **k: real_open(*a, **{**k, "codec_tables": True}))
        first = train(model, cfg, **kw)
    meta = runlog.read_json(tmp_path / "runs" / "old" / "config.json")
    assert "codec_tables" not in meta["data_spec"]                   # recorded as the old code did
    again = train(model, cfg, resume=True, **kw)
    assert again["complete"] and again["points"] == first["points"]
    with pytest.raises(Exception, match="already holds a run"):
        train(model, cfg, **kw)
    fresh = train(model, cfg, tier="proxy-tiny", run_name="new", runs_dir=tmp_path / "runs")
    assert runlog.read_json(tmp_path / "runs" / "new" / "config.json")["data_spec"]["codec_tables"] is False
    assert fresh["complete"]


def test_a_plan_can_ask_for_the_old_corpus():
    """`[data] codec_tables = true` reproduces the runs made before the tables were left out (checked
    on iso-d06 SMELT of runs/: every point to the last digit); it is recorded as they were."""
    from scaling.common.errors import UserError
    from scaling.training.data.loader import check_data_table
    from scaling.training.loop.config import fields_of_tables

    fields = fields_of_tables({}, check_data_table({"codec_tables": True}, "plan"), {}, "plan")
    assert fields == {"data_codec_tables": True}
    old = TrainConfig(tokens=(512,), data_codec_tables=True)
    assert old.to_dict()["data_codec_tables"] is True
    assert "codec_tables" not in old.data_spec(4096).to_dict()          # the old corpus, the old key
    assert "data_codec_tables" not in TrainConfig(tokens=(512,)).to_dict()  # as every run before recorded it
    assert TrainConfig(tokens=(512,)).data_spec(4096).to_dict()["codec_tables"] is False
    with pytest.raises(UserError, match="apply to the built-in corpus"):
        check_data_table({"path": "x", "codec_tables": True}, "plan")
