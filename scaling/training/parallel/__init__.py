"""Many processes, one training: the process group and DeviceMesh from torchrun/submitit
(``distributed``), DDP/FSDP2/HSDP wrapping, the train step and gradient sync
(``data_parallel``), expert parallelism (``expert_parallel``), and the parent-death watch that
stops a worker whose launcher died (``launcher``).

May import ``scaling.common``, ``scaling.accounting``, the base modules ``scaling.training.runlog``
and ``scaling.training.schema``, and ``scaling.training.model``; never data, the loop or sweeps.
"""
