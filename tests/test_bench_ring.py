"""benchmarks/bench_ring.py (issue 19's scaling run) as torchrun launches it, here on two CPU
ranks over gloo at toy sizes: every cell gives a row with the ring's and the one-device times
and the efficiencies that follow from them."""
import json
import os
import subprocess
import sys

import pytest
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                    reason="this torch build has no torch.distributed gloo backend")
def test_bench_ring_dry_run(tmp_path):
    out = tmp_path / "ring.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
           "--standalone", os.path.join(ROOT, "benchmarks", "bench_ring.py"),
           "--device", "cpu", "--tokens-per-rank", "64", "--total", "96", "--heads", "2",
           "--dim", "16", "--dtype", "fp32", "--reps", "1", "--warmup", "0",
           "--json", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["header"]["gpu_count"] == 2 and result["header"]["backend"] == "gloo"
    rows = result["rows"]
    assert [(r["mode"], r["causal"]) for r in rows] == [
        ("weak", True), ("weak", False), ("strong", True), ("strong", False)]
    for r in rows:
        assert r["tokens"] == (128 if r["mode"] == "weak" else 96)
        for what in ("fwd", "fwd_bwd"):
            assert r[f"ring_{what}_ms"] > 0 and r[f"one_{what}_ms"] > 0
            assert r[f"eff_{what}"] == pytest.approx(
                r[f"one_{what}_ms"] / 2 / r[f"ring_{what}_ms"])
