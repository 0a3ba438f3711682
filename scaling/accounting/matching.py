"""Derive the compute-matched SMELT twin of a Baseline config.

Recipe (SMELT paper, arXiv 2609.01343, via its reading notes in shared/reference): loop the
middle 50% of the physical layers twice (r = 2, Prelude-Recur-Coda), then

* shrink the width (d_model and the expert hidden size f) so per-token training FLOPs match
  the Baseline's: the executed depth grows from L to L + (r-1)*L_loop (1.5x for r = 2);
* grow the number of experts E so the non-embedding parameters match (MoE decouples
  parameters from FLOPs);
* shrink KV heads x head dim so the KV cache (each pass keeps its own K/V) matches.

The search is a small exhaustive one over hardware-friendly integers:

1. KV cache: H_kv' * h' must equal H_kv * h * L / passes. Keep the Baseline's H_kv and
   take h' = round(target / H_kv') (head dims are free integers, as the paper's 36 and 55);
   only when that is off by more than the tolerance try the nearest other H_kv', scaling
   the query heads with it so the GQA group size H / H_kv stays the Baseline's.
2. For every d' (a multiple of ``width_multiple`` in [d/2, d]) solve the FLOPs equation
   for f' (secant steps: it is linear in f' but for the shared expert's integer rounding;
   ``_solve_ffn``); round f' down and up to a multiple of ``ffn_multiple``; then solve the
   parameter equation (linear in E') for E' and round it down and up. The shared expert, if
   any, keeps its ratio to f (``max(1, round(ratio * f'))``). Every candidate is scored exactly with
   ``scaling.accounting.costs``.
3. Among candidates with all three mismatches within tolerance, take those whose d' is
   within two width multiples of the one closest to ``width_ratio * d`` (default
   sqrt(L / passes): the FLOPs cut is split evenly between width and FFN size, which makes
   E' ~ E * passes / L, the paper's 336 -> 504), and of those the smallest worst mismatch
   (the slack of two multiples trades a width slightly off the target for a tighter match).
4. Only when no candidate is within tolerance (few, wide experts: one expert is a large share
   of the parameters, so no E' is near them at the FLOPs root): every f' whose FLOPs stay
   within twice the tolerance is tried as in step 2, trading FLOPs for parameters. Twins found
   by steps 2-3 never change.

The paper reached about +-4% on FLOPs and KV cache and +-1% on parameters; the default
tolerance here is 1% on all three.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scaling.accounting.config import ModelConfig
from scaling.accounting.costs import MATCHED, costs, mismatch
from scaling.common.errors import UserError


@dataclass(frozen=True)
class Match:
    """A Baseline, its SMELT twin and the relative mismatches twin/baseline - 1."""

    baseline: ModelConfig
    smelt: ModelConfig
    mismatch: dict[str, float]

    @property
    def worst(self) -> float:
        return max(abs(v) for v in self.mismatch.values())


def loop_block(n_layers: int, fraction: float = 0.5) -> tuple[int, int]:
    """The middle ``fraction`` of the layers, [start, end): L=10 -> layers 2..6 (0-based).

    Matches the paper's looped indices 3-7, 4-9, 6-15, 8-22 (1-based) for L = 10, 12, 20, 30.
    The block is floor(fraction * L) layers with floor of the rest before it (the prelude), so
    for an odd L, or one not divisible by 4, it is less than half and the coda gets the extra
    layer: L = 5 loops [1, 3) (40%), L = 9 loops [2, 6), L = 13 loops [3, 9). The paper has only
    even L (10, 12, 20, 30); this rounding is this package's choice.
    """
    n_loop = int(n_layers * fraction)
    if n_loop < 1:
        raise UserError(f"a {n_layers}-layer model has no middle {fraction:.0%} to loop")
    start = (n_layers - n_loop) // 2
    return start, start + n_loop


def _round_to(x: float, multiple: int) -> list[int]:
    lo = max(multiple, int(math.floor(x / multiple)) * multiple)
    return sorted({lo, lo + multiple})


def _solve_ffn(flops_at, target: float, multiple: int, steps: int = 6) -> float | None:
    """f' (real) where ``flops_at(f')`` reaches ``target``; None when no f' >= multiple / 2 does.

    FLOPs/token are affine in f' only without a shared expert: its width round(ratio * f') is an
    integer, so at small f' (the first probes, f' = multiple and 2 multiple) it does not grow in
    proportion (1 at both probes for ratio 1/3 and multiple 1) and a slope from there misses the
    shared expert's share. Secant steps on the grid of multiples therefore re-probe next to the
    root until the probe lands on the multiple nearest to it; the root is then read off the slope
    of the last two probes.
    """
    f0, f1 = multiple, 2 * multiple
    y0, y1 = flops_at(f0), flops_at(f1)
    for _ in range(steps):
        slope = (y1 - y0) / (f1 - f0)
        if slope <= 0:
            return None
        root = f1 + (target - y1) / slope
        if root < multiple / 2:
            return None
        nxt = max(multiple, round(root / multiple) * multiple)
        if nxt in (f0, f1):
            return root
        f0, y0, f1, y1 = f1, y1, nxt, flops_at(nxt)
    return root


def _match_kv(base: ModelConfig, passes: int, tolerance: float) -> tuple[int, int, int]:
    """(n_heads', n_kv_heads', head_dim') holding the KV cache; the GQA group size is kept."""
    target = base.n_kv_heads * base.head_dim * base.n_layers / passes
    group = base.n_heads // base.n_kv_heads
    options = []
    for kv in range(1, 2 * base.n_kv_heads + 1):
        hd = max(1, round(target / kv))
        err = abs(kv * hd / target - 1.0)
        options.append((err > tolerance, abs(kv - base.n_kv_heads), err, kv, hd))
    options.sort()
    off, _, err, kv, hd = options[0]
    if off:
        _, _, err, kv, hd = min(options, key=lambda o: o[2])   # name the nearest, not the likest
        raise UserError(
            f"KV cache cannot be matched within {tolerance:.2%}: n_kv_heads*head_dim must shrink from "
            f"{base.n_kv_heads * base.head_dim} to {target:.2f} per layer pass and the closest "
            f"integer choice ({kv} x {hd}) is {err:.2%} off")
    return kv * group, kv, hd


MAX_LOOPS = 16
MAX_SEARCH_WIDTHS = 20_000  # d_model up to 320k at width multiple 8; the paper's widths are < 4k


def smelt_twin(
    base: ModelConfig,
    *,
    n_loops: int = 2,
    loop_fraction: float = 0.5,
    width_multiple: int = 8,
    ffn_multiple: int | None = None,
    width_ratio: float | None = None,
    tolerance: float = 0.01,
) -> Match:
    """The SMELT twin of ``base`` matched on FLOPs/token, non-embedding params and KV cache.

    Raises UserError naming the budget that cannot be matched within ``tolerance``.
    """
    if base.is_looped:
        raise UserError("the Baseline config must not be looped")
    if n_loops < 2 or n_loops > MAX_LOOPS:
        raise UserError(f"n_loops must be between 2 and {MAX_LOOPS} for a looped twin, got {n_loops}")
    if width_multiple < 1 or (ffn_multiple is not None and ffn_multiple < 1):
        raise UserError(f"the width multiple must be a positive integer, got {width_multiple}")
    if width_ratio is not None and not 0 < width_ratio <= 1:
        raise UserError(f"the width ratio d'/d must be in (0, 1], got {width_ratio}")
    if not 0 < tolerance < 1:
        raise UserError(f"the matching tolerance must be in (0, 1), got {tolerance}")
    # The search below tries every width in [d/2, d]: bound it so an absurd d_model fails at once.
    n_widths = base.d_model // (2 * width_multiple)
    if n_widths > MAX_SEARCH_WIDTHS:
        largest = 2 * MAX_SEARCH_WIDTHS * width_multiple
        raise UserError(f"d_model {base.d_model} at a width multiple of {width_multiple} means "
                        f"{n_widths:,} candidate widths (more than {MAX_SEARCH_WIDTHS:,}): use a larger "
                        f"width multiple or a realistic d_model (at most {largest:,})")
    ffn_multiple = width_multiple if ffn_multiple is None else ffn_multiple
    start, end = loop_block(base.n_layers, loop_fraction)
    passes = base.n_layers + (n_loops - 1) * (end - start)
    n_heads, kv_heads, head_dim = _match_kv(base, passes, tolerance)
    ref = costs(base)
    shared_ratio = base.shared_expert_hidden / base.expert_hidden
    ratio = math.sqrt(base.n_layers / passes) if width_ratio is None else width_ratio
    d_target = ratio * base.d_model

    def make(d: int, f: int, e: int) -> ModelConfig:
        shared = 0 if shared_ratio == 0 else max(1, round(shared_ratio * f))
        return base.replace(d_model=d, expert_hidden=f, n_experts=e, n_heads=n_heads, n_kv_heads=kv_heads,
                            head_dim=head_dim, shared_expert_hidden=shared,
                            loop_start=start, loop_end=end, n_loops=n_loops)

    def twins_at(d: int, fs: list[int]) -> list[tuple[float, ModelConfig]]:
        """The twins of width d at each f': E' from the parameters (linear in E'), rounded both ways."""
        out = []
        for f in fs:
            p1, p2 = costs(make(d, f, base.top_k)), costs(make(d, f, base.top_k + 1))
            e_star = base.top_k + (ref.non_embedding_params - p1.non_embedding_params) / (
                p2.non_embedding_params - p1.non_embedding_params)
            for e in {max(base.top_k, math.floor(e_star)), max(base.top_k, math.ceil(e_star))}:
                cfg = make(d, f, e)
                out.append((max(abs(v) for v in mismatch(cfg, base).values()), cfg))
        return out

    candidates: list[tuple[float, ModelConfig]] = []
    roots: dict[int, float] = {}
    d_lo = max(width_multiple, int(math.ceil(base.d_model / 2 / width_multiple)) * width_multiple)
    widths = range(d_lo, base.d_model + 1, width_multiple)
    for d in widths:
        # FLOPs/token are linear in f' (at fixed E'); parameters are linear in E' (at fixed f').
        e_guess = max(base.top_k, round(base.n_experts * base.d_model * base.expert_hidden
                                        / (d * base.expert_hidden * ratio)))
        f_star = _solve_ffn(lambda f: costs(make(d, f, e_guess)).flops_per_token, ref.flops_per_token,
                            ffn_multiple)
        if f_star is not None:
            roots[d] = f_star
            candidates += twins_at(d, _round_to(f_star, ffn_multiple))
    if candidates and not any(c[0] <= tolerance for c in candidates):
        # Where one expert is a large share of the parameters (few, wide experts), no E' is near
        # the parameters at the FLOPs root: trade FLOPs for parameters over every f' whose FLOPs
        # stay within the tolerance (only then, so that every twin found before keeps its config).
        for d, f_star in roots.items():
            fs = []
            for step in (-1, 1):
                f = _round_to(f_star, ffn_multiple)[0 if step < 0 else -1]
                while f >= ffn_multiple and len(fs) < 4 * MAX_SEARCH_WIDTHS:
                    if abs(costs(make(d, f, base.n_experts)).flops_per_token / ref.flops_per_token - 1) > (
                            2 * tolerance):
                        break
                    fs.append(f)
                    f += step * ffn_multiple
            candidates += twins_at(d, sorted(set(fs)))
    if not candidates:
        raise UserError("no SMELT width can match the Baseline's FLOPs (the fixed terms alone exceed it)")
    within = [c for c in candidates if c[0] <= tolerance]
    if not within:
        worst, cfg = min(candidates, key=lambda c: c[0])
        mm = mismatch(cfg, base)
        bad = ", ".join(f"{k} {v:+.2%}" for k, v in mm.items() if abs(v) > tolerance)
        hint = ("try a smaller width multiple" if min(width_multiple, ffn_multiple) > 1 else
                "the integer expert count and widths get no closer; allow a larger tolerance")
        raise UserError(f"cannot match within {tolerance:.1%} at width multiples of {width_multiple}: "
                        f"best twin is off on {bad}; {hint}")
    best_gap = min(abs(c[1].d_model - d_target) for c in within)
    near = [c for c in within if abs(c[1].d_model - d_target) <= best_gap + 2 * width_multiple]
    _, cfg = min(near, key=lambda c: (c[0], abs(c[1].d_model - d_target)))
    name = f"{base.name}-smelt" if base.name else ""
    cfg = cfg.replace(name=name)
    return Match(baseline=base, smelt=cfg, mismatch=mismatch(cfg, base))


__all__ = ["MATCHED", "Match", "loop_block", "smelt_twin"]
