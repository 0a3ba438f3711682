"""Run a sweep plan through submitit: local processes here, Slurm on a cluster.

Local executor: the runs are packed into ``concurrency`` lanes (longest estimated run first,
each to the least-loaded lane), and each lane is one submitit job that trains its runs in
order, so at most ``concurrency`` trainings share the machine. Slurm executor: one job per
run, submitted as an array. Every run goes through ``scaling.training.loop.trainer.train(resume=True)``:
a finished run is skipped, an interrupted one resumes from its last checkpoint.

One distributed training per job, shaped by the run's ``[parallel]`` layout (the one the memory
planner checked): a Slurm job has ``nodes`` x ``gpus_per_node`` tasks, one per GPU
(``ntasks_per_node = gpus_per_node``); a local job has ``gpus_per_node`` processes on this
machine (gloo on the CPU, or one per GPU of a workstation). submitit starts every task with the
same function; ``scaling.training.parallel.distributed.setup_distributed`` exports the torch distributed
variables from submitit's job environment (``submitit.helpers.TorchDistributedEnvironment``), so
the tasks form one process group and only rank 0 writes the run folder. Runs of different shapes
(``[tier."1.6B".parallel] nodes = 4``) go in separate arrays.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scaling.accounting.config import ModelConfig
from scaling.accounting.memory import GB, MemoryEstimate, estimate_memory
from scaling.accounting.steptime import StepTime, predict_step_time
from scaling.common.errors import UserError
from scaling.common.files import bad_number
from scaling.common.run_folder import CONFIG, FINAL, METRICS, WEIGHTS, RunFolder
from scaling.training.loop.lock import check_free
from scaling.training.sweep.plan import PlannedRun, SweepPlan

# the plan's [executor] assumptions when it states none (a typical MFU; H100 SXM dense bf16)
DEFAULT_MFU = 0.4
DEFAULT_GPU_PEAK_FLOPS = 9.89e14


def run_status(runs_dir: Path, name: str) -> str:
    """'done', 'partial' (resume it) or 'new' (start it): :meth:`RunFolder.status`, the one rule."""
    return RunFolder(runs_dir / name).status()


def recorded_diff(run: PlannedRun, runs_dir: Path) -> list[str]:
    """What the run folder's recorded config.json says differently from the plan's run, as
    ``section.key old -> new`` strings (empty: the same run, or no run there yet). The keys a
    resume may change (``trainer.RESUME_FREE``: logging, checkpoint cadence, device, threads,
    parallel layout) are not compared; an unreadable config.json is a difference. A finished WSD
    run trained to more budgets than the plan's, the plan's budgets first (:func:`extends`), is
    the plan's run: its points at those budgets are the plan's trainings."""
    from scaling.training.loop.trainer import RESUME_FREE

    path = runs_dir / run.name / CONFIG
    if not path.exists():
        return []
    try:
        old = json.loads(path.read_text())
        old_train, old_model = dict(old["train"]), dict(old["model"])
    except (OSError, ValueError, KeyError, TypeError):
        return ["config.json unreadable"]
    new_train, new_model = run.train_config().to_dict(), run.model.to_dict()
    out = []
    for section, a, b in (("model", old_model, new_model), ("train", old_train, new_train)):
        for key in sorted(set(a) | set(b)):
            if section == "train" and key in RESUME_FREE:
                continue
            # final weights are a run option, not in the train dict: a longer run's are of its own
            # last budget, so a plan that wants them is not served by one
            if ((section, key) == ("train", "tokens") and extends(a, b)
                    and not run.train.get("save_final_weights") and run_status(runs_dir, run.name) == "done"):
                continue
            if key in a and key in b and a[key] != b[key]:
                out.append(f"{section}.{key} {_short(a[key])} -> {_short(b[key])}")
            elif (key in a) != (key in b) and section == "model":
                out.append(f"{section}.{key}")
    return out


def extends(recorded: dict, planned: dict) -> bool:
    """Whether a run of train config ``recorded`` holds the run of ``planned``: both WSD, the same
    but for token budgets, and the recorded budgets the planned ones followed by more. A WSD run is
    one trunk at constant lr with a cooldown branched off at each budget, each branch the schedule
    of a standalone run to that budget (``scaling.training.loop``), so nothing before a budget
    depends on the budgets after it (`runs/README.md` shows it bitwise on 24 runs). The further
    budgets must all be larger than the plan's: the trainer sorts the budgets, and a smaller one
    would change the budget indices and the default warm-up (taken from the smallest budget)."""
    old, new = recorded.get("tokens"), planned.get("tokens")
    if recorded.get("schedule") != "wsd" or planned.get("schedule") != "wsd":
        return False
    if not isinstance(old, list) or not isinstance(new, list) or not new:
        return False
    return len(old) > len(new) and old[:len(new)] == new and min(old[len(new):]) > max(new)


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def missing_outputs(run: PlannedRun, runs_dir: Path) -> list[str]:
    """Files the plan asks of a finished run that its folder lacks (final weights when
    [train] save_final_weights)."""
    folder = runs_dir / run.name
    wanted = [FINAL] + ([WEIGHTS] if run.train.get("save_final_weights") else [])
    return [name for name in wanted if not (folder / name).is_file()]


def planned_status(run: PlannedRun, runs_dir: Path) -> str:
    """'done' only when final.json is complete, the recorded config is the plan's and every output
    the plan asks for exists; 'partial' (resume it), 'new', or 'differs' (refused: see
    :func:`check_recorded`)."""
    status = run_status(runs_dir, run.name)
    if status == "new":
        return status
    if recorded_diff(run, runs_dir):
        return "differs"
    if status == "done" and missing_outputs(run, runs_dir):
        return "partial"  # e.g. killed while writing its final weights: the resume writes them
    return status


def check_recorded(plan: SweepPlan) -> None:
    """UserError (one line) when a run folder of the plan holds a run trained (or started) with
    another configuration: skipping it would keep a result of another config, resuming it mixes
    two; the user decides (remove the folder, or restore the plan)."""
    bad = [(r, recorded_diff(r, plan.runs_dir)) for r in plan.runs]
    bad = [(r, d) for r, d in bad if d]
    if not bad:
        return
    run, diff = bad[0]
    others = [r.name for r, _ in bad[1:]]
    more = f"; also {', '.join(others[:3])}{' ...' if len(others) > 3 else ''}" if others else ""
    raise UserError(f"run {run.name} in {plan.runs_dir} was trained with another configuration than the "
                    f"plan's ({', '.join(diff[:4])}){more}; remove its folder to train it again, or restore "
                    "the plan")


def train_config(run: PlannedRun, threads: int | None = None):
    """The run's TrainConfig (see :meth:`PlannedRun.train_config`)."""
    return run.train_config(threads)


