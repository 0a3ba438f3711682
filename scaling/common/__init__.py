"""Helpers every subpackage may use: the user-facing error type (``errors``), JSON and the generic
dataclass serializer (``serialize``), config and JSONL readers (``files``), the run folder's one
definition (``run_folder``: file names, crash-safe writes, the typed ``Point``, reading and status),
quantiles and the percentile interval (``stats``), number formats (``format``) and the device
choice (``device``).

Imports nothing else from ``scaling``.
"""
