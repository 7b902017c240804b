"""benchmarks/bench_attn.py and flashattn.bench around the peers, on the CPU: the fa4 adapter,
--require-peer (FA4 not importable, not usable on this device, a peer without a number), the
versions in the JSON header, and the bwd kernel path."""
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import types

import pytest
import torch

from flashattn import bench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_attn.py")
TINY = ["--device", "cpu", "--N", "64", "--tokens", "64", "--hidden", "64", "--d", "64",
        "--causal", "0", "--warmup-ms", "0", "--rep-ms", "0"]


def _bench_attn():
    spec = importlib.util.spec_from_file_location("bench_attn", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def fa4_missing(monkeypatch):
    """flash_attn.cute cannot be imported, whatever is installed."""
    monkeypatch.setitem(sys.modules, "flash_attn", None)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)
    bench.fa4_func.cache_clear()
    yield
    bench.fa4_func.cache_clear()


@pytest.fixture
def fa4_fake(monkeypatch):
    """flash_attn.cute imports, with a flash_attn_func that records its calls."""
    calls = []

    def flash_attn_func(q, k, v, causal=False):
        calls.append((q.shape, causal))
        return q * 2, torch.zeros(q.shape[0], q.shape[2], q.shape[1])

    cute = types.ModuleType("flash_attn.cute")
    cute.flash_attn_func = flash_attn_func
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    bench.fa4_func.cache_clear()
    yield calls
    bench.fa4_func.cache_clear()


def _main(monkeypatch, argv):
    monkeypatch.setattr(sys, "argv", [SCRIPT] + argv)
    _bench_attn().main()


def test_require_fa4_not_importable(monkeypatch, tmp_path, fa4_missing, capsys):
    out = tmp_path / "result.json"
    with pytest.raises(SystemExit) as exit_info:
        _main(monkeypatch, TINY + ["--modes", "fwd", "--require-peer", "fa4",
                                   "--json", str(out)])
    message = str(exit_info.value.code)
    assert "--require-peer" in message and "fa4: import flash_attn.cute failed" in message
    assert not out.exists()
    assert "TFLOP/s" not in capsys.readouterr().out  # failed before timing anything


