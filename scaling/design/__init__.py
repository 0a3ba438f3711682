"""Study design: the next IsoFLOP set proposed from the current fits (``smelt-scale plan``) and the
simulation of whether a design can resolve the saving (``smelt-scale simulate``).

May import ``scaling.common``, ``scaling.accounting`` and ``scaling.fitting``; no torch.
"""
