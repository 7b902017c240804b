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
