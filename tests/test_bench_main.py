"""The main job, `python -m flashattn.bench`: its closing summary of ratios and --plot."""
import sys

import pytest

from flashattn import bench


def _row(mode, d, N, causal, ours, sdpa):
    return {"mode": mode, "d": d, "N": N, "causal": causal, "B": 1, "H": 8, "path": "cpu",
            "flashattn": ours, "sdpa": sdpa}


ROWS = [_row("fwd", 64, 1024, False, 2.0, 1.0), _row("fwd", 64, 2048, False, 1.0, 2.0),
        _row("fwd", 64, 4096, True, 3.0, 1.0), _row("bwd", 64, 1024, False, 1.0, None)]


def test_summary_lines():
    lines = bench.summary_lines(ROWS, ["flashattn", "sdpa"])
    assert lines[0].startswith("summary:")
    fwd = next(line for line in lines if line.strip().startswith("fwd:"))
    assert "xsdpa 2.00 (min 0.50 at d=64 N=2048)" in fwd  # ratios 2, 0.5, 3
    bwd = next(line for line in lines if line.strip().startswith("bwd:"))
    assert "xsdpa -" in bwd  # the peer ran no bwd cell


def test_plot_without_matplotlib(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert bench.plot_rows(ROWS, ["flashattn", "sdpa"], str(tmp_path)) == []
    assert "matplotlib is not installed" in capsys.readouterr().err


def test_plot_writes_charts(tmp_path):
    pytest.importorskip("matplotlib")
    paths = bench.plot_rows([dict(r, dtype="fp32") for r in ROWS], ["flashattn", "sdpa"],
                            str(tmp_path))
    assert sorted(p.rsplit("/", 1)[1] for p in paths) == ["bwd_fp32.png", "fwd_fp32.png"]


def test_main_prints_summary_and_plots(monkeypatch, tmp_path, capsys):
    """main() on the CPU path (timing replaced by fixed rows) ends with the summary and
    hands --plot's folder to the charts."""
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(bench, "run_cells", lambda cells, impls, device, timing, unit: ROWS)
    plotted = []
    monkeypatch.setattr(bench, "plot_rows", lambda rows, names, out: plotted.append(out))
    assert bench.main(["--plot", str(tmp_path)]) == ROWS
    out = capsys.readouterr().out
    assert "summary: our speed over each peer's" in out and "xsdpa 2.00" in out
    assert plotted == [str(tmp_path)]
