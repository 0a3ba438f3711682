"""Process-group setup for one training process: torchrun, a Slurm task started by submitit, or alone.

Where the rank comes from:

* ``torchrun`` exports ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK`` (and ``LOCAL_WORLD_SIZE``,
  ``MASTER_ADDR``/``MASTER_PORT``); we read them.
* a task started by submitit (``SUBMITIT_EXECUTOR`` is ``slurm`` or ``local``, one task per GPU)
  has none of them: submitit's own ``submitit.helpers.TorchDistributedEnvironment().export()``
  sets them from the job (master = first host of the job, port derived from the job id).
  ``CUDA_VISIBLE_DEVICES`` is left alone so that device ``cuda:LOCAL_RANK`` means the same under
  both launchers.
* otherwise: one process, rank 0 of 1.

The device is ``cuda:LOCAL_RANK`` when CUDA is there (or asked for), else the CPU; the process
group is nccl on CUDA and gloo on the CPU, initialised only when the world has more than one
rank. The ``DeviceMesh`` for FSDP2 is 1-D ``("dp_shard",)`` over all ranks; for HSDP it is 2-D
``("dp_replicate", "dp_shard")``: replicate across nodes, shard within a node (the replicate
degree defaults to ``WORLD_SIZE / LOCAL_WORLD_SIZE``, the node count). DDP and one process need
no mesh. With expert parallelism (``ep`` > 1) the mesh gains an innermost ``ep`` dimension
(:mod:`scaling.training.parallel.expert_parallel`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from scaling.accounting.memory import MODES, resolve_mode
from scaling.common.device import check_device
from scaling.common.errors import UserError


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits: rank of world, local rank on its node, its device, and the mesh."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1
    device: torch.device = torch.device("cpu")
    mesh: object | None = None  # torch.distributed.device_mesh.DeviceMesh for fsdp/hsdp
    initialized_here: bool = False
    # scaling.training.parallel.expert_parallel.EPMeshes with expert parallelism (then ``mesh`` is its
    # ``dp`` mesh, for the non-expert parameters); None without
    ep: object | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def backend(self) -> str:
        return "nccl" if self.device.type == "cuda" else "gloo"

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()

    def close(self) -> None:
        """Destroy the process group if this object created it."""
        if self.initialized_here and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def export_submitit_env() -> bool:
    """Inside a submitit job, export the torch distributed variables for this task; True if done.

    Re-exported on every call (``overwrite=True``): a local-executor lane trains several runs in
    one process, and the values are a pure function of the job.
    """
    if os.environ.get("SUBMITIT_EXECUTOR") not in ("slurm", "local"):
        return False
    from submitit.helpers import TorchDistributedEnvironment

    TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
    return True


def launch_rank() -> int:
    """This process's rank as its launcher gave it: ``RANK`` from torchrun, or from submitit once
    :func:`setup_distributed` exported it; 0 for a process alone. Readable before the process group
    exists and after it is gone (a command prints its result on rank 0 only)."""
    return int(os.environ.get("RANK", "0"))


def _pick_device(device_pref: str, local_rank: int) -> torch.device:
    if check_device(device_pref) == "auto":
        return torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    device = torch.device(device_pref)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"device {device_pref!r} requested but CUDA is not available")
        if device.index is None:
            device = torch.device(f"cuda:{local_rank}")
    return device


def build_mesh(mode: str, world: int, device_type: str, replicate: int | None = None,
               local_world: int | None = None):
    """The DeviceMesh of ``mode``: None for none/ddp, 1-D for fsdp, 2-D (replicate x shard) for hsdp.

    HSDP's replicate degree is ``replicate`` or else the node count ``world / local_world``; it
    must divide the world size.
    """
    if mode not in MODES:
        raise UserError(f"parallel mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode in ("none", "ddp"):
        return None
    from torch.distributed.device_mesh import init_device_mesh

    if mode == "fsdp":
        return init_device_mesh(device_type, (world,), mesh_dim_names=("dp_shard",))
    rep = replicate if replicate is not None else world // max(1, local_world or world)
    if rep < 1 or world % rep:
        raise UserError(f"HSDP replicate degree {rep} does not divide the world size {world}")
    return init_device_mesh(device_type, (rep, world // rep), mesh_dim_names=("dp_replicate", "dp_shard"))


def setup_distributed(device_pref: str = "auto", mode: str = "none", *,
                      replicate: int | None = None, ep: int = 1) -> DistEnv:
    """Read the launcher's environment, pick the device, init the process group, build the mesh.

    ``mode`` is the parallel mode (none, ddp, fsdp, hsdp); see ``resolve_mode`` for what one rank
    and several ranks with ``none`` do. ``replicate`` overrides HSDP's replicate degree (tests:
    1x2 and 2x1 meshes on 2 processes).
    """
    if mode not in MODES:
        raise UserError(f"parallel mode must be one of {', '.join(MODES)}, got {mode!r}")
    if "WORLD_SIZE" not in os.environ:
        export_submitit_env()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = launch_rank()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    device = _pick_device(device_pref, local)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    here = False
    if world > 1:
        from scaling.training.parallel.launcher import watch_launcher

        watch_launcher()  # stop when torchrun dies (parent-death signal), not train on as an orphan
    if world > 1 and not torch.distributed.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        torch.distributed.init_process_group(backend=backend, **kwargs)
        here = True
    resolved = resolve_mode(mode, world)
    if ep > 1:  # expert parallelism: its own mesh dimension (scaling.training.parallel.expert_parallel)
        from scaling.training.parallel.expert_parallel import build_ep_meshes

        if world % ep:
            raise UserError(f"expert-parallel degree {ep} does not divide the world size {world}")
        rep = replicate if replicate is not None else world // max(1, local_world)
        meshes = build_ep_meshes(resolved, world, ep, device.type, rep if resolved == "hsdp" else 1)
        return DistEnv(rank, world, local, local_world, device, meshes.dp, here, meshes)
    mesh = build_mesh(resolved, world, device.type, replicate, local_world)
    return DistEnv(rank, world, local, local_world, device, mesh, here)
