"""The Hopper forward's tile deals (csrc/sm90/tile_order_sm90.h), checked on the host:
tools/check_fwd_tile_order.cpp gives every tile to exactly one CTA over random list sizes and
grids (none after a CTA's end, which the kernel stops at), and holds the causal pair deal within
10% of the ideal makespan of a schedule model on the benchmark's cells."""
import os
import random
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CXX = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("g++") or shutil.which("c++")


@pytest.mark.skipif(CXX is None, reason="no C++ compiler (g++ / c++ / $CXX) found")
def test_fwd_tile_deals(tmp_path):
    exe = tmp_path / "check_fwd_tile_order"
    subprocess.run([CXX, "-O2", "-std=c++17", "-I", os.path.join(ROOT, "csrc"),
                    os.path.join(ROOT, "tools", "check_fwd_tile_order.cpp"), "-o", str(exe)],
                   check=True)
    seed = random.randrange(1 << 30)
    res = subprocess.run([str(exe), "300", str(seed)], capture_output=True, text=True)
    assert res.returncode == 0, f"seed {seed}\n" + res.stdout + res.stderr
    assert "0 failures" in res.stdout, res.stdout
