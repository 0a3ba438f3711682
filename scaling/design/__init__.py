"""Study design: the next IsoFLOP sets proposed from the current laws (``smelt-scale plan``) and the
simulation of whether a design can resolve the saving (``smelt-scale simulate``).

``sizing`` (a size N or F -> a buildable Baseline config and its SMELT twin), ``proposal``
(IsoFLOP sets around each law's optimum: ``propose`` -> ``Proposal``), ``output`` (a proposal as
a sweep-plan document), ``points`` (designs as canonical points: ``isoflop_design``,
``points_of_sweep_plan``), ``simulate`` (Monte Carlo of fit -> savings on synthetic losses).

May import ``scaling.common``, ``scaling.accounting`` and ``scaling.fitting``; no torch.
"""
