"""The training loop: :class:`trainer.Trainer` and ``train`` with its components: the
learning-rate schedule (``schedule``), token budgets and cooldown branches (``branches``), the
resumable state (``state``) and its DCP checkpoints (``checkpoint``), validation (``evaluate``),
metrics and their resume (``metrics``), progress lines (``progress``), the run-folder lock
(``lock``) and the CPU allocator tuning of a training process (``cpu``).

May import ``scaling.common``, ``scaling.accounting``, the base modules ``scaling.training.runlog``
and ``scaling.training.schema``, and ``scaling.training.data``, ``.model``, ``.parallel``; never
``scaling.training.sweep`` (sweeps drive the loop, not the other way round).
"""
