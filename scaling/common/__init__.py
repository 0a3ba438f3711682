"""Helpers every subpackage may use: the user-facing error type and JSON serialisation.

Imports nothing else from ``scaling``.
"""
