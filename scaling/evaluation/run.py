"""``smelt-scale eval``: runs x budgets x tasks through lm-eval, offline, into one table.

For each run folder and each budget asked (``weights.resolve_weights``), the model is loaded and
evaluated on the local tasks (``tasks``) with lm-eval's ``simple_evaluate``, through either

* ``native``: :class:`scaling.evaluation.lm.NativeLM` over our own forward (every tier), or
* ``hf``: the run exported to a temporary folder (``export``) and read by lm-eval's ``hf``
  backend (``transformers`` + ``accelerate``; exportable configurations only).

Every lm-eval metric becomes one row, plus ``bpb_gold``: the bits per byte of each document's gold
answer, ``sum_i -log p(gold_i | context_i) / (ln 2 * sum_i bytes(gold_i))`` over the documents (the
multiple-choice target's continuation, the text of a text task, the reference solution of a code
task: ``tasks.GOLD``; gold_i is the continuation as lm-eval scores it, so with the context's
trailing whitespace moved in front of it (``scored_pair``), and bytes(gold_i) counts that
whitespace too; scored in pieces when longer than the context:
``continuation_loglikelihood``), as OLMo-core's ladder evaluation reports it beside accuracy, because it
varies smoothly where accuracies sit at chance. Its standard error is the delta-method one of
that ratio estimator: ``sqrt(sum_i (a_i - r b_i)^2 / (n (n - 1))) / mean(b)`` with ``a_i`` the
bits and ``b_i`` the bytes of document i, ``r`` the ratio.

A row: run, arch, tier, seed, budget_index, N, D, flops (C), loss (the run's validation loss at
that budget, nats/token), val_bpb, task, metric, value, stderr, n, backend, num_fewshot, weights
(sha256); the column names of the trainer's points, so ``fit`` and ``compare`` read the table.

Offline: ``HF_DATASETS_OFFLINE``, ``HF_HUB_OFFLINE``, ``HF_EVALUATE_OFFLINE`` and
``TRANSFORMERS_OFFLINE`` are set to 1 before lm-eval is imported.

Quiet: lm-eval's and datasets' progress bars (one per task and stage, on stderr) are held back
while ``simple_evaluate`` runs and shown only if it fails, and its provenance probes are skipped:
``git describe`` in the caller's working directory (which printed "fatal: not a git repository"
outside one, and names the caller's checkout, not the model) and torch's ``collect_env`` (about
0.8 s per evaluation). Neither reaches a row; a row's provenance is the weights' sha256 and the
run's own config.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from scaling.common.device import check_device
from scaling.common.errors import UserError
from scaling.evaluation.tasks import GOLD, LocalTask, resolve_task, write_overlays
from scaling.evaluation.weights import (
    LoadedWeights,
    available_budgets,
    load_weights,
    resolve_weights,
    run_meta,
    tokenizer_file,
)

BACKENDS = ("native", "hf")
OFFLINE = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "HF_EVALUATE_OFFLINE", "TRANSFORMERS_OFFLINE")
LN2 = math.log(2.0)


@dataclass(frozen=True)
class EvalSettings:
    """What to evaluate and how.

    tasks          task names (folders of ``data``; see ``scaling.evaluation.tasks``)
    data           the local data folder
    backend        "native" or "hf"
    budgets        "all" (every budget with weights), None (the largest) or budget indices
    checkpoint     a DCP checkpoint folder to read instead of budget weights (one run only)
    limit          at most this many documents per task (None: all)
    num_fewshot    few-shot examples (None: each task's default)
    device         "cpu", "cuda", "cuda:N" or "auto"
    batch_size     loglikelihood requests per forward
    allow_code     run model-generated programs (code tasks)
    """

    tasks: tuple[str, ...]
    data: Path
    backend: str = "native"
    budgets: str | tuple[int, ...] | None = None
    checkpoint: Path | None = None
    limit: int | None = None
    num_fewshot: int | None = None
    device: str = "auto"
    batch_size: int = 16
    allow_code: bool = False

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise UserError(f"backend must be native or hf, got {self.backend!r}")
        if not self.tasks:
            raise UserError("no tasks given (--tasks arc_easy,humaneval,...)")
        # a task twice would be evaluated twice and give duplicated rows in the table
        dup = sorted({t for t in self.tasks if self.tasks.count(t) > 1})
        if dup:
            raise UserError(f"--tasks names {', '.join(dup)} more than once; give each task once")
        if self.limit is not None and self.limit < 1:
            raise UserError(f"limit must be >= 1, got {self.limit}")
        if self.num_fewshot is not None and self.num_fewshot < 0:
            raise UserError(f"num_fewshot must be >= 0, got {self.num_fewshot}")
        if self.batch_size < 1:
            raise UserError(f"batch_size must be >= 1, got {self.batch_size}")
        if not Path(self.data).is_dir():
            raise UserError(f"no data folder {self.data}")


def parse_budgets(text: str | None) -> str | tuple[int, ...] | None:
    """'all', None (the largest) or '0,2' -> (0, 2)."""
    if text is None or text.strip() == "":
        return None
    if text.strip() == "all":
        return "all"
    try:
        out = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise UserError(f"--budget must be 'all' or budget indices like 0,2; got {text!r}") from None
    if not out or min(out) < 0:
        raise UserError(f"--budget must be 'all' or budget indices >= 0; got {text!r}")
    if len(set(out)) < len(out):   # each (run, budget) is one row of the table
        raise UserError(f"--budget gives a budget index twice: {text!r}")
    return out


def resolve_device(device: str) -> str:
    import torch

    if check_device(device) == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device {device}: CUDA is not available here")
    return device


def _require_lm_eval(backend: str) -> None:
    missing = []
    for mod in ("lm_eval",) + (("transformers", "accelerate") if backend == "hf" else ()):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        raise UserError(f"eval needs {', '.join(missing)}: pip install 'smelt-scale[eval]'")


def _offline() -> None:
    for key in OFFLINE:
        os.environ[key] = "1"
    for name in ("lm-eval", "lm_eval", "datasets", "transformers", "accelerate", "httpx", "urllib3"):
        logging.getLogger(name).setLevel(logging.ERROR)


def native_lm(loaded: LoadedWeights, device: str, batch_size: int):
    from tokenizers import Tokenizer

    from scaling.evaluation.export import special_token_ids
    from scaling.evaluation.lm import NativeLM

    tok_path = tokenizer_file(loaded.source.run, loaded.meta, loaded.model)
    ids = special_token_ids(tok_path)
    loaded.model.to(device)
    return NativeLM(
        loaded.model,
        Tokenizer.from_file(str(tok_path)),
        bos_id=ids["bos"],
        eos_id=ids["eos"],
        pad_id=ids["pad"],
        batch_size=batch_size,
        device=device,
    )


def hf_lm(folder: Path, device: str, batch_size: int):
    """lm-eval's HFLM on an exported folder, scoring a continuation longer than the context in
    pieces as the native backend does (``lm.loglikelihood_in_pieces``) where HFLM would assert."""
    from lm_eval.models.huggingface import HFLM

    from scaling.evaluation.lm import loglikelihood_in_pieces

    class PiecewiseHFLM(HFLM):
        def _loglikelihood_tokens(self, requests, disable_tqdm=False, override_bs=None):
            def score(reqs):
                return super(PiecewiseHFLM, self)._loglikelihood_tokens(reqs, disable_tqdm, override_bs)

            return loglikelihood_in_pieces(score, requests, self.max_length)

    return PiecewiseHFLM(
        pretrained=str(folder),
        dtype="float32" if device == "cpu" else "bfloat16",
        device=device,
        batch_size=batch_size,
    )


# ----- gold-answer bits per byte ----------------------------------------------------------


def _ratio_stderr(a: Sequence[float], b: Sequence[float]) -> float | None:
    n = len(a)
    if n < 2 or sum(b) <= 0:
        return None
    r = sum(a) / sum(b)
    mean_b = sum(b) / n
    return math.sqrt(sum((x - r * y) ** 2 for x, y in zip(a, b)) / (n * (n - 1))) / mean_b


def scored_pair(context: str, continuation: str) -> tuple[str, str]:
    """(context, continuation) as lm-eval scores them: ``TemplateLM._encode_pair`` moves the
    context's trailing whitespace to the front of the continuation (HumanEval's prompt ends in
    "\n", so lm-eval scores "\n" + solution). The bytes of a bits-per-byte ratio must be those of
    this continuation, the text whose log-likelihood is in the numerator."""
    n = len(context) - len(context.rstrip())
    return (context[:-n], context[-n:] + continuation) if n else (context, continuation)


def gold_pairs(task: LocalTask, samples: list[dict]) -> tuple[list[float | None], list[tuple[str, str]]]:
    """Per sample: the gold answer's log-likelihood when lm-eval computed it (multiple choice, text),
    else None, and its (context, gold continuation) as scored (:func:`scored_pair`: the context's
    trailing whitespace belongs to the continuation)."""
    lls: list[float | None] = []
    pairs: list[tuple[str, str]] = []
    for s in samples:
        args, resps = s["arguments"], s["resps"]
        if task.kind == "text":
            text = args[0][0]
            lls.append(float(resps[0][0]))
            pairs.append(("", text))
        elif task.kind == "code":
            ctx = args[0][0]
            lls.append(None)
            pairs.append(scored_pair(ctx, str(s["doc"][GOLD[task.name]])))
        else:
            target = s["target"]
            conts = [a[1] for a in args]
            if isinstance(target, str):
                stripped = [c.lstrip() for c in conts]
                if target.strip() not in stripped:
                    raise UserError(f"task {task.name}: gold answer {target!r} is not one of the choices")
                target = stripped.index(target.strip())
            if isinstance(target, list):
                target = target[0]
            target = int(target)
            lls.append(
                float(
                    resps[target][0][0] if isinstance(resps[target][0], (list, tuple)) else resps[target][0]
                )
            )
            pairs.append(scored_pair(args[target][0], conts[target]))
    return lls, pairs


def continuation_loglikelihood(lm, context: str, continuation: str) -> float:
    """log p(continuation | context) under an lm-eval ``TemplateLM`` (native or hf), also when the
    continuation is longer than the model's context: its tokens are scored in pieces of at most
    ``max_length // 2``, each given everything before it (truncated from the left to the context,
    as lm-eval truncates any request)."""
    from scaling.evaluation.lm import continuation_pieces

    if context:
        ctx, cont = lm._encode_pair(context, continuation)
    else:
        ctx, cont = [lm.prefix_token_id], lm.tok_encode(continuation)
    reqs = [(None, c, p) for c, p in continuation_pieces(ctx, cont, lm.max_length)]
    return float(sum(ll for ll, _ in lm._loglikelihood_tokens(reqs, disable_tqdm=True)))


def gold_bpb(lm, task: LocalTask, samples: list[dict]) -> dict:
    """{value, stderr, n} of the gold answers' bits per byte (see the module docstring)."""
    lls, pairs = gold_pairs(task, samples)
    for i, ll in enumerate(lls):
        if ll is None:
            lls[i] = continuation_loglikelihood(lm, *pairs[i])
    bits = [-float(ll) / LN2 for ll in lls]
    nbytes = [len(cont.encode("utf-8")) for _, cont in pairs]
    total = sum(nbytes)
    return {
        "value": sum(bits) / total if total else None,
        "stderr": _ratio_stderr(bits, nbytes),
        "n": len(bits),
    }


