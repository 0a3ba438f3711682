"""Helpers every subpackage may use: the user-facing error type (``errors``), JSON and the generic
dataclass serializer (``serialize``), config and JSONL readers (``files``), reading a run folder
(``run_folder``), the percentile interval (``stats``) and number formats (``format``).

Imports nothing else from ``scaling``.
"""
