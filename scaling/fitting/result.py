"""Fit results: ``FitResult`` (one group: estimates, bootstrap intervals, diagnostics), ``FitSet`` (fits
by group, the JSON that ``smelt-scale fit --json`` prints and ``--out`` writes), and the checks that
read a fits file back (a fits file is user input)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from scaling.common.errors import UserError
from scaling.common.files import read_json
from scaling.common.stats import percentile_interval
from scaling.fitting.laws import Law, TokenCost, default_sparsity, frontier, get_law
from scaling.fitting.objective import DEFAULT_DELTA, DEFAULT_OBJECTIVE

CI_LEVEL = 0.95
FITS_SCHEMA = "smelt-scale.fit"
FITS_VERSION = 2  # 2: parameters under "params"; 1 (no "schema" key): parameters as top-level keys


def _percentile_ci(samples: np.ndarray, level: float) -> tuple[float, float]:
    return percentile_interval(samples, level)


def _import_lmfit():
    try:
        import lmfit
    except ImportError:
        raise UserError("the lmfit report needs lmfit: pip install 'smelt-scale[lmfit]'") from None
    return lmfit


@dataclass(frozen=True)
class FitResult:
    """One approach-3 fit of one group: point estimate, bootstrap intervals, diagnostics.

    ``params`` and ``derived`` are in natural units; ``bootstrap`` holds the K resampled
    parameter vectors (K x P, ``Law.params`` order; K = 0 without a bootstrap); ``ci`` maps
    every parameter and derived quantity to its percentile interval at ``settings["ci_level"]``.
    ``data_summary`` has the ranges of the fitted points, ``compute_min``/``compute_max``
    (total training FLOPs) and the per-token FLOPs model F(N) = k N + e sqrt(N) + c of the points
    (``flops_per_param_k``, ``flops_per_sqrt_param``, ``flops_per_token_offset``,
    ``flops_model_max_error``: ``scaling.fitting.laws.TokenCost``; k = 6, e = c = 0 when unrecorded).
    ``data`` holds the fitted points themselves, the law's inputs and the observed ``loss``
    ({name: (n,) array}), so that ``residuals()`` needs no table (empty for a fits file written
    before it was recorded). Frozen, and JSON round-trippable: ``from_json(to_json())``.
    """

    law: str
    group: str
    params: dict[str, float]
    ci: dict[str, tuple[float, float]]
    bootstrap: np.ndarray
    diagnostics: dict[str, Any]
    n_points: int
    data_summary: dict[str, Any]
    derived: dict[str, float] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    cross_checks: dict[str, Any] = field(default_factory=dict)
    data: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def law_obj(self) -> Law:
        return get_law(self.law)

    @property
    def theta(self) -> np.ndarray:
        return self.law_obj.theta_array(self.params)

    @property
    def cost(self) -> TokenCost:
        """Training FLOPs per token as a function of N, C = F(N) D (the chinchilla form's budget)."""
        return TokenCost.from_summary(self.data_summary)

    def predict(self, **inputs: object) -> np.ndarray:
        """Loss at the law's inputs (chinchilla: N, D; smelt: F, S, D), numpy broadcasting."""
        return self.law_obj.predict(self.params, **inputs)

    def predict_bootstrap(self, **inputs: object) -> np.ndarray:
        """Loss under every bootstrap sample: shape (K,) + broadcast input shape."""
        if self.bootstrap.shape[0] == 0:
            raise UserError("this fit has no bootstrap samples (fitted with 0 resamples)")
        return self.law_obj.predict(self.bootstrap, **inputs)

    def optimal(self, C: np.ndarray | float, cost: TokenCost | float | None = None,
                **fixed: object) -> dict[str, np.ndarray]:
        """Compute-optimal allocation at total training FLOPs C (``scaling.fitting.laws.frontier``).

        chinchilla: C = F(N) D with F = ``self.cost`` (the data's FLOPs per token) unless given;
        returns {"N", "D", "loss"}. smelt: C = F D at fixed ``S=``; returns {"F", "D", "loss"}.
        """
        return frontier(self.law_obj, self.params, C, cost=self.cost if cost is None else cost,
                        S=fixed.get("S")).as_dict()

    def at_budget(self, C: float, S: float | None = None) -> dict[str, Any]:
        """x*, D*, L* at budget C with their bootstrap percentile intervals:
        {"C": C, name: value, f"{name}_ci": [lo, hi], ...} for name in (size input, "D", "loss"),
        and where C lies against the data: ``extrapolation_decades`` (log10 C / the largest fitted
        compute; above 0 beyond the data), ``below_data_decades`` (log10 of the smallest fitted
        compute / C, where positive; else None), ``identified`` (the fit's verdict: an
        extrapolation from a law that is not identified is no result). A smelt-form law fitted at
        several sparsities is evaluated at ``S`` or the default one (``default_sparsity``: the
        median of the distinct fitted sparsities), given as ``S``."""
        law = self.law_obj
        recorded = self.data_summary.get("sparsities", [])
        if S is None and "S" in law.fixed_inputs and recorded:
            S = recorded[0] if len(recorded) == 1 else default_sparsity(recorded)
        level = self.settings.get("ci_level", CI_LEVEL)
        est = frontier(law, self.params, C, cost=self.cost, S=S).as_dict()
        out: dict[str, Any] = {"C": float(C)}
        if S is not None:
            out["S"] = float(S)
        top, bottom = self.data_summary.get("compute_max"), self.data_summary.get("compute_min")
        out["extrapolation_decades"] = float(np.log10(C / top)) if top else None
        out["below_data_decades"] = float(np.log10(bottom / C)) if bottom and bottom > C else None
        out["identified"] = bool(self.diagnostics.get("identified", False))
        boot = (frontier(law, self.bootstrap, C, cost=self.cost, S=S).as_dict() if self.bootstrap.shape[0]
                else None)
        for name, v in est.items():
            out[name] = float(v)
            ci = _percentile_ci(np.asarray(boot[name]), level) if boot else (math.nan, math.nan)
            out[f"{name}_ci"] = list(ci)
        return out

    def residuals(self) -> np.ndarray:
        """log L - log L_hat at the fitted points (``data``), in their order: what the fit minimised
        rho of (the log residuals whatever the objective, as ``diagnostics["rmse_log"]``)."""
        if not self.data:
            raise UserError(f"the fit of group {self.group!r} holds no fitted points (read from a fits file "
                            "written before they were recorded); refit it")
        inputs = {name: self.data[name] for name in self.law_obj.inputs}
        return np.log(self.data["loss"]) - np.log(self.predict(**inputs))

    @property
    def joint_groups(self) -> list[str]:
        """Groups fitted jointly with this one (shared parameters); their bootstrap rows are paired."""
        return list(self.settings.get("joint_groups") or [])

    # -- text and JSON ------------------------------------------------------------------------
    def summary(self) -> str:
        law = self.law_obj
        level = self.settings.get("ci_level", CI_LEVEL)
        delta = self.settings.get("huber_delta", DEFAULT_DELTA)
        kind = self.settings.get("objective", DEFAULT_OBJECTIVE)
        how = f"Huber delta {delta:g}" if kind == "huber-log" else f"objective {kind}"
        lines = [f"group {self.group}: {law.formula}  ({self.n_points} points, {how}, "
                 f"{self.bootstrap.shape[0]} bootstrap resamples)"]
        cons = [f"fixed {k}={v:g}" for k, v in (self.settings.get("fixed") or {}).items()]
        cons += [f"tied {t}" for t in self.settings.get("tied") or []]
        if self.settings.get("shared"):
            cons.append(f"shared {', '.join(self.settings['shared'])} with {', '.join(self.joint_groups)}")
        if cons:
            lines.append("  constraints: " + "; ".join(cons))
        for name, value in [*self.params.items(), *self.derived.items()]:
            lo, hi = self.ci.get(name, (math.nan, math.nan))
            ci = f"[{lo:.6g}, {hi:.6g}]" if np.isfinite(lo) else "(no bootstrap)"
            lines.append(f"  {name:>18} = {value:<12.6g} {100 * level:.0f}% CI {ci}")
        d = self.diagnostics
        lines.append(f"  RMSE(log L) {d['rmse_log']:.4g}, max |residual| {d['max_abs_residual']:.4g}, "
                     f"objective {d['objective']:.10g}, identified: {'yes' if d['identified'] else 'NO'}, "
                     f"fit: {'MISFIT' if d.get('misfit') else 'ok'}")
        lines += [f"  warning: {w}" for w in d.get("warnings", [])]
        prof = self.cross_checks.get("floor_profile")
        if prof:
            lines.append("  " + profile_text(prof, law.size_input))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        """The notebook view: ``summary()`` as preformatted text."""
        import html

        return f"<pre>{html.escape(self.summary())}</pre>"

    def to_lmfit(self):
        """The parameters as ``lmfit.Parameters``: values, the law's bounds, bootstrap standard errors
        and bootstrap correlations (lmfit's ``conf_interval`` would refit plain least squares, so the
        uncertainties come from the bootstrap over runs instead). Needs the optional ``lmfit``
        (``pip install 'smelt-scale[lmfit]'``)."""
        lmfit = _import_lmfit()

        law = self.law_obj
        pars = lmfit.Parameters()
        for name in law.params:
            lo, hi = law.bounds[name]
            pars.add(name, value=self.params[name], min=lo, max=hi)
        if self.bootstrap.shape[0] > 1:
            sd = self.bootstrap.std(axis=0, ddof=1)
            corr = np.corrcoef(self.bootstrap, rowvar=False)
            for i, name in enumerate(law.params):
                pars[name].stderr = float(sd[i])
                pars[name].correl = {o: float(corr[i, j]) for j, o in enumerate(law.params) if j != i}
        return pars

    def report(self) -> str:
        """lmfit's parameter report (values, bootstrap standard errors, correlations); needs ``lmfit``."""
        lmfit = _import_lmfit()

        return lmfit.fit_report(self.to_lmfit())

    def to_dict(self) -> dict[str, Any]:
        """The FitSet entry (schema smelt-scale.fit/2): law, params {name: value}, n_points, ci,
        diagnostics, extras."""
        return {
            "law": self.law,
            "params": {k: float(v) for k, v in self.params.items()},
            "n_points": int(self.n_points),
            "ci": {k: [float(lo), float(hi)] for k, (lo, hi) in self.ci.items()},
            "diagnostics": self.diagnostics,
            "group": self.group,
            "derived": self.derived,
            "data_summary": self.data_summary,
            "bootstrap_params": list(self.law_obj.params),
            "bootstrap": self.bootstrap.tolist(),
            "settings": self.settings,
            "cross_checks": self.cross_checks,
            "data": {k: np.asarray(v, dtype=float).tolist() for k, v in self.data.items()},
        }

    def to_json(self) -> str:
        """``to_dict`` as JSON text (``scaling.common.serialize.to_json``); ``from_json`` reads it back."""
        from scaling.common.serialize import to_json

        return to_json(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> "FitResult":
        """A fit from ``to_json`` text, checked as ``from_dict`` checks a fits file entry."""
        import json

        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(f"not a fit entry: invalid JSON ({exc})") from None
        return cls.from_dict(d)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], group: str | None = None,
                  version: int = FITS_VERSION) -> "FitResult":
        """A fit entry as written by :meth:`to_dict`, every field checked (a fits file is user input: a
        tampered ``E = NaN`` or ``alpha < 0`` is refused here, not printed as a -99999900% saving).
        Derived quantities are recomputed from the parameters, never taken from the file. ``version``:
        the fits schema (1: parameters as top-level keys, 2: under "params")."""
        where = f"fit entry{f' for group {group!r}' if group else ''}"
        try:
            if not isinstance(d, Mapping):
                raise TypeError("not an object")
            law = get_law(str(d["law"]))
            src = d if version == 1 else d["params"]
            params = {p: _checked_param(law, p, src[p]) for p in law.params}
            boot = _checked_bootstrap(law, d)
            ci = _checked_ci(d)
            n_points = d["n_points"]
            if isinstance(n_points, bool) or not isinstance(n_points, int) or n_points < 1:
                raise ValueError(f"n_points must be a positive integer, got {n_points!r}")
            sections = _checked_sections(d)
            summary = sections["data_summary"]
            derived = _derived(law, law.theta_array(params), sections["derived"], summary)
            g = d.get("group", group or "default")
            return cls(law=law.name, group=str(g), params=params, ci=ci, bootstrap=boot,
                       diagnostics=sections["diagnostics"], n_points=int(n_points), data_summary=summary,
                       derived=derived, settings=sections["settings"], cross_checks=sections["cross_checks"],
                       data=_checked_data(law, d.get("data"), int(n_points)))
        except KeyError as exc:
            raise UserError(f"not a {where}: missing field {exc}") from None
        except (UserError, TypeError, ValueError, IndexError, OverflowError) as exc:
            raise UserError(f"not a {where}: {exc}") from None

    def save(self, path: str | Path) -> None:
        """Write as a one-group FitSet file (readable by ``FitSet.load`` and ``savings --fits``)."""
        FitSet({self.group: self}).save(path)

    @classmethod
    def load(cls, path: str | Path, group: str | None = None) -> "FitResult":
        return FitSet.load(path).get(group)