def test_require_fa4_exit_status(tmp_path):
    """The same as a command: a non-zero exit status and the reason on stderr."""
    out = tmp_path / "result.json"
    argv = [SCRIPT] + TINY + ["--modes", "fwd", "--require-peer", "sdpa", "fa4",
                              "--json", str(out)]
    code = ("import runpy, sys; sys.modules['flash_attn'] = None; "  # flash_attn.cute fails
            f"sys.argv = {argv!r}; runpy.run_path({SCRIPT!r}, run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "cannot set up fa4: import flash_attn.cute failed" in done.stderr
    assert not out.exists()


def test_fa4_optional_when_not_required(monkeypatch, tmp_path, fa4_missing):
    out = tmp_path / "result.json"
    _main(monkeypatch, TINY + ["--modes", "fwd", "--json", str(out)])
    result = json.loads(out.read_text())
    assert result["header"]["fa4_off"].startswith("import flash_attn.cute failed")
    assert [row["flashattn"] > 0 and row["sdpa"] > 0 for row in result["rows"]] == [True]
    assert "fa4" not in result["rows"][0]


def test_require_fa4_on_cpu(monkeypatch, tmp_path, fa4_fake):
    """FA4 imports but is not a peer on the CPU: required, that is an error too."""
    with pytest.raises(SystemExit) as exit_info:
        _main(monkeypatch, TINY + ["--modes", "fwd", "--require-peer", "fa4"])
    assert "fa4: FlashAttention-4 runs on CUDA devices only" in str(exit_info.value.code)
    assert fa4_fake == []


def test_require_peer_without_numbers(monkeypatch, tmp_path, capsys):
    """A required peer set up but rejecting every cell fails the run, and no JSON is written."""
    def reject(q, k, v, causal):
        raise RuntimeError("sdpa: not this cell")
    monkeypatch.setattr(bench, "_sdpa", reject)
    out = tmp_path / "result.json"
    with pytest.raises(SystemExit) as exit_info:
        _main(monkeypatch, TINY + ["--modes", "fwd", "bwd", "--require-peer", "sdpa",
                                   "--json", str(out)])
    assert "sdpa gave no number in any of the 2 cells" in str(exit_info.value.code)
    assert not out.exists()
    assert "sdpa rejects fwd d=64" in capsys.readouterr().err


def test_header_versions(monkeypatch, fa4_missing):
    versions = {"flash-attn-4": "4.0.0b36", "nvidia-cutlass-dsl": "4.8.1"}

    def version(dist):
        if dist not in versions:
            raise importlib.metadata.PackageNotFoundError(dist)
        return versions[dist]
    bench_attn = _bench_attn()
    monkeypatch.setattr(sys, "argv", [SCRIPT] + TINY)
    args = bench_attn.parse_args()
    monkeypatch.setattr(importlib.metadata, "version", version)
    head = bench_attn.header(torch.device("cpu"), args)
    assert (head["fa4"], head["cutlass_dsl"]) == ("4.0.0b36", "4.8.1")
    versions.clear()
    head = bench_attn.header(torch.device("cpu"), args)
    assert (head["fa4"], head["cutlass_dsl"]) == (None, None)


def test_fa4_impl_on_cuda(fa4_fake):
    """On a CUDA device (only named here: nothing runs on it) fa4 is a peer on (B, N, H, d)
    that returns FA4's out and takes any exception as a rejected cell."""
    impls = {impl.name: impl for impl in bench.implementations(torch.device("cuda"))}
    assert "fa4" in impls and "sdpa" not in impls
    fa4 = impls["fa4"]
    assert not fa4.heads_first and fa4.rejects == (Exception,)
    q = torch.randn(2, 5, 3, 8)
    torch.testing.assert_close(fa4.fn(q, q, q, True), q * 2, rtol=0, atol=0)
    assert fa4_fake == [((2, 5, 3, 8), True)]
    assert "fa4" not in bench.unavailable_peers(torch.device("cuda"))


def test_fa4_rejection_is_null(capsys):
    def unsupported(q, k, v, causal):
        raise AssertionError("(head_dim, head_dim_v)=(72, 72) is not supported")
    impl = bench.Impl("fa4", unsupported, heads_first=False, rejects=(Exception,))
    cell = bench.Cell("fwd", torch.float32, 72, False, 16, B=1, H=1)
    rows = bench.run_cells([cell], [bench.implementations(torch.device("cpu"))[0], impl],
                           torch.device("cpu"), bench.Timing(0, 0, min_reps=1))
    assert rows[0]["flashattn"] > 0  # the other implementations of the cell still run
    assert rows[0]["fa4"] is None and rows[0]["fa4_ms_median"] is None
    assert "fa4 rejects fwd d=72 causal=0 N=16 B=1 H=1: AssertionError: (head_dim" \
        in capsys.readouterr().err
    # A peer that rejects only by RuntimeError lets the assertion through.
    with pytest.raises(AssertionError):
        bench.attempt(bench.Impl("sdpa_x", unsupported, heads_first=True), cell,
                      lambda: unsupported(None, None, None, False))


def test_kernel_path_bwd(monkeypatch):
    cell = bench.Cell("bwd", torch.float32, 64, True, 16, B=1, H=2)
    assert bench.kernel_path(cell, torch.device("cpu")) == "cpu+cpu"
    fwd = bench.Cell("fwd", torch.float32, 64, True, 16, B=1, H=2)
    assert bench.kernel_path(fwd, torch.device("cpu")) == "cpu"
    paths = {"fwd": "sm90", "bwd": "sm80"}
    monkeypatch.setattr(bench.flashattn, "kernel_path",
                        lambda q, k, v, causal, direction: paths[direction])
    assert bench.kernel_path(cell, torch.device("cpu")) == "sm90+sm80"
    assert bench.kernel_path(fwd, torch.device("cpu")) == "sm90"

    def no_bwd(q, k, v, causal, direction):
        if direction == "bwd":
            raise RuntimeError("flashattn: no backward kernel for this call")
        return "sm90"
    monkeypatch.setattr(bench.flashattn, "kernel_path", no_bwd)
    assert bench.kernel_path(cell, torch.device("cpu")) is None
    assert bench.kernel_path(fwd, torch.device("cpu")) == "sm90"


def test_impls_filter_keeps_asked_variants():
    """--impls names peers; the variant columns the flags ask for (and FP8's bf16 base) stay:
    a run with `--deterministic --impls flashattn sdpa_cudnn` must still time flashattn_det."""
    cpu = torch.device("cpu")
    names = [i.name for i in bench.implementations(cpu, ["flashattn"], deterministic=True,
                                                   dropout=True, sink=True)]
    assert names == [bench.OURS, bench.OURS_DET, bench.OURS_DROP, bench.OURS_SINK]
    assert [i.name for i in bench.implementations(cpu, ["sdpa"])] == ["sdpa"]
    assert [i.name for i in bench.fp8_implementations(["flashattn"])] == [bench.OURS,
                                                                          bench.OURS_BF16]
