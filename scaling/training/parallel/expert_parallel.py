"""Expert parallelism (EP) for the MoE layer on torch primitives: experts split over an ``ep``
mesh dimension, tokens sent to their experts and back with ``all_to_all_single``.

Layout (see docs/expert-parallel.md for the decision and its alternatives). The DeviceMesh of
``fsdp`` with EP degree P over W ranks is 2-D ``("dp_shard", "ep")`` = (W / P, P); of ``hsdp``
3-D ``("dp_replicate", "dp_shard", "ep")``. ``ep`` is the innermost dimension, so an EP group
is P consecutive ranks (inside a node when P <= GPUs per node: the all-to-all rides NVLink).

* Every rank trains on its own rows (data parallel over all W ranks, as without EP).
* Non-expert parameters (attention, norms, router, shared expert, embedding, head): FSDP2 over
  all W ranks (``dp_shard`` and ``ep`` flattened; HSDP: replicate x that).
* Expert parameters: EP rank j holds experts [start_j, start_{j+1}) of every MoE layer -- an
  ``array_split`` of E over P, so E need not divide by P (483 over 8: 3 x 61 + 5 x 60) -- and
  FSDP2 shards that share over the remaining ``dp_shard`` dimension (HSDP: replicate x shard).
  Gradients: the all-to-all's backward returns to expert e the gradients of every token routed
  to it from the P ranks of its EP group, each rank's loss being its own mean; FSDP then sums
  over the W / P ranks holding the same experts. The data-parallel mean over all W ranks is
  therefore the sum divided by W, not by W / P: ``set_gradient_divide_factor(W)``.
* Router statistics (load-balance f_e, P_e, z-loss) are computed before dispatch on the rank's
  own tokens over all E experts, exactly as without EP.

Dispatch, per MoE call (``dispatch``), between the layer's sort-by-expert and its combine (the
layer's ``MoE.expert_fn`` hook):

1. counts [E] (this rank's assignments per global expert) -> tokens per destination rank;
2. ``all_to_all_single`` of the counts (no gradient): recv [P, E_local], tokens from source
   s for local expert e;
3. ``all_to_all_single_autograd`` of the expert-sorted rows (uneven splits): the received rows
   are source-major (s, then e inside s);
4. permute them expert-major with one ``index_select`` and run the layer's own grouped expert
   matmul on the local experts (counts = recv.sum(0));
5. invert the permutation and send the rows back (splits swapped); they arrive in the order the
   layer sent them, so the layer's gated combine is unchanged.

Communication per MoE call and rank: the N*k*d dispatched rows in the compute dtype go out and
come back, forward and again in backward (the all-to-all's backward is an all-to-all): 4 x the
share (P-1)/P that leaves the rank under uniform routing -- ``scaling.accounting.memory``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from scaling.common.errors import UserError


def expert_split(n_experts: int, ep: int) -> list[int]:
    """Experts per EP rank: ``array_split`` sizes (the first E mod P ranks hold one more)."""
    if ep < 1:
        raise UserError(f"expert-parallel degree must be >= 1, got {ep}")
    if ep > n_experts:
        raise UserError(f"expert-parallel degree {ep} exceeds the {n_experts} experts")
    base, extra = divmod(n_experts, ep)
    return [base + (1 if j < extra else 0) for j in range(ep)]


@dataclass
class EPGroup:
    """One rank's place in its EP group: the process group, its size and rank, expert ranges."""

    group: object  # torch.distributed.ProcessGroup
    size: int
    rank: int
    sizes: list[int]  # experts per EP rank

    @property
    def starts(self) -> list[int]:
        out = [0]
        for s in self.sizes:
            out.append(out[-1] + s)
        return out

    @property
    def local(self) -> tuple[int, int]:
        st = self.starts
        return st[self.rank], st[self.rank + 1]


