"""smelt-scale command line, for readers: the typer app lives in :mod:`scaling.cli`.

Installed as the ``smelt-scale`` script (``scaling.cli:app``); ``python cli.py ...`` also works
from a checkout.
"""

from scaling.cli import app

if __name__ == "__main__":
    app()
