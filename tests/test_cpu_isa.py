"""The CPU backend's instruction-set builds (csrc/cpu/kernels_{generic,avx2,avx512}.cpp), each
forced with FLASHATTN_CPU_ISA in a fresh process (the choice is made once per process): forward
and backward against the float64 reference on shapes that hit the kernels' tails (key counts
and head dims off the 16-lane vector and the register tile), every dtype. A build this CPU
cannot run is skipped with the backend's reason, and only where /proc/cpuinfo agrees that the
CPU lacks it; the automatic choice must be the widest build the CPU runs."""
import os
import subprocess
import sys

import pytest
import torch

ISAS = ("generic", "avx2", "avx512")
# The CPU flags each build needs (what cpu_backend.cpp checks), as /proc/cpuinfo names them.
CPU_FLAGS = {"generic": (), "avx2": ("avx2", "fma", "f16c"),
             "avx512": ("avx512f", "avx512bw", "avx512dq", "avx512vl", "fma", "f16c")}

# Runs in the child: argv = (output file,). Prints UNAVAILABLE <why> if the forced build
# cannot run here, else checks every case and saves the fp32 results for the cross-ISA checks.
SCRIPT = r"""
import sys
import torch
import flashattn
from helpers import check_results, rand
from reference import ref_and_lowp

torch.manual_seed(0)
q = torch.randn(1, 20, 2, 64)
try:
    flashattn.flash_attn_func(q, q, q)
except RuntimeError as e:
    if "FLASHATTN_CPU_ISA" in str(e) and "cannot run here" in str(e):
        print("UNAVAILABLE", str(e).splitlines()[0])
        sys.exit(0)
    raise
# (dtype, batch, seqlen_q, seqlen_k, nheads, nheads_k, d, dv, causal, window, softcap, alibi)
CASES = [
    ("fp32", 1, 300, 300, 4, 4, 64, 64, False, (-1, -1), 0.0, False),   # keys off 64 and 16
    ("fp32", 2, 77, 145, 6, 2, 40, 40, True, (-1, -1), 0.0, False),     # d pads to 48: tails
    ("fp32", 1, 129, 257, 4, 1, 80, 80, False, (40, 7), 2.0, True),     # 5 vectors, window
    ("fp32", 1, 65, 33, 2, 2, 256, 256, True, (-1, -1), 0.0, False),    # empty rows, big d
    ("fp32", 1, 96, 200, 3, 3, 192, 128, False, (-1, -1), 0.0, True),   # dv != d
    ("bf16", 1, 300, 300, 4, 2, 64, 64, True, (-1, -1), 0.0, False),
    ("bf16", 2, 50, 77, 2, 2, 128, 128, False, (-1, -1), 1.5, False),
    ("fp16", 1, 300, 131, 4, 4, 64, 64, False, (-1, -1), 0.0, True),
    ("fp16", 1, 17, 300, 2, 1, 96, 96, False, (30, 30), 0.0, False),
]
DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
saved = []
for i, (dt, b, sq, sk, h, hk, d, dv, causal, window, softcap, alibi) in enumerate(CASES):
    dtype = DT[dt]
    q = rand((b, sq, h, d), dtype, "cpu")
    k = rand((b, sk, hk, d), dtype, "cpu")
    v = rand((b, sk, hk, dv), dtype, "cpu")
    dout = rand((b, sq, h, dv), dtype, "cpu")
    slopes = torch.rand(h) * 0.3 + 0.02 if alibi else None
    kw = dict(causal=causal, window_size=window, softcap=softcap, alibi_slopes=slopes)
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    out, lse, _ = flashattn.flash_attn_func(qg, kg, vg, return_attn_probs=True, **kw)
    dq, dk, dv_ = torch.autograd.grad(out, (qg, kg, vg), dout)
    ours = dict(out=out, lse=lse, dq=dq, dk=dk, dv=dv_)
    ref, lowp = ref_and_lowp(q, k, v, dout, **kw)
    try:
        check_results(ours, ref, lowp, dtype)
    except AssertionError as e:
        raise AssertionError(f"case {i} {CASES[i]}: {e}") from None
    saved.append({n: t.detach() for n, t in ours.items()})
    print("OK", i, flush=True)
torch.save(saved, sys.argv[1])
print("DONE")
"""


