"""Export and downstream evaluation of trained runs (issue 28).

``weights`` (which weights of a run: a budget's ``weights/budget-<i>.safetensors``, the final
weights, or a DCP checkpoint; the run's N, D, C and validation loss beside them), ``export``
(a looped or plain model as an exact, unrolled Hugging Face Mixtral folder), ``lm`` (the native
lm-eval model: a ``TemplateLM`` over our own forward, for every tier, exportable or not),
``tasks`` (offline lm-eval task overlays on local JSONL/Parquet files), ``code_eval`` (local
pass@k: one subprocess per program, with a timeout) and ``run`` (``smelt-scale eval``: runs x
budgets x tasks -> one row per metric). lm-eval, transformers and accelerate are optional
(the ``[eval]`` extra) and imported only inside the functions that need them.

May import ``scaling.common``, ``scaling.accounting``, ``scaling.training`` (model, run folders,
corpus) and ``scaling.analysis`` (a run's corpus and tokenizer); never ``fitting``, ``design``,
``plots`` or ``cli``. The loss->accuracy calibration law is in ``scaling.fitting.calibration``.
"""
