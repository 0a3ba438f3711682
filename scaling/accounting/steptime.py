"""Step-time model: predicted seconds per optimizer step, MFU and the binding resource of one run
under a parallel layout, from its FLOPs and the memory planner's communication volumes. Pure
arithmetic (no torch). A prediction, never a measurement: one layout has been timed on a real
GPU (one H200, world size 1, 2026-12-04: benchmarks/results/gpu-h200-2026-12-04*.json), against
which the optimizer term below is tested; the rest has not (issue 27, item 5).

Compute. Per GPU and optimizer step the model does

    F_model = flops_per_token(cfg) * micro_batch_size * grad_accum_steps * seq_len

training FLOPs (forward + backward, ``scaling.accounting.costs.flops_per_token``: 6 per matmul
weight per token + the attention products; every rank takes its own rows of the global batch,
so tokens per GPU = micro x accumulation x sequence). Activation checkpointing recomputes every
layer pass's forward during backward (the trainer checkpoints the layer calls, not the LM head),
so the GPU executes

    F_exec = F_model + (F_model - F_head) / 3  with checkpointing, F_model without,
    F_head = 6 V d per token (the LM head's share of F_model, tied or not)

(a forward is 2 of the 6 FLOPs per weight per token; Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models", section 5: full recomputation costs one
extra forward, 33% more of what is recomputed. Counting the head too over-counted F_exec
by 0.7-3.2% at the paper tiers and up to 9.9% at the proxy tiers.) The assumed MFU
(``[executor] mfu``) is read as the fraction of the GPU's dense peak (``[executor]
gpu_peak_flops``) that executed FLOPs reach:

    t_compute = F_exec / (peak * mfu_assumed)

Communication. The planner's volumes (``MemoryEstimate``: all_gather, reduce_scatter,
all_reduce, all_to_all) are bytes each GPU sends per step in NCCL's bus-bandwidth convention
(ring: (n-1)/n of the tensor for all-gather / reduce-scatter, twice that for all-reduce). So a
collective on a link of per-GPU, per-direction bus bandwidth B takes

    t = bytes / B

(NCCL tests, doc/PERFORMANCE.md: busBw is defined so that it is comparable to the link's
hardware bandwidth, whatever the rank count). A ring over ranks in more than one node is limited
by its inter-node hops, so it runs at the network bandwidth. Which link each collective uses
(ranks are numbered node-major, the trainer's mesh puts ``ep`` innermost):

* FSDP: all-gather and reduce-scatter over all W ranks (the experts' over the S/P ranks of the
  same EP position, one per EP group): NVLink on one node, the network on more than one.
* HSDP (R replicas x S shards): all-gather / reduce-scatter inside the shard group, NVLink when
  a group is S consecutive ranks inside one node (S divides gpus_per_node), else the network;
  the all-reduce across the R replicas crosses nodes when there is more than one node.
* DDP: the gradient all-reduce, NVLink on one node, the network otherwise.
* EP all-to-all: NVLink when an EP group stays inside a node (``Layout.ep_intra_node``), else
  the network.

Collectives on the same link are summed (one link, one direction's bandwidth); NVLink and the
network are separate links but FSDP issues its collectives in order, so their times are also
summed — a conservative choice.

Overlap. FSDP2 prefetches the next layer's all-gather and reduce-scatters a layer's gradients
while the previous layer's backward runs, so its all-gather / reduce-scatter / all-reduce time
can hide behind compute; ``overlap`` is the fraction of the compute time available for that.
The all-to-all of expert parallelism cannot hide: the trainer's dispatch waits for its tokens
before the expert matmul (scaling/training/parallel/expert_parallel.py). Hence

    t_step = t_compute + t_all_to_all + t_inline + max(0, t_fsdp - overlap * t_compute) + t_optimizer

where t_fsdp = t_all_gather + t_reduce_scatter + t_all_reduce - t_inline, and t_inline is the
time of the per-pass reduce-scatters the step waits for (``Layout.loop_grad = "per-pass"``,
``MemoryEstimate.reduce_scatter_inline``): scaling/training/parallel/loop_grad.py issues each
looped layer pass's reduce-scatter asynchronously from the backward and waits for it when the
next one is issued, so it overlaps one pass's backward as FSDP2's own do; the loop block's last
one (one layer pass per synced micro-batch) is waited for at once and does not hide; under HSDP
the per-pass reduction's all-reduce of each looped module's shard across the replicas, once per
step, is asynchronous (it hides like FSDP2's own) except under grad_sync "last" with
accumulation, where every looped reduction is finished at once
(``MemoryEstimate.all_reduce_inline``).
overlap = 1 gives
max(t_compute, t_fsdp) + t_all_to_all, overlap = 0 the plain sum.

Optimizer. After the backward each GPU clips and updates the parameters it holds (P_local, the
planner's ``params`` bytes / parameter bytes), a pass bound by the GPU's memory bandwidth, not
its FLOPs, and after the last reduce-scatter, so nothing hides it:

    t_optimizer = P_local * (2 p + 4 g + 4 o) / hbm

with p, g, o the bytes of a parameter, a gradient and one optimizer state: fused AdamW reads the
parameter, the gradient and both moments and writes the parameter and both moments (2p + g + 4o);
the clipping reads the gradients for the norm and reads and writes them to scale (3g). fp32
throughout: 40 bytes per parameter. It matters where few GPUs hold many parameters, as this
study's sparse tiers do on one GPU: 3.74e9 parameters (100M tier) give 31 ms at 4.8 TB/s, and the
H200 measured 38 ms (B) / 43 ms (S) of optimizer and foreach kernels per step (tested: within
30%, nominal bandwidth, so optimistic like the rest); on the paper plan's 8 GPUs it is 4 ms.
``hbm`` (``[parallel] hbm_gb_s``): 4800 GB/s, the H200's HBM3e (NVIDIA H200 datasheet); an H100
SXM has 3350 (HBM3).

Outputs. Predicted MFU (model FLOPs, PaLM's definition: Chowdhery et al. 2022, appendix B, which
does not count recomputation) is

    mfu = F_model / (t_step * peak)  <=  mfu_assumed

since t_step >= t_compute >= F_model / (peak * mfu_assumed). The binding resource is the one
busy longest per step: "compute" (t_compute), "nvlink" or "network" (the summed time of the
collectives on that link), or "hbm" (t_optimizer).

Default bandwidths (plan fields ``[parallel] nvlink_gb_s``, ``network_gb_s``, ``overlap``,
``hbm_gb_s``),
nominal peaks, which NCCL does not fully reach (measured bus bandwidths are typically 70-90% of
them), so predictions are optimistic:

* NVLink 450 GB/s per GPU per direction: H100 SXM and H200 SXM both have fourth-generation
  NVLink at 900 GB/s total (NVIDIA H100 / H200 datasheets), i.e. 450 GB/s each way.
* Network 50 GB/s per GPU: one 400 Gb/s InfiniBand NDR (ConnectX-7) adapter per GPU, as in
  the DGX H100 / H200 reference design (NVIDIA DGX H100 user guide); 400e9 / 8 = 50e9 B/s.
* overlap 0.8: most but not all FSDP traffic hides behind compute (the first all-gather and the
  last reduce-scatter of a step are exposed). An assumption, not a measurement.
* HBM 4800 GB/s (H200; plans for H100s set 3350).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from scaling.accounting.config import ModelConfig
from scaling.accounting.costs import flops_per_token
from scaling.accounting.memory import DTYPE_BYTES, GB, Layout, MemoryEstimate, estimate_memory
from scaling.common.errors import UserError

DEFAULT_NVLINK_GB_S = 450.0
DEFAULT_NETWORK_GB_S = 50.0
DEFAULT_OVERLAP = 0.8
DEFAULT_HBM_GB_S = 4800.0
RECOMPUTE_FACTOR = 4.0 / 3.0   # of the recomputed layers' FLOPs (module docstring)
RESOURCES = ("compute", "nvlink", "network", "hbm")


@dataclass(frozen=True)
class Links:
    """Per-GPU, per-direction bus bandwidths, the GPU's memory bandwidth (GB/s, GB = 1e9 bytes)
    and the overlap fraction."""

    nvlink_gb_s: float = DEFAULT_NVLINK_GB_S
    network_gb_s: float = DEFAULT_NETWORK_GB_S
    overlap: float = DEFAULT_OVERLAP
    hbm_gb_s: float = DEFAULT_HBM_GB_S

    def __post_init__(self) -> None:
        for name in ("nvlink_gb_s", "network_gb_s", "hbm_gb_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or v == float("inf"):
                raise UserError(f"{name} must be a positive number of GB/s, got {v!r}")
        o = self.overlap
        if isinstance(o, bool) or not isinstance(o, (int, float)) or not 0 <= o <= 1:
            raise UserError(f"overlap must be a number in [0, 1], got {o!r}")


def collective_links(layout: Layout) -> dict[str, str]:
    """The link ("nvlink" | "network") each collective of ``layout`` runs on (module docstring)."""
    multi = layout.nodes > 1
    cross = "network" if multi else "nvlink"
    if layout.mode == "hsdp":
        S = layout.shards
        inside = S <= layout.gpus_per_node and layout.gpus_per_node % S == 0
        shard = "nvlink" if inside else "network"
    else:
        shard = cross
    return {
        "all_gather": shard,
        "reduce_scatter": shard,
        "all_reduce": cross,
        "all_to_all": "nvlink" if layout.ep_intra_node else "network",
    }


@dataclass(frozen=True)
class StepTime:
    """Predicted time of one optimizer step on one GPU (seconds) and what binds it."""

    model_flops: float
    executed_flops: float
    compute_s: float
    all_gather_s: float
    reduce_scatter_s: float
    all_reduce_s: float
    all_to_all_s: float
    inline_reduce_scatter_s: float
    inline_all_reduce_s: float
    optimizer_s: float
    nvlink_s: float
    network_s: float
    step_s: float
    mfu: float
    binding: str
    assumed_mfu: float
    peak_flops: float
    nvlink_gb_s: float
    network_gb_s: float
    overlap: float
    hbm_gb_s: float
    links: dict[str, str]

    def to_dict(self) -> dict:
        return asdict(self)


def predict_step_time(cfg: ModelConfig, layout: Layout, memory: MemoryEstimate, peak_flops: float,
                      mfu: float, links: Links | None = None) -> StepTime:
    """Step time, predicted MFU and binding resource of ``cfg`` under ``layout`` (module docstring),
    from the planner's ``memory`` estimate of the same layout (its communication volumes)."""
    links = links or Links()
    if isinstance(peak_flops, bool) or not peak_flops > 0:
        raise UserError(f"gpu_peak_flops must be > 0, got {peak_flops!r}")
    if isinstance(mfu, bool) or not 0 < mfu <= 1:
        raise UserError(f"mfu must be in (0, 1], got {mfu!r}")
    seq = layout.seq_len if layout.seq_len is not None else cfg.seq_len
    f_model = float(flops_per_token(cfg)) * layout.micro_batch_size * layout.grad_accum_steps * seq
    f_head = 6.0 * cfg.vocab_size * cfg.d_model * layout.micro_batch_size * layout.grad_accum_steps * seq
    f_exec = f_head + (f_model - f_head) * (RECOMPUTE_FACTOR if layout.activation_checkpointing else 1.0)
    t_c = f_exec / (peak_flops * mfu)
    on = collective_links(layout)
    bw = {"nvlink": links.nvlink_gb_s * GB, "network": links.network_gb_s * GB}
    vol = {"all_gather": memory.all_gather, "reduce_scatter": memory.reduce_scatter,
           "all_reduce": memory.all_reduce, "all_to_all": memory.all_to_all}
    t = {k: v / bw[on[k]] for k, v in vol.items()}
    per_link = {name: sum(t[k] for k in t if on[k] == name) for name in ("nvlink", "network")}
    t_inline_rs = memory.reduce_scatter_inline / bw[on["reduce_scatter"]]
    t_inline_ar = memory.all_reduce_inline / bw[on["all_reduce"]]
    t_inline = t_inline_rs + t_inline_ar
    t_fsdp = t["all_gather"] + t["reduce_scatter"] + t["all_reduce"] - t_inline
    t_opt = optimizer_bytes(layout, memory) / (links.hbm_gb_s * GB)
    step = t_c + t["all_to_all"] + t_inline + max(0.0, t_fsdp - links.overlap * t_c) + t_opt
    busy = {"compute": t_c, **per_link, "hbm": t_opt}
    binding = max(RESOURCES, key=lambda r: busy[r])  # ties: the first in RESOURCES order
    return StepTime(
        model_flops=f_model, executed_flops=f_exec, compute_s=t_c,
        all_gather_s=t["all_gather"], reduce_scatter_s=t["reduce_scatter"],
        all_reduce_s=t["all_reduce"], all_to_all_s=t["all_to_all"], inline_reduce_scatter_s=t_inline_rs,
        inline_all_reduce_s=t_inline_ar,
        optimizer_s=t_opt, nvlink_s=per_link["nvlink"], network_s=per_link["network"], step_s=step,
        mfu=f_model / (step * peak_flops), binding=binding, assumed_mfu=float(mfu),
        peak_flops=float(peak_flops), nvlink_gb_s=float(links.nvlink_gb_s),
        network_gb_s=float(links.network_gb_s), overlap=float(links.overlap),
        hbm_gb_s=float(links.hbm_gb_s), links=on,
    )


