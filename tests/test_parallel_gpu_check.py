"""benchmarks/gpu_check.py: skipped without CUDA; its code path at a tiny size on the CPU (2 gloo ranks)."""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def load():
    # importable by name: the spawned ranks unpickle gpu_check._worker (sys.path is passed on)
    if str(SCRIPT.parent) not in sys.path:
        sys.path.insert(0, str(SCRIPT.parent))
    return importlib.import_module("gpu_check")


def test_without_cuda_it_skips_in_one_line():
    if torch.cuda.is_available():
        return
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout == "gpu_check: skipped, no CUDA device\n"


def test_the_check_at_tiny_size_on_two_cpu_ranks(capsys):
    gpu_check = load()
    rc = gpu_check.main(["--device", "cpu", "--tier", "proxy-tiny", "--archs", "smelt", "--steps", "6",
                         "--warmup", "1", "--lr", "1e-2", "--nproc", "2", "--json"])
    lines = capsys.readouterr().out.strip().splitlines()
    doc = json.loads(lines[-1])
    assert rc == 0 and doc["ok"] and len(lines) == 1
    (arch,) = doc["archs"]
    assert arch["arch"] == "smelt" and arch["steps"] == 6 and arch["timed_steps"] == 5
    assert arch["tokens_per_s"] > 0 and arch["tokens_per_step"] == 2 * 2 * 2 * 64
    assert arch["loss_fell"] and arch["last_loss"] < arch["first_loss"]
    assert arch["mfu"] is None and arch["peak_memory_gb"] is None  # CUDA-only numbers
    assert 0 < arch["planned_memory_gb"] < 1  # the planner's estimate for this layout (fp32, 2 ranks)
    for which in ("baseline", "smelt"):
        m = doc["meta_build"][which]
        assert m["equal"] and m["all_meta"] and m["built"] > 50e9
    assert arch["profile"] is None and arch["sync_check"]["sync_free"] is None  # CUDA-only check
    assert arch["compile"] is False  # the CPU default
    assert arch["loop_grad"] == "per-pass"  # the trainer's default for SMELT under fsdp
    rc = gpu_check.main(["--device", "cpu", "--tier", "proxy-tiny", "--archs", "smelt", "--steps", "3",
                         "--warmup", "1", "--nproc", "2", "--loop-grad", "fsdp", "--json"])
    (arch,) = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["archs"]
    assert rc == 0 and arch["loop_grad"] == "fsdp"
    assert doc["extra_skipped"] == [] and doc["scale"]["ok"] and doc["kernels"]["ok"]
    assert doc["kernels"]["smelt"]["router"]["logits_rel_err"] <= 1e-6  # the CPU path: exact


def test_suite_runs_the_three_configurations(monkeypatch, capsys):
    """--suite spawns one fresh set of ranks per configuration of issue 31's table, with its
    micro-batch, accumulation and compile setting (the ranks replaced by a recorder here)."""
    gpu_check = load()
    assert [c[0] for c in gpu_check.SUITE] == ["mb2x2", "mb8", "mb8-compiled"]
    seen = []

    def fake_spawn(args, world):
        seen.append((args.micro_batch, args.grad_accum, args.compile, args.max_seconds, world))
        return [{"arch": a, "finite": True, "loss_fell": True, "peak_memory_gb": None,
                 "planned_memory_gb": None} for a in args.archs]

    monkeypatch.setattr(gpu_check, "_spawn", fake_spawn)
    monkeypatch.setattr(gpu_check, "meta_build", lambda tier: {})
    monkeypatch.setattr(gpu_check, "EXTRA_CHECKS", {})
    doc = gpu_check.run(gpu_check.parse_args(["--device", "cpu", "--suite", "--nproc", "1"]))
    assert seen == [(2, 2, False, 20.0, 1), (8, 1, False, 20.0, 1), (8, 1, True, 20.0, 1)]
    assert [a["config"] for a in doc["archs"]] == ["mb2x2"] * 2 + ["mb8"] * 2 + ["mb8-compiled"] * 2
    assert doc["ok"] and [c["name"] for c in doc["configs"]] == ["mb2x2", "mb8", "mb8-compiled"]


def test_extra_checks_plug_in_and_count_in_ok(monkeypatch, tmp_path):
    gpu_check = load()
    code = "def run_checks(args):\n    return {'ok': False, 'why': 'planted'}\n"
    (tmp_path / "extra_mod_planted.py").write_text(code)
    monkeypatch.setattr(gpu_check, "EXTRA_CHECKS", {"extra": "extra_mod_planted", "absent": "no_such_module"})
    monkeypatch.syspath_prepend(str(tmp_path))
    results, skipped = gpu_check.run_extra_checks(gpu_check.parse_args([]), here=str(tmp_path))
    assert results == {"extra": {"ok": False, "why": "planted"}} and skipped == ["absent"]


