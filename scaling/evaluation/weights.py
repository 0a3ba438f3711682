"""Which weights of a run to evaluate: a budget's, the final ones, or a DCP checkpoint's.

A run folder (``scaling.common.run_folder``) may hold, besides ``config.json`` and ``final.json``:

* ``final_weights.safetensors``: the weights at the end of the trunk, i.e. of the largest budget
  (``train --save-final-weights``);
* ``weights/budget-<i>.safetensors``: the weights at the end of budget ``i`` (its index in
  ``config.json``'s ``budgets`` and ``final.json``'s ``budget_index``; 0 = the smallest budget),
  written when each WSD cooldown branch ends (``train --save-budget-weights``);
* ``checkpoints/iter-<N>/``: the DCP checkpoints (model and optimizer state; any one of them can
  be read with ``checkpoint=``).

:func:`resolve_weights` picks one of these and :func:`load_weights` builds the model from it,
with the (N, D, C, validation loss) of that budget from ``final.json`` beside it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaling.accounting.config import ModelConfig
from scaling.accounting.costs import costs as accounting
from scaling.common import run_folder
from scaling.common.errors import UserError
from scaling.common.files import read_config


@dataclass(frozen=True)
class WeightsSource:
    """One set of weights of one run.

    run       run folder
    kind      "budget" (weights/budget-<i>), "final" (final_weights) or "checkpoint" (a DCP folder)
    path      the safetensors file or the DCP checkpoint folder
    budget    the budget index, or None (a checkpoint that is no budget end)
    point     that budget's final.json point (N, D, flops, loss, ...), or None
    """

    run: Path
    kind: str
    path: Path
    budget: int | None
    point: dict | None

    def describe(self) -> str:
        b = "" if self.budget is None else f" budget {self.budget}"
        return f"{self.run.name}{b} ({self.kind}: {self.path})"


def run_meta(run_dir: Path) -> dict:
    if not run_dir.is_dir():
        raise UserError(f"no run folder {run_dir}")
    if not (run_dir / run_folder.CONFIG).is_file():
        raise UserError(f"{run_dir} is not a run folder (no {run_folder.CONFIG})")
    return read_config(run_dir / run_folder.CONFIG, "run config")


def model_config(meta: dict, run_dir: Path) -> ModelConfig:
    model = meta.get("model")
    if not isinstance(model, dict):
        raise UserError(f"{run_dir / run_folder.CONFIG} has no model config (key 'model')")
    return ModelConfig.from_dict(model)


def _points(run_dir: Path) -> dict[int, dict]:
    f = run_dir / run_folder.FINAL
    if not f.is_file():
        return {}
    doc = read_config(f, "final")
    points = doc.get("points", [])
    if not isinstance(points, list):
        raise UserError(f"{f}: 'points' must be a list of budget points")
    out = {}
    for i, p in enumerate(points):
        if not isinstance(p, dict):
            raise UserError(f"{f}: point {i + 1} is not an object")
        if "budget_index" not in p:
            continue
        b = p["budget_index"]
        # the trainer writes an int; anything else would become a wrong budget or a traceback
        if isinstance(b, bool) or not isinstance(b, int) or b < 0:
            raise UserError(f"{f}: point {i + 1} has budget_index {str(b)[:30]!r}, not a budget index "
                            "(an integer >= 0)")
        out[int(b)] = p
    return out


def n_budgets(meta: dict) -> int:
    return len(meta.get("budgets") or [])


def available_budgets(run_dir: Path | str) -> list[int]:
    """Budget indices whose weights this run folder holds (budget files, or final weights for
    the largest budget)."""
    run_dir = Path(run_dir)
    meta = run_meta(run_dir)
    n = n_budgets(meta)
    out = [i for i in range(n) if run_folder.budget_weights_path(run_dir, i).is_file()]
    if n and (n - 1) not in out and (run_dir / run_folder.WEIGHTS).is_file():
        out.append(n - 1)
    return sorted(out)


def resolve_weights(
    run_dir: Path | str, budget: int | None = None, checkpoint: Path | str | None = None
) -> WeightsSource:
    """The weights to load. ``budget=None``: the largest budget (final weights, else its budget
    file); ``checkpoint``: a DCP checkpoint folder of this run (``budget`` must then be None).
    UserError (one line, naming what exists) when the weights are not there."""
    run_dir = Path(run_dir)
    meta = run_meta(run_dir)
    n = n_budgets(meta)
    points = _points(run_dir)
    if checkpoint is not None:
        if budget is not None:
            raise UserError("give a budget or a checkpoint, not both")
        ckpt = Path(checkpoint)
        if not (ckpt / ".metadata").is_file():
            raise UserError(f"{ckpt} is not a DCP checkpoint folder (no .metadata)")
        return WeightsSource(run_dir, "checkpoint", ckpt, None, None)
    last = n - 1
    if budget is None:
        budget = last
    if not 0 <= budget < max(n, 1):
        raise UserError(f"run {run_dir.name} has budgets 0..{last}, not {budget}")
    path = run_folder.budget_weights_path(run_dir, budget)
    if path.is_file():
        return WeightsSource(run_dir, "budget", path, budget, points.get(budget))
    if budget == last and (run_dir / run_folder.WEIGHTS).is_file():
        return WeightsSource(run_dir, "final", run_dir / run_folder.WEIGHTS, budget, points.get(budget))
    have = available_budgets(run_dir)
    raise UserError(
        f"run {run_dir.name} has no weights for budget {budget} (weights for budgets: "
        f"{', '.join(map(str, have)) or 'none'})",
        hint="train it with --save-budget-weights (every budget) or --save-final-weights (the largest), "
             "or give --checkpoint")


def _check_holds(metadata, wanted: dict, source: WeightsSource) -> None:
    """UserError naming the first tensor of ``wanted`` (the model's state, DCP's flattened keys
    under ``model.``) that the checkpoint lacks or stores at another shape: DCP's own error for
    another run's checkpoint is ``CheckpointException ranks:dict_keys([0])``."""
    stored = metadata.state_dict_metadata
    for name, tensor in wanted.items():
        entry = stored.get(f"model.{name}")
        shape = tuple(getattr(entry, "size", ()) or ())
        if entry is None or shape != tuple(tensor.shape):
            there = "missing" if entry is None else f"{list(shape)}"
            raise UserError(
                f"checkpoint {source.path} does not hold run {source.run.name}'s model: {name} is "
                f"{there} there, {list(tensor.shape)} in the run's config",
                hint="give a checkpoint from this run's checkpoints/ folder")


