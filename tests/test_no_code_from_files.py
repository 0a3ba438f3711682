"""Nothing the toolkit reads may run code (issue 25): checkpoints hold pickles, so they are read
with unpicklers that resolve only what a checkpoint holds."""

from __future__ import annotations

import json
import os
import pickle

import pytest
import torch

from scaling.common.errors import UserError
from scaling.training.loop.checkpoint import Checkpointer
from scaling.training.loop.state import TrainState


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _checkpoint(tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    ck = Checkpointer(tmp_path / "ckpt", {"model": {"d": 3}}, "run-a", every=1)
    ck.prepare()
    ck.save_latest(model, opt, TrainState(iter=1))
    return ck, model, opt


def test_a_clean_checkpoint_loads(tmp_path):
    ck, model, opt = _checkpoint(tmp_path)
    assert ck.load(ck.latest(), model, opt).iter == 1


@pytest.mark.parametrize("with_digest", [True, False], ids=["checksum-rewritten", "checksum-kept"])
@pytest.mark.parametrize("target", ["rng.pt", ".metadata"])
def test_a_tampered_checkpoint_pickle_runs_nothing(tmp_path, target, with_digest):
    """A pickle planted in the checkpoint runs no code: refused by its checksum, or, where the
    tamperer rewrote the checksum in meta.json too, by the weights-only readers."""
    from scaling.training.loop.checkpoint import _crc32

    ck, model, opt = _checkpoint(tmp_path)
    marker = tmp_path / "pwned"
    path = ck.latest()
    if target == "rng.pt":
        torch.save({"torch": _Payload(marker)}, path / target)
    else:
        (path / target).write_bytes(pickle.dumps(_Payload(marker)))
    if with_digest:
        meta = json.loads((path / "meta.json").read_text())
        meta["digests"][target] = _crc32(path / target)
        (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="unreadable" if with_digest else "is corrupt") as exc:
        ck.load(path, model, opt)
    assert "\n" not in str(exc.value)
    assert not marker.exists()
