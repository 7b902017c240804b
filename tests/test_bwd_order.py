"""The deterministic backward's add orders (csrc/sm80/bwd_order_sm80.h), checked on the host:
tools/check_bwd_order.cpp compares each rank formula with a brute-force order over random
shapes, windows and tiles, and runs the waits to the end (no deadlock); and the sm90
backward's dQ staging order (tools/check_bwd_dq_stage.cpp)."""
from helpers import needs_host_cxx, run_host_check


@needs_host_cxx
def test_bwd_orders(tmp_path):
    run_host_check(tmp_path, "check_bwd_order.cpp", 400)


@needs_host_cxx
def test_sm90_dq_stage_order(tmp_path):
    """The sm90 backward's dQ staging order (csrc/sm90/bwd_layout_sm90.h): every block stored
    once where the reduce box expects it, and the swapped order's half-warp stores conflict-free
    (tools/check_bwd_dq_stage.cpp, exhaustive)."""
    run_host_check(tmp_path, "check_bwd_dq_stage.cpp", 1)


@needs_host_cxx
def test_sm90_det_dq_order(tmp_path):
    """The sm90 deterministic backward's dQ order (csrc/sm90/bwd_layout_sm90.h): at every query
    block the visiting key blocks' turns are 0 .. count - 1, and the waits end with key blocks
    dispatched in index order onto 1, 2, 7 or all slots, each visiting its query blocks from
    the last down (tools/check_bwd_det_sm90.cpp, random shapes, masks and tiles); and the two
    dQ warps' hand-over (bwd_dq_hand_barrier) over random interleavings under named barriers'
    counting, where one shared barrier must be seen to fail."""
    run_host_check(tmp_path, "check_bwd_det_sm90.cpp", 300)
