"""Trained runs for the mechanism analyses: a run folder (``scaling.common.run_folder``) loaded as
its ModelConfig and model, with its evaluation data.

A run folder holds ``config.json`` (``model``: the ModelConfig; ``data_spec`` and ``data``: the
corpus spec and its provenance) and the final weights ``final_weights.safetensors``.
:func:`load_run` rebuilds the model from them; the tokenizer and validation data come from the
run's ``eval_data/`` snapshot (:func:`save_eval_data`) or else its corpus
(``scaling.training.data.corpus.load_corpus`` of the recorded spec), checked against the tokenizer hash
recorded at training time.
"""

from __future__ import annotations

import hashlib
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch

from scaling.accounting.config import ModelConfig
from scaling.accounting.tiers import ARCHS
from scaling.common import run_folder
from scaling.common.errors import UserError
from scaling.common.files import read_config, sha256_file
from scaling.common.run_folder import EVAL_DATA, EVAL_DATA_FILES
from scaling.training.data.corpus import Corpus, DataSpec, load_corpus
from scaling.training.model.transformer import MoETransformer

# What of a corpus folder the analyses read (tokenizer, validation split, provenance).
_EVAL_FILES = tuple(n for n in EVAL_DATA_FILES if n != "train.npy")


def batched(items: Sequence, size: int) -> Iterable[Sequence]:
    """Consecutive slices of ``items`` of at most ``size`` elements."""
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _model_config(meta: dict, where: Path) -> ModelConfig:
    model = meta.get("model")
    if not isinstance(model, dict):
        raise UserError(f"{where / run_folder.CONFIG} has no model config (key 'model')")
    return ModelConfig.from_dict(model)


def _data_spec(meta: dict, where: Path) -> tuple[DataSpec, dict]:
    """The run's DataSpec (``data_spec``) and the corpus provenance recorded at training (``data``)."""
    spec = meta.get("data_spec")
    if not isinstance(spec, dict):
        raise UserError(f"{where / run_folder.CONFIG} has no data spec (key 'data_spec')")
    return DataSpec.from_dict(spec), meta.get("data") or {}


class LoadedRun:
    """A trained run: its folder, config.json, ModelConfig and model (eval mode, no grad).

    ``corpus`` and ``tokenizer`` are built on first use (the corpus build takes ~30 s once per
    machine, then it is cached).
    """

    def __init__(self, path: Path, meta: dict, config: ModelConfig, model: MoETransformer,
                 weights_sha256: str | None = None):
        self.path, self.meta, self.config, self.model = path, meta, config, model
        self.weights_sha256 = weights_sha256   # of the bytes the model was loaded from

    @property
    def weights_record(self) -> dict:
        """What a saved analysis records of the weights it was computed on (``analysis/<kind>.json``
        key ``weights``; compare checks it against the run's weights file)."""
        return {"run": self.name, "file": run_folder.WEIGHTS, "sha256": self.weights_sha256}

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def arch(self) -> str:
        return self.config.arch

    @property
    def seq_len(self) -> int:
        return self.config.seq_len

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @cached_property
    def corpus(self) -> Corpus:
        """The run's evaluation data: its shipped ``eval_data/`` snapshot if present (see
        :func:`save_eval_data`), else the corpus of its data spec built on this machine; either
        must carry the tokenizer recorded at training (same SHA-256)."""
        spec, provenance = _data_spec(self.meta, self.path)
        want = (provenance.get("tokenizer") or {}).get("sha256")
        snapshot = self.path / EVAL_DATA
        if snapshot.exists():
            # a folder that is there was meant as the snapshot: a damaged one is an error, never a
            # silent fallback to a corpus built here (whose text may differ; see save_eval_data)
            corpus = open_snapshot(snapshot)
            have = corpus.provenance["tokenizer"]["sha256"]
            if want and want != have:
                raise UserError(f"{snapshot} holds tokenizer {have[:12]}, not the run's {want[:12]}")
            return corpus
        corpus = _corpus(spec)
        have = corpus.provenance["tokenizer"]["sha256"]
        if want and want != have:
            raise UserError(
                f"run {self.name} was trained with tokenizer {want[:12]}, but the corpus built here "
                f"({corpus.path}) has tokenizer {have[:12]}: its sources differ from the training "
                f"machine's (recorded: {_sources_line(provenance)}; "
                f"here: {_sources_line(corpus.provenance)}); "
                f"ship the run with its {EVAL_DATA}/ snapshot (scaling.analysis.runs.save_eval_data)")
        return corpus

    @property
    def tokenizer(self):
        return self.corpus.tokenizer

    def require(self, arch: str | None = None) -> "LoadedRun":
        if arch is not None and self.arch != arch:
            raise UserError(f"run {self.name} is a {self.arch} run; this needs a {arch} run")
        return self

    def __repr__(self) -> str:
        return f"LoadedRun({self.name!r}, arch={self.arch!r}, path={str(self.path)!r})"


@lru_cache(maxsize=8)
def _corpus(spec: DataSpec) -> Corpus:
    """One Corpus per spec and process (assembling the sources to find the cache key takes ~2 s)."""
    return load_corpus(spec)


def _sources_line(provenance: dict) -> str:
    return ", ".join(f"{s.get('name')} {s.get('version')} sha {str(s.get('sha256'))[:8]}"
                     for s in provenance.get("sources", [])) or "unknown"


