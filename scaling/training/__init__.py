"""Training: the torch model, the corpora and token shards, the trainer and its components, the
process group and data/expert parallelism, and sweep plans submitted through submitit.

Rooms within the room, lowest first (each may import only the ones before it; tests/test_layout.py
enforces it):

* ``runlog``, ``schema`` (modules at this level): run metadata and weights files (the run folder
  itself is ``scaling.common.run_folder``'s, re-exported by ``runlog``) and the typed checks of plan
  and config values; the base every sub-package may use.
* ``data/``: the built-in corpus, prepared token shards (``prepare-data``) and ``open_data``.
* ``model/``: the torch model (``transformer``) and its chunked cross-entropy.
* ``parallel/``: the process group and DeviceMesh, DDP/FSDP2/HSDP, expert parallelism, the
  launcher watch.
* ``loop/``: the trainer and its components (schedule, budgets and branches, state, checkpoints,
  metrics, validation, progress, the run lock).
* ``sweep/``: sweep plans (``plan``) and their submission (``submit``).

The package may import ``scaling.common`` and ``scaling.accounting``; never ``fitting``,
``design``, ``plots``, ``analysis``, ``evaluation`` or ``cli``.
"""
