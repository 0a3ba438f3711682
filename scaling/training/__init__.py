"""Training: the torch model, the corpora and token shards, the learning-rate schedule, the trainer
and its components (state, checkpointer, evaluator, metrics), the process group and data parallelism
(``distributed``: torchrun/submitit ranks and the DeviceMesh; ``parallel``: DDP, FSDP2, HSDP), run
folders, sweep plans and their submission through submitit.

May import ``scaling.common`` and ``scaling.accounting``; never ``fitting``, ``design``, ``plots``
or ``cli``.
"""
