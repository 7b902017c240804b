"""The deterministic backward's add orders (csrc/sm80/bwd_order_sm80.h), checked on the host:
tools/check_bwd_order.cpp compares each rank formula with a brute-force order over random
shapes, windows and tiles, and runs the waits to the end (no deadlock)."""
from helpers import needs_host_cxx, run_host_check


@needs_host_cxx
def test_bwd_orders(tmp_path):
    run_host_check(tmp_path, "check_bwd_order.cpp", 400)
