"""benchmarks/bench_attn.py --dtype fp8 (issue 14) on the CPU: our FP8 forward and our bf16
forward of the same cell in one run (rows with dtype "e4m3", the fp8/bf16 column, no SDPA
peer), the summary against the issue's targets, and a clear exit (no traceback, no JSON) where
the FP8 forward cannot run (the CUDA kernel not built yet, a build without FP8)."""
import json
import subprocess
import sys

import pytest

import flashattn
from flashattn import bench
from test_bench_peers import SCRIPT, TINY, _main

NOT_BUILT = "flashattn: the sm90 FP8 kernel is not built yet (issue 14): test double"


def _row(d, N, causal, fp8, bf16):
    return {"mode": "fwd", "dtype": "e4m3", "d": d, "causal": causal, "N": N, "B": 1, "H": 8,
            "path": "sm90", "flashattn": fp8, "flashattn_bf16": bf16}


def test_fp8_run(monkeypatch, tmp_path, capsys):
    if flashattn.BUILD_CONFIG.get("FLASHATTN_DISABLE_FP8"):
        pytest.skip("this build has no FP8 kernels (FLASHATTN_DISABLE_FP8)")
    out = tmp_path / "fp8.json"
    _main(monkeypatch, TINY + ["--dtype", "fp8", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["mode"], r["dtype"]) for r in rows] == [("fwd", "e4m3")]  # fwd only by default
    assert rows[0]["flashattn"] > 0 and rows[0]["flashattn_bf16"] > 0
    assert not any(key.startswith("sdpa") for key in rows[0])
    text = capsys.readouterr().out
    assert "fp8/bf16" in text and "fp8 summary: our FP8 forward over our bf16 forward" in text


def test_fp8_summary():
    rows = [_row(128, 1024, False, 300.0, 250.0), _row(128, 4096, False, 900.0, 600.0),
            _row(128, 16384, False, 1000.0, 500.0), _row(256, 8192, True, 800.0, 400.0),
            _row(256, 512, False, 100.0, 200.0)]
    lines = bench.fp8_summary_lines(rows)
    assert "median over N >= 4096: 2.00 (target >= 1.4)" in lines[1]  # 1.5, 2, 2
    assert "min over N >= 1024: 1.20 at d=128 N=1024 (target >= 1.15)" in lines[2]  # not N=512
    assert "d=128: best 1000 TFLOP/s at d=128 N=16384" in lines[3]
    assert "d=256: best 800 TFLOP/s at d=256 N=8192 causal" in lines[4]
    table = bench.TablePrinter(["flashattn", "flashattn_bf16"])
    assert table.columns[-1] == "fp8/bf16" and table.row(rows[1]).endswith("1.500")


def test_fp8_kernel_absent(monkeypatch, tmp_path, capsys):
    """Our FP8 forward cannot run (here: kernel_path raising as CUDA does today): the run stops
    before timing anything, naming the reason, and writes no JSON."""
    def kernel_path(*args, **kwargs):
        raise RuntimeError(NOT_BUILT)
    monkeypatch.setattr(flashattn, "kernel_path", kernel_path)
    out = tmp_path / "fp8.json"
    with pytest.raises(SystemExit) as exit_info:
        _main(monkeypatch, TINY + ["--dtype", "fp8", "--json", str(out)])
    assert str(exit_info.value.code) == ("bench_attn.py: --dtype fp8: our FP8 forward cannot run "
                                         f"on cpu: {NOT_BUILT}")
    assert not out.exists() and "TFLOP/s" not in capsys.readouterr().out


def test_fp8_kernel_absent_command(tmp_path):
    """The same as a command: exit status 1, the reason on stderr, no traceback."""
    out = tmp_path / "fp8.json"
    argv = [SCRIPT] + TINY + ["--dtype", "fp8", "--json", str(out)]
    code = ("import runpy, sys, flashattn\n"
            "def kernel_path(*a, **k): raise RuntimeError(" + repr(NOT_BUILT) + ")\n"
            "flashattn.kernel_path = kernel_path\n"
            f"sys.argv = {argv!r}; runpy.run_path({SCRIPT!r}, run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "our FP8 forward cannot run on cpu: " + NOT_BUILT in done.stderr
    assert "Traceback" not in done.stderr and not out.exists()


@pytest.mark.parametrize("extra, message", [
    (["--modes", "fwd", "bwd"], "FP8 attention is forward only (issue 14); use --modes fwd"),
    (["--memory"], "--memory measures fwd+bwd"),
])
def test_fp8_forward_only(monkeypatch, extra, message):
    with pytest.raises(SystemExit) as exit_info:
        _main(monkeypatch, TINY + ["--dtype", "fp8"] + extra)
    assert message in str(exit_info.value.code)
