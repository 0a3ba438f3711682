"""Accounting: the one ModelConfig, its exact costs (parameters, training FLOPs and KV cache per
token), the SMELT matcher and the named tiers.

Pure arithmetic on dataclasses: imports only ``scaling.common``; no torch, numpy or I/O.
"""
