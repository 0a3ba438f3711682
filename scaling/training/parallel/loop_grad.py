"""Loop-aware gradient sharding: reduce-scatter a looped layer's gradient after *each* pass.

Why: FSDP2 reduce-scatters a module's gradients in its post-backward, from the unsharded
parameter's ``.grad``. A SMELT layer in the loop block runs twice per forward with the same
unsharded parameter (a leaf), and the autograd engine sums every contribution to a leaf before
its ``AccumulateGrad`` runs: the later pass's gradient (first in backward) waits, unsharded and
whole, in the engine until the earlier pass's backward. Across the loop block that is one
unsharded gradient per looped layer alive at once (the planner's "held looped gradients": 56 GB
per GPU at the 1.6B tier). No FSDP2 setting changes when the engine sums, and two FSDP modules
may not share parameters.

What this does (``loop_grad = "per-pass"``, the default for SMELT under fsdp/hsdp): for each
FSDP module inside a looped layer (the layer, and under expert parallelism its nested MoE /
router / shared-expert groups), three module hooks around FSDP2's own:

* before FSDP's pre-forward (``prepend=True``): note the sharded DTensor parameters;
* after FSDP's all-gather: replace each unsharded parameter in the module by
  ``_PassGrad.apply(unsharded)``, an identity (a view) with its own autograd node, so every pass
  has its own non-leaf "weight" and its own backward node;
* before FSDP's reshard (``prepend=True``): put the unsharded parameters back.

In backward, a pass's ``_PassGrad`` node (one per module and pass, over all its weights)
receives that pass's summed weight gradients once the layer pass's backward has produced them
(its sequence number sits just below the pass's own ops, so the engine runs it at the pass
boundary) and reduce-scatters them, in one flat collective as FSDP2 does, into the sharded
gradients itself, returning nothing to the unsharded leaves, so FSDP's post-backward finds no
gradient to reduce. FSDP still owns the all-gathers, resharding and prefetching.

The reduction mirrors FSDP2's ``foreach_reduce`` (torch/distributed/fsdp/_fully_shard/
_fsdp_collectives.py) with public collectives: cast to the policy's ``reduce_dtype``, pad dim 0
to a multiple of the shard degree S (``torch.chunk`` rows, as FSDP2 shards), one
``reduce_scatter_single`` (``reduce_scatter_tensor`` before torch 2.13) over the shard
dimension's group with ``AVG`` (fp32/bf16; fp16 sums and divides after, without FSDP2's
pre/post split), or with a divide factor (expert
parallelism's ``set_gradient_divide_factor``) ``SUM`` and a division; under HSDP the result is
summed over the micro-batches that do not all-reduce and all-reduced (``AVG``) over the replicate
group once, at the last pass of the micro-batch that does (FSDP2's ``partial_reduce_output``);
then cast to the parameter's dtype and added to the DTensor ``.grad``. A micro-batch that
does not reduce (``grad_sync="last"`` before the last one) hands the gradient to autograd
unchanged, i.e. FSDP2's own unsharded accumulation, reduced by FSDP on the last micro-batch.

Overlap (``InFlight``): each pass's reduce-scatter is issued with ``async_op=True`` (NCCL runs
it on its own stream while the engine goes on with the earlier pass's backward, as DDP's bucket
all-reduces do) and finished (waited for, post-processed) when the next one is issued, so one is
in flight at a time with its input kept alive, as FSDP2 keeps one of its own. Under HSDP the
post-processing of a module's last pass issues its cross-replica all-reduce, also with
``async_op=True`` (since 2026-12-08): it stays in flight beside the next reduce-scatter and is
finished (waited for, divided, added into ``.grad``) when that one is. The loop block's last
reduce-scatter in backward is finished at once (its all-reduce may stay in flight behind the
first layers' backward), and an autograd-engine callback finishes everything at the end of the
backward. Under ``grad_sync="last"`` with accumulation everything is finished at once on the
synced micro-batch (as before 2026-12-07): FSDP2 then also reduces the looped gradients it
accumulated and adds them into ``.grad`` on its own stream; on CUDA each add of ours first
waits for FSDP2's post-reduce events of the module (``PerPassReducer._after_fsdp_writes``). The
planner counts what is finished at once in line (``MemoryEstimate.reduce_scatter_inline`` and
``all_reduce_inline``) and lets the others hide like FSDP2's traffic.

Cost: reduce-scatters per step go from one per looped layer to one per looped layer pass (for
SMELT's loop of r = 2 passes over half the layers, 1.5x the layer reduce-scatter bytes), and
a looped layer's sharded gradient exists from the backward of its later pass on (the first
in backward) instead of its earlier one.

``torch.compile``: the hooks are ``torch._dynamo.disable``-d as FSDP2's are and run outside the
compiled block graphs (``Module.compile`` + ``fullgraph=True``, with activation checkpointing:
on CPU every pass gradient reaches its node and 2 ranks train like one process, the slow test
of tests/test_parallel.py); on CUDA ``benchmarks/gpu_check_scale.py`` checks it.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
from torch import nn

from scaling.accounting.memory import LOOP_GRADS  # the planner's Layout.loop_grad choices
from scaling.common.errors import UserError


def resolve_loop_grad(loop_grad: str | None, mode: str, looped: bool) -> str:
    """None -> "per-pass" for a looped model under fsdp/hsdp, else "fsdp" (nothing to do): the
    rule of ``scaling.accounting.memory.Layout.loop_grad``."""
    if loop_grad is None:
        return "per-pass" if looped and mode in ("fsdp", "hsdp") else "fsdp"
    if loop_grad not in LOOP_GRADS:
        raise UserError(f"loop_grad must be one of {', '.join(LOOP_GRADS)}, got {loop_grad!r}")
    return loop_grad


def _recomputing() -> bool:
    """Inside a backward (a non-reentrant checkpoint's recompute runs there)."""
    return torch._C._current_graph_task_id() != -1


class _PassGrad(torch.autograd.Function):
    """Identity on all of one FSDP module's weights in forward (one autograd node per pass); in
    backward, reduce this pass's gradients of them together (see the module docstring)."""

    @staticmethod
    def forward(ctx, hook: "PerPassReducer", *ws: torch.Tensor):
        ctx.hook = hook
        ctx.meta = [(w.shape, w.dtype, w.device) for w in ws]
        return tuple(w.view_as(w) for w in ws)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        hook = ctx.hook
        hook.pending -= 1
        if hook.observer is not None:
            for g in grads:
                if g is not None:
                    hook.observer(g)
        if not hook.sync:  # FSDP2's own unsharded accumulation (grad_sync="last")
            return (None, *grads)
        # a weight this pass did not use reduces zeros: every rank must send the same layout
        hook.reduce([g if g is not None else torch.zeros(shape, dtype=dtype, device=device)
                     for g, (shape, dtype, device) in zip(grads, ctx.meta)])
        return (None,) + (None,) * len(grads)


class PerPassReducer:
    """The hooks on one FSDP module of a looped layer (``install_per_pass`` makes them).

    ``sync`` (reduce on this micro-batch) and ``all_reduce`` (HSDP: all-reduce on this one) are
    set per micro-batch by ``data_parallel.gradient_sync``, as FSDP2's
    ``set_requires_gradient_sync`` / ``set_requires_all_reduce`` are. ``observer(grad)``, if
    set, sees every unsharded pass gradient as it arrives (tests measure their lifetime).
    """

    def __init__(self, module: nn.Module, mp_policy, divide_factor: float | None,
                 in_flight: "InFlight"):
        from torch.distributed.fsdp import FSDPModule

        self.module = module
        self.in_flight = in_flight   # the model's, shared by all its reducers
        self.reduce_dtype = getattr(mp_policy, "reduce_dtype", None)
        self.divide_factor = divide_factor
        self.sync = True
        self.all_reduce = True
        self.observer: Callable[[torch.Tensor], None] | None = None
        # the parameters this FSDP module manages: its submodules' own, not a nested FSDP group's
        self.entries: list[tuple[nn.Module, str]] = []
        self.sharded: list = []      # their sharded DTensors, noted before each all-gather
        self.pending = 0             # passes of this micro-batch whose backward has not run
        self.partial = None          # HSDP: reduce-scattered, not yet all-reduced (flat)
        self._saved: list[torch.Tensor] = []

        def walk(m: nn.Module) -> None:
            for name, p in m._parameters.items():
                if p is not None and p.requires_grad:
                    self.entries.append((m, name))
            for child in m.children():
                if not isinstance(child, FSDPModule):
                    walk(child)

        walk(module)
        disable = torch._dynamo.disable
        module.register_forward_pre_hook(disable(self._note_sharded), prepend=True)
        module.register_forward_pre_hook(disable(self._swap_in))
        module.register_forward_hook(disable(self._swap_out), prepend=True, always_call=True)

    # -- forward -----------------------------------------------------------------------------
    def _note_sharded(self, module, args) -> None:
        if _recomputing():
            return
        self.sharded = [m._parameters[name] for m, name in self.entries]

    def _swap_in(self, module, args) -> None:
        self._saved = []
        # an activation-checkpointing recompute (in backward) reruns the forward hooks of FSDP
        # modules nested inside the checkpointed one (expert parallelism's moe/router): it must not
        # add a pass nor note the unsharded parameters as sharded; its gradients flow through the
        # original forward's _PassGrad nodes
        if not torch.is_grad_enabled() or not self.entries or _recomputing():
            return
        self._saved = [m._parameters[name] for m, name in self.entries]
        self.pending += 1
        for (m, name), w in zip(self.entries, _PassGrad.apply(self, *self._saved)):
            m._parameters[name] = w

    def _swap_out(self, module, args, output) -> None:
        if self._saved:
            for (m, name), w in zip(self.entries, self._saved):
                m._parameters[name] = w
            self._saved = []

    # -- backward ----------------------------------------------------------------------------
    @torch.no_grad()
    def reduce(self, grads: list[torch.Tensor]) -> None:
        """Reduce-scatter one pass's unsharded gradients (one flat collective, FSDP2's layout:
        each rank's dim-0 chunk of every weight, padded, side by side), asynchronously; the
        model's ``InFlight`` finishes it (adds each rank's share to the sharded ``.grad``)."""
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor

        sharded = list(self.sharded)
        if not all(isinstance(p, DTensor) for p in sharded):
            raise RuntimeError("per-pass gradient reduction needs FSDP2's sharded DTensor parameters")
        mesh, placements = sharded[0].device_mesh, sharded[0].placements
        shard_dims = [i for i, pl in enumerate(placements) if pl.is_shard()]
        if len(shard_dims) != 1 or placements[shard_dims[0]].dim != 0:
            raise RuntimeError(f"per-pass reduction expects Shard(0) on one mesh dim, got {placements}")
        # the previous pass's reduce-scatter is finished first: one in flight, one flat buffer alive
        # (under HSDP its all-reduce starts and stays in flight beside the next reduce-scatter)
        self.in_flight.advance()
        S = mesh.size(shard_dims[0])
        rdtype = self.reduce_dtype or grads[0].dtype
        rows = [-(-g.shape[0] // S) for g in grads]
        chunks = []
        for g, r in zip(grads, rows):
            g = g.to(rdtype)
            if r * S != g.shape[0]:
                g = torch.cat([g, g.new_zeros(r * S - g.shape[0], *g.shape[1:])])
            chunks.append(g.reshape(S, -1))
        flat = torch.cat(chunks, dim=1) if len(chunks) > 1 else chunks[0].contiguous()
        del chunks, grads
        out = flat.new_empty(flat.shape[1])
        avg = self.divide_factor is None and rdtype in (torch.float32, torch.bfloat16)
        work = None
        if S > 1:
            # torch >= 2.13 names it reduce_scatter_single (the old name warns); 2.11 has the old one
            reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            work = reduce_scatter(out, flat.view(-1), op=dist.ReduceOp.AVG if avg else dist.ReduceOp.SUM,
                                  group=mesh.get_group(shard_dims[0]), async_op=True)
        else:
            out.copy_(flat.view(-1))
        # the HSDP all-reduce is due at the last pass of a micro-batch that all-reduces
        final = self.all_reduce and self.pending == 0
        self.in_flight.issue(work, flat, lambda: self._post(out, sharded, rows, S, avg, final))
        # finished at once, all-reduce included: every one on a micro-batch where FSDP2 also
        # reduces the looped layers' gradients it accumulated (grad_sync "last"): FSDP2 then writes
        # .grad on its own stream, and a deferred add would not be ordered after it
        if self.in_flight.inline:
            self.in_flight.finish()
        # the loop block's last reduce-scatter (nothing of the loop is left to hide it; its buffer
        # would stay alive through the first layers' backward); an HSDP all-reduce it starts stays
        # in flight behind that backward, finished by the engine callback
        elif sum(r.pending for r in self.in_flight.reducers) == 0:
            self.in_flight.advance()

    def _post(self, out: torch.Tensor, sharded: list, rows: list[int], S: int, avg: bool,
              final: bool) -> tuple | None:
        """After the reduce-scatter: HSDP's cross-replica all-reduce (or the partial sum over
        micro-batches that do not all-reduce), the division, and the add into ``.grad``. The
        all-reduce is issued asynchronously and returned as the second stage
        ``(work, keep, post)`` for ``InFlight``; None when nothing is left to do."""
        import torch.distributed as dist

        mesh, placements = sharded[0].device_mesh, sharded[0].placements
        rep_dims = [i for i, pl in enumerate(placements) if pl.is_replicate()]
        replicas = 1
        for i in rep_dims:
            replicas *= mesh.size(i)
        add = functools.partial(self._add, out, sharded, rows, S * replicas, avg)
        if not rep_dims:
            add()
            return None
        if self.partial is not None:
            out += self.partial
            self.partial = None
        if not final:
            self.partial = out
            return None
        op = dist.ReduceOp.AVG if avg else dist.ReduceOp.SUM
        for i in rep_dims[:-1]:   # HSDP's 2-D mesh has one replicate dimension; more run in turn
            dist.all_reduce(out, op=op, group=mesh.get_group(i))
        work = dist.all_reduce(out, op=op, group=mesh.get_group(rep_dims[-1]), async_op=True)
        return work, out, add

    def _add(self, out: torch.Tensor, sharded: list, rows: list[int], ranks: int, avg: bool) -> None:
        """Divide (a SUM reduction) and add each rank's rows of ``out`` into the sharded ``.grad``."""
        from torch.distributed.tensor import DTensor

        mesh, placements = sharded[0].device_mesh, sharded[0].placements
        if not avg:
            out.div_(self.divide_factor or ranks)
        if out.is_cuda:
            self._after_fsdp_writes()
        offset = 0
        for p, r in zip(sharded, rows):
            row = p.numel() // p.shape[0] if p.shape[0] else 0
            local = p.to_local()
            new = out[offset: offset + local.numel()].view(local.shape).to(p.dtype)
            offset += r * row
            if p.grad is None:
                p.grad = DTensor.from_local(new, mesh, placements, run_check=False,
                                            shape=p.shape, stride=p.stride())
            else:
                p.grad.to_local().add_(new)

    def _after_fsdp_writes(self) -> None:
        """Order the add into ``.grad`` after FSDP2's own writes to it. Under grad_sync "last" with
        accumulation FSDP2 reduce-scatters this module's accumulated gradient at its later pass
        in backward and adds it into the same ``.grad`` on its post-reduce stream, making the
        compute stream wait for that only at the end of the backward (``finalize_backward``);
        ``work.wait()`` orders our add after FSDP2's collectives but not after its ``+=``, so
        the two read-modify-writes would race (the review of 2026-12-08; a CUDA-only hazard, CPU
        runs one stream). The events are FSDP2's own (the same names in torch 2.11-2.15)."""
        from torch.distributed.fsdp import FSDPModule

        if not isinstance(self.module, FSDPModule):
            return
        group = self.module._get_fsdp_state()._fsdp_param_group
        if group is None:
            return
        stream = torch.cuda.current_stream()
        for event in (getattr(group, "_post_reduce_event", None),
                      getattr(getattr(group, "_all_reduce_state", None), "event", None)):
            if event is not None:
                stream.wait_event(event)


class InFlight:
    """A model's per-pass reductions in flight: one reduce-scatter, as FSDP2 keeps one of its own,
    and under HSDP one cross-replica all-reduce (its second stage).

    ``issue`` starts a reduce-scatter with ``async_op=True`` (NCCL runs it on its own stream while
    the engine goes on with the earlier pass's backward, as DDP's bucket all-reduces do), keeping
    its input alive. ``advance`` finishes what is in flight one stage on: the all-reduce is waited
    for (on CUDA the compute stream waits; the host does not) and added into ``.grad``; the
    reduce-scatter is waited for and post-processed, which under HSDP issues its all-reduce, now
    in flight on the replicate group's communicator beside the next reduce-scatter. The next
    ``issue`` advances first, the loop block's last reduction advances at once, and an engine
    callback at the end of the backward finishes everything (``finish``), so every gradient is
    in ``.grad`` when ``backward()`` returns. Each gradient gets the same adds in the same order
    as with in-line collectives, so the result is bitwise theirs.
    """

    def __init__(self) -> None:
        self.reducers: list[PerPassReducer] = []
        self._scatter: tuple | None = None   # (work, keep, post): post may return an all-reduce stage
        self._reduce: tuple | None = None    # (work, keep, post) of the HSDP all-reduce
        self._callback_queued = False
        self.inline = False           # finish each at once (set by set_loop_grad_sync)
        self._fsdp_accumulated = False  # a micro-batch of this step handed its gradients to FSDP2

    def issue(self, work, keep: torch.Tensor, post: Callable[[], tuple | None]) -> None:
        if self._scatter is not None:   # PerPassReducer.reduce advanced before building its buffer
            self.advance()
        self._scatter = (work, keep, post)
        if not self._callback_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._at_backward_end)
            self._callback_queued = True

    @staticmethod
    def _complete(stage: tuple) -> tuple | None:
        work, keep, post = stage
        if work is not None:
            work.wait()
        del keep
        return post()

    def advance(self) -> None:
        """Finish the all-reduce in flight, then the reduce-scatter (which may start the next one)."""
        if self._reduce is not None:
            stage, self._reduce = self._reduce, None
            self._complete(stage)
        if self._scatter is not None:
            stage, self._scatter = self._scatter, None
            self._reduce = self._complete(stage)

    def finish(self) -> None:
        """Finish everything in flight."""
        while self._scatter is not None or self._reduce is not None:
            self.advance()

    def _at_backward_end(self) -> None:
        self._callback_queued = False
        self.finish()

    def reset(self, sync: bool) -> None:
        """A new micro-batch (``sync``: it reduces): anything left from a backward that did not end
        is waited for (stream order) and dropped; inline when an earlier micro-batch of the step
        left its looped gradients to FSDP2."""
        for stage in (self._reduce, self._scatter):
            if stage is not None and stage[0] is not None:
                stage[0].wait()
        self._scatter = self._reduce = None
        self._callback_queued = False
        self.inline = sync and self._fsdp_accumulated
        self._fsdp_accumulated = not sync


def install_per_pass(model: nn.Module, mp_policy, divide_factors: dict | None = None) -> list[PerPassReducer]:
    """Per-pass reduction on every FSDP module inside the looped layers of a sharded model.

    Call after ``fully_shard`` (the hooks must wrap FSDP2's). ``divide_factors`` maps a module to
    its ``set_gradient_divide_factor`` (expert parallelism). Returns the reducers, also kept in
    ``model.loop_grad_reducers`` for ``gradient_sync``.
    """
    from torch.distributed.fsdp import FSDPModule

    cfg = model.cfg
    reducers = []
    in_flight = InFlight()
    if cfg.is_looped:
        for i in range(cfg.loop_start, cfg.loop_end):
            for m in model.layers[i].modules():
                if isinstance(m, FSDPModule):
                    reducers.append(PerPassReducer(m, mp_policy, (divide_factors or {}).get(m), in_flight))
    in_flight.reducers = reducers
    model.loop_grad_reducers = reducers
    return reducers


def set_loop_grad_sync(model: nn.Module, sync: bool, all_reduce: bool) -> None:
    """Whether this micro-batch reduces its looped gradients (and, HSDP, all-reduces them).
    Called before the micro-batch's forward: the pass count starts afresh (a forward with a
    graph but no backward, e.g. after an error, would otherwise leave it off by its passes)."""
    reducers = getattr(model, "loop_grad_reducers", ())
    for r in reducers:
        r.sync, r.all_reduce, r.pending = sync, all_reduce, 0
    for in_flight in {id(r.in_flight): r.in_flight for r in reducers}.values():
        in_flight.reset(sync)