def execute_run(run: PlannedRun, runs_dir: str, threads: int | None = None,
                ckpt_dir: str | None = None) -> dict:
    """Train (or resume, or skip) one planned run; returns its final.json document."""
    from scaling.training.loop.trainer import train

    return train(run.model, train_config(run, threads), tier=run.tier, proxy=run.proxy,
                 run_name=run.name, runs_dir=runs_dir, ckpt_dir=ckpt_dir,
                 resume=planned_status(run, Path(runs_dir)) != "new",
                 save_final_weights=bool(run.train.get("save_final_weights", False)),
                 save_budget_weights=bool(run.train.get("save_budget_weights", False)))


def execute_lane(runs: list[PlannedRun], runs_dir: str, threads: int | None = None,
                 ckpt_dir: str | None = None) -> list[dict]:
    """One submitit job of the local executor: its runs, one after the other."""
    return [execute_run(r, runs_dir, threads, ckpt_dir) for r in runs]


# ----- estimates ------------------------------------------------------------------------

def probe_tokens_per_s(
    cfg: ModelConfig, batch_size: int, threads: int | None = None, steps: int = 3
) -> float:
    """Measured training tokens/s of ``cfg`` on this machine (random tokens, AdamW, fp32 CPU).

    One warm-up update, then ``steps`` timed updates; a rough estimate for planning only.
    """
    import torch

    from scaling.training.model.transformer import MoETransformer

    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        model = MoETransformer(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randint(0, cfg.vocab_size, (batch_size, cfg.seq_len + 1))

        def step() -> None:
            out = model(x[:, :-1], targets=x[:, 1:])
            (out.loss + 0.01 * out.aux_loss).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        step()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        return steps * batch_size * cfg.seq_len / (time.perf_counter() - t0)
    finally:
        torch.set_num_threads(old_threads)


BUSY_LOAD_PER_CORE = 0.25   # a 1-minute load average above this share of the cores: a busy machine


def machine_load() -> dict[str, Any] | None:
    """The 1-minute load average and the core count (``os.getloadavg``; None where the platform has
    none): taken before a probe, it says whether the probe ran on an idle machine."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    cores = os.cpu_count() or 1
    return {"load_1min": round(float(load), 2), "cores": cores, "busy": load > BUSY_LOAD_PER_CORE * cores}


@dataclass(frozen=True)
class RunEstimate:
    run: PlannedRun
    status: str
    tokens: float
    flops: float
    tokens_per_s: float | None
    seconds: float | None
    gpu_hours: float | None
    memory: MemoryEstimate | None = None
    step: StepTime | None = None

    @property
    def fits(self) -> bool | None:
        """Whether the per-GPU peak fits the plan's gpu_memory_gb (None: the plan states none)."""
        limit = self.run.gpu_memory_gb
        return None if limit is None or self.memory is None else self.memory.fits(limit)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": self.run.name,
            "tier": self.run.tier,
            "arch": self.run.arch,
            "seed": self.run.seed,
            "budgets": list(self.run.budgets),
            "status": self.status,
            "tokens": self.tokens,
            "flops": self.flops,
            "tokens_per_s": self.tokens_per_s,
            "est_seconds": self.seconds,
            "gpu_hours": self.gpu_hours,
            **self.memory_dict(),
            **self.step_dict(),
        }

    def step_dict(self) -> dict[str, Any]:
        """Predicted step time (s), MFU and binding resource, and the step-time model's parts."""
        if self.step is None:
            return {}
        return {
            "predicted_step_s": self.step.step_s,
            "predicted_mfu": self.step.mfu,
            "binding_resource": self.step.binding,
            "step_time": self.step.to_dict(),
        }

    def memory_dict(self) -> dict[str, Any]:
        """memory_gb_per_gpu (total and parts, GB = 1e9 bytes), fits, communication per step."""
        if self.memory is None:
            return {}
        m = self.memory.to_dict()
        parts = ("total", "params", "grads", "optimizer", "activations", "working", "buffers")
        return {
            "memory_gb_per_gpu": {k: m[k] for k in parts},
            "gpu_memory_gb": self.run.gpu_memory_gb,
            "fits": self.fits,
            "memory_peak_at": m["peak_at"],
            "communication_gb_per_step": m["communication_per_step"],
            "layout": m["layout"],
        }