# ----- one model on all tasks -------------------------------------------------------------


def _metric_rows(task: str, res: dict, n: int | None) -> list[dict]:
    rows = []
    for key, value in res.items():
        if key == "alias" or "_stderr," in key or not isinstance(value, (int, float)):
            continue
        metric, _, flt = key.partition(",")
        if metric == "sample_len":  # the document count, already in n
            continue
        name = metric if flt in ("none", "", "create_test") else f"{metric}[{flt}]"
        name = "pass@1" if metric == "pass_at_1" else name
        se = res.get(f"{metric}_stderr,{flt}")
        rows.append(
            {
                "task": task,
                "metric": name,
                "value": float(value),
                "stderr": float(se) if isinstance(se, (int, float)) else None,
                "n": n,
            }
        )
    return rows


@contextlib.contextmanager
def _quiet_lm_eval():
    """Hold lm-eval's stderr (progress bars) and skip its git/env probes; see the module docstring.
    The held text is written out if the evaluation fails (not for a ``UserError``, which is one
    line), so a failure keeps its context."""
    import lm_eval.evaluator as evaluator

    saved = {name: getattr(evaluator, name) for name in ("get_git_commit_hash", "add_env_info")
             if hasattr(evaluator, name)}
    if "get_git_commit_hash" in saved:
        evaluator.get_git_commit_hash = lambda: None
    if "add_env_info" in saved:
        evaluator.add_env_info = lambda storage: None
    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            yield
    except UserError:
        raise
    except BaseException:
        sys.stderr.write(held.getvalue())
        raise
    finally:
        for name, fn in saved.items():
            setattr(evaluator, name, fn)


