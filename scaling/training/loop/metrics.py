"""The metrics sink: ``metrics.jsonl`` (the source of truth) plus optional TensorBoard / W&B mirrors,
and the per-step measurements (MFU, peak memory) the trainer logs.

Durability without an fsync per line: each line is written and flushed to the operating system
at once (it survives the process being killed), and the file is fsynced before every checkpoint
(:meth:`MetricsSink.sync`), so the lines up to a checkpoint survive a power loss as well. On resume
the lines past the checkpoint are dropped (:func:`resume_metrics`): a run killed at any moment and
resumed logs exactly what an uninterrupted run logs. Only a torn *final* line (a write cut short)
may be dropped; a corrupt line anywhere else is an error naming the file and line, and nothing
is changed.

Model FLOPs utilisation (PaLM, Chowdhery et al. 2022, appendix B):

    MFU = tokens_per_s * flops_per_token / (world_size * peak_flops)

with ``flops_per_token`` the exact training count of :func:`scaling.accounting.costs.flops_per_token`
(6 x matmul parameters touched per token + attention) and ``peak_flops`` the dense peak of one
device. Presets (:data:`PEAK_FLOPS`), dense (no structured sparsity) tensor-core throughput from
NVIDIA's datasheets: H100 SXM5 BF16 989.4 TFLOP/s ("NVIDIA H100 Tensor Core GPU" datasheet, the
1,979 TFLOP/s figure is with 2:4 sparsity); H200 SXM BF16 989.4 TFLOP/s ("NVIDIA H200 Tensor Core
GPU" datasheet, 1,979 with sparsity); A100 SXM BF16 312 TFLOP/s ("NVIDIA A100 Tensor Core GPU"
datasheet, 624 with sparsity).

Peak memory: ``torch.cuda.max_memory_allocated`` on CUDA (bytes held by tensors, per device);
on CPU the process's maximum resident set size (``resource.getrusage``, ru_maxrss in KiB on
Linux), which also counts the interpreter and libraries.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from scaling.common.errors import UserError
from scaling.common.files import bad_number, read_jsonl
from scaling.common.serialize import to_json
from scaling.training import runlog

log = logging.getLogger(__name__)

PEAK_FLOPS = {"h100-sxm-bf16": 989.4e12, "h200-bf16": 989.4e12, "a100-bf16": 312e12}
LOG_TARGETS = ("jsonl", "tensorboard", "wandb")
# where a record is (the x-axis and the tag say it), not what was measured: no TensorBoard chart
TB_BOOKKEEPING = frozenset({"iter", "step", "tokens", "branch", "budget_index"})


def resolve_peak_flops(value: float | str | None) -> float | None:
    """A preset name or a number of FLOP/s per device -> FLOP/s (None stays None)."""
    if value is None:
        return None
    if isinstance(value, str):
        if value in PEAK_FLOPS:
            return PEAK_FLOPS[value]
        try:
            value = float(value)
        except ValueError:
            raise UserError(f"unknown peak_flops {value!r}; give FLOP/s per device or one of "
                            f"{', '.join(PEAK_FLOPS)}") from None
    if not (value > 0 and value < float("inf")):
        raise UserError(f"peak_flops must be a positive number of FLOP/s, got {value}")
    return float(value)


def mfu(tokens_per_s: float, flops_per_token: int, peak_flops: float, world_size: int) -> float:
    """Model FLOPs utilisation of the whole job (see the module docstring)."""
    return tokens_per_s * flops_per_token / (world_size * peak_flops)


def peak_memory_bytes(device) -> int:
    """Peak bytes allocated by tensors on a CUDA device, or the process's max RSS on CPU."""
    import torch

    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # bytes on macOS, KiB on Linux


def resume_metrics(path: Path, upto_iter: int, lines: int | None = None) -> int:
    """Keep the lines of ``path`` with ``iter <= upto_iter``; returns how many are kept.

    A torn final line is dropped; a corrupt line before it raises UserError and leaves the file
    as it was, and so do a line repeated or out of order and, when the checkpoint says how many
    ``lines`` the run had written (``TrainState.metrics_lines``), a different number of them up
    to ``upto_iter`` (a line deleted, or the file cut short). The file is rewritten atomically,
    and only when something is dropped.
    """
    read = read_jsonl(path, missing_ok=True)
    for i, r in enumerate(read.rows, start=1):
        key = bad_number(r)
        if key is not None:
            raise UserError(f"{path}: record {i} holds {key} = {str(r[key])[:30]!r}, not a number; the log "
                            "is corrupt: resume refuses to rewrite it")
    kept = [r for r in read.rows if (r.get("iter") or 0) <= upto_iter]
    # the trainer logs each update once, in order (every shipped log: 474 of 474): a repeated or
    # reordered line is outside damage the resume would carry on (the resume audit, 2026-12-07)
    iters = [r.get("iter") or 0 for r in kept]
    for i, (a, b) in enumerate(zip(iters, iters[1:]), start=2):
        if b <= a:
            raise UserError(f"{path}: record {i} has iter {b} after iter {a} (a line repeated or out of "
                            "order); the log is damaged: resume refuses to rewrite it")
    if lines is not None and len(kept) != lines:
        raise UserError(f"{path}: holds {len(kept)} line(s) up to update {upto_iter} where the run wrote "
                        f"{lines} (a line lost, or the file cut short); the log is damaged: resume refuses "
                        "to rewrite it")
    if read.skipped or not read.terminated or len(kept) != len(read.rows):
        runlog.rewrite_jsonl(path, kept)
    return len(kept)