def estimate(plan: SweepPlan, probe: bool = True) -> list[RunEstimate]:
    """FLOPs of every run, time on this machine from a measured probe (proxy tiers) and
    GPU-hours at the plan's stated MFU (paper tiers): hours = FLOPs / (mfu * peak) / 3600."""
    ex = plan.executor
    mfu = float(ex.get("mfu", DEFAULT_MFU))
    peak = float(ex.get("gpu_peak_flops", DEFAULT_GPU_PEAK_FLOPS))
    threads = ex.get("threads_per_job")
    speed: dict[tuple, float] = {}
    out = []
    for run in plan.runs:
        tokens, flops = run.tokens_trained(), run.flops()
        tps = secs = gpu_h = None
        if run.proxy:
            if probe:
                key = (run.tier, run.arch, run.train.get("batch_size", 16))
                if key not in speed:
                    speed[key] = probe_tokens_per_s(run.model, int(key[2]), threads)
                tps = speed[key]
                secs = tokens / tps
        else:
            gpu_h = flops / (mfu * peak) / 3600.0
        layout = run.layout()
        memory = estimate_memory(run.model, layout)
        step = predict_step_time(run.model, layout, memory, peak, mfu, run.links())
        out.append(RunEstimate(run, planned_status(run, plan.runs_dir), tokens, flops, tps, secs, gpu_h,
                               memory, step))
    return out


def check_memory(estimates: list[RunEstimate]) -> None:
    """UserError (one line) naming the runs whose per-GPU peak exceeds gpu_memory_gb, first in full."""
    over = [e for e in estimates if e.fits is False]
    if not over:
        return
    e = over[0]
    lay, need, limit = e.memory.layout, e.memory.total / GB, e.run.gpu_memory_gb
    others = "".join(
        f"; also {o.run.name} (+{o.memory.total / GB - o.run.gpu_memory_gb:.1f} GB)" for o in over[1:]
    )
    raise UserError(
        f"tier {e.run.tier} ({e.run.name}) needs {need:.1f} GB per GPU, {need - limit:.1f} GB more "
        f"than gpu_memory_gb = {limit:g} ({lay.mode} on {lay.nodes} x {lay.gpus_per_node} GPUs, "
        f"micro-batch {lay.micro_batch_size}, activation checkpointing "
        f"{'on' if lay.activation_checkpointing else 'off'}){others}"
    )


# ----- dispatch -------------------------------------------------------------------------


