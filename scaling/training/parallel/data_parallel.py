"""Data parallelism for the MoE Transformer with PyTorch's own parts: DDP, FSDP2, HSDP.

One way to build a model for training on ``DistEnv`` (see :mod:`scaling.training.parallel.distributed`)::

    dist = setup_distributed(device, mode)                  # process group + DeviceMesh
    model = build_model(cfg, seed, dist, mode, activation_checkpointing=..., compile=...)
    ... train_step(model, opt, params, x, y, ...) ...       # accumulation, sync, clipping

Modes:

* ``none``: one process, the plain module.
* ``ddp``: ``DistributedDataParallel``, every rank holds everything (~16 bytes/parameter with
  fp32 weights, gradients and AdamW states); fine for small models.
* ``fsdp``: FSDP2 (``torch.distributed.fsdp.fully_shard``) on the 1-D mesh ``("dp_shard",)``:
  one shard group per *physical* layer, then the root (embedding, final norm, LM head) last.
* ``hsdp``: the same on the 2-D mesh ``("dp_replicate", "dp_shard")``: parameters sharded within
  a node and replicated across nodes (reduce-scatter in the node, all-reduce across nodes).

**The looped layers.** A SMELT layer in the loop block is one module that runs twice per
forward (prelude, pass 1 of the block, pass 2 of the block, coda). It is wrapped once and keeps
FSDP2's ``reshard_after_forward=True``: it is all-gathered before each of its passes and freed
after, in forward and again in backward. Keeping the block unsharded between its two passes
would hold the whole loop block (half the layers) unsharded: at the 1.6B tier that is ~27B
parameters, 54 GB in bf16 per GPU, which does not fit next to the rest. Resharding costs one
extra all-gather per looped layer and pass: per step (L + L_loop) all-gathers in forward and
again in backward instead of 2 L, i.e. 1.5x a Baseline's traffic for SMELT's 1.5x layer passes,
so the communication per FLOP stays that of the Baseline. The root keeps FSDP2's default
(no reshard after forward: its parameters are needed first in backward). Their *gradients* are
reduce-scattered after each pass by default (``loop_grad="per-pass"``,
:mod:`scaling.training.parallel.loop_grad`): FSDP2 alone would hold each looped layer's later-pass
gradient unsharded until its first pass's backward; ``loop_grad="fsdp"`` leaves it to FSDP2.

**Mixed precision.** On CUDA ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``: the
sharded fp32 parameters are the master weights (AdamW updates them in fp32), the all-gathered
copies used for compute are bf16, gradients are reduced in fp32. On the CPU everything is fp32.

**Activation checkpointing** wraps each physical layer in ``checkpoint_wrapper`` (non-reentrant).
The wrapper checkpoints each *call*, so a looped layer stores its input once per pass and
recomputes each pass in backward: per layer pass, as the memory planner counts.
**torch.compile** compiles each block in place (``Module.compile(fullgraph=True)``, as
torchtitan does per block) before sharding, so the FSDP2 hooks stay outside the graphs. The MoE
layer has static shapes and no host sync (scaling/training/model/transformer.py), so each block is one
graph. The trainer compiles by default on CUDA (``resolve_compile``) and not on the CPU, where
compiling measured no faster than eager and costs minutes of inductor time per run.

**Meta-device build.** For fsdp/hsdp the model is built under ``torch.device("meta")`` (no
storage), sharded, then ``to_empty`` allocates only each rank's shards and ``materialize`` fills
them: ``MoETransformer.init_weights`` draws each parameter's *full* fp32 value from its seeded
CPU generator in the eager order, and the writer keeps this rank's ``torch.chunk`` slice of it
(FSDP2's ``Shard(0)`` layout; HSDP's ``(Replicate, Shard(0))`` alike). Every rank draws the same
sequence, so the shards are bitwise the eager values with no communication; the peak extra
memory is one full parameter in host RAM (at the 1.6B tier the largest is an expert stack
``w_gate_up`` [336, 2304, 1536] = 1.19e9 floats, 4.8 GB), never the model. The cost is that
each rank draws every parameter's random numbers (the CPU generator cannot skip ahead).

**Gradient accumulation.** ``grad_sync="last"`` reduces gradients once, on the last micro-batch
(DDP ``no_sync``; FSDP2 ``set_requires_gradient_sync(False)`` before the others): the least
traffic, but FSDP2 then keeps *unsharded* fp32 gradients of the whole model between
micro-batches (216 GB at the 1.6B tier), which defeats sharding. ``grad_sync="every"``
reduce-scatters after every micro-batch instead (gradients stay sharded; HSDP still all-reduces
across replicas only on the last one). The default (``resolve_grad_sync``) is the memory
planner's: "every" under fsdp/hsdp, "last" under ddp.
**Gradient clipping** takes the global norm of the (sharded, DTensor) gradients:
``get_total_norm`` gives a partial DTensor, ``full_tensor()`` reduces it across ranks, and
``clip_grads_with_norm_`` scales the shards, as ``clip_grad_norm_`` does in one process.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
from torch import nn

from scaling.accounting.config import ModelConfig
from scaling.accounting.memory import GRAD_SYNCS, MODES, resolve_mode
from scaling.common.errors import UserError
from scaling.training.parallel.distributed import DistEnv

# how build_model fills the weights: the eager init bitwise, or its distributions drawn on the device
INITS = ("exact", "device")


def resolve_grad_sync(grad_sync: str | None, mode: str) -> str:
    """None -> "every" under fsdp/hsdp (gradients stay sharded), "last" otherwise: the rule of
    ``scaling.accounting.memory.Layout``, so that the planner counts what the trainer does."""
    if grad_sync is None:
        return "every" if mode in ("fsdp", "hsdp") else "last"
    if grad_sync not in GRAD_SYNCS:
        raise UserError(f"grad_sync must be one of {', '.join(GRAD_SYNCS)}, got {grad_sync!r}")
    return grad_sync


def resolve_compile(compile: bool | None, device_type: str) -> bool:
    """None -> compile the blocks on CUDA, not on the CPU (see the module docstring)."""
    return device_type == "cuda" if compile is None else bool(compile)


def split_batch(batch_size: int, world: int, micro_batch_size: int | None = None) -> tuple[int, int, int]:
    """(rows per rank, micro-batch rows, micro-batches per step) of a global batch of sequences."""
    if batch_size % world:
        raise UserError(f"batch size {batch_size} is not divisible by the {world} ranks")
    per_rank = batch_size // world
    micro = micro_batch_size or per_rank
    if per_rank % micro:
        raise UserError(f"micro batch {micro} does not divide the per-rank batch {per_rank}")
    return per_rank, micro, per_rank // micro


def unwrap(model: nn.Module) -> nn.Module:
    """The MoETransformer inside a DDP wrapper (FSDP2 and compile-in-place keep the module)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def _is_fsdp(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def parallelize(
    model: nn.Module,
    mode: str,
    mesh=None,
    *,
    mixed_precision: bool | None = None,
    activation_checkpointing: bool = False,
    compile: bool = False,
    ep_meshes=None,
    loop_grad: str | None = None,
) -> nn.Module:
    """Apply activation checkpointing, torch.compile and the data-parallel wrapping of ``mode``.

    ``model`` is a ``MoETransformer`` (on the meta device for fsdp/hsdp, on its device for
    ddp/none). ``mesh`` is the DeviceMesh of fsdp/hsdp. ``mixed_precision`` (fsdp/hsdp): bf16
    compute with fp32 reduce and master weights; None = on CUDA only. Returns the module to
    train (DDP's wrapper for ddp; the same module, changed in place, otherwise).
    ``loop_grad`` (fsdp/hsdp, looped models): "per-pass" or "fsdp" (``resolve_loop_grad``).
    """
    if mode not in MODES:
        raise UserError(f"parallel mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode in ("fsdp", "hsdp") and mesh is None:
        raise UserError(f"parallel mode {mode} needs a device mesh (a process group of >1 rank)")
    if mode == "hsdp" and mesh.ndim != 2:
        raise UserError(f"HSDP needs a 2-D (replicate, shard) mesh, got {mesh.ndim}-D")
    layers = model.layers
    for i in range(len(layers)):
        block = layers[i]
        if activation_checkpointing:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
                CheckpointImpl,
                checkpoint_wrapper,
            )

            # the forward looks layers up in the container at call time, so replacing works
            block = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
            layers[i] = block
        if compile:
            block.compile(fullgraph=True)
    if mode in ("fsdp", "hsdp"):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        if mixed_precision is None:
            mixed_precision = mesh.device_type == "cuda"
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if mixed_precision else MixedPrecisionPolicy())
        from scaling.training.parallel.loop_grad import install_per_pass, resolve_loop_grad

        per_pass = resolve_loop_grad(loop_grad, mode, model.cfg.is_looped) == "per-pass"
        if ep_meshes is not None:
            from scaling.training.parallel.expert_parallel import shard_with_ep

            shard_with_ep(model, ep_meshes, mp)
            if per_pass:  # the expert groups divide by the world size (shard_with_ep)
                install_per_pass(model, mp, {getattr(b, "_checkpoint_wrapped_module", b).moe:
                                             float(ep_meshes.world) for b in layers})
            return model
        for block in layers:  # one group per physical layer; looped ones reshard between passes
            fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
        fully_shard(model, mesh=mesh, mp_policy=mp)  # root last: embedding, norm, LM head
        if per_pass:
            install_per_pass(model, mp)
        return model
    if mode == "ddp":
        import inspect

        device = next(model.parameters()).device
        # the only buffers are the RoPE tables, equal on every rank: never sync them per forward
        # (torch 2.13 renamed broadcast_buffers to forward_sync_buffers)
        ddp = nn.parallel.DistributedDataParallel
        renamed = "forward_sync_buffers" in inspect.signature(ddp).parameters
        no_sync = {"forward_sync_buffers": False} if renamed else {"broadcast_buffers": False}
        return ddp(model, device_ids=[device.index] if device.type == "cuda" else None, **no_sync)
    return model


