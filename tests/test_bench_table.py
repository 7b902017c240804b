"""benchmarks/make_table.py on a synthetic result: the deterministic column and summary, and
that our deterministic variant is never taken for a peer."""
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _make_table():
    spec = importlib.util.spec_from_file_location(
        "make_table", os.path.join(ROOT, "benchmarks", "make_table.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(mode, N, ours, det, peer):
    row = {"mode": mode, "dtype": "bf16", "d": 128, "causal": True, "N": N, "B": 1, "H": 16,
           "path": "sm80"}
    for name, value in (("flashattn", ours), ("flashattn_det", det), ("sdpa_eff", peer)):
        row[name] = value
        row[f"{name}_ms_median"] = None if value is None else 1.0 / value
        row[f"{name}_ms_spread"] = None if value is None else 0.01
    return row


def test_det_column_and_summary():
    mt = _make_table()
    rows = [_row("fwd", 2048, 300.0, None, 200.0), _row("bwd", 2048, 200.0, 150.0, 250.0),
            _row("bwd", 4096, 250.0, 225.0, 100.0)]
    header = {"gpu": "X", "torch": "t", "cuda": "c", "cudnn": 1, "date": "d", "commit": "abc"}
    text = mt.markdown({"header": header, "rows": rows}, "sdpa_flash")
    # The reference falls back to a peer, never to our deterministic variant.
    assert "×sdpa_eff" in text and "×flashattn_det" not in text
    bwd = text[text.index("## bwd"):]
    assert "det ÷ default" in bwd
    assert "| 0.75 |" in bwd and "| 0.90 |" in bwd  # 150/200 and 225/250
    assert "median 0.82, min 0.75; below 0.8: d 128 causal N 2048 (0.75)." in text
    # ×best over the peer only: 200/250 and 250/100.
    assert "| 0.80 | 0.80 | sdpa_eff |" in bwd and "| 2.50 | 2.50 | sdpa_eff |" in bwd


def _peer_row(mode, d, N, values):
    row = {"mode": mode, "dtype": "bf16", "d": d, "causal": False, "N": N, "B": 1, "H": 16,
           "path": "sm90" if mode == "fwd" else "sm90+sm80"}
    for name, value in values.items():
        row[name] = value
        row[f"{name}_ms_median"] = None if value is None else 1.0 / value
        row[f"{name}_ms_spread"] = None if value is None else 0.01
    return row


def _peer_rows():
    names = ("flashattn", "sdpa_flash", "sdpa_cudnn", "fa4")
    cells = [("fwd", 128, 2048, (300.0, 300.0, 600.0, 150.0)),  # ours over: 1, 0.5, 2
             ("fwd", 128, 4096, (400.0, 200.0, 400.0, 800.0)),  # 2, 1, 0.5
             ("fwd", 128, 8192, (500.0, 250.0, 250.0, 625.0)),  # 2, 2, 0.8
             ("fwd", 256, 2048, (200.0, 100.0, 400.0, None)),   # 2, 0.5, fa4 rejects
             ("bwd", 128, 2048, (100.0, 50.0, 200.0, 100.0))]   # 2, 0.5, 1
    return [_peer_row(mode, d, N, dict(zip(names, values))) for mode, d, N, values in cells]


def test_summary_over_cudnn_and_fa4():
    mt = _make_table()
    header = {"gpu": "NVIDIA H200", "torch": "t", "cuda": "c", "cudnn": 1, "date": "d",
              "commit": "abc", "fa4": "4.0.0b36", "cutlass_dsl": "4.8.1", "fa4_off": None}
    text = mt.markdown({"header": header, "rows": _peer_rows()}, "sdpa_flash")
    assert text.startswith("# flashattn vs SDPA and FlashAttention-4 on NVIDIA H200")
    assert "cuDNN 1, FlashAttention-4 4.0.0b36 (CuTe DSL 4.8.1), d, commit abc." in text
    # fa4 is a peer column of the cell table, null where it rejected the cell.
    assert "| path | flashattn | sdpa_flash | sdpa_cudnn | fa4 | ×sdpa_flash |" in text
    assert "| 256 | no | 2048 | 1 | 16 | sm90 | 200 | 100 | 400 | — | 2.00 | 0.50 " \
        "| sdpa_cudnn |" in text
    summary = text[text.index("## Summary"):]
    assert ("| median ×best | min ×best | median ×sdpa_cudnn | min ×sdpa_cudnn "
            "| median ×fa4 | min ×fa4 |") in summary
    # best per cell: 600, 800, 625, 400 (fwd) and 200 (bwd).
    assert "| fwd | d ∈ {64, 128}, N ≥ 2048 | 3 (0) | 2.00 | 1.00 | 0.50 | 0.50 | " \
        "1.00 | 0.50 | 0.80 | 0.50 |" in summary
    assert "| fwd | whole grid | 4 (0) | 2.00 | 1.00 | 0.50 | 0.50 | 0.75 | 0.50 | 0.80 | 0.50 |" \
        in summary
    assert "| bwd | whole grid | 1 (0) | 2.00 | 2.00 | 0.50 | 0.50 | 0.50 | 0.50 | 1.00 | 1.00 |" \
        in summary
    # fa4's whole-grid forward ratio covers the 3 cells it ran, not the 4 of ×best.
    assert "Ratios over fewer cells (the peer rejects the others): " \
        "×fa4 fwd whole grid: 3 of 4." in summary


def test_summary_without_fa4():
    mt = _make_table()
    rows = _peer_rows()
    for row in rows:
        for key in ("fa4", "fa4_ms_median", "fa4_ms_spread"):
            del row[key]
    header = {"gpu": "NVIDIA H200", "torch": "t", "cuda": "c", "cudnn": 1, "date": "d",
              "commit": "abc", "device": "cuda", "fa4_off": "import flash_attn.cute failed"}
    text = mt.markdown({"header": header, "rows": rows}, "sdpa_cudnn")
    assert "fa4 |" not in text and "×fa4" not in text and "FlashAttention-4 " not in text
    assert "No fa4 column: import flash_attn.cute failed." in text
    # sdpa_cudnn as the reference is not repeated among the extra summary columns.
    assert "| median ×sdpa_cudnn | min ×sdpa_cudnn | median ×best | min ×best |\n" in text
    # best per cell without fa4: 600, 400, 250, 400.
    assert "| fwd | whole grid | 4 (0) | 0.75 | 0.50 | 0.75 | 0.50 |\n" in text
    assert "Ratios over fewer cells" not in text


def test_make_table_runs_without_torch(tmp_path):
    import json
    import subprocess
    import sys
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"header": {"gpu": None, "device": "cpu", "torch": "t",
                                           "cuda": None, "cudnn": None, "date": "d",
                                           "commit": "abc"}, "rows": _peer_rows()}))
    script = os.path.join(ROOT, "benchmarks", "make_table.py")
    code = ("import runpy, sys; sys.modules['torch'] = None; "  # import torch now fails
            f"sys.argv = [{script!r}, {str(path)!r}]; runpy.run_path({script!r}, "
            "run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "| median ×fa4 | min ×fa4 |" in done.stdout


def test_dropout_and_sink_columns_and_summary():
    """bench_attn.py --dropout / --sink: our variants get ratio columns and a summary, never
    a peer's place."""
    mt = _make_table()
    names = ("flashattn", "flashattn_drop", "flashattn_sink", "sdpa_cudnn")
    rows = [_peer_row("fwd", 128, 2048, dict(zip(names, (400.0, 320.0, 396.0, 500.0)))),
            _peer_row("fwd", 128, 8192, dict(zip(names, (500.0, 450.0, 490.0, 500.0)))),
            _peer_row("bwd", 128, 4096, dict(zip(names, (300.0, 270.0, 297.0, 250.0))))]
    header = {"gpu": "X", "torch": "t", "cuda": "c", "cudnn": 1, "date": "d", "commit": "abc"}
    text = mt.markdown({"header": header, "rows": rows}, "sdpa_cudnn")
    assert "dropout ÷ default" in text and "sink ÷ default" in text
    assert "×flashattn_drop" not in text and "×flashattn_sink" not in text
    fwd = text[text.index("## fwd"):text.index("## bwd")]
    assert "| 0.80 | 0.99 |" in fwd and "| 0.90 | 0.98 |" in fwd  # 320/400 396/400, 450/500 490/500
    assert "dropout ÷ default, fwd, d 128, N ≥ 2048: median 0.85, min 0.80 (2 cells)." in text
    assert "sink ÷ default, bwd, every cell: median 0.99, min 0.99 (1 cells)." in text