def dispatch(ep: EPGroup, xs: Tensor, counts: Tensor, run_local) -> Tensor:
    """Expert outputs for rows ``xs`` [S, d] sorted by global expert with ``counts`` [E].

    ``run_local(rows, local_offsets, local_counts)`` runs this rank's experts on expert-sorted
    rows (``MoE.experts``). Returns [S, d] in the order of ``xs`` (see the module docstring).
    The split sizes of ``all_to_all_single`` are host integers: the counts come to the host
    once per call, the one host sync of EP (the layer itself is sync-free).
    """
    from torch.distributed._functional_collectives import all_to_all_single_autograd

    P, starts = ep.size, ep.starts
    n_local = ep.sizes[ep.rank]
    counts = counts.to(torch.int64)
    # 2. each destination j gets this rank's counts for j's experts (uneven lengths)
    recv = counts.new_empty(P * n_local)
    torch.distributed.all_to_all_single(recv, counts, output_split_sizes=[n_local] * P,
                                        input_split_sizes=ep.sizes, group=ep.group)
    recv = recv.view(P, n_local)  # [source, local expert]
    c_cpu, r_cpu = counts.cpu(), recv.cpu()  # split sizes are host integers
    send_split = [int(c_cpu[starts[j]:starts[j + 1]].sum()) for j in range(P)]
    recv_split = r_cpu.sum(1).tolist()
    # 3. rows out (source-major on arrival)
    got = all_to_all_single_autograd(xs, recv_split, send_split, ep.group)
    # 4. source-major -> expert-major: row blocks (s, e) reordered to (e, s)
    block_start = torch.cat([r_cpu.new_zeros(1), r_cpu.reshape(-1).cumsum(0)[:-1]]).view(P, n_local)
    order = [torch.arange(int(block_start[s, e]), int(block_start[s, e] + r_cpu[s, e]))
             for e in range(n_local) for s in range(P)]
    perm = (torch.cat(order) if order else torch.zeros(0, dtype=torch.int64)).to(xs.device)
    local_counts = recv.sum(0)
    local_out = run_local(got.index_select(0, perm), local_counts.cumsum(0).to(torch.int32), local_counts)
    # 5. back to source-major, then home
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=perm.device)
    back = local_out.index_select(0, inv)
    return all_to_all_single_autograd(back, send_split, recv_split, ep.group)


def _route_forward(router, top_k: int, x: Tensor):
    from scaling.training.model.transformer import route

    return route(x, router.weight, top_k)


def _ep_experts(moe, xs: Tensor, offsets: Tensor, counts: Tensor) -> Tensor:
    """``MoE.expert_fn`` under EP (the layer's hook between its dispatch and its combine)."""
    return dispatch(moe.ep, xs, counts, moe.experts)


# ----- meshes and sharding ------------------------------------------------------------------

@dataclass
class EPMeshes:
    """The meshes of a run with EP: ``dp`` for non-expert parameters (1-D fsdp / 2-D hsdp, as
    without EP), ``expert_dp`` for the expert shares (fsdp: ``dp_shard``; hsdp: replicate x
    ``dp_shard``), ``ep`` (1-D) for the all-to-all, ``world`` for the gradient divide factor."""

    dp: object
    expert_dp: object
    ep: object
    world: int


