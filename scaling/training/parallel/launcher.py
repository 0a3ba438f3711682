"""Workers stop when their launcher dies: a rank whose ``torchrun`` is killed must not train on.

When the launcher (``torchrun``'s elastic agent, the parent of every worker) is killed with
SIGKILL, nothing tells its workers: they keep training, holding GPUs and writing the run folder
that a restarted job then shares with them. Linux's parent-death signal
(``prctl(PR_SET_PDEATHSIG, SIGTERM)``, through ctypes) makes the kernel send SIGTERM to the
worker the moment its parent exits; :func:`watch_launcher` sets it up and installs a SIGTERM
handler that only records the request, and the trainer calls :func:`stop_requested` at each
safe point (before every update) and stops there without writing anything more. A worker stuck
in a collective whose peer is gone cannot reach a safe point: a watchdog ends it
(``os._exit``) :data:`GRACE_S` seconds after the signal. A SIGTERM from the launcher itself
(torchrun stopping its workers) takes the same path. Elsewhere (macOS, no torchrun) nothing
is installed and SIGTERM keeps its default action.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading

PR_SET_PDEATHSIG = 1
GRACE_S = 30.0
_state: dict = {"reason": None, "parent": None}


def _on_term(signum, frame) -> None:
    if _state["reason"] is None:
        gone = os.getppid() == 1 or os.getppid() != _state.get("parent")
        _state["reason"] = ("the launcher is gone (its parent process exited)" if gone
                            else "the launcher asked the workers to stop (SIGTERM)")
        timer = threading.Timer(GRACE_S, os._exit, (128 + signal.SIGTERM,))
        timer.daemon = True
        timer.start()


def watch_launcher() -> bool:
    """Under torchrun on Linux, SIGTERM on the parent's death and a deferred SIGTERM handler;
    True when installed. Call once per worker process, from the main thread."""
    if (sys.platform != "linux" or "TORCHELASTIC_RUN_ID" not in os.environ
            or threading.current_thread() is not threading.main_thread()):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    _state["parent"] = os.getppid()
    signal.signal(signal.SIGTERM, _on_term)
    if os.getppid() == 1:  # the launcher died before the signal was armed
        _on_term(signal.SIGTERM, None)
    return True


def stop_requested() -> str | None:
    """Why this worker must stop now (None: go on)."""
    return _state["reason"]