def lanes(runs: list[PlannedRun], weights: dict[str, float], n: int) -> list[list[PlannedRun]]:
    """Longest-processing-time-first packing of runs into n lanes (balanced total weight)."""
    buckets: list[list[PlannedRun]] = [[] for _ in range(max(1, n))]
    load = [0.0] * len(buckets)
    for run in sorted(runs, key=lambda r: -weights.get(r.name, 0.0)):
        i = load.index(min(load))
        buckets[i].append(run)
        load[i] += weights.get(run.name, 0.0)
    return [b for b in buckets if b]


def run_tasks(run: PlannedRun) -> tuple[int, int]:
    """(nodes, tasks per node) of one run's job: its [parallel] layout, one task per GPU."""
    return int(run.parallel.get("nodes", 1)), int(run.parallel.get("gpus_per_node", 1))


def executor_parameters(plan: SweepPlan, kind: str, nodes: int = 1,
                        tasks_per_node: int = 1) -> dict[str, Any]:
    """submitit parameters of one job of ``nodes`` x ``tasks_per_node`` tasks (one per GPU / rank)."""
    ex = plan.executor
    time_min = int(ex.get("time_limit_min", 24 * 60))
    if kind == "local":
        if nodes != 1:
            raise UserError(f"the local executor runs on this machine only; the plan asks for {nodes} nodes")
        return {"timeout_min": time_min, "tasks_per_node": tasks_per_node}
    params: dict[str, Any] = dict(
        time=time_min,
        nodes=nodes,
        gpus_per_node=tasks_per_node,
        ntasks_per_node=tasks_per_node,  # one task per GPU; each becomes one rank
        cpus_per_task=int(ex.get("cpus_per_job", 8)),
        array_parallelism=int(ex.get("concurrency", 64)),
        job_name=f"smelt-{plan.name}",
    )
    if "partition" in ex:
        params["partition"] = ex["partition"]
    if "mem_gb" in ex:
        params["mem"] = f"{int(ex['mem_gb'])}G"
    return params


def make_executor(plan: SweepPlan, log_dir: Path, kind: str | None = None, nodes: int = 1,
                  tasks_per_node: int = 1):
    import submitit

    kind = kind or plan.executor.get("kind", "local")
    if kind == "local":
        executor = submitit.LocalExecutor(folder=str(log_dir))
    elif kind == "debug":  # in-process, for tests and pdb
        return submitit.DebugExecutor(folder=str(log_dir)), kind
    elif kind == "slurm":
        executor = submitit.SlurmExecutor(folder=str(log_dir))
    else:
        raise UserError(f"unknown executor kind {kind!r}; choose local, slurm or debug")
    executor.update_parameters(**executor_parameters(plan, kind, nodes, tasks_per_node))
    return executor, kind


@dataclass(frozen=True)
class Submitted:
    """One submitit job and the runs it trains, in order (a local lane holds several)."""

    job: Any
    runs: tuple[str, ...]

    @property
    def log(self) -> Path:
        """The job's stderr file (submitit's log: the traceback of a failure ends up here)."""
        return Path(self.job.paths.stderr)


def submit(plan: SweepPlan, **kw):
    """Submit the plan's unfinished runs; returns (jobs, skipped run names). See :func:`submit_runs`."""
    submitted, skipped = submit_runs(plan, **kw)
    return [s.job for s in submitted], skipped


def submit_runs(
    plan: SweepPlan,
    *,
    kind: str | None = None,
    concurrency: int | None = None,
    threads: int | None = None,
    log_dir: Path | None = None,
    estimates: list[RunEstimate] | None = None,
) -> tuple[list[Submitted], list[str]]:
    """Submit the plan's unfinished runs; returns ([Submitted], skipped run names).

    A plan whose runs do not fit their gpu_memory_gb is refused (UserError) before anything starts.
    """
    check_memory(estimates if estimates is not None else estimate(plan, probe=False))
    check_recorded(plan)  # a run of another config is neither skipped nor resumed
    todo = [r for r in plan.runs if planned_status(r, plan.runs_dir) != "done"]
    skipped = [r.name for r in plan.runs if r not in todo]
    for r in todo:  # another sweep or training holds one: refuse the sweep before starting any run
        try:
            check_free(plan.runs_dir / r.name)
        except UserError as exc:
            raise UserError(f"{exc}; this sweep starts nothing while another process trains one of its "
                            "runs") from None
    plan.runs_dir.mkdir(parents=True, exist_ok=True)
    log_dir = log_dir or plan.runs_dir / ".submitit"
    executor, kind = make_executor(plan, log_dir, kind)
    threads = threads if threads is not None else plan.executor.get("threads_per_job")
    if not todo:
        return [], skipped
    runs_dir = str(plan.runs_dir)
    # one array / set of lanes per job shape: every task of a job is one rank of its run
    shapes = sorted({run_tasks(r) for r in todo})
    jobs = []
    if kind == "slurm":
        for nodes, tasks in shapes:
            executor.update_parameters(**executor_parameters(plan, kind, nodes, tasks))
            group = [r for r in todo if run_tasks(r) == (nodes, tasks)]
            with executor.batch():
                handles = [executor.submit(execute_run, r, runs_dir, threads) for r in group]
            jobs += [Submitted(j, (r.name,)) for j, r in zip(handles, group)]
        return jobs, skipped
    n = concurrency or int(plan.executor.get("concurrency", 1))
    weights = {e.run.name: (e.seconds or e.flops) for e in (estimates or [])}
    if not weights:
        weights = {r.name: r.flops() for r in todo}
    for nodes, tasks in shapes:
        if kind == "local":
            executor.update_parameters(**executor_parameters(plan, kind, nodes, tasks))
        group = [r for r in todo if run_tasks(r) == (nodes, tasks)]
        for lane in lanes(group, weights, n):
            job = executor.submit(execute_lane, lane, runs_dir, threads)
            jobs.append(Submitted(job, tuple(r.name for r in lane)))
    return jobs, skipped


