"""flashattn test suite.

Run (CPU everywhere, CUDA too when a GPU is present; same files):

    cd /work/main && python -m pytest -q tests            # whole suite (about a minute on 2 cores)
    python -m pytest -q tests -k "not compile"            # skip the torch.compile tests
    FLASHATTN_TEST_SEED=1234 python -m pytest tests/test_attention.py -k "d59"   # reproduce

Every test draws fresh random inputs from a per-test seed (os.urandom); a failing test
prints `FLASHATTN_TEST_SEED=<seed>` in its report, and setting that variable replays it.
Fresh allocations are NaN-poisoned (deterministic algorithms + fill_uninitialized_memory),
so an output element the kernels never write fails the NaN check.

Tolerance rule (tests/helpers.py: assert_close): max |ours - ref64| <= 2x (3x for
gradients) max |lowp - ref64| + tiny, where ref64 is tests/reference.py in float64, lowp the
same PyTorch computation in the inputs' dtype (fp16/bf16/fp32), and tiny = eps(dtype) *
max|ref64| (16x for fp32) + 64 fp32 ulps of the quantity's magnitude (fp32 accumulation
noise, which only matters where the exact answer is 0). Never a bare atol.

On a GPU machine, FLASHATTN_REQUIRE_CUDA=1 (set by tools/gpu_job.sh) turns a CUDA case skipped
for want of a kernel (the build has none, a head dim or arch left out) into a failure: a build
without CUDA kernels must not read as "N passed, M skipped". Under FLASHATTN_FORCE_BACKEND=sm90, a call the
sm90 forward does not take raises a named error, which becomes a skip giving the reason.

Files: test_reference (the reference itself against SDPA), test_attention (padded covering
set + hard corners), test_varlen, test_api (packed APIs, return_attn_probs, deterministic,
non-contiguous), test_opcheck, test_compile, test_bad_input, test_bad_metadata,
test_stable_abi, test_torch_version (the import-time check of torch against the build),
test_kvcache (flash_attn_with_kvcache and paged KV against the reference), test_kvcache_edges
(its wrong metadata, argument errors, compile, opcheck), test_cuda (CUDA-only extras),
test_dropout and test_sinks (issue 15: dropout, attention sinks), test_block_sparse (issue 16:
block-sparse attention, CPU and the sm80 kernels), test_fp8 (issue 14: the
FP8 forward against the emulation of tests/reference.py, CPU and the sm90 kernel), test_build_flags (FLASHATTN_DISABLE_* plumbing),
test_bench_fp8 (bench_attn.py --dtype fp8), test_backend (the backend
choice, the sm90 forward, these rules), test_build_archs (setup's arch-list rules), test_bench_* (the benchmark),
test_suite_selection (every CUDA-only test is one the GPU jobs' `-k cuda` selects: mark such
tests without a `device` parameter @pytest.mark.cuda).
"""
import logging
import os

import pytest
import torch

from helpers import DEVICES

torch.use_deterministic_algorithms(True, warn_only=True)
torch.utils.deterministic.fill_uninitialized_memory = True