def optimizer_bytes(layout: Layout, memory: MemoryEstimate) -> float:
    """Bytes the optimizer step moves through one GPU's memory: its parameters x (2p + 4g + 4o)
    (module docstring: fused AdamW and the gradient clipping)."""
    p, g, o = (DTYPE_BYTES[d] for d in (layout.param_dtype, layout.grad_dtype, layout.optim_dtype))
    return memory.params / p * (2 * p + 4 * g + 4 * o)


# ----- choosing a layout ------------------------------------------------------------------------

EP_DEGREES = (1, 2, 4, 8)


@dataclass(frozen=True)
class LayoutChoice:
    """One candidate layout with its planner memory (GB per GPU) and predicted step."""

    layout: Layout
    memory_gb: float
    step: StepTime

    def to_dict(self) -> dict:
        lay = self.layout
        return {
            "mode": lay.mode, "ep": lay.ep, "replicate": lay.replicas if lay.mode == "hsdp" else None,
            "micro_batch_size": lay.micro_batch_size, "grad_accum_steps": lay.grad_accum_steps,
            "activation_checkpointing": lay.activation_checkpointing, "memory_gb_per_gpu": self.memory_gb,
            "predicted_step_s": self.step.step_s, "predicted_mfu": self.step.mfu,
            "binding_resource": self.step.binding,
        }