def load_run(path: Path | str, device: str | torch.device = "cpu") -> LoadedRun:
    """Load ``runs/<run>``: config.json -> ModelConfig -> MoETransformer with the run's final weights.

    Raises UserError (one line) for a missing folder, a folder without config.json, a run
    without final weights (trained without ``save_final_weights``), or weights that do not fit
    the config.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load as load_bytes

    path = Path(path)
    if not path.is_dir():
        raise UserError(f"no run folder {path}")
    cfg_file = path / run_folder.CONFIG
    if not cfg_file.is_file():
        raise UserError(f"{path} is not a run folder (no {run_folder.CONFIG})")
    meta = read_config(cfg_file, "run config")
    config = _model_config(meta, path)
    weights = path / run_folder.WEIGHTS
    if not weights.is_file():
        raise UserError(f"run {path.name} has no weights ({run_folder.WEIGHTS}); the analyses need a "
                        "trained checkpoint: train it with its final weights saved (save_final_weights)")
    try:
        raw = weights.read_bytes()   # read once: the hash is of the very bytes loaded
        state = load_bytes(raw)
    except (SafetensorError, OSError) as exc:
        raise UserError(f"cannot read {weights}: {exc}") from None
    sha = hashlib.sha256(raw).hexdigest()
    del raw
    model = MoETransformer(config)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        raise UserError(f"weights of run {path.name} do not fit its config: {' '.join(first[:2])}") from None
    model.eval().requires_grad_(False).to(device)
    return LoadedRun(path, meta, config, model, sha)


def snapshot_problems(folder: Path) -> list[str]:
    """What is wrong with an ``eval_data/`` snapshot: missing files (every one of
    ``run_folder.EVAL_DATA_FILES``), a provenance.json without ``spec`` (an object) or
    ``tokenizer.sha256``, and a tokenizer.json whose SHA-256 is not the recorded one; [] when whole."""
    if not folder.is_dir():
        return [f"{folder} is not a folder"]
    problems = [f"{name} is missing" for name in EVAL_DATA_FILES if not (folder / name).is_file()]
    if (folder / "provenance.json").is_file():
        prov = read_config(folder / "provenance.json", "eval_data provenance")
        sha = prov.get("tokenizer", {}).get("sha256") if isinstance(prov.get("tokenizer"), dict) else None
        if not isinstance(prov.get("spec"), dict):
            problems.append("provenance.json has no data spec (key 'spec')")
        if not isinstance(sha, str):
            problems.append("provenance.json has no tokenizer hash (key 'tokenizer.sha256')")
        elif (folder / "tokenizer.json").is_file():
            have = sha256_file(folder / "tokenizer.json")
            if have != sha:
                problems.append(f"tokenizer.json has SHA-256 {have[:12]}, not the recorded {sha[:12]}")
    return problems


def open_snapshot(folder: Path) -> Corpus:
    """The ``eval_data/`` snapshot as a Corpus; UserError (one line) naming what is missing or
    unreadable, and what to do (nothing here deletes a user's files)."""
    problems = snapshot_problems(folder)
    fix = (f"restore it from where the run came from, or move {folder} aside and rebuild it with "
           "`smelt-scale analyze snapshot-data` (it needs the run's corpus on this machine)")
    if problems:
        raise UserError(f"the evaluation-data snapshot {folder} is damaged: {'; '.join(problems)}; {fix}")
    try:
        return Corpus(folder)
    except (OSError, ValueError, KeyError, TypeError) as exc:  # e.g. a truncated .npy
        raise UserError(f"cannot read the evaluation-data snapshot {folder}: {exc}; {fix}") from None


def save_eval_data(run_dir: Path | str) -> Path:
    """Snapshot the evaluation data of a run into ``<run_dir>/eval_data/`` (~0.5 MB for the
    default corpus): the tokenizer, the validation split and the provenance of its corpus, plus
    an empty ``train.npy`` so the folder opens as a ``scaling.training.data.corpus.Corpus`` (training batches
    from it raise UserError). A run shipped with it (and its weights) is analysed on any machine
    without rebuilding the corpus, even where the Python standard library differs.

    An existing ``eval_data/`` is kept: returned when whole (every file, the provenance keys and
    the run's tokenizer; :func:`open_snapshot`), else UserError naming what is wrong. It is never
    overwritten or deleted: it may be the only copy of data the run was trained on."""
    import shutil

    run = load_run(run_dir)
    if (run.path / EVAL_DATA).exists():
        run.corpus  # checks the existing snapshot whole; UserError if damaged
        return run.path / EVAL_DATA
    source = run.corpus.path  # built and checked against the recorded tokenizer
    dest = run.path / EVAL_DATA
    tmp = run.path / f".{EVAL_DATA}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name in _EVAL_FILES:
        shutil.copy2(source / name, tmp / name)
    np.save(tmp / "train.npy", np.zeros(0, dtype=np.uint16))
    tmp.rename(dest)
    return dest


def load_runs(paths: Sequence[Path | str], device: str | torch.device = "cpu") -> list[LoadedRun]:
    if not paths:
        raise UserError("no runs given")
    runs = [load_run(p, device) for p in paths]
    names = [r.name for r in runs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UserError(f"more than one run named {', '.join(dup)}: results are keyed by run folder name")
    return runs


def pair_runs(runs: Sequence[LoadedRun]) -> tuple[LoadedRun, LoadedRun]:
    """(baseline, smelt) from exactly one run of each architecture; UserError otherwise."""
    archs = [r.arch for r in runs]
    if len(runs) != 2 or sorted(archs) != ["baseline", "smelt"]:
        raise UserError("a SMELT-minus-Baseline gain needs one baseline and one smelt run; got "
                        + (", ".join(f"{r.name} ({r.arch})" for r in runs) or "none"))
    base, smelt = sorted(runs, key=lambda r: ARCHS.index(r.arch))
    return base, smelt

