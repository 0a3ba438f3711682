"""The torch model: the looped/baseline MoE transformer (``transformer``) and the chunked
cross-entropy that keeps the [N, V] logits out of memory (``chunked_ce``).

May import ``scaling.common``, ``scaling.accounting`` and the base modules ``scaling.training.runlog``
and ``scaling.training.schema``; never data, parallelism, the loop or sweeps: a model is built from
a ``ModelConfig`` alone.
"""
