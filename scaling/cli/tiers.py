"""`smelt-scale tiers` and `smelt-scale match`: the budget table of Baselines and SMELT twins."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from scaling.accounting.config import ModelConfig
from scaling.accounting.costs import costs
from scaling.accounting.matching import Match, smelt_twin
from scaling.accounting.tiers import TIERS, get_config, get_match, is_proxy, tier_names, tier_width_multiple
from scaling.cli._util import emit_json, run_cli, stdout
from scaling.common.errors import UserError
from scaling.common.files import read_config
from scaling.common.format import si


def _arch_entry(cfg: ModelConfig) -> dict:
    b = costs(cfg)
    return {
        "active_params": b.active_params,
        "non_embedding_params": b.non_embedding_params,
        "total_params": b.total_params,
        "flops_per_token": float(b.flops_per_token),
        "flops_6n": float(b.flops_6n),
        "kv_cache_per_token": b.kv_cache_per_token,
        "sparsity": b.sparsity,
        "config": cfg.to_dict(),
    }


def match_entry(name: str, match: Match, proxy: bool) -> dict:
    return {"name": name, "proxy": proxy, "baseline": _arch_entry(match.baseline),
            "smelt": _arch_entry(match.smelt), "mismatch": dict(match.mismatch)}


def _shape(cfg: ModelConfig) -> str:
    loop = f" loop {cfg.loop_start}-{cfg.loop_end - 1}x{cfg.n_loops}" if cfg.is_looped else ""
    return (f"L{cfg.n_layers} d{cfg.d_model} h{cfg.n_heads}/{cfg.n_kv_heads}x{cfg.head_dim} "
            f"E{cfg.n_experts} k{cfg.top_k} f{cfg.expert_hidden}{loop}")


def print_table(entries: list[dict], title: str) -> None:
    table = Table(title=title, title_justify="left")
    for col in ("tier", "arch", "shape", "active", "non-emb", "total", "FLOPs/tok", "KV/tok",
                "dFLOPs", "dNonEmb", "dKV"):
        table.add_column(col, justify="left" if col in ("tier", "arch", "shape") else "right", no_wrap=True)
    for e in entries:
        tier = e["name"] + (" (proxy)" if e["proxy"] else "")
        for arch in ("baseline", "smelt"):
            a = e[arch]
            mm = e["mismatch"]
            mm_txt = (
                ["", "", ""]
                if arch == "baseline"
                else [
                    f"{mm[k]:+.2%}" for k in ("flops_per_token", "non_embedding_params", "kv_cache_per_token")
                ]
            )
            table.add_row(
                tier if arch == "baseline" else "",
                arch,
                _shape(ModelConfig.from_dict(a["config"])),
                si(a["active_params"]),
                si(a["non_embedding_params"]),
                si(a["total_params"]),
                f"{a['flops_per_token']:.3g}",
                str(a["kv_cache_per_token"]),
                *mm_txt,
            )
    stdout.print(table)
    stdout.print(
        "Budgets: FLOPs/tok = training FLOPs per token (6 x matmul weights per layer pass + "
        "attention + LM head); KV/tok = cached K,V scalars per token (each pass keeps its own); "
        "dX = SMELT/Baseline - 1.",
        highlight=False,
    )


def _load_config_file(path: Path) -> dict:
    data = read_config(path, "config")
    model = data.get("model", data)
    if not isinstance(model, dict):
        raise UserError(f"{path}: 'model' must be an object of config fields, got {type(model).__name__}")
    return model


def register(app: typer.Typer) -> None:
    @app.command()
    @run_cli
    def tiers(
        tier: Optional[list[str]] = typer.Option(None, "--tier", "-t", help="Only these tiers (repeatable)."),
        proxies: bool = typer.Option(True, "--proxies/--no-proxies", help="List the CPU proxy tiers too."),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
    ) -> None:
        """The paper tiers and CPU proxies: Baseline, its compute-matched SMELT twin, and their budgets."""
        names = tier or [n for n in tier_names() if proxies or not TIERS[n].proxy]
        entries = [match_entry(n, get_match(n), TIERS[n].proxy) for n in names]
        if json_out:
            emit_json({"tiers": entries})
        else:
            print_table(entries, "SMELT tiers: Baseline vs compute-matched SMELT twin")

    @app.command()
    @run_cli
    def match(
        config: Optional[Path] = typer.Argument(
            None, help="Baseline config as JSON or TOML (keys of ModelConfig)."
        ),
        tier: Optional[str] = typer.Option(
            None, "--tier", help="Start from this tier's Baseline (see `smelt-scale tiers`); the config "
            "file and the options below override its fields."
        ),
        vocab_size: Optional[int] = typer.Option(None, help="Vocabulary size."),
        d_model: Optional[int] = typer.Option(None, help="Residual width."),
        n_layers: Optional[int] = typer.Option(None, help="Physical layers."),
        n_heads: Optional[int] = typer.Option(None, help="Query heads."),
        n_kv_heads: Optional[int] = typer.Option(None, help="Key/value heads (GQA)."),
        head_dim: Optional[int] = typer.Option(None, help="Per-head width."),
        n_experts: Optional[int] = typer.Option(None, help="Routed experts per layer."),
        top_k: Optional[int] = typer.Option(None, help="Experts per token."),
        expert_hidden: Optional[int] = typer.Option(None, help="SwiGLU hidden size of one expert."),
        shared_expert_hidden: Optional[int] = typer.Option(
            None, help="Shared expert hidden size (0 = none)."
        ),
        seq_len: Optional[int] = typer.Option(None, help="Training sequence length."),
        tie_embeddings: Optional[bool] = typer.Option(None, "--tie-embeddings/--untie-embeddings"),
        n_loops: int = typer.Option(2, help="Passes through the looped middle block."),
        width_multiple: Optional[int] = typer.Option(
            None, help="d_model and expert_hidden are multiples of this (1 = exact) [default: the tier's "
            "with --tier (1 for the CPU proxies, as `tiers` and `train` build them), else 8]."
        ),
        width_ratio: Optional[float] = typer.Option(
            None, help="Target d_model ratio (default sqrt(L/passes))."
        ),
        tolerance: float = typer.Option(0.01, help="Largest relative mismatch allowed on each budget."),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
    ) -> None:
        """Derive the compute-matched SMELT twin of a Baseline config (file and/or options)."""
        data = get_config(tier, "baseline").to_dict() if tier else {}
        data.update(_load_config_file(config) if config else {})
        options = dict(
            vocab_size=vocab_size,
            d_model=d_model,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            head_dim=head_dim,
            n_experts=n_experts,
            top_k=top_k,
            expert_hidden=expert_hidden,
            shared_expert_hidden=shared_expert_hidden,
            seq_len=seq_len,
            tie_embeddings=tie_embeddings,
        )
        data.update({k: v for k, v in options.items() if v is not None})
        base = ModelConfig.from_dict(data)
        if width_multiple is None:  # a tier's twin as `tiers` and the trainer derive it
            width_multiple = tier_width_multiple(tier) if tier else 8
        result = smelt_twin(
            base, n_loops=n_loops, width_multiple=width_multiple, width_ratio=width_ratio, tolerance=tolerance
        )
        entry = match_entry(base.name or tier or "custom", result, proxy=is_proxy(tier) if tier else False)
        if json_out:
            emit_json({"tiers": [entry]})
        else:
            print_table([entry], "Baseline and its compute-matched SMELT twin")
