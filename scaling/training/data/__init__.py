"""Tokens for training: the built-in offline corpus and its BPE tokenizer (``corpus``), prepared
memmapped token shards and their manifest (``shards``), ``prepare-data``'s pipeline from raw
documents to shards (``prepare``), and :func:`loader.open_data`, the one way the trainer gets
batches and validation windows from either.

May import ``scaling.common``, ``scaling.accounting`` and the base modules ``scaling.training.runlog``
and ``scaling.training.schema``; never the model, parallelism, the loop or sweeps (no torch here:
the data side is numpy and tokenizers).
"""
