"""Publication figures (matplotlib): one function per figure, each returning a Figure.

Draws what the library computed; may import ``scaling.common`` and, for data shapes,
``scaling.fitting``; never ``cli``.
"""
