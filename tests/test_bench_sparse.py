"""The block-sparse benchmark (flashattn/bench_sparse.py, issue 16) on tiny CPU cells: its rows
carry the schema, the kept-block FLOP count, and Flex computing the same attention as ours
under the same mask (the benchmark's own check); make_table renders them."""
import importlib.util
import os

import pytest
import torch

from flashattn import bench, bench_sparse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_flex = pytest.mark.skipif(bench_sparse.flex_unavailable() is not None,
                                reason=str(bench_sparse.flex_unavailable()))


def test_masks():
    for kind in bench_sparse.MASKS:
        m = bench_sparse.block_mask(kind, 3, 9, torch.device("cpu"), seed=5)
        assert m.shape == (1, 3, 9, 9) and m.dtype == torch.bool
        assert m[0, :, torch.arange(9), torch.arange(9)].all()  # the diagonal always kept
        assert torch.equal(m, bench_sparse.block_mask(kind, 3, 9, torch.device("cpu"), seed=5))
    r50 = bench_sparse.block_mask("random50", 4, 64, torch.device("cpu")).float().mean()
    r25 = bench_sparse.block_mask("random25", 4, 64, torch.device("cpu")).float().mean()
    assert 0.45 < r50 < 0.6 and 0.2 < r25 < 0.33
    lg = bench_sparse.block_mask("local_global", 1, 16, torch.device("cpu"))[0, 0]
    assert lg[10, 8:13].all() and not lg[10, 7] and not lg[10, 13] and lg[10, :2].all()


@needs_flex
def test_rows_on_cpu():
    timing = bench.Timing(warmup_ms=0, rep_ms=0, min_reps=1, max_reps=1)
    cells = [bench_sparse.SparseCell(mode, kind, 16, 300, 2, 2, dtype=torch.float32)
             for mode in ("fwd", "bwd") for kind in ("random50", "local_global")]
    rows = bench_sparse.run_grid(torch.device("cpu"), timing, cells=cells)
    for cell, row in zip(cells, rows):
        assert row["kind"] == "sparse" and row["mode"] == cell.mode and row["mask"] == cell.mask
        mask = bench_sparse.block_mask(cell.mask, cell.H, 3, torch.device("cpu"))
        kept = int(mask.sum()) * cell.B
        assert row["kept_flops"] == 4.0 * 128 * 128 * 16 * kept * (2.5 if cell.mode == "bwd" else 1)
        assert row["flashattn"] > 0 and row["dense"] > 0
        assert row[bench_sparse.PER_CALL] > 0  # ours given the raw mask, compressed per call
        assert row["path"] == ("cpu" if cell.mode == "fwd" else "cpu+cpu")  # kernel_path's
        # ours and Flex agree on the same inputs (fp32: rounding only)
        assert row["flex_max_diff"] < 1e-4, row
        if cell.mode == "fwd":
            assert row["flex"] > 0  # Flex has no backward on the CPU
    spec = importlib.util.spec_from_file_location(
        "make_table", os.path.join(ROOT, "benchmarks", "make_table.py"))
    make_table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_table)
    lines = make_table.sparse_table(rows)
    assert len([ln for ln in lines if ln.startswith("| fwd") or ln.startswith("| bwd")]) == 4
    assert any(ln.startswith("fwd: ×flex median") for ln in lines)
    assert "| cpu |" in lines[2] and "mask per call" in lines[0]
