"""The smelt-scale command line with a training that SIGKILLs itself right after update KILL_AT.

    python tests/killing_cli.py KILL_AT train --tier ... (or under torchrun: every rank kills itself)

The kill lands where the trainer's ``after_update`` hook runs: the update's metrics line (and, at a
budget end, its final.json point) is durable, its checkpoint not yet written, the most adversarial
moment for a resume. The library holds no deliberate kill; the tests bring it (issue 30).
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KILLING_CLI = str(Path(__file__).resolve())


def kill_after(at: int):
    """An ``after_update`` hook that SIGKILLs this process once update ``at`` is done."""

    def hook(state) -> None:
        if state.iter == at:
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


def main() -> None:
    at = int(sys.argv.pop(1))
    from scaling.training.loop import trainer

    # the train command imports ``train`` from the module when it runs, so it gets this one
    trainer.train = functools.partial(trainer.train, after_update=kill_after(at))
    from scaling.cli import app

    app(prog_name="smelt-scale")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # this checkout's scaling, as `python -m cli` from ROOT imports it
    main()
