"""flashattn test suite.

Run (CPU everywhere, CUDA too when a GPU is present; same files):

    cd /work/main && python -m pytest -q tests            # whole suite (~10 min on 2 cores)
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

Files: test_reference (the reference itself against SDPA), test_attention (padded covering
set + hard corners), test_varlen, test_api (packed APIs, return_attn_probs, deterministic,
non-contiguous), test_opcheck, test_compile, test_bad_input, test_bad_metadata,
test_stable_abi, test_cuda (CUDA-only extras).
"""
import logging
import os

import pytest
import torch

from helpers import DEVICES

torch.use_deterministic_algorithms(True, warn_only=True)
torch.utils.deterministic.fill_uninitialized_memory = True

# torch's structured-trace logger emits DEBUG records that pytest would capture and print
# (thousands of lines) with every failing torch.compile test.
logging.getLogger("torch.__trace").propagate = False

_SEED_KEY = pytest.StashKey[int]()


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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and _SEED_KEY in item.stash:
        report.sections.append(
            ("seed", f"reproduce with FLASHATTN_TEST_SEED={item.stash[_SEED_KEY]}"))