def fits_version(schema: Any) -> int:
    """The version of a fits document's "schema" (None: 1); UserError for one this code cannot read."""
    if schema is None:
        return 1
    name, _, version = str(schema).rpartition("/")
    if name == FITS_SCHEMA and version in ("1", "2"):
        return int(version)
    raise UserError(f"fits schema {schema!r} is not one this version of smelt-scale reads "
                    f"({FITS_SCHEMA}/1 or /{FITS_VERSION}); refit with `smelt-scale fit --out`")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _num(v: Any) -> float:
    """A number of a fits file: null is NaN (an interval that could not be formed); anything but a
    number (a string, a boolean, a list) is a TypeError."""
    if v is None:
        return math.nan
    if not _is_number(v):
        raise TypeError(f"expected a number, got {v!r}")
    return float(v)


def _checked_bootstrap(law: Law, d: Mapping[str, Any]) -> np.ndarray:
    """The bootstrap samples of an entry (K x P, the law's parameter order), each within the bounds."""
    raw_boot = [] if d.get("bootstrap") is None else d["bootstrap"]
    if not isinstance(raw_boot, list):
        raise TypeError("bootstrap is not a list")
    boot = np.asarray([[_num(v) for v in row] for row in raw_boot], dtype=float)
    boot = boot.reshape(-1, law.n_params)
    order = d.get("bootstrap_params")
    if order is not None and list(order) != list(law.params):
        if sorted(map(str, order)) != sorted(law.params):
            raise ValueError(f"bootstrap_params {list(order)} are not the law's {list(law.params)}")
        boot = boot[:, [list(order).index(p) for p in law.params]]
    lo_b, hi_b = np.array([law.bounds[p] for p in law.params], dtype=float).T
    finite = np.isfinite(boot)
    # rounding slack relative to each bound (a slack from the larger one let A = -5 pass (1e-6, 1e20))
    low, high = lo_b - 1e-9 * np.abs(lo_b), hi_b + 1e-9 * np.abs(hi_b)
    if ((boot < low) & finite).any() or ((boot > high) & finite).any():
        raise ValueError("a bootstrap sample lies outside the law's parameter bounds")
    return boot


