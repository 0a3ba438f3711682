"""Publication figures (matplotlib): one function per figure, each returning a Figure; save one
with :func:`save`. ``smelt-scale plot`` and the notebooks both call them.

Modules by figure family: ``style`` (rc, colours, markers, shared helpers), ``curves`` (training
curves), ``fits`` (fits, residuals, parameters, IsoFLOP profiles, frontier), ``savings`` (savings
and loss gap), ``compare`` (paired differences), ``mechanisms`` (attention sink, loss by length,
in-context learning). The figure functions draw what the library computed
(``scaling.fitting.curves.read_curves``, ``scaling.fitting.slices.isoflop_slices``,
``scaling.fitting.savings_sweep.savings_over``, ``scaling.analysis.saved_analyses``); they compute
nothing beyond evaluating a fitted law or a parabola on a grid to draw it. Import them from
here: ``from scaling import plots``.

May import ``scaling.common``, ``scaling.accounting`` and, for data shapes, ``scaling.fitting``;
never ``cli``.
"""

from scaling.plots.compare import compare
from scaling.plots.curves import loss_curves
from scaling.plots.fits import fits, frontier, holdout, isoflop, params, residuals
from scaling.plots.mechanisms import icl, lengths, sink
from scaling.plots.savings import savings
from scaling.plots.style import ARCH_COLOURS, ARCH_LABELS, group_colours, group_label, save, shades, si

__all__ = [
    "ARCH_COLOURS", "ARCH_LABELS", "compare", "fits", "frontier", "group_colours", "group_label", "holdout",
    "icl", "isoflop", "lengths", "loss_curves", "params", "residuals", "save", "savings", "shades", "si",
    "sink",
]
