"""Sweeps: plans read and checked from TOML into runs with their memory and time estimates
(``plan``), and their submission through submitit, local or Slurm, with run status (``submit``).

May import everything below it in ``scaling.training`` (base modules, data, model, parallel,
loop) besides ``scaling.common`` and ``scaling.accounting``.
"""
