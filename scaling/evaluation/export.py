"""Export a trained model as a plain Hugging Face Mixtral folder (``smelt-scale export``).

A looped SMELT model is exactly an unrolled Mixtral. Our forward (``scaling.training.model.transformer``) is
``x <- x + s * Attn(RMSNorm(x))``, ``x <- x + s * MoE(RMSNorm(x))`` for each (layer, pass) of
``cfg.schedule()``, with ``s = 1/r`` inside the looped block. Both branches end in a linear map
(attention's ``wo``; each expert's ``w_down``, summed with gates), so ``s * W y = (s W) y``: HF layer
``j`` holds a copy of physical layer ``schedule[j][0]`` with ``o_proj`` and every expert's down
projection multiplied by ``s``. Nothing else changes; the unrolled model computes the same function
(fp32 logits match to ~1e-5, tests/test_export.py). Mixtral cannot represent: partial rotary
(our odd head sizes rotate h-1 dims; Mixtral rotates the whole head) and an always-on shared
expert; those are refused (evaluate them with ``eval --backend native``), never approximated.

Files written (what ``transformers.AutoModelForCausalLM.from_pretrained`` and lm-eval's ``hf``
backend read):

* ``model.safetensors`` in the original Mixtral layout (the layout of the Hub's Mixtral
  checkpoints, which transformers 5 also writes and converts on load):
  ``model.layers.{j}.block_sparse_moe.experts.{e}.w1|w3|w2.weight`` (gate [f, d] | up [f, d] |
  down [d, f]; our ``w_gate_up`` [E, d, 2f] has columns [gate | up]), ``...block_sparse_moe.gate``
  [E, d], ``self_attn.{q,k,v,o}_proj`` (our fused ``wqkv`` rows are [q | k | v]),
  ``input_layernorm``, ``post_attention_layernorm``, ``model.embed_tokens``, ``model.norm``,
  ``lm_head`` (absent when tied);
* ``config.json``: ``MixtralConfig`` fields, ``max_position_embeddings`` = the training context,
  ``experts_implementation: "eager"`` unless d and f are multiples of 8 (transformers' grouped
  experts call a kernel that needs 16-byte-aligned rows: multiples of 4 in fp32, 8 in bf16),
  and a ``smelt_scale`` block (tier, arch, run, run id, loop layout with the HF layer ->
  (physical layer, pass) map, the source weights and their SHA-256);
* ``tokenizer.json`` (the run's own byte-level BPE) and ``tokenizer_config.json`` (bos
  ``<|bos|>``, eos ``<|eos|>``, pad ``<|pad|>``, ``model_max_length`` = the context);
* ``generation_config.json`` (greedy; bos/eos/pad ids).

The folder is written to a temporary sibling and renamed into place, so a failed export leaves
nothing half-written; ``--overwrite`` replaces only a previous export (``check_export_target``).
Needs only torch and safetensors (transformers reads it; it does not write it).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from scaling.accounting.config import ModelConfig
from scaling.common.errors import UserError
from scaling.common.run_folder import CONFIG, FINAL, METRICS

NATIVE_HINT = "evaluate it with `smelt-scale eval --backend native`"
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
SPECIAL = {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"}
EXPORT_FILES = frozenset({"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json",
                          "special_tokens_map.json", "generation_config.json"})


def unexportable(cfg: ModelConfig) -> str | None:
    """Why Mixtral cannot represent ``cfg`` exactly, or None when it can."""
    if cfg.rotary_dim != cfg.head_dim:
        return (
            f"head size {cfg.head_dim} is odd: the model rotates {cfg.rotary_dim} of its dims, "
            "Mixtral rotates the whole head"
        )
    if cfg.shared_expert_hidden:
        return "the model has a shared expert, which Mixtral lacks"
    return None


def check_exportable(cfg: ModelConfig) -> None:
    why = unexportable(cfg)
    if why is not None:
        raise UserError(f"cannot export {cfg.name or cfg.arch} exactly as Mixtral: {why}", hint=NATIVE_HINT)


def eager_experts(cfg: ModelConfig) -> bool:
    return cfg.d_model % 8 != 0 or cfg.expert_hidden % 8 != 0


def hf_state_dict(cfg: ModelConfig, state: dict, dtype: Any = None) -> dict:
    """Our state dict -> the unrolled Mixtral state dict (original Mixtral key layout).

    Each tensor is its own contiguous copy (safetensors refuses shared storage), cast to
    ``dtype`` after the residual scale is applied in fp32.
    """
    check_exportable(cfg)
    H, Hkv, h, f = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.expert_hidden

    def put(t):
        t = t.detach().float().contiguous().clone()
        return t if dtype is None else t.to(dtype)

    out = {
        "model.embed_tokens.weight": put(state["embed.weight"]),
        "model.norm.weight": put(state["norm.weight"]),
    }
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = put(state["lm_head.weight"])
    for j, (layer, _) in enumerate(cfg.schedule()):
        src, dst, s = f"layers.{layer}.", f"model.layers.{j}.", cfg.residual_scale(layer)
        q, k, v = state[src + "attn.wqkv.weight"].split([H * h, Hkv * h, Hkv * h])
        out[dst + "self_attn.q_proj.weight"] = put(q)
        out[dst + "self_attn.k_proj.weight"] = put(k)
        out[dst + "self_attn.v_proj.weight"] = put(v)
        out[dst + "self_attn.o_proj.weight"] = put(state[src + "attn.wo.weight"].float() * s)
        out[dst + "input_layernorm.weight"] = put(state[src + "attn_norm.weight"])
        out[dst + "post_attention_layernorm.weight"] = put(state[src + "moe_norm.weight"])
        moe = dst + "block_sparse_moe."
        out[moe + "gate.weight"] = put(state[src + "moe.router.weight"])
        gate_up, down = state[src + "moe.w_gate_up"].float(), state[src + "moe.w_down"].float()
        for e in range(cfg.n_experts):
            out[f"{moe}experts.{e}.w1.weight"] = put(gate_up[e, :, :f].t())
            out[f"{moe}experts.{e}.w3.weight"] = put(gate_up[e, :, f:].t())
            out[f"{moe}experts.{e}.w2.weight"] = put(down[e].t() * s)
    return out


def hf_config(
    cfg: ModelConfig, dtype: str = "fp32", smelt_scale: dict | None = None, special_ids: dict | None = None
) -> dict:
    """config.json of the unrolled Mixtral (see the module docstring)."""
    if dtype not in DTYPES:
        raise UserError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    ids = special_ids or {}
    doc = {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.expert_hidden,
        "num_hidden_layers": cfg.n_layer_passes,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "tie_word_embeddings": cfg.tie_embeddings,
        "sliding_window": None,
        "hidden_act": "silu",
        "num_local_experts": cfg.n_experts,
        "num_experts_per_tok": cfg.top_k,
        "attention_dropout": 0.0,
        "router_jitter_noise": 0.0,
        "output_router_logits": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "dtype": DTYPES[dtype],
        "bos_token_id": ids.get("bos"),
        "eos_token_id": ids.get("eos"),
        "pad_token_id": ids.get("pad"),
    }
    if eager_experts(cfg):
        doc["experts_implementation"] = "eager"
    if smelt_scale is not None:
        doc["smelt_scale"] = smelt_scale
    return doc


def loop_layout(cfg: ModelConfig) -> dict:
    """The loop and the HF layer -> (physical layer, pass, residual scale) map."""
    return {
        "n_layers": cfg.n_layers,
        "loop_start": cfg.loop_start,
        "loop_end": cfg.loop_end,
        "n_loops": cfg.n_loops,
        "loop_residual_scale": cfg.loop_residual_scale,
        "hf_layers": [
            {"layer": layer, "pass": p, "residual_scale": cfg.residual_scale(layer)}
            for layer, p in cfg.schedule()
        ],
    }


def special_token_ids(tokenizer_json: Path) -> dict:
    """bos/eos/pad ids of a tokenizer.json (UserError when one of the three is missing)."""
    doc = json.loads(Path(tokenizer_json).read_text())
    found = {t["content"]: t["id"] for t in doc.get("added_tokens", [])}
    missing = [v for v in SPECIAL.values() if v not in found]
    if missing:
        raise UserError(f"{tokenizer_json} lacks the special tokens {', '.join(missing)}")
    return {
        "bos": found[SPECIAL["bos_token"]],
        "eos": found[SPECIAL["eos_token"]],
        "pad": found[SPECIAL["pad_token"]],
    }


def check_export_target(out: Path, overwrite: bool) -> None:
    """Refuse (UserError) an ``out`` that export must not replace.

    A missing or empty folder is always fine. With ``overwrite`` a folder is replaced only when it
    is a previous export: its config.json carries the ``smelt_scale`` block and it holds nothing but
    the files in ``EXPORT_FILES``. Anything else (a run folder, the runs root, the working
    directory, a folder a user keeps other files in) is refused, naming what it holds, so that
    ``--overwrite`` can never delete data the tool did not write.
    """
    for parent in out.absolute().parents:
        # below a run folder the export's config.json would read as an unfinished run to fit/compare
        if (parent / CONFIG).is_file() and any((parent / n).exists() for n in (FINAL, METRICS)):
            raise UserError(f"--out {out} lies inside the run folder {parent}; choose a folder outside it")
    if not out.exists() and not out.is_symlink():
        return
    if out.is_symlink() or not out.is_dir():
        raise UserError(f"--out {out} exists and is not a folder; choose a new folder")
    entries = sorted(p.name for p in out.iterdir())
    if not entries:
        return
    foreign = [e for e in entries if e not in EXPORT_FILES or not _plain_file(out / e)]
    if foreign or not _is_export_config(out / "config.json"):
        what = (f"holds {', '.join(foreign[:3])}{' ...' if len(foreign) > 3 else ''}" if foreign
                else "has no smelt_scale config.json")
        raise UserError(f"--out {out} is not a previous export (it {what}); choose a new or empty folder")
    if not overwrite:
        raise UserError(f"--out {out} holds a previous export; pass --overwrite to replace it")


def _plain_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def _is_export_config(path: Path) -> bool:
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(doc, dict) and isinstance(doc.get("smelt_scale"), dict)


def write_hf_folder(
    out: Path | str,
    cfg: ModelConfig,
    state: dict,
    *,
    tokenizer_json: Path | str | None,
    dtype: str = "fp32",
    smelt_scale: dict | None = None,
    overwrite: bool = False,
) -> Path:
    """Write the export folder ``out`` atomically (temporary sibling, then rename).

    ``tokenizer_json`` None writes no tokenizer files (and no special ids): a model-only folder.
    """
    import torch
    from safetensors.torch import save_file

    out = Path(out)
    check_exportable(cfg)
    if dtype not in DTYPES:
        raise UserError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    check_export_target(out, overwrite)
    ids = special_token_ids(Path(tokenizer_json)) if tokenizer_json is not None else None
    tensors = hf_state_dict(cfg, state, torch.bfloat16 if dtype == "bf16" else torch.float32)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(
            json.dumps(hf_config(cfg, dtype, smelt_scale, ids), indent=2) + "\n"
        )
        if ids is not None:
            shutil.copyfile(tokenizer_json, tmp / "tokenizer.json")
            tok_cfg = {
                "tokenizer_class": "PreTrainedTokenizerFast",
                **SPECIAL,
                "model_max_length": cfg.seq_len,
                "add_bos_token": False,
                "add_eos_token": False,
                "clean_up_tokenization_spaces": False,
            }
            (tmp / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
            (tmp / "special_tokens_map.json").write_text(json.dumps(SPECIAL, indent=2) + "\n")
            gen = {
                "bos_token_id": ids["bos"],
                "eos_token_id": ids["eos"],
                "pad_token_id": ids["pad"],
                "do_sample": False,
            }
            (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
        os.chmod(tmp, 0o755)
        check_export_target(out, overwrite)  # again: the folder may have changed while we wrote
        old = None
        if out.exists():
            # set the previous export aside, move the new one in, then drop the old: a crash at any
            # point leaves one complete export under out or beside it, never none
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            os.replace(out, old / "export")
        try:
            os.replace(tmp, out)
        except BaseException:
            if old is not None and not out.exists():
                os.replace(old / "export", out)  # the previous export back in place
                old.rmdir()
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def export_run(
    run_dir: Path | str,
    out: Path | str,
    *,
    budget: int | None = None,
    checkpoint: Path | str | None = None,
    dtype: str = "fp32",
    overwrite: bool = False,
) -> dict:
    """Export one run's weights (a budget's, the final ones, or a checkpoint's) to ``out``.

    Returns the ``smelt_scale`` block written into config.json. Refuses (UserError, before reading
    any weights) a configuration Mixtral cannot represent.
    """
    from scaling.evaluation.weights import (
        load_weights,
        model_config,
        resolve_weights,
        run_meta,
        tokenizer_file,
    )

    run_dir = Path(run_dir)
    if dtype not in DTYPES:
        raise UserError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    check_export_target(Path(out), overwrite)  # before any weights are read
    check_exportable(model_config(run_meta(run_dir), run_dir))
    source = resolve_weights(run_dir, budget, checkpoint)
    loaded = load_weights(source)
    tok = tokenizer_file(run_dir, loaded.meta, loaded.model)
    facts = loaded.facts()
    block = {
        "tier": loaded.meta.get("tier"),
        "arch": loaded.config.arch,
        "run": run_dir.name,
        "run_id": loaded.meta.get("run_id"),
        "seed": loaded.meta.get("seed"),
        "budget": source.budget,
        "N": facts["N"],
        "D": facts["D"],
        "C": facts["C"],
        "val_loss": facts["val_loss"],
        "loop": loop_layout(loaded.config),
        "model_config": loaded.config.to_dict(),
        "source_weights": {"kind": source.kind, "path": str(source.path), "sha256": loaded.sha256},
        "dtype": dtype,
    }
    write_hf_folder(
        out,
        loaded.config,
        loaded.model.state_dict(),
        tokenizer_json=tok,
        dtype=dtype,
        smelt_scale=block,
        overwrite=overwrite,
    )
    return block


def to_hf_mixtral(model, experts_implementation: str | None = None):
    """An equivalent in-memory ``transformers`` ``MixtralForCausalLM`` of ``model`` (looped or not):
    the export folder written to a temporary directory and read back. Needs ``transformers`` >= 5.
    Used by the parity test (tests/test_reference_parity.py) and benchmarks/train_throughput.py."""
    try:
        import transformers
        from transformers import MixtralForCausalLM
    except ImportError:
        raise UserError("transformers is not installed (pip install -e '.[eval]')") from None
    if int(transformers.__version__.split(".")[0]) < 5:
        raise UserError(f"transformers >= 5 is needed, found {transformers.__version__}")
    check_exportable(model.cfg)
    kwargs = {"attn_implementation": "sdpa", "dtype": "float32"}
    if experts_implementation is not None:
        kwargs["experts_implementation"] = experts_implementation
    with tempfile.TemporaryDirectory() as tmp:
        write_hf_folder(Path(tmp) / "m", model.cfg, model.state_dict(), tokenizer_json=None)
        return MixtralForCausalLM.from_pretrained(Path(tmp) / "m", **kwargs)
