"""Memory planner: per-GPU bytes of one training step of a ModelConfig under a parallel layout,
and the collective-communication bytes per optimizer step. Pure arithmetic (no torch).

Units: bytes internally; every reported size is in GB = 1e9 bytes (``GB``), never GiB. A card's
nominal size (H100 80 GB, H200 141 GB) is used as a decimal budget; the CUDA context, NCCL's
own buffers and allocator fragmentation are not counted, so plans should keep headroom.

What is counted, per GPU, at the peak of a step (the backward pass):

``params``      the master weights, ``param_bytes`` each (fp32). Sharded by FSDP/HSDP: FSDP2
                shards every parameter on dim 0 in ``torch.chunk`` fashion and pads each local
                shard to ceil(dim0 / S) rows (PyTorch FSDP2 docs, ``fully_shard``: "shards
                parameters on dim-0"), so rank 0, the largest, holds
                sum_p ceil(dim0_p / S) * numel_p / dim0_p elements. DDP / one GPU: everything.
``grads``       gradients in ``grad_bytes`` (fp32 with fp32 master weights; FSDP2 keeps the
                sharded gradient in the parameter's dtype after reduce-scattering in
                ``reduce_dtype``), sharded like the parameters. DDP also keeps its reducer
                buckets, a second full copy, unless ``gradient_as_bucket_view=True``
                (``torch.nn.parallel.DistributedDataParallel`` docs), which this project's
                trainer does not set, so DDP counts 2 x. Counted as present *at the peak*:
                the trainer frees gradients after every step (``zero_grad(set_to_none=True)``),
                so with one micro-batch per step they appear layer by layer during the
                backward (the root's from its start, each layer's after its first pass's
                backward; DDP's buckets always); with accumulation the later micro-batches find
                them all. (Calibration, docs/gpu-memory.md: counting every gradient at the
                head's backward over-planned the H200 Baseline runs without accumulation by
                the whole 15-16 GB of fp32 gradients.) The optimizer step, every gradient and
                no activation, is the peak only for tiny models.
``optimizer``   AdamW's two moments in ``optim_bytes`` each, shaped like the (sharded)
                parameters, plus the 4-byte ``step`` scalar per parameter tensor that the fused
                CUDA AdamW keeps on the device: ZeRO's 4 + 4 + 8 = 16 bytes per parameter for
                fp32 master + fp32 grads + Adam (Rajbhandari et al. 2020, "ZeRO", section 3.1,
                there with fp16 weights + fp32 master copy; here the master *is* the weight).
``activations`` tensors saved for backward, counted the way Korthikanti et al. 2022
                ("Reducing Activation Recomputation in Large Transformer Models", section 4)
                count them: op by op, the inputs/outputs each op keeps for its backward, for
                *this* model's forward (scaling/training/model/transformer.py). Per layer *pass* (a looped
                layer runs ``n_loops`` times and saves its activations each time), with
                N = micro_batch * seq_len tokens, c = compute bytes, r = residual-stream bytes
                (c under FSDP2 mixed precision, which casts every block's input; the weights'
                dtype otherwise, as autocast keeps the residual stream in fp32)::

                    N * ( 2*(8*d + 4)      the two RMSNorms in fp32 (decomposed on CPU): input,
                                           x * rstd, rstd; 2*(r*d + 4) when c != 4 (bf16
                                           compute means CUDA, whose fused rms_norm kernel
                                           saves its input and rstd)
                        + 2*c*d            the inputs of wqkv and of the router's GEMM, in the
                                           compute dtype (the norm outputs; under autocast,
                                           r != c, their bf16 copies)
                        + c*(H+2Hkv)*h     the q|k|v projection (v is a view of it)
                        + c*(H+Hkv)*h      RoPE output (q, k)
                        + c*H*h            SDPA output (its [B,T,H*h] reshape, wo's input, is
                                           a view: the kernels write [B,T,H,h] memory; not
                                           on CPU for an odd h, whose output comes back in
                                           another layout: the reshape copies, + c*H*h more)
                        + 4*H              SDPA log-sum-exp (fp32)
                        + 2*4*E            router logits and softmax (fp32)
                        + 2*4              logsumexp (z-loss) and the top-k sum
                        + k*(3*8 + 4)      top-k ids, sort order, token ids (int64), top-k probs
                        + k*c*(d' + d + 4*f' + 1)   dispatched tokens, expert output
                                           gathered back to token order (the gate-weighted sum
                                           keeps it for the gates' gradient), expert hidden
                                           (gate|up), silu(gate), silu*up, gates
                        + c*4*f_s          shared expert, when there is one: hidden, silu,
                                           product (+ c*d, its own bf16 input, when r != c) )
                    + c*E*3*d'*f'          zero-padded copies of the expert weights, saved by
                                           grouped_mm, when d or f is not a multiple of 4

                (d', f' = d, f rounded up to multiples of 4 when the model pads them), and once
                per forward (not per pass) the RoPE tables cast to the compute dtype, 2*c*T*rd
                when c != 4 (``rope_table_bytes``).
                Attention is SDPA (flash / memory-efficient / CPU-flash kernels): it saves
                q, k, v, the output and the log-sum-exp, never the T x T score matrix; the
                ``5*a*s/h`` term of Korthikanti's formula is absent. On CUDA a head size h
                that is not a multiple of 8 (the SMELT twins') runs at h' = h rounded up to 8
                (``transformer.sdpa_head_size``; SDPA's flash path padded the same way before):
                the kernel then saves padded q|k|v and output, not the projection and RoPE
                output, and wo keeps an unpadded copy: c*((H+2Hkv)*h' + H*h' + H*h) for the
                c*((2H+3Hkv)*h + H*h) above, 3% less at the 100M twin's attention terms and
                under 0.3% of its layer pass, left uncounted.
                LM head: the final norm (8*d + 4), the head's input (c*d), the logits
                [B, T, V] (c, held by the caller's output until backward ends), the fp32
                log-probabilities cross-entropy saves (4*V), the int64 targets and embedding
                ids: N*(8*d + 4 + c*d + (c + 4)*V + 16).
                With the chunked cross-entropy (the default, ``Layout.chunked_ce``) the head
                keeps N*(8*d + 4 + c*d + 16) + 4*V*d instead (``head_activation_bytes``) and
                its transients are one chunk's logits and gradient products
                (``head_working_bytes``).
                These terms were read off this model's autograd graph and are checked against
                it (tests/test_memory.py: the bytes a saved_tensors_hooks pack hook sees match
                to <0.01% in fp32 on CPU). The bf16 (CUDA) terms are checked the same way on
                CPU emulations of the two CUDA layouts (a bf16 model for FSDP2's, autocast over
                fp32 for one GPU unwrapped, a norm that saves what CUDA's fused kernel saves);
                docs/gpu-memory.md has the GPU comparison.
                With activation checkpointing (``torch.utils.checkpoint``, non-reentrant, around
                every layer call) a layer pass stores only its input, N*r*d, and recomputes
                the rest during its own backward; the recompute stops after the layer's last
                saved tensor (the combine's gate product), whose N*k*c*d output is then alive
                beside the recomputed activations.
``working``     transients at the peak: the head's backward (fp32 gradients of the log-probs
                and of the logits, N*8*V) or one layer's backward, whose first steps (in
                reverse: index_add_, gating, the second grouped_mm) hold the gradients of the
                gated and ungated expert outputs and of the residual stream,
                N*(2*k*c*d' + r*d), plus, without FSDP, w_down's weight-gradient temporary
                E*f*d in ``grad_bytes`` (later steps free more than they allocate; checked
                against measured CPU peaks, tests/test_memory.py); and the gradients of
                looped weights: autograd sums all contributions to a leaf before accumulating
                it, so a looped layer's weight gradient from its later pass waits, whole, in
                the engine until its first pass's backward (c each under FSDP mixed precision,
                ``grad_bytes`` otherwise), unless FSDP/HSDP reduce-scatter each pass's gradient
                at its pass boundary (``Layout.loop_grad = "per-pass"``, the default when
                sharded; scaling/training/parallel/loop_grad.py): then nothing is held and each
                pass's gradient is the one layer's unsharded gradient of ``buffers``. The
                peak is found by walking the backward pass in order (the head, then the layer
                passes in reverse), each moment's live set being the activations still stored +
                the held looped gradients + the current working set + the FSDP buffers.
``buffers``     FSDP/HSDP: the root module's parameters (embedding, final norm, LM head) stay
                unsharded in the compute dtype for the whole step (FSDP2 sets the root's
                ``reshard_after_forward`` to False); two layers' all-gathered parameters
                (the current one and the prefetched next) in the compute dtype; in backward
                also one layer's unsharded gradients, in the compute dtype and their
                ``reduce_bytes`` copy for the reduce-scatter; and, when gradients are synced
                only on the last micro-batch (``grad_sync="last"`` with accumulation), FSDP2's
                ``unsharded_accumulated_grad``: every parameter's *unsharded* gradient in the
                reduce dtype (torch/distributed/fsdp/_fully_shard/_fsdp_param.py,
                ``to_accumulated_grad_if_needed``); HSDP with accumulation otherwise: the
                reduce-scattered shard summed over the micro-batches that do not all-reduce
                (FSDP2's ``_partial_reduce_output``), a reduce-dtype copy of the sharded
                gradients. DDP / one GPU with a compute dtype narrower
                than the weights (autocast): the compute-dtype weight copies, once for the
                non-expert weights (autocast's cast cache) and once per stored layer pass for
                the expert weights (the model's explicit ``.to(dtype)`` before grouped_mm, saved
                for backward; one layer's with activation checkpointing).

Not counted: the CUDA context and NCCL buffers, allocator fragmentation, optimizer-step
temporaries (the fused AdamW has none), the evaluation pass (no backward, smaller).

Communication per optimizer step, per GPU, in bytes each GPU sends with ring algorithms
(NCCL's "bus bandwidth" convention: all-gather and reduce-scatter move (n-1)/n of the full
tensor, all-reduce twice that; ZeRO section 7: data parallel 2 Psi, ZeRO-3 3 Psi per step):

* FSDP/HSDP (shard degree S): per micro-batch, every layer *pass* all-gathers its layer in
  the compute dtype in forward and again in backward (``reshard_after_forward=True``, the
  FSDP2 default, also for the looped layers: keeping them unsharded across the loop would
  hold half the model); the root once. Reduce-scatter in ``reduce_bytes`` once per layer and
  synced micro-batch: the weight gradient of both passes arrives summed (see ``working``);
  with ``loop_grad = "per-pass"`` once per layer *pass* instead (the looped layers r times).
  HSDP adds an all-reduce of the reduce-scattered shard across the R replicas, once per step
  (the last micro-batch's; the others only reduce-scatter, ``data_parallel.gradient_sync``).
  Under ``grad_sync="last"`` with accumulation and per-pass reduction, the synced micro-batch
  also reduce-scatters the looped gradients FSDP2 accumulated, once per looped layer.
* DDP: one all-reduce of the fp32 gradients per optimizer step (``no_sync`` before).
* Expert parallelism of degree P (scaling/training/parallel/expert_parallel.py): a rank holds the
  largest array_split share ceil(E/P) of each layer's experts, FSDP-sharded over the S / P
  ranks of its shard group, so the experts' all-gather and reduce-scatter run over S / P ranks
  on 1/P of the expert bytes (the rest of the layer as above). Per layer pass and micro-batch
  each rank sends (P-1)/P of its N*k dispatched rows (c*d bytes each) four times: dispatch and
  combine, in forward and again in backward (``all_to_all``; uniform routing assumed, the
  imbalance of a real router is not modelled, nor the all-to-all's receive buffers).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from scaling.accounting.config import ModelConfig
from scaling.accounting.costs import total_params
from scaling.common.errors import UserError

GB = 1e9
# the parallel modes, gradient-sync rules and looped-gradient reductions, defined once here
# (torch-free) for the planner, the trainer and the CLI's choice options
MODES = ("none", "ddp", "fsdp", "hsdp")
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
GRAD_SYNCS = ("last", "every")
LOOP_GRADS = ("per-pass", "fsdp")


def resolve_mode(mode: str, world: int) -> str:
    """The mode the trainer runs in ``mode`` on ``world`` ranks: one rank runs unwrapped (nothing
    to shard or reduce), whatever was asked; several ranks with 'none' use DDP, as the trainer did
    before FSDP existed. The planner applies it to plans too, so that it counts what trains."""
    if mode not in MODES:
        raise UserError(f"parallel mode must be one of {', '.join(MODES)}, got {mode!r}")
    if world == 1:
        return "none"
    return "ddp" if mode == "none" else mode
# torch.compile (inductor, per block) fuses the layer's elementwise chains (SwiGLU, norms, rotary,
# gate products) and stores fewer, smaller tensors for backward: the bytes one forward leaves
# allocated were 0.807 / 0.793 / 0.805 / 0.792 of this module's eager per-layer count on one H200
# (100M tier Baseline / SMELT at micro-batch 8 and 16, torch 2.11, FSDP2 bf16, the sync-free layer;
# benchmarks/results/gpu-h200-2026-12-04*.json, "stored_after_forward_gb"). An empirical factor,
# calibrated and checked on the same four runs (docs/gpu-memory.md), not derived
COMPILED_LAYER_ACTIVATIONS = 0.80


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _dtype_bytes(name: str, what: str) -> int:
    try:
        return DTYPE_BYTES[name]
    except KeyError:
        raise UserError(f"{what} must be one of {', '.join(DTYPE_BYTES)}, got {name!r}") from None


# ----- the parameters, tensor by tensor ------------------------------------------------------

def param_shapes(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """Every parameter of ``MoETransformer(cfg)`` as (name, shape), in ``named_parameters`` order.

    The shapes FSDP2 shards on dim 0 (a test checks the list against a meta-device build).
    """
    d, h, E, f, fs = cfg.d_model, cfg.head_dim, cfg.n_experts, cfg.expert_hidden, cfg.shared_expert_hidden
    out: list[tuple[str, tuple[int, ...]]] = [("embed.weight", (cfg.vocab_size, d))]
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        out += [
            (p + "attn_norm.weight", (d,)),
            (p + "attn.wqkv.weight", ((cfg.n_heads + 2 * cfg.n_kv_heads) * h, d)),
            (p + "attn.wo.weight", (d, cfg.n_heads * h)),
            (p + "moe_norm.weight", (d,)),
            (p + "moe.w_gate_up", (E, d, 2 * f)),  # a module's own parameters come first
            (p + "moe.w_down", (E, f, d)),
            (p + "moe.router.weight", (E, d)),
        ]
        if fs > 0:
            out += [(p + "moe.shared_gate_up.weight", (2 * fs, d)), (p + "moe.shared_down.weight", (d, fs))]
    out.append(("norm.weight", (d,)))
    if not cfg.tie_embeddings:
        out.append(("lm_head.weight", (cfg.vocab_size, d)))
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def sharded_numel(shape: tuple[int, ...], shards: int) -> int:
    """Elements of the largest FSDP2 shard (rank 0): ceil(dim0 / S) rows of dim0's row size."""
    rows = -(-shape[0] // shards)
    return rows * (_numel(shape) // shape[0])


def _layer_params(cfg: ModelConfig) -> int:
    """Parameters of one physical layer (every layer has the same shapes)."""
    return sum(_numel(s) for n, s in param_shapes(cfg) if n.startswith("layers.0."))


# ----- the layout -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    """How one run is spread over GPUs, and its per-GPU micro-batch and dtypes.

    mode              "none" (one GPU), "ddp", "fsdp" (shard over all GPUs) or "hsdp"
                      (replicate across ``replicate`` groups x shard within each group)
    gpus_per_node, nodes   world = gpus_per_node * nodes
    replicate         HSDP replicate degree (default: nodes, i.e. shard within a node)
    micro_batch_size  sequences per forward/backward on one GPU
    grad_accum_steps  micro-batches per optimizer step on one GPU
    activation_checkpointing  recompute every layer pass in backward (store only its input)
    grad_sync         "every" micro-batch reduces gradients, or only the "last" (no_sync /
                      set_requires_gradient_sync(False) before it). Default: "every" for
                      FSDP/HSDP (syncing only the last costs an unsharded fp32 gradient of
                      the whole model), "last" for DDP (free there)
    seq_len           tokens per sequence (None: the config's)
    param_dtype, grad_dtype, optim_dtype, compute_dtype, reduce_dtype   "fp32" | "bf16" | "fp16"
    ep                expert-parallel degree P (fsdp/hsdp): each layer's experts are split over P
                      ranks (array_split), each share FSDP-sharded over the other S / P ranks of
                      its shard group; must divide the shard degree S
    chunked_ce        the loss is computed in token chunks (the trainer's default; see
                      ``head_activation_bytes``); False: plain cross-entropy over [N, V] logits
    compiled          blocks run under torch.compile (the trainer's default on CUDA): each layer
                      pass stores ``COMPILED_LAYER_ACTIVATIONS`` of the eager bytes (measured)
    loop_grad         fsdp/hsdp, looped models: "per-pass" reduce-scatters a looped layer's gradient
                      after each pass (nothing held unsharded across passes, r reduce-scatters per
                      looped layer), "fsdp" leaves it to FSDP2 (after the last pass; the later
                      passes' gradients wait unsharded). Default: "per-pass" when sharded, the
                      trainer's (scaling.training.parallel.loop_grad.resolve_loop_grad)
    """

    mode: str = "none"
    gpus_per_node: int = 1
    nodes: int = 1
    replicate: int | None = None
    micro_batch_size: int = 1
    grad_accum_steps: int = 1
    activation_checkpointing: bool = False
    grad_sync: str | None = None
    seq_len: int | None = None
    param_dtype: str = "fp32"
    grad_dtype: str = "fp32"
    optim_dtype: str = "fp32"
    compute_dtype: str = "bf16"
    reduce_dtype: str = "fp32"
    chunked_ce: bool = True
    ep: int = 1
    compiled: bool = False
    loop_grad: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise UserError(f"parallel mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        for name in ("gpus_per_node", "nodes", "micro_batch_size", "grad_accum_steps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UserError(f"{name} must be a positive integer, got {v!r}")
        if self.seq_len is not None and (not isinstance(self.seq_len, int) or self.seq_len < 1):
            raise UserError(f"seq_len must be a positive integer, got {self.seq_len!r}")
        if self.grad_sync is None:
            object.__setattr__(self, "grad_sync", "every" if self.mode in ("fsdp", "hsdp") else "last")
        if self.grad_sync not in GRAD_SYNCS:
            raise UserError(f"grad_sync must be one of {', '.join(GRAD_SYNCS)}, got {self.grad_sync!r}")
        if self.loop_grad is None:
            object.__setattr__(self, "loop_grad", "per-pass" if self.mode in ("fsdp", "hsdp") else "fsdp")
        if self.loop_grad not in LOOP_GRADS:
            raise UserError(f"loop_grad must be one of {', '.join(LOOP_GRADS)}, got {self.loop_grad!r}")
        for name in ("param_dtype", "grad_dtype", "optim_dtype", "compute_dtype", "reduce_dtype"):
            _dtype_bytes(getattr(self, name), name)
        if self.mode == "none" and self.world != 1:
            raise UserError(f"parallel mode 'none' runs on one GPU, but the layout has {self.world}")
        if isinstance(self.ep, bool) or not isinstance(self.ep, int) or self.ep < 1:
            raise UserError(f"ep must be a positive integer, got {self.ep!r}")
        if self.ep > 1 and self.mode not in ("fsdp", "hsdp"):
            raise UserError(f"expert parallelism (ep = {self.ep}) needs parallel mode fsdp or hsdp")
        if self.replicate is not None:
            if self.mode != "hsdp":
                raise UserError("a replicate degree is only meaningful for parallel mode 'hsdp'")
            if not isinstance(self.replicate, int) or self.replicate < 1 or self.world % self.replicate:
                raise UserError(f"replicate degree {self.replicate!r} must divide the {self.world} GPUs")
        if self.ep > 1 and self.shards % self.ep:
            raise UserError(f"expert-parallel degree {self.ep} must divide the shard degree {self.shards}")

    @property
    def world(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def ep_intra_node(self) -> bool:
        """Whether an EP group (P consecutive ranks) stays inside one node."""
        return self.ep <= self.gpus_per_node and self.gpus_per_node % self.ep == 0

    @property
    def replicas(self) -> int:
        """Data-parallel copies of each shard: world for DDP, R for HSDP, 1 for FSDP."""
        if self.mode == "hsdp":
            return self.replicate if self.replicate is not None else self.nodes
        return self.world if self.mode == "ddp" else 1

    @property
    def shards(self) -> int:
        """Shard degree S: how many GPUs split each parameter."""
        return self.world // self.replicas if self.mode in ("fsdp", "hsdp") else 1

    @property
    def sharded(self) -> bool:
        return self.mode in ("fsdp", "hsdp")


# ----- the estimate -----------------------------------------------------------------------------

PARTS = ("params", "grads", "optimizer", "activations", "working", "buffers")


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-GPU peak bytes of one training step, by part, and communication bytes per step.

    params, grads, optimizer   persistent state (sharded under FSDP/HSDP)
    activations    stored for backward at the peak moment (what the step has not freed yet)
    working        transients at that moment (backward gradients, held looped weight grads)
    buffers        FSDP all-gather/reduce-scatter buffers, or autocast weight copies
    total          the sum: the peak of the backward pass
    activations_stored   all tensors stored for backward at the end of forward (the largest
                   activation footprint, reported beside the peak's split)
    peak_at        where in the backward the peak falls ("head", "layer <i> pass <p>")
    all_gather, reduce_scatter, all_reduce   bytes each GPU sends per optimizer step
    all_to_all     expert parallelism: token rows each GPU sends per optimizer step (dispatch
                   and combine, forward and backward), under uniform routing
    reduce_scatter_inline   the part of ``reduce_scatter`` that the step waits for in line: under
                   the per-pass reduction of looped layers (``loop_grad = "per-pass"``,
                   scaling/training/parallel/loop_grad.py) each pass's reduce-scatter overlaps
                   the earlier passes' backward, as FSDP2's own do, except the loop block's
                   last one in backward, finished at once: one layer pass per synced micro-batch
                   (every looped pass under grad_sync "last" with accumulation, where FSDP2
                   writes the same gradients)
    all_reduce_inline   the part of ``all_reduce`` the step waits for in line: under HSDP the
                   per-pass reduction all-reduces each looped module's shard across the replicas
                   once per step, asynchronously (``loop_grad.InFlight``'s second stage: it hides
                   like FSDP2's own), except under grad_sync "last" with accumulation, where each
                   reduction is finished at once (``PerPassReducer.reduce``)
    """

    config_name: str
    layout: Layout
    params: int
    grads: int
    optimizer: int
    activations: int
    working: int
    buffers: int
    activations_stored: int
    peak_at: str
    all_gather: int
    reduce_scatter: int
    all_reduce: int
    all_to_all: int = 0
    reduce_scatter_inline: int = 0
    all_reduce_inline: int = 0

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations + self.working + self.buffers

    @property
    def communication(self) -> int:
        return self.all_gather + self.reduce_scatter + self.all_reduce + self.all_to_all

    def parts_gb(self) -> dict[str, float]:
        return {p: getattr(self, p) / GB for p in PARTS}

    def fits(self, gpu_memory_gb: float) -> bool:
        return self.total <= gpu_memory_gb * GB

    def to_dict(self) -> dict:
        """JSON-ready: sizes in GB (1e9 bytes), the layout, and where the peak falls."""
        return {
            "unit": "GB (1e9 bytes)",
            "total": self.total / GB,
            **self.parts_gb(),
            "activations_stored": self.activations_stored / GB,
            "peak_at": self.peak_at,
            "communication_per_step": {
                "all_gather": self.all_gather / GB,
                "reduce_scatter": self.reduce_scatter / GB,
                "all_reduce": self.all_reduce / GB,
                "all_to_all": self.all_to_all / GB,
                "reduce_scatter_inline": self.reduce_scatter_inline / GB,
                "all_reduce_inline": self.all_reduce_inline / GB,
                "total": self.communication / GB,
            },
            "layout": asdict(self.layout),
        }

    def summary(self) -> str:
        lay = self.layout
        where = f"{lay.mode} on {lay.nodes} x {lay.gpus_per_node} GPUs"
        if lay.sharded:
            where += f" (shard {lay.shards} x replicate {lay.replicas})"
        if lay.ep > 1:
            where += f", expert-parallel {lay.ep}"
        parts = ", ".join(f"{p} {v:.2f}" for p, v in self.parts_gb().items())
        return (
            f"{self.config_name or 'model'}: {self.total / GB:.2f} GB per GPU, {where}, micro-batch "
            f"{lay.micro_batch_size} x {lay.grad_accum_steps}, activation checkpointing "
            f"{'on' if lay.activation_checkpointing else 'off'}\n"
            f"  parts (GB): {parts}; peak at {self.peak_at}\n"
            f"  communication per step and GPU (GB): all-gather {self.all_gather / GB:.2f}, "
            f"reduce-scatter {self.reduce_scatter / GB:.2f}, all-reduce {self.all_reduce / GB:.2f}, "
            f"all-to-all {self.all_to_all / GB:.2f}"
        )


def _expert_dims(cfg: ModelConfig, c: int = 4) -> tuple[int, int]:
    """d', f': the widths grouped_mm runs at: rounded up to 16 bytes (multiples of 4 in fp32, 8
    in bf16), the kernel's stride alignment."""
    d, f = cfg.d_model, cfg.expert_hidden
    return _round_up(d, 16 // c), _round_up(f, 16 // c)


def layer_activation_bytes(cfg: ModelConfig, micro_batch: int, seq_len: int, c: int,
                           r: int | None = None) -> int:
    """Bytes one layer pass saves for backward (micro_batch x seq_len tokens, compute bytes c,
    residual-stream bytes r: c under FSDP2 mixed precision and in fp32, 4 under autocast over
    fp32 weights, i.e. one GPU unwrapped).

    The formula in the module docstring, op by op for scaling/training/model/transformer.py.
    """
    r = c if r is None else r
    d, H, Hkv, h = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    E, k, fs = cfg.n_experts, cfg.top_k, cfg.shared_expert_hidden
    dp, fp = _expert_dims(cfg, c)
    per_token = (
        (2 * (8 * d + 4) if c == 4             # norms, CPU (decomposed): fp32 input, x * rstd,
         else 2 * (r * d + 4))                 # rstd; CUDA (fused kernel): input, rstd
        + 2 * c * d                            # the inputs of wqkv and of the router's GEMM in
                                               # the compute dtype (the norm outputs, or under
                                               # autocast their bf16 copies)
        + c * (H + 2 * Hkv) * h                # qkv (v is a view)
        + c * (H + Hkv) * h                    # RoPE output (q, k)
        + c * H * h                            # SDPA output (wo's input is a view of it)
        + (c * H * h if c == 4 and h % 2 else 0)   # CPU, odd h: SDPA returns another layout and
                                               # wo's input is a saved copy (module docstring)
        + 4 * H                                # SDPA log-sum-exp
        + 2 * 4 * E                            # router logits and probs
        + 2 * 4                                # logsumexp and top-k sum
        + k * (3 * 8 + 4)                      # top-k ids, order, token ids; top-k probs
        + k * c * (dp + d + 4 * fp + 1)        # dispatched tokens, expert output in token
                                               # order (the combine's gate product), hidden
                                               # (gate|up), silu, product, gates
        + (c * 4 * fs + (c * d if r != c else 0) if fs else 0)  # shared expert: hidden, silu,
                                               # product; its input is the router's unless
                                               # autocast casts it separately
    )
    padded = c * E * 3 * dp * fp if (dp, fp) != (d, cfg.expert_hidden) else 0
    return micro_batch * seq_len * per_token + padded


def rope_table_bytes(cfg: ModelConfig, seq_len: int, c: int) -> int:
    """The RoPE tables cast to the compute dtype (cos, sin [T, rd]), once per forward and saved by
    every layer pass's rotation: 0 in fp32, where the tables are used as they are."""
    return 0 if c == 4 else 2 * c * seq_len * cfg.rotary_dim


def head_activation_bytes(cfg: ModelConfig, micro_batch: int, seq_len: int, c: int,
                          chunked_ce: bool = False) -> int:
    """Final norm (fp32 input, x * rstd, rstd), LM-head input, logits (c, held by the caller),
    the fp32 log-probs cross-entropy saves, and the int64 targets and embedding ids.

    With the chunked cross-entropy (scaling/training/model/chunked_ce.py) no logits are kept: its
    forward saves the input gradient [N, d] (c) and the fp32 weight gradient [V, d] instead of
    the head input, the logits and the log-probs: N*(8*d + 4 + c*d + 16) + 4*V*d."""
    d, V = cfg.d_model, cfg.vocab_size
    if chunked_ce:
        return micro_batch * seq_len * (8 * d + 4 + c * d + 2 * 8) + 4 * V * d
    return micro_batch * seq_len * (8 * d + 4 + c * d + (c + 4) * V + 2 * 8)


def ce_chunk_tokens(vocab_size: int) -> int:
    """Tokens per cross-entropy chunk: scaling.training.model.chunked_ce.default_chunk (2**24 // V)."""
    return max(1, (1 << 24) // max(1, vocab_size))


def head_working_bytes(cfg: ModelConfig, micro_batch: int, seq_len: int, c: int,
                       chunked_ce: bool = False) -> int:
    """Transients of the loss. Plain: the backward's fp32 gradients of the log-probs and of the
    logits, N*8*V. Chunked (scaling/training/model/chunked_ce.py, whose forward also computes the
    gradients): the larger of
    - one chunk's forward: its fp32 logits, turned in place into the softmax gradient g, and the
      compute-dtype copy gc (C*V*(4 + c), c only when narrower than fp32), with the products
      gc @ w [C, d] and gc.t() @ hc [V, d] in c, and that product's fp32 cast when c < 4
      (c*C*d + c*V*d + 4*V*d): the two products were left out before, 7% of the peak of a
      V = 1001, d = 42, 96-token step (PyTorch's MemTracker; the accounting audit of 2026-12-06);
    - the backward's scaled gradients plus the weight gradient's cast to c (N*c*d + (4 + c)*V*d).
    """
    N, d, V = micro_batch * seq_len, cfg.d_model, cfg.vocab_size
    if not chunked_ce:
        return 8 * N * V
    C = min(N, ce_chunk_tokens(V))
    narrow = c < 4
    forward = C * V * (4 + (c if narrow else 0)) + c * C * d + c * V * d + (4 * V * d if narrow else 0)
    return max(forward, N * c * d + (4 + c) * V * d)


def _all_reduce_volumes(layout: Layout, grad_bytes: float, shard_bytes: float,
                        looped_shard_bytes: float) -> tuple[int, int]:
    """(all-reduce bytes each GPU sends per step, the part the step waits for in line): DDP's fp32
    gradients once per synced micro-batch (every one under grad_sync "every": DDP has no
    reduce-scatter to keep them sharded, so it all-reduces each; once per step under "last");
    HSDP's reduce-scattered shard across the R replicas once per step (only the last micro-batch
    all-reduces), of which the looped layers' part is all-reduced in line by
    the per-pass reduction where it finishes each reduction at once (``looped_shard_bytes``; 0
    where its all-reduces run asynchronously, ``loop_grad.InFlight``)."""
    R = layout.replicas
    if R <= 1 or layout.mode not in ("ddp", "hsdp"):
        return 0, 0
    ring = 2 * (R - 1) / R
    if layout.mode == "ddp":
        syncs = layout.grad_accum_steps if layout.grad_sync == "every" else 1
        return round(ring * grad_bytes * syncs), 0
    return round(ring * shard_bytes), round(ring * looped_shard_bytes)


EXPERT_STACKS = ("moe.w_gate_up", "moe.w_down")


def _on_rank(name: str, shape: tuple[int, ...], S: int, P: int, share: int) -> tuple[tuple[int, ...], int]:
    """The unsharded shape of parameter ``name`` that this rank's FSDP2 group holds, and the
    degree it is sharded over: under expert parallelism (P > 1) an EP rank's ``share`` experts
    over the S / P ranks of its expert group; everything else whole, over S."""
    if P > 1 and name.endswith(EXPERT_STACKS):
        return (share, *shape[1:]), max(1, S // P)
    return shape, S


def _gathered(shapes: list, S: int, P: int, share: int) -> tuple[int, int, int]:
    """Elements FSDP2 all-gathers, and reduce-scatters, of one layer's non-expert parameters, of
    the experts this rank holds, and of the root's: each parameter's dim 0 padded up to a
    multiple of its shard degree (S; S / P for an EP rank's share of ``share`` experts), as
    FSDP2 pads its flat buffers (torch/distributed/fsdp/_fully_shard/_fsdp_param.py). Unpadded,
    the volumes and buffers came out 4-6% low at 1.6B over 32 GPUs (336 experts) and 22% low on
    4 ranks of proxy-tiny (the planner audit of 2026-12-08)."""
    def padded(name: str, shape: tuple[int, ...]) -> int:
        held, degree = _on_rank(name, shape, S, P, share)
        return sharded_numel(held, degree) * degree

    layer = [(n, sh) for n, sh in shapes if n.startswith("layers.0.")]
    return (sum(padded(n, sh) for n, sh in layer if not n.endswith(EXPERT_STACKS)),
            sum(padded(n, sh) for n, sh in layer if n.endswith(EXPERT_STACKS)),
            sum(padded(n, sh) for n, sh in shapes if not n.startswith("layers.")))


def _grads_at_backward_start(cfg: ModelConfig, layout: Layout, gb: int, rb: int, local: int, grads: int,
                             layer_local: int) -> int:
    """Gradient bytes alive as the (last) micro-batch's backward starts. The trainer frees them after
    each step (zero_grad with set_to_none), so with one micro-batch per step they appear layer by
    layer as the backward reaches each layer's first pass (the root's, embedding and head, counted
    from the start; DDP's reducer buckets persist). With accumulation every later micro-batch
    finds them all, except where FSDP2 holds no sharded ``.grad`` before the last micro-batch
    reduces (grad_sync "last"; HSDP, which all-reduces only then): there the accumulation buffers
    (``_accumulation_bytes``) stand in for them, and as that backward goes on each group's buffer
    turns into its gradient (HSDP: the reduce-dtype partial into the grad-dtype gradient). Counting
    both was the planner audit's largest finding (2026-12-08: under grad_sync "last", 1.5x the real
    gradient-side bytes on 2 ranks)."""
    if layout.grad_accum_steps == 1:
        bucket = gb * local if layout.mode == "ddp" else 0
        return bucket + gb * (local - cfg.n_layers * layer_local)
    if layout.sharded and (layout.grad_sync == "last" or layout.mode == "hsdp"):
        return max(0, gb - rb) * local if layout.grad_sync == "every" else 0
    return grads


def _accumulation_bytes(layout: Layout, shapes: list, S: int, P: int, share: int, rb: int, local: int) -> int:
    """What FSDP2 holds between the micro-batches of a step, in the reduce dtype: under
    ``grad_sync = "last"`` every parameter's *unsharded* accumulated gradient
    (``unsharded_accumulated_grad``; under expert parallelism only the experts this rank holds:
    counting all of them was 216 GB instead of 29 at 1.6B with EP 8); under HSDP the sharded
    gradient summed over the micro-batches that do not all-reduce (``_partial_reduce_output``, the
    per-pass reducer's ``partial`` for looped layers; with one replica as well). Either stands in
    for the sharded gradients until the last micro-batch reduces (``estimate_memory``'s ``g_now``);
    both equal the real buffers byte for byte on 2 and 4 gloo ranks (tests/test_memory_gloo.py)."""
    if layout.grad_accum_steps <= 1:
        return 0
    if layout.grad_sync == "last":
        return rb * sum(_numel(_on_rank(n, sh, S, P, share)[0]) for n, sh in shapes)
    return rb * local if layout.mode == "hsdp" else 0


def _sharded_volumes(cfg: ModelConfig, S: int, P: int, m: int, m_sync: int, c: int, rb: int, Lp_ne: float,
                     share_layer: float, root: float, per_pass: bool) -> tuple[int, int, int]:
    """FSDP/HSDP bytes each GPU sends per step over its S-rank shard group (experts over S / P):
    all-gather (every layer pass, forward and backward, in the compute dtype's ``c`` bytes),
    reduce-scatter (``rb`` bytes; per layer, or per layer pass under per-pass reduction) and the
    part of it the step waits for in line (per-pass reduction: the loop block's last layer pass
    in backward, finished at once; the others overlap the earlier passes' backward), in NCCL's
    bus-bandwidth convention ((S-1)/S of the tensor)."""
    frac, frac_e = (S - 1) / S, (S // P - 1) / (S // P)  # experts: over the S / P ranks
    ag = round(m * c * (frac * (2 * cfg.n_layer_passes * Lp_ne + root)
                        + frac_e * 2 * cfg.n_layer_passes * share_layer))
    looped = cfg.loop_end - cfg.loop_start if cfg.is_looped else 0
    # grad_sync "last" with accumulation: on the synced micro-batch FSDP2 reduce-scatters a looped
    # layer's accumulated gradient once more, at its later pass in backward, beside its own
    # reductions (per pass under per-pass reduction, else at the first pass: 7 calls, not 5, on
    # proxy-tiny, the planner audit of 2026-12-08)
    accumulated = m_sync == 1 and m > 1
    n_rs = (cfg.n_layer_passes if per_pass else cfg.n_layers) + (looped if accumulated else 0)
    rs = round(m_sync * rb * (frac * (n_rs * Lp_ne + root) + frac_e * n_rs * share_layer))
    # in line (loop_grad.InFlight): the loop block's last pass per synced micro-batch, or every
    # looped pass where FSDP2 writes the same .grad (accumulated)
    n_inline = (looped * cfg.n_loops if accumulated else 1) if per_pass else 0
    rs_inline = round(m_sync * rb * (frac * n_inline * Lp_ne + frac_e * n_inline * share_layer))
    return ag, rs, rs_inline


def estimate_memory(cfg: ModelConfig, layout: Layout) -> MemoryEstimate:
    """Per-GPU memory at the peak of a training step and communication per step (see module doc)."""
    c = _dtype_bytes(layout.compute_dtype, "compute_dtype")
    pb = _dtype_bytes(layout.param_dtype, "param_dtype")
    gb = _dtype_bytes(layout.grad_dtype, "grad_dtype")
    ob = _dtype_bytes(layout.optim_dtype, "optim_dtype")
    rb = _dtype_bytes(layout.reduce_dtype, "reduce_dtype")
    S = layout.shards
    T = layout.seq_len or cfg.seq_len
    N = layout.micro_batch_size * T
    d = cfg.d_model

    shapes = param_shapes(cfg)
    P = layout.ep
    if P > cfg.n_experts:
        raise UserError(f"expert-parallel degree {P} exceeds the {cfg.n_experts} experts of {cfg.name}")
    share = -(-cfg.n_experts // P)  # the largest EP share of a layer's experts (array_split)

    def local_numel(name: str, shape: tuple[int, ...]) -> int:
        return sharded_numel(*_on_rank(name, shape, S, P, share))

    local = sum(local_numel(n, s) for n, s in shapes)
    n_total = total_params(cfg)
    params = pb * local
    grads = gb * local * (2 if layout.mode == "ddp" else 1)
    optimizer = 2 * ob * local + 4 * len(shapes)

    # activations stored per layer pass, per the module docstring
    resid = c if layout.sharded else pb  # FSDP2 mixed precision casts the residual stream too
    A = layer_activation_bytes(cfg, layout.micro_batch_size, T, c, resid)
    stored_pass = resid * N * d if layout.activation_checkpointing else A
    if layout.compiled and not layout.activation_checkpointing:  # recompute under AC: unmeasured
        stored_pass = round(stored_pass * COMPILED_LAYER_ACTIVATIONS)
    head_stored = head_activation_bytes(cfg, layout.micro_batch_size, T, c, layout.chunked_ce)
    head_work = head_working_bytes(cfg, layout.micro_batch_size, T, c, layout.chunked_ce)
    dp, fp = _expert_dims(cfg, c)
    expert_layer = cfg.n_experts * 3 * d * cfg.expert_hidden  # one layer's expert stacks
    Lp_ne = _layer_params(cfg) - expert_layer                 # its non-expert parameters
    share_layer = share * 3 * d * cfg.expert_hidden           # the experts one rank gathers
    Lp = Lp_ne + share_layer  # one layer's parameters on one rank (its unsharded gradient)
    Lp_ne_g, share_g, root_g = _gathered(shapes, S, P, share) if layout.sharded else (Lp_ne, share_layer, 0)
    Lp_g = Lp_ne_g + share_g  # ... as FSDP2 all-gathers and reduce-scatters them, padded
    # the MoE backward's first steps: the gradients of the gated and ungated expert outputs,
    # the residual stream's gradient, and (unsharded) w_down's weight-gradient temporary
    layer_work = N * (2 * cfg.top_k * c * dp + resid * d) + (
        0 if layout.sharded else gb * cfg.n_experts * fp * dp)
    held_bytes = Lp * (c if layout.sharded else gb)
    # per-pass reduction: each pass's gradient is reduce-scattered at its pass boundary, except on
    # micro-batches that do not sync (grad_sync "last" before the last one), which hand it to FSDP2
    per_pass = layout.sharded and layout.loop_grad == "per-pass" and cfg.is_looped
    if per_pass and (layout.grad_sync == "every" or layout.grad_accum_steps == 1):
        held_bytes = 0

    # FSDP buffers / autocast copies (constant over the backward)
    if layout.sharded:
        buffers = c * root_g + 2 * c * Lp_g + c * Lp + rb * Lp_g
        buffers += _accumulation_bytes(layout, shapes, S, P, share, rb, local)
    elif c < pb:  # autocast: non-expert weights cast once; expert weights per stored pass
        expert = cfg.n_experts * 3 * d * cfg.expert_hidden
        copies = 1 if layout.activation_checkpointing else cfg.n_layer_passes
        buffers = c * (n_total - cfg.n_layers * expert) + c * copies * expert
    else:
        buffers = 0

    layer_local = sum(sharded_numel(s, S) for n, s in shapes if n.startswith("layers.0."))
    progressive = layout.grad_accum_steps == 1
    g_now = _grads_at_backward_start(cfg, layout, gb, rb, local, grads, layer_local)

    # walk the backward: the head first, then the layer passes in reverse execution order
    schedule = cfg.schedule()
    remaining = len(schedule) * stored_pass + head_stored + rope_table_bytes(cfg, T, c)
    activations_stored = remaining
    best = (remaining + head_work + g_now, remaining, head_work, g_now, "head")
    remaining -= head_stored - 8 * N  # the head's tensors are freed; the embedding ids stay
    held = 0
    # the recompute stops at the layer's last saved tensor, the combine's gate product, whose
    # [N, k, d] output is alive at that moment beside the recomputed activations
    recompute = A + N * cfg.top_k * c * d if layout.activation_checkpointing else 0
    for layer, pass_ in reversed(schedule):
        live = remaining + recompute + layer_work + held + g_now
        if live > best[0]:
            best = (live, remaining + recompute, layer_work + held, g_now, f"layer {layer} pass {pass_}")
        remaining -= stored_pass
        looped = cfg.is_looped and cfg.loop_start <= layer < cfg.loop_end
        if looped:
            if pass_ == cfg.n_loops:
                held += held_bytes  # its weight gradient waits, summed, for the first pass
            elif pass_ == 1:
                held -= held_bytes
        if progressive and pass_ == (cfg.n_loops if per_pass and looped else 1):
            g_now += gb * layer_local  # the sharded gradient exists from the first reduce-scatter
    # the optimizer step: every gradient, and neither activations nor the backward's buffers (the
    # gathered layers, the accumulation that turned into the gradients): tiny models, and layouts
    # whose accumulation buffers stand in for the gradients through the backward
    if grads > best[0] + buffers:
        best, buffers = (grads, 0, 0, grads, "optimizer step"), 0
    _, acts, work, grads, peak_at = best

    # communication per optimizer step
    m = layout.grad_accum_steps
    m_sync = m if layout.grad_sync == "every" else 1
    ag, rs, rs_inline = (_sharded_volumes(cfg, S, P, m, m_sync, c, rb, Lp_ne_g, share_g, root_g, per_pass)
                         if layout.sharded and S > 1 else (0, 0, 0))
    # expert parallelism: N*k rows of d go out and come back per layer pass, forward and backward,
    # and once more in forward where activation checkpointing recomputes the layer; (P-1)/P of
    # them leave the rank under uniform routing
    trips = 6 if layout.activation_checkpointing else 4
    a2a = round(m * cfg.n_layer_passes * trips * N * cfg.top_k * d * c * (P - 1) / P) if P > 1 else 0
    # in line: the per-pass reduction's all-reduces of the looped shards where it finishes each at
    # once (grad_sync "last" with accumulation); elsewhere they hide like the reduce-scatters
    inline_ar = per_pass and m_sync == 1 and m > 1
    looped = tuple(f"layers.{i}." for i in range(cfg.loop_start, cfg.loop_end)) if inline_ar else ()
    looped_local = sum(local_numel(n, sh) for n, sh in shapes if n.startswith(looped))
    ar, ar_inline = _all_reduce_volumes(layout, gb * n_total, rb * local, rb * looped_local)

    return MemoryEstimate(
        config_name=cfg.name, layout=layout, params=params, grads=grads, optimizer=optimizer,
        activations=acts, working=work, buffers=buffers, activations_stored=activations_stored,
        peak_at=peak_at, all_gather=ag, reduce_scatter=rs, all_reduce=ar, all_to_all=a2a,
        reduce_scatter_inline=rs_inline, all_reduce_inline=ar_inline,
    )