def _cpu_budget():
    """CPUs this process may use: its affinity mask, capped by a cgroup CPU quota (a
    container's "16 cores" is often a quota on a larger host, which OpenMP does not see)."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    for path in ("/sys/fs/cgroup/cpu.max", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"):
        try:
            with open(path) as f:
                fields = f.read().split()
            if path.endswith("cfs_quota_us"):
                with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
                    fields.append(f.read().strip())
        except (OSError, ValueError):
            continue
        if len(fields) == 2 and fields[0] not in ("max", "-1") and int(fields[1]) > 0:
            n = min(n, max(1, -(-int(fields[0]) // int(fields[1]))))
        break
    return max(1, n)


# The float64 reference runs on the CPU in every test, CUDA cases included. Under pytest-xdist
# (-n 8) each worker's torch would start an OpenMP pool as wide as the machine: 8 pools of 16
# spinning threads on 16 cores made each reference op wait on descheduled threads (5x slower
# measured at the same 8x oversubscription on 2 cores). Each worker gets its share; an explicit
# OMP_NUM_THREADS is left alone.
if "OMP_NUM_THREADS" not in os.environ:
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    _threads = max(1, _cpu_budget() // max(1, _workers))
    if _threads < torch.get_num_threads():
        torch.set_num_threads(_threads)

# torch's structured-trace logger emits DEBUG records that pytest would capture and print
# (thousands of lines) with every failing torch.compile test.
logging.getLogger("torch.__trace").propagate = False

_SEED_KEY = pytest.StashKey[int]()


def pytest_configure(config):
    # CUDA-only tests without a `device` parameter carry this marker, so that the GPU jobs'
    # `-k cuda` selects them (test_suite_selection.py checks that they do).
    config.addinivalue_line("markers", "cuda: a CUDA-only test (selected by -k cuda)")


def pytest_generate_tests(metafunc):
    if "device" in metafunc.fixturenames and not any(
        "device" in m.args[0] for m in metafunc.definition.iter_markers("parametrize")
    ):
        metafunc.parametrize("device", DEVICES)


@pytest.fixture(autouse=True)
def seed(request):
    """Fresh per-test seed (replay with FLASHATTN_TEST_SEED); reported on failure."""
    env = os.environ.get("FLASHATTN_TEST_SEED")
    s = int(env) if env else int.from_bytes(os.urandom(4), "little")
    request.node.stash[_SEED_KEY] = s
    request.node.user_properties.append(("seed", s))
    torch.manual_seed(s)
    return s


# The message of the error raised under FLASHATTN_FORCE_BACKEND=sm90 (csrc/api/backend_choice.h).
FORCED_SM90_MARK = "FLASHATTN_FORCE_BACKEND=sm90, but the sm90 forward does not take this call"
# The error of a CUDA call with a feature whose CUDA kernels are not written yet (issue 15:
# dropout, sinks, return_attn_probs' S; issue 16: block-sparse attention;
# csrc/api/backend_choice.h). Such a case runs and becomes a skip giving the error, a failure
# under FLASHATTN_REQUIRE_CUDA=1.
NOT_BUILT_MARK = "is not built yet (issue 15)"
NOT_BUILT_MARKS = (NOT_BUILT_MARK, "are not built yet (issue 15)")
# Skip reasons that mean "this build or machine has no kernel for it" (flashattn's errors).
MISSING_KERNEL_MARKS = ("this build has no", "left out of this build", "TORCH_CUDA_ARCH_LIST",
                        "needs a CUDA device", "do not run on compute capability",
                        *NOT_BUILT_MARKS)


def _is_cuda_case(item):
    callspec = getattr(item, "callspec", None)
    return "cuda" in item.nodeid or (callspec is not None and any(
        str(v).startswith("cuda") for v in callspec.params.values()))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if (report.failed and call.excinfo is not None
            and call.excinfo.type is RuntimeError
            and str(call.excinfo.value).startswith("flashattn: " + FORCED_SM90_MARK)):
        # Forced onto sm90, the call is one sm90 does not take: a skip that says why.
        reason = str(call.excinfo.value).strip().splitlines()[0]
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {reason}")
        return
    # Also a head-dim bucket a narrowed build (FLASHATTN_HEADDIMS) left out, met on a path the
    # case's own check did not foresee (e.g. a dropout backward that falls back to sm80).
    if (report.failed and call.excinfo is not None and call.excinfo.type is RuntimeError
            and _is_cuda_case(item)
            and any(m in str(call.excinfo.value)
                    for m in (*NOT_BUILT_MARKS, "left out of this build"))):
        reason = str(call.excinfo.value).strip().splitlines()[0]
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {reason}")
    if (report.skipped and os.environ.get("FLASHATTN_REQUIRE_CUDA") == "1"
            and _is_cuda_case(item)):
        reason = str(report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr)
        if any(mark in reason for mark in MISSING_KERNEL_MARKS):
            report.outcome = "failed"
            report.longrepr = f"FLASHATTN_REQUIRE_CUDA=1, but this CUDA case skipped: {reason}"
            return
    if report.failed and _SEED_KEY in item.stash:
        report.sections.append(
            ("seed", f"reproduce with FLASHATTN_TEST_SEED={item.stash[_SEED_KEY]}"))


def pytest_sessionstart(session):
    if os.environ.get("FLASHATTN_REQUIRE_CUDA") == "1" and not torch.cuda.is_available():
        raise pytest.UsageError("FLASHATTN_REQUIRE_CUDA=1 but torch sees no CUDA device")