def build_ep_meshes(mode: str, world: int, ep: int, device_type: str, replicate: int = 1) -> EPMeshes:
    """fsdp: mesh (W/P, P) ("dp_shard", "ep"); hsdp: (R, W/(R P), P) with "dp_replicate" first."""
    from torch.distributed.device_mesh import init_device_mesh

    if mode not in ("fsdp", "hsdp"):
        raise UserError(f"expert parallelism needs parallel mode fsdp or hsdp, got {mode!r}")
    if ep < 1 or world % ep:
        raise UserError(f"expert-parallel degree {ep} does not divide the world size {world}")
    if mode == "fsdp":
        mesh = init_device_mesh(device_type, (world // ep, ep), mesh_dim_names=("dp_shard", "ep"))
        dp = mesh["dp_shard", "ep"]._flatten("dp")
        return EPMeshes(dp, mesh["dp_shard"], mesh["ep"], world)
    if replicate < 1 or world % (replicate * ep):
        raise UserError(f"HSDP replicate {replicate} x expert-parallel {ep} does not divide the "
                        f"world size {world}")
    mesh = init_device_mesh(device_type, (replicate, world // (replicate * ep), ep),
                            mesh_dim_names=("dp_replicate", "dp_shard", "ep"))
    mesh["dp_shard", "ep"]._flatten("dp_shard_ep")
    dp = mesh["dp_replicate", "dp_shard_ep"]
    return EPMeshes(dp, mesh["dp_replicate", "dp_shard"], mesh["ep"], world)


def localize_experts(model, meshes: EPMeshes) -> None:
    """On a meta-device model: give every MoE layer only this rank's experts and its EPGroup.

    The expert stacks become [E_local, ...] meta parameters; ``model.ep_slices`` records, by
    parameter name, the full shape and the dim-0 range, so that ``init_weights`` draws each full
    value (the same random stream as one process) and keeps this rank's rows.
    """
    from torch import nn

    ep_mesh = meshes.ep
    P, rank = ep_mesh.size(), ep_mesh.get_local_rank()
    group = ep_mesh.get_group()
    for i, block in enumerate(model.layers):
        moe = block.moe
        sizes = expert_split(moe.n_experts, P)
        moe.ep = EPGroup(group, P, rank, sizes)
        moe.expert_fn = functools.partial(_ep_experts, moe)
        # the layer reads router.weight directly; under EP the router is its own FSDP group, whose
        # hooks (all-gather, gradient reduce-scatter) run only when the module is called: route
        # through a call of the router module, computing the layer's own route()
        moe.router.forward = functools.partial(_route_forward, moe.router, moe.top_k)
        moe.route = moe.router.__call__  # a bound method, not a submodule
        lo, hi = moe.ep.local
        for name in ("w_gate_up", "w_down"):
            full = getattr(moe, name)
            model.ep_slices[f"layers.{i}.moe.{name}"] = (tuple(full.shape), lo, hi)
            setattr(moe, name, nn.Parameter(torch.empty((hi - lo, *full.shape[1:]), device=full.device,
                                                        dtype=full.dtype)))


def shard_with_ep(model, meshes: EPMeshes, mp_policy) -> None:
    """FSDP2 with EP: per layer, the router and shared expert over ``dp`` (own groups, so that the
    MoE module's group holds only the expert shares, over ``expert_dp`` with the divide factor
    W), then the rest of the block over ``dp``; the root last."""
    from torch.distributed.fsdp import fully_shard

    for block in model.layers:
        inner = getattr(block, "_checkpoint_wrapped_module", block)
        moe = inner.moe
        for sub in (moe.router, moe.shared_gate_up, moe.shared_down):
            if sub is not None:
                fully_shard(sub, mesh=meshes.dp, mp_policy=mp_policy, reshard_after_forward=True)
        fully_shard(moe, mesh=meshes.expert_dp, mp_policy=mp_policy, reshard_after_forward=True)
        moe.set_gradient_divide_factor(float(meshes.world))
        shard = meshes.expert_dp.size(meshes.expert_dp.ndim - 1)   # FSDP2 shards over the last dim
        if meshes.expert_dp.device_type != "cuda" and shard > 1:   # gloo off CUDA (DistEnv.backend)
            # a divide factor other than the group size makes FSDP2 reduce-scatter with PREMUL_SUM,
            # which only NCCL has (gloo: "Cannot use ReduceOp.PREMUL_SUM"); a plain sum and a
            # division after it give the same mean. Not for a one-rank shard group: there FSDP2
            # skips the collective and divides by the factor itself, and forcing sums would
            # divide a second time (torch 2.13 _fsdp_collectives.foreach_reduce)
            moe.set_force_sum_reduction_for_comms(True)
        fully_shard(block, mesh=meshes.dp, mp_policy=mp_policy, reshard_after_forward=True)
    fully_shard(model, mesh=meshes.dp, mp_policy=mp_policy)


def tag_expert_params(model) -> None:
    """Mark the expert shares (``p.ep_group``) for the gradient norm, which sums their squared norm
    over the EP group. Called after ``materialize``: ``to_empty`` makes new parameter objects."""
    for block in model.layers:
        moe = getattr(block, "_checkpoint_wrapped_module", block).moe
        if moe.ep is not None:
            for p in (moe.w_gate_up, moe.w_down):
                p.ep_group = moe.ep.group


def _clean(name: str) -> str:
    return name.replace("_checkpoint_wrapped_module.", "")


def gather_expert_share(share: torch.Tensor, ep: EPGroup) -> torch.Tensor:
    """The full [E, ...] stack from each EP rank's [E_j, ...] share (uneven: padded to the
    largest share for ``all_gather``, then trimmed)."""
    most = max(ep.sizes)
    padded = share.new_zeros((most, *share.shape[1:]))
    padded[: share.shape[0]] = share
    parts = [torch.empty_like(padded) for _ in range(ep.size)]
    torch.distributed.all_gather(parts, padded.contiguous(), group=ep.group)
    return torch.cat([part[:n] for part, n in zip(parts, ep.sizes)])


def full_state_dict(model) -> dict[str, torch.Tensor]:
    """Every parameter's full value on CPU in rank 0 (empty dict elsewhere), as one process names
    them: FSDP shards gathered over their mesh, expert shares over the EP group."""
    from torch.distributed.tensor import DTensor

    eps = {f"layers.{i}.moe.": getattr(b, "_checkpoint_wrapped_module", b).moe.ep
           for i, b in enumerate(model.layers)}
    out = {}
    for name, p in model.named_parameters():
        name = _clean(name)
        value = p.detach().full_tensor() if isinstance(p, DTensor) else p.detach()
        if name in model.ep_slices:
            value = gather_expert_share(value, eps[name.rsplit(".", 1)[0] + "."])
        if torch.distributed.get_rank() == 0:
            out[name] = value.cpu().clone()
    return out


# ----- checkpoints: one entry per expert ------------------------------------------------------

EXPERT_STACKS = ("moe.w_gate_up", "moe.w_down")


def _local_rows(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """This rank's rows of a (possibly FSDP-sharded) stack and the index of its first row within
    the stack this rank's EP share holds (``Shard(0)`` keeps ``torch.chunk`` rows)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(t, DTensor):
        return t, 0
    offset, n = 0, t.shape[0]
    coord = t.device_mesh.get_coordinate()
    for i, placement in enumerate(t.placements):
        if placement.is_shard() and placement.dim == 0:
            offset = min(n, coord[i] * -(-n // t.device_mesh.size(i)))
    return t.to_local(), offset


def split_expert_stacks(sd: dict, model) -> dict:
    """The checkpoint payload with every expert stack (weights and AdamW moments) stored as one
    entry per *global* expert, ``<name>.expert<e>``: the same keys whatever the EP degree and
    the FSDP sharding (each FSDP shard of a stack holds whole experts), so a checkpoint written
    at one EP degree loads at another (DCP matches entries by key). The entries are views of
    the live tensors, so ``dcp.load`` fills the model and optimizer in place.

    ``sd`` is ``{"model": model state dict, "optim": optimizer state dict}`` as
    ``torch.distributed.checkpoint.state_dict.get_state_dict`` gives them.
    """
    starts = {name: lo for name, (_shape, lo, _hi) in getattr(model, "ep_slices", {}).items()}

    def rows(t: torch.Tensor, name: str) -> dict[str, torch.Tensor]:
        local, offset = _local_rows(t)
        base = starts.get(name, 0) + offset
        return {f"{name}.expert{base + r}": local[r] for r in range(local.shape[0])}

    model_sd = {}
    for k, v in sd["model"].items():
        model_sd.update(rows(v, k) if k.endswith(EXPERT_STACKS) else {k: v})
    state = {}
    for k, st in sd["optim"].get("state", {}).items():
        if not k.endswith(EXPERT_STACKS):
            state[k] = st
            continue
        stacks = {key: v for key, v in st.items() if torch.is_tensor(v) and v.ndim == 3}
        per = {key: rows(v, k) for key, v in stacks.items()}
        for ek in next(iter(per.values()), {}):
            state[ek] = {key: (per[key][ek] if key in per else v) for key, v in st.items()}
    return {"model": model_sd, "optim": {**sd["optim"], "state": state}}


def stacked_checkpoint(metadata) -> bool:
    """Whether a DCP checkpoint's metadata (``checkpoint.check_dcp_metadata``, read through the
    restricted unpickler) stores expert stacks whole (written before per-expert entries)."""
    keys = metadata.state_dict_metadata
    return any(k.startswith("model.") and k.endswith(EXPERT_STACKS) for k in keys)