def candidate_layouts(base: Layout, n_experts: int) -> list[Layout]:
    """Layouts of the same GPUs and per-GPU batch as ``base``: FSDP, or HSDP (shard inside a node,
    replicate across nodes) when there is more than one node; EP degree in {1, 2, 4, 8} where it
    divides the shard degree (uneven expert splits are allowed, as in the trainer) and does not
    exceed the experts; every power-of-two micro-batch dividing the per-GPU batch; activation
    checkpointing on and off. Dtypes, sequence length, compilation and grad_sync as in ``base``
    (grad_sync "every" when ``base`` is not sharded). On one GPU only the unwrapped layout
    ("none", grad_sync "last": nothing to reduce), the one the trainer runs there."""
    per_gpu = base.micro_batch_size * base.grad_accum_steps
    micros = [m for m in (2 ** i for i in range(per_gpu.bit_length())) if per_gpu % m == 0]
    sync = base.grad_sync if base.sharded else "every"
    modes = [("fsdp", None)] + ([("hsdp", base.nodes)] if base.nodes > 1 else [])
    if base.world == 1:  # one GPU trains unwrapped (memory.resolve_mode): no other layout to choose
        modes, sync = [("none", None)], "last"
    out = []
    for mode, replicate in modes:
        for ep in EP_DEGREES:
            shards = base.world // (replicate or 1)
            if ep > n_experts or shards % ep:
                continue
            for micro in micros:
                for ac in (False, True):
                    out.append(Layout(
                        mode=mode, gpus_per_node=base.gpus_per_node, nodes=base.nodes,
                        replicate=replicate, micro_batch_size=micro, grad_accum_steps=per_gpu // micro,
                        activation_checkpointing=ac, grad_sync=sync, seq_len=base.seq_len,
                        param_dtype=base.param_dtype, grad_dtype=base.grad_dtype,
                        optim_dtype=base.optim_dtype, compute_dtype=base.compute_dtype,
                        reduce_dtype=base.reduce_dtype, chunked_ce=base.chunked_ce, ep=ep,
                        compiled=base.compiled))
    return out