def cpu_flags():
    """The CPU's feature flags from /proc/cpuinfo (None where there is none to read)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def run_isa(isa, tmp_path):
    """(results, None), or (None, why the build cannot run here) for FLASHATTN_CPU_ISA=isa
    (isa None: the automatic choice)."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env.pop("FLASHATTN_CPU_ISA", None)
    if isa is not None:
        env["FLASHATTN_CPU_ISA"] = isa
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join([tests_dir] + [p for p in sys.path if p])
    out = tmp_path / f"{isa or 'auto'}.pt"
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(out)], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, f"FLASHATTN_CPU_ISA={isa}: rc={r.returncode}\n{r.stdout[-2000:]}" \
                              f"\n{r.stderr[-3000:]}"
    if r.stdout.startswith("UNAVAILABLE"):
        return None, r.stdout.split(" ", 1)[1].strip()
    assert "DONE" in r.stdout, r.stdout
    return torch.load(out), None


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Per ISA (and "auto"): the fp32 results of SCRIPT's cases, or the reason it cannot run."""
    tmp = tmp_path_factory.mktemp("isa")
    return {isa: run_isa(None if isa == "auto" else isa, tmp) for isa in ISAS + ("auto",)}


@pytest.mark.parametrize("isa", ISAS)
def test_isa_matches_reference(results, isa):
    res, why = results[isa]
    flags = cpu_flags()
    if res is None:
        assert isa != "generic", f"the portable build must always run: {why}"
        if flags is not None and all(f in flags for f in CPU_FLAGS[isa]):
            pytest.fail(f"/proc/cpuinfo lists {CPU_FLAGS[isa]} but the backend says: {why}")
        pytest.skip(f"FLASHATTN_CPU_ISA={isa}: {why}")
    if flags is not None:
        assert all(f in flags for f in CPU_FLAGS[isa]), (
            f"the {isa} build ran on a CPU whose /proc/cpuinfo lacks some of {CPU_FLAGS[isa]}")


def test_auto_picks_the_widest(results):
    """The automatic choice gives bit for bit the results of the widest build that runs here,
    and the builds differ in their bits (so that each forced run did run its own build)."""
    ran = [isa for isa in ISAS if results[isa][0] is not None]
    auto = results["auto"][0]
    assert auto is not None
    widest = results[ran[-1]][0]
    for case_auto, case_widest in zip(auto, widest):
        for name in case_auto:
            assert torch.equal(case_auto[name], case_widest[name]), (ran[-1], name)
    if len(ran) < 2:
        pytest.skip(f"only {ran} runs here: nothing to tell the builds apart by")
    for a, b in zip(ran, ran[1:]):
        assert any(not torch.equal(x[n], y[n]) for x, y in zip(results[a][0], results[b][0])
                   for n in x), f"{a} and {b} gave identical bits: was {b} really forced?"


def test_unknown_isa_named():
    env = dict(os.environ, FLASHATTN_CPU_ISA="avx9000", CUDA_VISIBLE_DEVICES="")
    code = ("import torch, flashattn\nq = torch.randn(1, 4, 1, 16)\n"
            "try:\n    flashattn.flash_attn_func(q, q, q)\nexcept RuntimeError as e:\n"
            "    print('ERR', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120, cwd=os.path.dirname(os.path.dirname(
                           os.path.abspath(__import__("flashattn").__file__))))
    assert "ERR flashattn: FLASHATTN_CPU_ISA=avx9000 is not one of auto, generic, avx2, " \
           "avx512" in r.stdout, r.stdout + r.stderr
