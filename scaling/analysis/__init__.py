"""Mechanism analyses of trained runs (SMELT paper, arXiv 2609.01343, "Analyses"; numbers in
shared/reference/smelt_paper.md): the attention sink per layer pass (``sink``), the loss and the
SMELT-over-Baseline gain by sample length and token position (``lengths``), and in-context
learning on a Dyck-language completion task (``icl``, with its generator ``dyck`` and greedy
decoding ``decode``). ``runs`` loads a trained run folder; ``results`` saves and reads back the
frozen results (``runs/<run>/analysis/<kind>.json``). Losses are natural-log cross-entropies in
nats per token.

May import ``scaling.common``, ``scaling.accounting`` and ``scaling.training`` (model, corpus,
run folders); never ``cli``. The public names are re-exported here: ``from scaling import analysis``.
"""

from scaling.analysis.decode import greedy_decode
from scaling.analysis.icl import ICLResult, ShotAccuracy, icl_accuracy, wilson_interval
from scaling.analysis.lengths import (
    GainBucket,
    LengthGain,
    LengthsResult,
    LossBucket,
    length_edges,
    length_gain,
    loss_by_length,
    position_edges,
)
from scaling.analysis.results import KINDS, Result, load_result, save_result, saved_analyses
from scaling.analysis.runs import EVAL_DATA, LoadedRun, load_run, load_runs, pair_runs, save_eval_data
from scaling.analysis.sink import (
    PassMass,
    SinkResult,
    attention_masses,
    attention_sink,
    dyck_sink,
    pass_order,
    sink_sequences,
)

__all__ = [
    "EVAL_DATA", "KINDS", "GainBucket", "ICLResult", "LengthGain", "LengthsResult", "LoadedRun",
    "LossBucket", "PassMass", "Result", "ShotAccuracy", "SinkResult", "attention_masses",
    "attention_sink", "dyck_sink", "greedy_decode", "icl_accuracy", "length_edges", "length_gain",
    "load_result", "load_run", "load_runs", "loss_by_length", "pair_runs", "pass_order",
    "position_edges", "save_eval_data", "save_result", "saved_analyses", "sink_sequences",
    "wilson_interval",
]
