"""Mechanism analyses of trained runs: attention mass on BOS per layer pass, loss by document length
and token position, and in-context Dyck completion (with its generator).

May import ``scaling.common``, ``scaling.accounting`` and ``scaling.training`` (model, corpus,
run folders); never ``cli``.
"""