def _write_local_shard(p: torch.Tensor, value: torch.Tensor) -> None:
    """Store this rank's part of a parameter's full value: all of it, or its DTensor shard.

    A ``Shard(d)`` placement on mesh dimension i holds ``value.chunk(size_i, d)[coord_i]`` (the
    ``torch.chunk`` split DTensor and FSDP2 use; ranks past the last chunk hold an empty one).
    """
    from torch.distributed.tensor import DTensor

    if not isinstance(p, DTensor):
        p.copy_(value.to(p))
        return
    mesh, coord = p.device_mesh, p.device_mesh.get_coordinate()
    for i, placement in enumerate(p.placements):
        if placement.is_shard():
            chunks = value.chunk(mesh.size(i), dim=placement.dim)
            value = chunks[coord[i]] if coord[i] < len(chunks) else value.narrow(placement.dim, 0, 0)
    local = p.to_local()
    if local.shape != value.shape:
        raise RuntimeError(f"shard of shape {tuple(value.shape)} does not fit local {tuple(local.shape)}")
    local.copy_(value)


@torch.no_grad()
def materialize(model: nn.Module, device: torch.device, seed: int, init: str = "exact") -> None:
    """Allocate a meta-built (possibly sharded) model on ``device`` and give it the eager init
    (``init="exact"``: drawn on the CPU), or the same distributions drawn on ``device``
    (``"device"``: fast on a GPU, other bits; for benchmarks: ``MoETransformer.init_weights``)."""
    if init not in INITS:
        raise UserError(f"init must be one of {', '.join(INITS)}, got {init!r}")
    model.to_empty(device=device)
    raw = unwrap(model)
    raw.init_weights(seed, write=_write_local_shard, device=device if init == "device" else "cpu")
    raw.init_buffers()