# ----- following a sweep ----------------------------------------------------------------

@dataclass(frozen=True)
class RunProgress:
    """How far one run of a plan is, read from its folder (``metrics.jsonl``, ``final.json``).

    tokens_done: tokens trained so far, cooldown branches included (iter x tokens per update);
    tokens_total: the plan's count (trunk to the largest budget + each cooldown). eta_s: the
    tokens left at the run's own measured rate (its wall_s over its tokens_done).
    """

    run: str
    status: str
    tokens_done: float
    tokens_total: float
    train_loss: float | None
    val_loss: float | None
    wall_s: float | None
    eta_s: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _last_lines(path: Path, n_bytes: int = 65536) -> list[dict]:
    """The complete JSON lines at the end of a log being appended to (reads its tail only)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - n_bytes))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    lines = text.splitlines()[1:] if size > n_bytes else text.splitlines()
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line: the writer is mid-line
        if isinstance(row, dict) and bad_number(row) is None:  # a status line never fails on a bad record
            rows.append(row)
    return rows


def run_progress(plan: SweepPlan, run: PlannedRun) -> RunProgress:
    total = float(run.tokens_trained())
    status = run_status(plan.runs_dir, run.name)
    rows = _last_lines(plan.runs_dir / run.name / METRICS)
    if not rows:
        return RunProgress(run.name, status, total if status == "done" else 0.0, total, None, None, None,
                           0.0 if status == "done" else None)
    last = rows[-1]
    per_update = last["tokens"] / last["step"] if last.get("step") else 0
    # a finished run trained its plan (tokens_trained counts its whole updates)
    done = total if status == "done" else float(last.get("iter", 0)) * per_update
    val = next((r["val_loss"] for r in reversed(rows) if r.get("val_loss") is not None), None)
    train_loss = last.get("train_loss")
    if status == "done":
        # a run trained further than the plan asks (``extends``): show it at the plan's last budget
        final = RunFolder(plan.runs_dir / run.name).final() or {}
        at = [p for p in final.get("points", []) if p.get("budget_index") == len(run.budgets) - 1]
        if len(final.get("points", [])) > len(run.budgets) and at:
            val, train_loss = at[0].get("loss"), at[0].get("train_loss")
    wall = last.get("wall_s")
    eta = 0.0 if status == "done" else (total - done) * wall / done if wall and done > 0 else None
    return RunProgress(run.name, status, done, total, train_loss, val, wall, eta)


_ERROR_LINE = re.compile(r"^\s*(?:[\w.]+\.)?(\w*(?:Error|Exception|Interrupt|Exit)\w*):\s*(.*)$")


def failure_reason(exc: BaseException | None) -> str:
    """One line from a failed job's exception: the last ``SomeError: message`` line of the traceback
    submitit relays (module path dropped), else the exception's last non-empty line."""
    if exc is None:
        return "failed"
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    for line in reversed(lines):
        m = _ERROR_LINE.match(line)
        if m and not m.group(1).startswith("FailedJob"):
            return f"{m.group(1)}: {m.group(2)}".strip().rstrip(":")
    return lines[-1].strip() if lines else type(exc).__name__


def failed_run(sub: Submitted, runs_dir: Path) -> str:
    """The run of a failed job that failed: the first of its runs not done."""
    return next((r for r in sub.runs if run_status(runs_dir, r) != "done"), sub.runs[-1])
