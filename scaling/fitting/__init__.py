"""Fitting: the law registry, point tables (run folders, CSV, JSONL, Parquet), the approach-3 fitter
with its bootstrap, approaches 1-2, the loss floor's profile, the compute-optimal frontier and the
savings, and the paper's reference laws.

numpy/scipy/pandas maths; may import ``scaling.common`` and ``scaling.accounting``; no torch.
"""
