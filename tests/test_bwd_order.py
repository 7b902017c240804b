"""The deterministic backward's add orders (csrc/sm80/bwd_order_sm80.h), checked on the host:
tools/check_bwd_order.cpp compares each rank formula with a brute-force order over random
shapes, windows and tiles, and runs the waits to the end (no deadlock)."""
import os
import random
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CXX = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("g++") or shutil.which("c++")


@pytest.mark.skipif(CXX is None, reason="no C++ compiler (g++ / c++ / $CXX) found")
def test_bwd_orders(tmp_path):
    exe = tmp_path / "check_bwd_order"
    subprocess.run([CXX, "-O2", "-std=c++17", "-I", os.path.join(ROOT, "csrc"),
                    os.path.join(ROOT, "tools", "check_bwd_order.cpp"), "-o", str(exe)],
                   check=True)
    seed = random.randrange(1 << 30)
    res = subprocess.run([str(exe), "400", str(seed)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 failures" in res.stdout, res.stdout