def _checked_ci(d: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
    """The intervals of an entry: [low, high] with low <= high (or NaN: none could be formed)."""
    ci_raw = {} if d.get("ci") is None else d["ci"]
    if not isinstance(ci_raw, Mapping):
        raise TypeError("ci is not an object")
    ci = {}
    for k, v in ci_raw.items():
        if not isinstance(v, (list, tuple)) or len(v) != 2:
            raise ValueError(f"ci of {k} is not [low, high]")
        lo, hi = _num(v[0]), _num(v[1])
        if math.isfinite(lo) and math.isfinite(hi) and lo > hi:
            raise ValueError(f"ci of {k} has low {lo} > high {hi}")
        ci[str(k)] = (lo, hi)
    return ci


def _checked_sections(d: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The free-form objects of an entry, the data summary's ranges positive and finite."""
    sections = {}
    for key in ("diagnostics", "data_summary", "settings", "cross_checks", "derived"):
        v = d.get(key)
        v = {} if v is None else v
        if not isinstance(v, Mapping):
            raise TypeError(f"{key} is not an object")
        sections[key] = dict(v)
    diag = sections["diagnostics"]
    for key in ("on_bound", "warnings"):   # read by savings, fit, plot: lists of text
        if key in diag and not (isinstance(diag[key], list) and all(isinstance(v, str) for v in diag[key])):
            raise TypeError(f"diagnostics.{key} must be a list of strings, got {diag[key]!r:.60}")
    for key in ("identified", "identified_at_observed_share"):
        if key in diag and not isinstance(diag[key], bool):
            raise TypeError(f"diagnostics.{key} must be true or false, got {diag[key]!r:.60}")
    for key in ("bootstrap_on_bound_fraction", "bootstrap_on_bound_upper", "rmse_log", "objective"):
        v = diag.get(key)
        if v is not None and not (_is_number(v) and (math.isnan(v) or 0 <= v < math.inf)):
            raise ValueError(f"diagnostics.{key} must be a finite number >= 0, got {diag[key]!r:.60}")
    if "n_runs" in diag and (isinstance(diag["n_runs"], bool) or not isinstance(diag["n_runs"], int)):
        raise TypeError(f"diagnostics.n_runs must be an integer, got {diag['n_runs']!r:.60}")
    summary = sections["data_summary"]
    for key in ("flops_per_sqrt_param", "flops_per_token_offset", "flops_model_max_error"):
        if key in summary and not (_is_number(summary[key]) and 0 <= summary[key] < math.inf):
            raise ValueError(f"data_summary.{key} must be a finite number >= 0, got {summary[key]!r}")
    for key in ("compute_min", "compute_max", "flops_per_param_k", "N_min", "N_max", "D_min", "D_max",
                "F_min", "F_max", "loss_min", "loss_max"):
        if key in summary and not (_is_number(summary[key]) and 0 < summary[key] < math.inf):
            raise ValueError(f"data_summary.{key} must be a positive finite number, got "
                             f"{summary[key]!r}")
    # read by savings, plan, simulate and plot (the default sparsity) and by plot (the intervals'
    # level, the residual trend): a string, a number out of range or a list there crashed them or
    # moved the default S (2026-12-07 review: sparsities [-5, 2] made savings print -137.75%)
    sp = summary.get("sparsities")
    if sp is not None and not (isinstance(sp, list) and all(_is_number(v) and 0 <= v < 1 for v in sp)):
        raise ValueError(f"data_summary.sparsities must be a list of numbers in [0, 1), got {sp!r:.60}")
    level = sections["settings"].get("ci_level")
    if level is not None and not (_is_number(level) and 0 < level < 1):
        raise ValueError(f"settings.ci_level must be a number in (0, 1), got {level!r:.60}")
    if diag.get("goodness_of_fit") is not None and not isinstance(diag["goodness_of_fit"], Mapping):
        raise TypeError(f"diagnostics.goodness_of_fit must be an object, got {diag['goodness_of_fit']!r:.60}")
    return sections


def _derived(law: Law, theta: np.ndarray, recorded: Mapping[str, Any], summary: Mapping[str, Any]) -> dict:
    """Derived quantities recomputed from the parameters (never read from the file); the allocation
    at the recorded k and S when the entry recorded one."""
    derived = law.derive(theta)
    if "a_data" in recorded and law.budget_uses_k and not law.fixed_inputs:
        lo, hi = summary.get("compute_min"), summary.get("compute_max")
        if _is_number(lo) and _is_number(hi) and 0 < lo < hi < math.inf:
            derived["a_data"] = float(exponent_over_data(law, theta, TokenCost.from_summary(summary), lo, hi))
    if "G" in recorded:           # the allocation: recomputed at the recorded k and S
        k = float(summary.get("flops_per_param_k", 6.0))
        sp = summary.get("sparsities") or []
        S = float(sp[0]) if "S" in law.fixed_inputs and len(sp) == 1 and _is_number(sp[0]) else None
        if not law.fixed_inputs or S is not None:
            derived.update({k_: float(v) for k_, v in allocation(law, theta, k, S).items()})
    return derived


def _checked_data(law: Law, raw: Any, n_points: int) -> dict[str, np.ndarray]:
    """The fitted points of a fits file entry: the law's inputs and the loss, n_points numbers each,
    losses and inputs other than S positive (the residuals take their logs); absent: {}."""
    if raw is None or raw == {}:
        return {}
    if not isinstance(raw, Mapping):
        raise TypeError("data is not an object")
    out = {}
    for name in (*law.inputs, "loss"):
        if name not in raw:
            raise ValueError(f"data has no {name}")
        if not isinstance(raw[name], list) or len(raw[name]) != n_points:
            raise ValueError(f"data.{name} must be a list of n_points = {n_points} numbers")
        v = np.array([_num(x) for x in raw[name]], dtype=float)
        if not np.isfinite(v).all() or (name != "S" and (v <= 0).any()):
            raise ValueError(f"data.{name} must hold finite{' positive' if name != 'S' else ''} numbers")
        out[name] = v
    return out


def _checked_param(law: Law, name: str, v: Any) -> float:
    """A fitted parameter from a file: a finite number within the law's bounds (those every fit obeys)."""
    if not _is_number(v) or not math.isfinite(float(v)):
        raise ValueError(f"parameter {name} must be a finite number, got {v!r}")
    lo, hi = law.bounds[name]
    if not (lo - 1e-9 * abs(lo) <= float(v) <= hi + 1e-9 * abs(hi)):  # rounding slack per bound
        raise ValueError(f"parameter {name} = {v!r} lies outside the {law.name} law's bounds "
                         f"[{lo:g}, {hi:g}]")
    return float(v)


@dataclass(frozen=True)
class FitSet:
    """Fits by group; its JSON is exactly what ``smelt-scale fit --json`` prints: {"fits": {group: entry}}."""

    fits: dict[str, FitResult]

    def __getitem__(self, group: str) -> FitResult:
        return self.get(group)

    def __iter__(self):
        return iter(self.fits)

    def __len__(self) -> int:
        return len(self.fits)

    def get(self, group: str | None = None) -> FitResult:
        if group is None:
            if len(self.fits) != 1:
                raise UserError(f"several fits ({', '.join(self.fits)}); name a group")
            return next(iter(self.fits.values()))
        if group not in self.fits:
            raise UserError(f"no fit for group {group!r}; groups: {', '.join(self.fits) or 'none'}")
        return self.fits[group]

    def to_dict(self, at_budget: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The fits document; ``at_budget`` (group -> ``FitResult.at_budget``, ``fit --at``) adds each
        group's allocation at that budget under ``at_budget`` (read back as nothing: it is derived)."""
        fits = {g: f.to_dict() for g, f in self.fits.items()}
        for g, a in (at_budget or {}).items():
            fits[g]["at_budget"] = a
        return {"schema": f"{FITS_SCHEMA}/{FITS_VERSION}", "fits": fits}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FitSet":
        """A fits document: schema smelt-scale.fit/2, or a file without "schema" (written before
        schemas existed: read as version 1, parameters as top-level keys of each entry). Any other
        schema is refused: a renamed field must not be dropped silently."""
        if not isinstance(d, Mapping) or not isinstance(d.get("fits"), Mapping) or not d["fits"]:
            raise UserError('not a fits file: expected {"fits": {"<group>": {...}}}')
        version = fits_version(d.get("schema"))
        return cls({str(g): FitResult.from_dict(e, group=str(g), version=version)
                    for g, e in d["fits"].items()})

    def save(self, path: str | Path, at_budget: Mapping[str, Any] | None = None) -> None:
        """Write the document of ``to_dict`` (with ``at_budget``): the file `fit --out` writes is
        the document `fit --json` prints."""
        from scaling.common.run_folder import atomic_write_bytes
        from scaling.common.serialize import to_json

        # never half-written; a link at path is replaced, not followed
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(Path(path), (to_json(self.to_dict(at_budget)) + "\n").encode())

    @classmethod
    def load(cls, path: str | Path) -> "FitSet":
        path = Path(path)
        if not path.exists():
            raise UserError(f"no such fits file: {path}")
        try:
            return cls.from_dict(read_json(path, "fits file"))
        except UserError as exc:
            msg = str(exc)
            raise UserError(msg if str(path) in msg else f"{path}: {msg}") from None

    def summary(self) -> str:
        return "\n\n".join(f.summary() for f in self.fits.values())

    def _repr_html_(self) -> str:
        """The notebook view: ``summary()`` as preformatted text."""
        import html

        return f"<pre>{html.escape(self.summary())}</pre>"

    def paired(self, a: str, b: str) -> bool:
        """Whether groups a and b were fitted jointly, so that bootstrap row i of one and row i of the
        other come from the same resample of runs (savings then pairs them by index)."""
        ga = self.get(a).joint_groups
        return a == b or (b in ga and a in ga)



def allocation(law: Law, theta: np.ndarray, k: float, S: float | None = None) -> dict[str, np.ndarray]:
    """Coefficients of the compute-optimal allocation x* = G C^a, D* = H C^b (x = N, or F), H = 1/(k G)
    (k = 1 for per-token FLOPs): the frontier at C = 1 (``scaling.fitting.laws.frontier``) of
    C = k N D, i.e. the large-budget limit where a per-token cost k N + e sqrt(N) + c is k N."""
    fr = frontier(law, theta, 1.0, cost=k, S=S)
    return {"G": fr.size, "H": fr.tokens}


def profile_text(prof: dict[str, Any], size_input: str = "N") -> str:
    """One line of a loss-floor profile (``scaling.fitting.floor_profile``): the floors the points
    allow and the exponents over them."""
    if not prof.get("available"):
        return f"loss-floor profile: not available ({prof.get('reason', '')})"
    lo, hi = prof["E_range"]
    if not math.isfinite(lo):
        return "loss-floor profile: none of the floors tried is allowed"
    lo_t = "its bound" if prof["from_bound"] else f"{lo:.3g}"
    hi_t = f"{hi:.3g}" + (" (0.99 x the lowest loss)" if prof["up_to_lowest_loss"] else "")
    text = (f"loss-floor profile: the points allow E from {lo_t} to {hi_t} ({100 * prof['level']:.0f}% "
            f"profile F, design effect {prof['design_effect']:.2f} for {prof['points_per_run']:.1f} "
            "points per run)")
    labels = {"a_data": f"{size_input}* ~ C^a across the data's compute"}
    spans = []
    for k in prof.get("exponents", []):
        lo_k, hi_k = prof[f"{k}_range"]
        if math.isfinite(lo_k):
            spans.append(f"{labels.get(k, f'the large-budget {k}')} {lo_k:.3f} to {hi_k:.3f}")
    if spans:
        text += ("; over them the best fit's " + " and ".join(spans)
                 + " (the floor's part of their uncertainty, not their interval)")
    return text + ("" if prof["contiguous"] else "; the allowed floors are not one interval")


def exponent_over_data(law: Law, theta: np.ndarray, cost: TokenCost, c_lo: float, c_hi: float,
                       S: float | None = None) -> np.ndarray:
    """d log N* / d log C of the frontier across the data's compute range [c_lo, c_hi]:
    (log N*(c_hi) - log N*(c_lo)) / (log c_hi - log c_lo), theta (..., P). Where F(N) is not k N this
    is what approaches 1 and 2 measure on the same points, while ``a`` is its large-budget limit."""
    theta = np.asarray(theta, dtype=float)
    fr = frontier(law, theta[..., None, :], np.array([c_lo, c_hi]), cost=cost, S=S)
    size = np.asarray(fr.size)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(size[..., 1] / size[..., 0]) / np.log(c_hi / c_lo)