def evaluate_model(lm, tasks: list[LocalTask], settings: EvalSettings, max_length: int) -> list[dict]:
    """lm-eval on ``tasks`` with ``lm`` (an lm-eval model): one row per (task, metric).

    Generation is capped at ``max_length // 2`` new tokens when the tasks ask for more (HumanEval
    asks 1024; a 256-token proxy has no room for them), the same cap on both backends."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    with tempfile.TemporaryDirectory(prefix="smelt-tasks-") as tmp:
        write_overlays(tasks, Path(tmp))
        manager = TaskManager(include_path=tmp, include_defaults=False)
        with _quiet_lm_eval():
            try:
                out = simple_evaluate(
                    model=lm,
                    tasks=[t.name for t in tasks],
                    num_fewshot=settings.num_fewshot,
                    limit=settings.limit,
                    task_manager=manager,
                    log_samples=True,
                    bootstrap_iters=1000,
                    confirm_run_unsafe_code=settings.allow_code,
                    gen_kwargs={"max_gen_toks": max_length // 2} if max_length < 2048 else None,
                    verbosity="ERROR",
                )
            except ValueError as exc:
                if "larger than population" not in str(exc):
                    raise
                # lm-eval draws the few-shot examples without replacement
                raise UserError(f"num_fewshot {settings.num_fewshot} is more than the tasks' "
                                "few-shot documents") from None
    if out is None:  # a non-zero rank under torch.distributed
        return []
    rows = []
    for task in tasks:
        res = out["results"].get(task.name, {})
        n = (out.get("n-samples", {}).get(task.name) or {}).get("effective")
        rows += _metric_rows(task.name, res, n)
        gb = gold_bpb(lm, task, out["samples"][task.name])
        rows.append({"task": task.name, "metric": "bpb_gold", **gb})
    return rows


def _facts_row(loaded: LoadedWeights, settings: EvalSettings) -> dict:
    f = loaded.facts()
    return {
        "run": f["run"],
        "arch": f["arch"],
        "tier": f["tier"],
        "seed": f["seed"],
        "proxy": f["proxy"],
        "budget_index": f["budget"],
        "N": f["N"],
        "D": f["D"],
        "flops": f["C"],
        "loss": f["val_loss"],
        "val_bpb": f["val_bpb"],
        "backend": settings.backend,
        "num_fewshot": settings.num_fewshot,
        "limit": settings.limit,
        "weights": f["weights"],
        "weights_sha256": f["weights_sha256"],
    }


def _budgets_of(run: Path, settings: EvalSettings) -> list[int | None]:
    if settings.checkpoint is not None:
        return [None]
    if settings.budgets is None:
        return [None]
    if settings.budgets == "all":
        have = available_budgets(run)
        if not have:
            raise UserError(f"run {run.name} holds no budget weights",
                            hint="(train with --save-budget-weights)", sep=" ")
        return list(have)
    return list(settings.budgets)


def evaluate_runs(
    runs: Sequence[Path | str], settings: EvalSettings, progress: Callable[[str], None] | None = None
) -> list[dict]:
    """Every (run, budget) on every task: one row per (run, budget, task, metric).

    Checks everything it can (runs, budgets, task folders, exportability for ``hf``, code tasks
    without ``allow_code``) before the first model is evaluated.
    """
    from scaling.evaluation.export import check_exportable, write_hf_folder
    from scaling.evaluation.weights import model_config

    runs = [Path(r) for r in runs]
    if not runs:
        raise UserError("no runs given")
    if settings.checkpoint is not None and len(runs) != 1:
        raise UserError("--checkpoint reads one run's checkpoint: give exactly one run")
    _require_lm_eval(settings.backend)
    device = resolve_device(settings.device)
    tasks = [resolve_task(t, Path(settings.data).resolve()) for t in settings.tasks]
    code = [t.name for t in tasks if t.kind == "code"]
    if code and not settings.allow_code:
        raise UserError(
            f"task {', '.join(code)} runs model-generated programs; pass --allow-code-execution "
            "to run them (each in its own subprocess with a timeout)"
        )
    plan = []
    for run in runs:
        meta = run_meta(run)
        if settings.backend == "hf":
            check_exportable(model_config(meta, run))
        for b in _budgets_of(run, settings):
            plan.append(resolve_weights(run, b, settings.checkpoint))
    _offline()
    rows = []
    for source in plan:
        if progress:
            progress(f"evaluating {source.describe()} on {', '.join(settings.tasks)} ({settings.backend})")
        loaded = load_weights(source)
        head = _facts_row(loaded, settings)
        if settings.backend == "native":
            lm = native_lm(loaded, device, settings.batch_size)
            got = evaluate_model(lm, tasks, settings, loaded.config.seq_len)
        else:
            tok = tokenizer_file(source.run, loaded.meta, loaded.model)
            with tempfile.TemporaryDirectory(prefix="smelt-export-") as tmp:
                folder = write_hf_folder(
                    Path(tmp) / "model",
                    loaded.config,
                    loaded.model.state_dict(),
                    tokenizer_json=tok,
                    dtype="fp32",
                )
                got = evaluate_model(
                    hf_lm(folder, device, settings.batch_size), tasks, settings, loaded.config.seq_len
                )
        rows += [{**head, **r} for r in got]
    return rows


COLUMNS = (
    "run",
    "arch",
    "tier",
    "seed",
    "budget_index",
    "N",
    "D",
    "flops",
    "loss",
    "task",
    "metric",
    "value",
    "stderr",
    "n",
    "backend",
    "num_fewshot",
    "limit",
    "val_bpb",
    "proxy",
    "weights",
    "weights_sha256",
)


def write_table(rows: list[dict], path: Path) -> None:
    """The rows as CSV (.csv), JSON Lines (.jsonl) or a JSON list (.json), written atomically."""
    import csv
    import io

    from scaling.common.run_folder import atomic_write_bytes
    from scaling.common.serialize import to_json

    suffix = path.suffix.lower()
    if suffix == ".csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(COLUMNS), extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in COLUMNS})
        data = buf.getvalue()
    elif suffix == ".jsonl":
        data = "".join(to_json({k: r.get(k) for k in COLUMNS}, indent=None) + "\n" for r in rows)
    elif suffix == ".json":
        data = to_json([{k: r.get(k) for k in COLUMNS} for r in rows]) + "\n"
    else:
        raise UserError(f"--out {path}: use a .csv, .jsonl or .json file name")
    atomic_write_bytes(path, data.encode())