class MetricsSink:
    """Appends metric records to ``metrics.jsonl`` and mirrors them (rank 0 only; others no-op).

    ``log_to`` holds "jsonl" (always) and optionally "tensorboard" (event files under
    ``<run_dir>/tensorboard``; needs the ``tensorboard`` package) and "wandb" (offline unless
    ``WANDB_MODE`` says otherwise, files under ``<run_dir>/wandb``); both are imported lazily.
    Both mirrors tag the trunk ``trunk/<metric>`` and each cooldown branch ``cooldown_<k>/<metric>``
    against tokens, without the bookkeeping fields. W&B keeps one run id across resumes (the run's
    ``run_id``, ``resume="allow"``); it cannot take back history it was sent, so the updates a
    killed run logged past its checkpoint stay in W&B beside their replay (the same tokens).
    ``start_iter`` is the update the run resumes after: the mirrors drop their events past it.
    """

    def __init__(self, run_dir: Path, *, enabled: bool, log_to=("jsonl",), start_iter: int = 0,
                 run_name: str = "", run_id: str = "", config: dict | None = None):
        self.path = Path(run_dir) / runlog.METRICS
        self.enabled = enabled
        self._fh = None
        self._tb = None
        self._wandb = None
        check_log_to(log_to)
        if not enabled:
            return
        self._fh = open(self.path, "a", encoding="utf-8")
        require_trackers(log_to)
        if "tensorboard" in log_to:
            self._open_tensorboard(Path(run_dir) / "tensorboard", start_iter)
        if "wandb" in log_to:
            import wandb

            self._wandb = wandb.init(project=os.environ.get("WANDB_PROJECT", "smelt-scale"), name=run_name,
                                     id=run_id or None, resume="allow", dir=str(run_dir),
                                     mode=os.environ.get("WANDB_MODE", "offline"), config=config or {})
            # tokens is the x of every chart (wandb's own _step only counts log calls) and no chart
            self._wandb.define_metric("tokens", hidden=True)
            self._wandb_prefixes: set[str] = set()

    def _open_tensorboard(self, folder: Path, start_iter: int) -> None:
        """A fresh event log. On resume it is rebuilt from metrics.jsonl up to the checkpoint: the
        events a killed run wrote past its checkpoint cannot be removed from an event file
        (``purge_step`` only asks TensorBoard to hide them; tbparse and other readers return the
        resumed iterations twice), so the old files go and the kept records are written again."""
        import shutil

        from torch.utils.tensorboard import SummaryWriter

        if folder.exists():
            shutil.rmtree(folder)
        self._tb = SummaryWriter(str(folder))
        if start_iter > 0:
            for row in read_jsonl(self.path, missing_ok=True).rows:
                if row.get("iter", 0) <= start_iter:
                    self._tb_write(row)

    def _tb_write(self, record: dict[str, Any]) -> None:
        """One record as TensorBoard scalars against tokens: the trunk under ``trunk/``, each
        cooldown branch under ``cooldown_<k>/`` (k: the budget, 1-based), so a branch is its own
        curve rather than a sawtooth on the trunk's; bookkeeping fields are not charts."""
        prefix, x, values = tagged(record)
        for k, v in values.items():
            self._tb.add_scalar(f"{prefix}/{k}", v, x)

    def _wandb_write(self, record: dict[str, Any]) -> None:
        """The same tags as TensorBoard, with ``tokens`` as the x of each prefix's charts."""
        prefix, x, values = tagged(record)
        if prefix not in self._wandb_prefixes:
            self._wandb.define_metric(f"{prefix}/*", step_metric="tokens")
            self._wandb_prefixes.add(prefix)
        self._wandb.log({**{f"{prefix}/{k}": v for k, v in values.items()}, "tokens": x})

    def log(self, record: dict[str, Any]) -> None:
        """Write one line (flushed to the OS, not fsynced) and mirror its numbers."""
        if not self.enabled:
            return
        self._fh.write(to_json(record, indent=None) + "\n")
        self._fh.flush()
        if self._tb is not None:
            self._tb_write(record)
        if self._wandb is not None:
            self._wandb_write(record)

    def sync(self) -> None:
        """Make every line written so far durable (called before each checkpoint)."""
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        if self._fh is not None:
            self.sync()
            self._fh.close()
            self._fh = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def tagged(record: dict[str, Any]) -> tuple[str, int, dict[str, float]]:
    """(prefix, tokens, values) of a record for the mirrors: prefix ``trunk`` or ``cooldown_<k>``
    (k = branch + 1, the budget), x = tokens (iter where absent), values without bookkeeping."""
    prefix = "trunk" if record.get("branch") is None else f"cooldown_{int(record['branch']) + 1}"
    x = int(record.get("tokens", record.get("iter", 0)))
    return prefix, x, {k: v for k, v in _numbers(record).items() if k not in TB_BOOKKEEPING}


def _numbers(record: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def require_trackers(log_to) -> None:
    """UserError if a mirror in ``log_to`` lacks its package (checked before a run starts)."""
    for target, package in (("tensorboard", "tensorboard"), ("wandb", "wandb")):
        if target in log_to:
            try:
                __import__(package)
            except ImportError:
                raise UserError(f"logging to {target} needs the {package} package "
                                "(pip install 'smelt-scale[track]')") from None


def check_log_to(log_to) -> None:
    unknown = sorted(set(log_to) - set(LOG_TARGETS))
    if unknown or "jsonl" not in log_to:
        raise UserError(f"log_to must include jsonl and only {', '.join(LOG_TARGETS)}; got {list(log_to)}")
