"""Issue 13's decode cells, a chosen few, ours beside SDPA's backends in one process (the
benchmark's own timing, flashattn/bench_decode.py): for a quick check of the small-batch cells
between full grids. Usage: python3 tools/device/decode_cells.py [--cells 1x4096 8x4096p256 ...]
[--impls flashattn sdpa_flash sdpa_cudnn]."""
import argparse

import torch

from flashattn import bench
from flashattn.bench_decode import DecodeCell, run_grid


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", nargs="+",
                    default=["1x4096", "1x16384", "1x65536", "8x4096", "8x16384", "1x16384p256"])
    ap.add_argument("--impls", nargs="+", default=[bench.OURS, "sdpa_flash", "sdpa_cudnn"])
    args = ap.parse_args()
    cells = []
    for spec in args.cells:
        b, rest = spec.split("x")
        n, _, page = rest.partition("p")
        cells.append(DecodeCell(int(b), int(n), page=int(page or 0)))
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    run_grid(torch.device("cuda"), bench.Timing(), args.impls, cells)


if __name__ == "__main__":
    main()