def test_profile_summary_of_a_cpu_step():
    """--profile's summary: top operators with shares, and the GEMM share, from a real profile."""
    from torch.profiler import ProfilerActivity, profile

    from scaling.accounting.tiers import get_config
    from scaling.training.model.transformer import MoETransformer

    gpu_check = load()
    cfg = get_config("proxy-tiny", "smelt")
    model = MoETransformer(cfg)
    x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = model(x, x)
        out.loss.backward()
    summary = gpu_check.profile_summary(prof, "cpu", top=5, steps=1)
    assert len(summary["top"]) == 5 and summary["total_ms"] > 0
    assert summary["ms_per_step"] == summary["total_ms"]
    fams = summary["families"]
    assert 0 < len(fams) <= 5 and all(f["ms"] >= g["ms"] for f, g in zip(fams, fams[1:]))
    assert fams[0]["ms"] >= summary["top"][0]["ms"]  # a family holds at least its largest member
    assert all(t["ms"] >= u["ms"] for t, u in zip(summary["top"], summary["top"][1:]))
    assert 0 < summary["gemm_share"] < 1 and 0 <= summary["copy_share"] < 1
    assert sum(t["share"] for t in summary["top"]) <= 1 + 1e-9
    assert gpu_check.sync_check(lambda: None)["sync_free"] in (None, True)


def test_synthetic_tokens_follow_the_successor_table():
    gpu_check = load()
    ids = gpu_check.synthetic_tokens(97, 8, 200, seed=1)
    table = torch.randperm(97, generator=torch.Generator().manual_seed(1))
    follows = (ids[:, 1:] == table[ids[:, :-1]]).float().mean().item()
    assert ids.shape == (8, 201) and 0.85 < follows < 0.95


def test_issue31_preset_sets_each_configuration_s_options(monkeypatch):
    """--configs issue31: each configuration's own mode / head padding / loop_grad / archs reach
    its ranks, the command line's settings everywhere else."""
    gpu_check = load()
    seen, warm = [], []

    def fake_spawn(args, world):
        seen.append((args.micro_batch, args.grad_accum, args.compile, args.mode, args.head_padding,
                     args.loop_grad, tuple(args.archs)))
        warm.append((args.warmup, args.profile_steps))
        return [{"arch": a, "finite": True, "loss_fell": True} for a in args.archs]

    monkeypatch.setattr(gpu_check, "_spawn", fake_spawn)
    monkeypatch.setattr(gpu_check, "meta_build", lambda tier: {})
    monkeypatch.setattr(gpu_check, "EXTRA_CHECKS", {})
    doc = gpu_check.run(gpu_check.parse_args(["--device", "cpu", "--configs", "issue31", "--nproc", "1"]))
    both = ("baseline", "smelt")
    assert warm == [(3, 1)] + [(10, 3)] * 4
    assert seen == [(16, 4, True, "none", "auto", None, both), (8, 1, False, "none", "auto", None, both),
                    (8, 1, False, "fsdp", "auto", None, both),
                    (8, 1, False, "fsdp", "never", None, ("smelt",)),
                    (8, 1, False, "fsdp", "auto", "fsdp", ("smelt",))]
    assert [c["name"] for c in doc["configs"]] == list(gpu_check.PRESETS["issue31"])
    assert doc["configs"][3]["options"] == {"head_padding": "never", "archs": ["smelt"]}
    assert doc["init"] == "device" and doc["head_padding"] == "auto"


def test_one_unwrapped_rank_with_the_device_init_and_no_head_padding(capsys):
    """--mode none on one rank: the trainer's one-GPU layout (no FSDP2 mesh); the result says what ran."""
    gpu_check = load()
    rc = gpu_check.main(["--device", "cpu", "--tier", "proxy-tiny", "--archs", "smelt", "--steps", "4",
                         "--warmup", "1", "--lr", "1e-2", "--nproc", "1", "--mode", "none",
                         "--head-padding", "never", "--json"])
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (arch,) = doc["archs"]
    assert rc == 0 and doc["ok"], arch
    assert arch["layout"] == "none" and arch["init"] == "device" and arch["head_padding"] == "never"
    assert arch["loop_grad"] == "fsdp"  # nothing to reduce per pass without FSDP2 (the key's default)
    assert arch["planned_memory_gb"] is not None


def test_the_planner_is_asked_for_the_layout_that_ran():
    """--mode none on several ranks runs DDP, --mode ddp on one runs unwrapped; fsdp keeps its mesh."""
    from scaling.accounting.memory import Layout, estimate_memory
    from scaling.accounting.tiers import get_config

    gpu_check = load()
    cfg = get_config("proxy-tiny", "smelt")
    cases = (("none", 2, "ddp"), ("ddp", 1, "none"), ("fsdp", 1, "fsdp"), ("none", 1, "none"))
    for mode, world, ran in cases:
        assert gpu_check.layout_that_ran(mode, world) == ran
        total, _ = gpu_check.planned_memory_gb(cfg, mode, world, 2, 1, False, "last", "cpu")
        want = estimate_memory(cfg, Layout(mode=ran, gpus_per_node=world, micro_batch_size=2,
                                           grad_sync="last", compute_dtype="fp32", seq_len=cfg.seq_len))
        assert total == pytest.approx(want.total / 1e9), (mode, world)


def test_kernel_families_merge_template_variants():
    gpu_check = load()
    fam = gpu_check.kernel_family
    copy = ("void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda"
            "(at::TensorIteratorBase&)::{lambda(float)#1}>(int)")
    assert fam(copy) == "at::native::vectorized_elementwise_kernel"
    mangled = "_ZN7cutlass13device_kernelIN2at4cuda6detail25enable"
    assert fam(mangled) == mangled
    assert fam("Memcpy DtoD (Device -> Device)") == "Memcpy DtoD"
    assert fam("aten::mm") == "aten::mm"
