"""The Hopper forward's tile deals (csrc/sm90/tile_order_sm90.h), checked on the host:
tools/check_fwd_tile_order.cpp gives every tile to exactly one CTA over random list sizes and
grids (none after a CTA's end, which the kernel stops at), and holds the causal pair deal within
10% of the ideal makespan of a schedule model on the benchmark's cells."""
from helpers import needs_host_cxx, run_host_check


@needs_host_cxx
def test_fwd_tile_deals(tmp_path):
    run_host_check(tmp_path, "check_fwd_tile_order.cpp", 300)
