"""smelt-scale: compute-matched looped MoE (SMELT) vs MoE baseline, from accounting to scaling laws."""

__version__ = "0.1.0"