def _load_state(source: WeightsSource, cfg: ModelConfig) -> dict:

    if source.kind == "checkpoint":
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        from scaling.training.loop.checkpoint import check_dcp_metadata
        from scaling.training.model.transformer import MoETransformer
        from scaling.training.parallel.expert_parallel import split_expert_stacks, stacked_checkpoint

        model = MoETransformer(cfg)
        weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        try:
            import warnings

            # the restricted unpickler first: DCP itself reads .metadata with plain pickle
            metadata = check_dcp_metadata(source.path)
            # the trainer's checkpoints store each expert as its own entry (views: filled in place);
            # older ones hold the stacks whole
            payload = ({"model": weights} if stacked_checkpoint(metadata)
                       else {"model": split_expert_stacks({"model": weights, "optim": {}}, model)["model"]})
            _check_holds(metadata, payload["model"], source)
            with warnings.catch_warnings():  # "torch.distributed is disabled ... single process": meant
                warnings.simplefilter("ignore", UserWarning)
                dcp.load(payload, checkpoint_id=str(source.path), no_dist=True)
        except UserError:
            raise
        except (Exception, CheckpointException) as exc:  # DCP's own exception is a BaseException
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UserError(f"cannot read the model from checkpoint {source.path}: {first}") from None
        return weights
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(source.path), device="cpu")
    except (SafetensorError, OSError) as exc:
        raise UserError(f"cannot read {source.path}: {exc}") from None