def build_model(
    cfg: ModelConfig,
    seed: int,
    dist: DistEnv,
    mode: str,
    *,
    mixed_precision: bool | None = None,
    activation_checkpointing: bool = False,
    compile: bool = False,
    loop_grad: str | None = None,
    init: str = "exact",
) -> nn.Module:
    """The model to train on ``dist`` in ``mode``, initialised exactly as ``MoETransformer(cfg, seed)``
    (``init="device"``: the same distributions drawn on the device, for benchmarks; ``materialize``).

    fsdp/hsdp build on the meta device and materialise shard by shard (no rank ever holds the
    whole model); none/ddp build on the device. One rank runs unwrapped.
    """
    from scaling.training.model.transformer import MoETransformer

    if init not in INITS:
        raise UserError(f"init must be one of {', '.join(INITS)}, got {init!r}")
    if dist.mesh is None:  # with a mesh (even of one rank) fsdp/hsdp are taken as asked
        mode = resolve_mode(mode, dist.world)
    if dist.ep is not None and mode not in ("fsdp", "hsdp"):
        raise UserError(f"expert parallelism needs parallel mode fsdp or hsdp, got {mode!r}")
    if mode in ("fsdp", "hsdp"):
        with torch.device("meta"):
            model = MoETransformer(cfg, seed=seed)
        if dist.ep is not None:
            from scaling.training.parallel.expert_parallel import localize_experts

            localize_experts(model, dist.ep)
        model = parallelize(model, mode, dist.mesh, mixed_precision=mixed_precision,
                            activation_checkpointing=activation_checkpointing, compile=compile,
                            ep_meshes=dist.ep, loop_grad=loop_grad)
        materialize(model, dist.device, seed, init)
        if dist.ep is not None:
            from scaling.training.parallel.expert_parallel import tag_expert_params

            tag_expert_params(model)
        return model
    if init == "device":
        with torch.device("meta"):
            model = MoETransformer(cfg, seed=seed)
        materialize(model, dist.device, seed, init)
    else:
        model = MoETransformer(cfg, seed=seed).to(dist.device)
    return parallelize(model, mode, None, activation_checkpointing=activation_checkpointing, compile=compile)


