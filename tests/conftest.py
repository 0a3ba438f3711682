"""Fixtures shared by the training tests."""

from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture()
def env(tmp_path_factory, monkeypatch):
    """Environment of a training subprocess: one corpus cache for the session, one thread; the
    parent's torch thread count is restored after the test (in-process training changes it)."""
    cache = str(tmp_path_factory.getbasetemp() / "smelt-cache")
    monkeypatch.setenv("SMELT_CACHE", cache)
    threads = torch.get_num_threads()
    yield {**os.environ, "SMELT_CACHE": cache, "OMP_NUM_THREADS": "1"}
    torch.set_num_threads(threads)


@pytest.fixture()
def bench():
    """A script of benchmarks/ loaded as a module by its file name: ``bench("gpu_report")``
    (the benchmarks are scripts, not a package)."""
    import importlib.util
    from pathlib import Path

    def load(name: str):
        path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