def weights_sha256(source: WeightsSource, state: dict) -> str:
    """SHA-256 of the weights file; for a DCP checkpoint, of the tensors (names in sorted order,
    each name then its little-endian bytes), which does not depend on how DCP sharded them."""
    h = hashlib.sha256()
    if source.kind != "checkpoint":
        with open(source.path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()
    import torch

    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@dataclass
class LoadedWeights:
    """A model built from one :class:`WeightsSource`, with what the evaluation table needs."""

    source: WeightsSource
    meta: dict
    config: ModelConfig
    model: Any  # MoETransformer (eval mode, no grad)
    sha256: str

    def facts(self) -> dict:
        """The run's N (active parameters), D (tokens), C (training FLOPs) and validation loss
        at this budget (from final.json; a checkpoint: the tokens of its steps, no loss)."""
        acc = accounting(self.config)
        p = self.source.point or {}
        D = p.get("D")
        if D is None and self.source.kind == "checkpoint":
            # the steps on the path to these weights (Position.step: trunk, or trunk then branch),
            # not tokens_seen, which also counts the cooldown branches already closed
            meta_file = self.source.path / "meta.json"
            per_step = (self.meta.get("resolved") or {}).get("tokens_per_step")
            if meta_file.is_file() and per_step:
                pos = (json.loads(meta_file.read_text()).get("state") or {}).get("position") or {}
                step = pos.get("trunk_step") if pos.get("branch") is None else pos.get("branch_step")
                D = None if step is None else int(step) * int(per_step)
        return {
            "run": self.source.run.name,
            "arch": self.config.arch,
            "tier": self.meta.get("tier"),
            "seed": self.meta.get("seed"),
            "proxy": self.meta.get("proxy"),
            "budget": self.source.budget,
            "N": p.get("N", acc.active_params),
            "D": D,
            "C": p.get("flops", acc.flops_per_token * D if D is not None else None),
            "val_loss": p.get("loss"),
            "val_bpb": p.get("val_bpb"),
            "weights": self.source.kind,
            "weights_sha256": self.sha256,
        }


def load_weights(source: WeightsSource, device: str = "cpu") -> LoadedWeights:
    """Build the run's model and fill it from ``source`` (strict: every tensor must fit)."""
    from scaling.training.model.transformer import MoETransformer

    meta = run_meta(source.run)
    cfg = model_config(meta, source.run)
    state = _load_state(source, cfg)
    sha = weights_sha256(source, state)
    model = MoETransformer(cfg)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        raise UserError(
            f"weights {source.path} do not fit run {source.run.name}'s config: {' '.join(first[:2])}"
        ) from None
    model.eval().requires_grad_(False).to(device)
    return LoadedWeights(source, meta, cfg, model, sha)


def tokenizer_file(run_dir: Path, meta: dict, model: Any = None) -> Path:
    """The tokenizer.json the run was trained with, checked against its recorded SHA-256.

    Built-in corpus: the run's ``eval_data/`` snapshot, else the corpus of its data spec built on
    this machine (``scaling.analysis.runs.LoadedRun.corpus``, which compares the hashes); token
    shards: the tokenizer the shard manifest records, whose file's SHA-256 must equal both the
    manifest's ``tokenizer.sha256`` and the run's ``data_identity.tokenizer_sha256`` (a folder
    re-prepared, or a tokenizer.json copied over, since training). UserError naming both hashes
    otherwise.
    """
    if isinstance(meta.get("data_spec"), dict):
        from scaling.analysis.runs import LoadedRun

        run = LoadedRun(run_dir, meta, model_config(meta, run_dir), model)
        return run.corpus.path / "tokenizer.json"
    data = (meta.get("train") or {}).get("data")
    if data:
        from scaling.common.files import sha256_file
        from scaling.training.data.shards import load_shards, resolve

        shards = load_shards(data, verify=False)
        tok = shards.manifest.get("tokenizer") or {}
        if not tok.get("path"):
            raise UserError(f"the shards of run {run_dir.name} ({data}) record no tokenizer")
        path = resolve(shards.path, tok["path"])
        if not path.is_file():
            raise UserError(f"the tokenizer of run {run_dir.name}'s shards is missing: no file {path}")
        # load_shards(verify=False) hashes nothing: the file is checked here, the one eval reads
        have = sha256_file(path)
        recorded = (meta.get("data_identity") or {}).get("tokenizer_sha256")
        for what, want in ((f"the shard manifest ({data})", tok.get("sha256")),
                           (f"run {run_dir.name}'s config.json (data_identity)", recorded)):
            if want and want != have:
                raise UserError(f"tokenizer {path} has SHA-256 {have}, but {what} records {want}: "
                                "not the tokenizer the run was trained with")
        if not (tok.get("sha256") or recorded):
            raise UserError(f"neither run {run_dir.name} nor its shard manifest records the "
                            f"tokenizer's SHA-256: {path} cannot be checked")
        return path
    raise UserError(f"run {run_dir.name} records no tokenizer (no data_spec, no shard folder)")