@contextlib.contextmanager
def gradient_sync(model: nn.Module, is_last: bool, grad_sync: str = "last"):
    """Around one micro-batch's forward and backward: reduce gradients only where due.

    ``grad_sync="last"``: only the last micro-batch reduces (DDP ``no_sync``, FSDP2
    ``set_requires_gradient_sync``). ``"every"`` (FSDP2/HSDP): reduce-scatter every micro-batch
    so that gradients stay sharded; HSDP's cross-replica all-reduce still waits for the last.
    The per-pass reducers of looped layers (``loop_grad``) follow the same two switches.
    """
    if grad_sync not in GRAD_SYNCS:
        raise UserError(f"grad_sync must be one of {', '.join(GRAD_SYNCS)}, got {grad_sync!r}")
    if isinstance(model, nn.parallel.DistributedDataParallel):
        with contextlib.nullcontext() if is_last or grad_sync == "every" else model.no_sync():
            yield
        return
    if _is_fsdp(model):
        from scaling.training.parallel.loop_grad import set_loop_grad_sync

        if grad_sync == "last":
            model.set_requires_gradient_sync(is_last)
        else:
            model.set_requires_gradient_sync(True)
            model.set_requires_all_reduce(is_last)
        set_loop_grad_sync(model, is_last or grad_sync == "every", is_last)
    yield


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Global L2 norm of the gradients (all ranks' shards), clipped to ``max_norm`` when > 0.

    Returns the norm as a 0-d tensor on the device: reading it (``float``) waits for the device,
    so the caller does that when it logs, not inside the step.
    """
    from torch.distributed.tensor import DTensor

    with_grad = [p for p in params if p.grad is not None]
    if any(hasattr(p, "ep_group") for p in with_grad):
        return _clip_grad_norm_ep(with_grad, max_norm)
    grads = [p.grad for p in with_grad]
    norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


def _clip_grad_norm_ep(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """The global norm with expert parallelism: DTensor gradients live on two meshes (``dp`` and
    the experts' ``expert_dp``), so the squared norm is summed per mesh; an expert share's norm
    covers only this EP rank's experts and is summed over the EP group (``p.ep_group``, set by
    ``expert_parallel.tag_expert_params``). A 0-d device tensor, as ``clip_grad_norm``."""
    from torch.distributed.tensor import DTensor

    groups: dict[tuple, list[torch.Tensor]] = {}
    for p in params:
        mesh = p.device_mesh if isinstance(p, DTensor) else None
        groups.setdefault((id(mesh), id(getattr(p, "ep_group", None))), []).append(p)
    total = None
    for members in groups.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in members], norm_type=2.0)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        sq = norm.double().square()
        group = getattr(members[0], "ep_group", None)
        if group is not None:
            torch.distributed.all_reduce(sq, group=group)
        total = sq if total is None else total + sq
    norm = total.sqrt().float()
    if max_norm > 0:
        for members in groups.values():
            torch.nn.utils.clip_grads_with_norm_(members, max_norm, norm)
    return norm


def train_step(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    params: list[torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    n_micro: int,
    grad_clip: float,
    aux_coef: float,
    z_coef: float,
    grad_sync: str = "last",
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer update on this rank's rows ``x, y`` [rows, T] split into ``n_micro`` micro-batches.

    Objective per micro-batch: ``CE + aux_coef * load_balance + z_coef * router_z``, divided by
    ``n_micro`` so that the accumulated gradient is the mean (ranks are averaged by the
    all-reduce / reduce-scatter). Returns this rank's mean [CE, aux, z] (float64, not yet
    averaged over ranks) and the global gradient norm before clipping, both device tensors: the
    step itself never waits for the device (no host sync; benchmarks/gpu_check.py checks it
    with CUDA's sync debug mode).
    """
    micro = x.shape[0] // n_micro
    sums = torch.zeros(3, dtype=torch.float64, device=x.device)
    for m in range(n_micro):
        sl = slice(m * micro, (m + 1) * micro)
        with gradient_sync(model, m == n_micro - 1, grad_sync):
            with autocast():
                out = model(x[sl], y[sl])
            objective = out.loss + aux_coef * out.aux_loss + z_coef * out.z_loss
            (objective / n_micro).backward()
        sums += torch.stack([out.loss.detach(), out.aux_loss.detach(), out.z_loss.detach()]).double()
    gnorm = clip_grad_norm(params, grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return sums / n_micro, gnorm


def reshard(model: nn.Module) -> None:
    """Free FSDP2's unsharded parameters and register the sharded ones again (else a no-op).

    After a forward without backward (evaluation) the root module keeps its parameters unsharded
    (its ``reshard_after_forward`` is False); until it reshards, ``model.parameters()`` yields
    those unsharded copies, whose ``.grad`` stays None: a gradient norm or a state dict taken
    then would miss the embedding and LM head. Call it after every evaluation.
    """
    if _is_fsdp(model):
        from torch.distributed.fsdp import FSDPModule

        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.reshard()


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict on CPU in rank 0 (empty elsewhere), plain parameter names.

    Gathers shard by shard (``torch.distributed.checkpoint.state_dict``): for export to one
    safetensors file and for tests; a checkpoint of a sharded model should use DCP instead.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not torch.distributed.is_initialized():
        return {k: v.detach().cpu().clone() for k, v in unwrap(model).state_dict().items()}
    if getattr(unwrap(model), "ep_slices", None):  # expert parallelism: shares over the EP group
        from scaling.training.parallel.expert_parallel import full_state_dict as ep_full_state_dict

        return ep_full_state_dict(unwrap(model))
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if next(model.parameters()).device.type == "cpu":
        # a snapshot: on the CPU a gathered tensor can alias the parameter (a 1-rank shard group)
        sd = {k: v.clone() for k, v in sd.items()}
    return sd