def choose_layout(cfg: ModelConfig, base: Layout, gpu_memory_gb: float | None, peak_flops: float,
                  mfu: float, links: Links | None = None) -> tuple[LayoutChoice | None, int, int]:
    """The candidate (``candidate_layouts``) with the shortest predicted step among those whose
    planner peak fits ``gpu_memory_gb`` (all, when None). Ties (to 1e-9 relative) go to the larger
    micro-batch up to ``MEASURED_MICRO`` (16), then the less memory: the model gives every
    micro-batch the same MFU, but GPU kernels run better on more rows (the H200 measured 25%
    more tokens/s at micro-batch 16 than at 8, both architectures, compiled; nothing larger was
    measured, so beyond 16 the memory decides), and on one GPU, with no communication to tell
    them apart, every micro-batch ties. Returns (best or None when nothing fits, candidates
    tried, candidates that fit)."""
    best, tried, fitting = None, 0, 0
    for lay in candidate_layouts(base, cfg.n_experts):
        tried += 1
        mem = estimate_memory(cfg, lay)
        if gpu_memory_gb is not None and not mem.fits(gpu_memory_gb):
            continue
        fitting += 1
        choice = LayoutChoice(lay, mem.total / GB, predict_step_time(cfg, lay, mem, peak_flops, mfu, links))
        if best is None or _better(choice, best):
            best = choice
    return best, tried, fitting


# the largest micro-batch measured on a GPU (benchmarks/results/gpu-h200-2026-12-04*.json)
MEASURED_MICRO = 16


def _better(a: LayoutChoice, b: LayoutChoice) -> bool:
    """a before b: a shorter step; on a tie the larger micro-batch up to MEASURED_MICRO, then the
    less memory."""
    ta, tb = a.step.step_s, b.step.step_s
    if abs(ta - tb) > 1e-9 * max(ta, tb):
        return ta < tb
    def key(c: LayoutChoice) -> tuple[int, float]:
        return -min(c.layout.micro_batch_size, MEASURED_MICRO), c.memory_gb
    return key(a) < key(b)
