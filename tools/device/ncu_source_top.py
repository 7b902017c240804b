"""Summarises `ncu -i REPORT --page source --csv --print-source sass` output: the SASS
instructions with the most warp-stall samples, and the samples per opcode. Column names are
looked up by substring (they vary between Nsight Compute versions); the header is printed if
the needed ones are missing."""
import csv
import sys
from collections import Counter


def num(x):
    try:
        return float(str(x).replace(",", ""))
    except ValueError:
        return 0.0


def main(path, top=40):
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    start = next((i for i, r in enumerate(rows) if any("Source" in c for c in r)), None)
    if start is None:
        print("no header with 'Source' found; first lines:", rows[:3])
        return 1
    head, body = rows[start], rows[start + 1:]

    def col(*keys):
        for i, c in enumerate(head):
            if all(k.lower() in c.lower() for k in keys):
                return i
        return None

    src = col("source")
    addr = col("address")
    stall = col("warp stall sampling", "all")
    if stall is None:
        stall = col("stall sampling")
    execd = col("instructions executed")
    if src is None or stall is None:
        print("columns not found; header:", head)
        return 1
    total = sum(num(r[stall]) for r in body if len(r) > stall)
    print(f"{len(body)} SASS lines, {total:.0f} stall samples; columns: {head[stall]!r}")
    ranked = sorted((r for r in body if len(r) > stall), key=lambda r: -num(r[stall]))
    for r in ranked[:top]:
        a = r[addr] if addr is not None else ""
        e = r[execd] if execd is not None and len(r) > execd else ""
        print(f"{num(r[stall]) / max(total, 1) * 100:5.1f}%  {a:>8}  {e:>12}  {r[src].strip()}")
    by_op = Counter()
    for r in body:
        if len(r) > stall:
            parts = r[src].split()
            op = next((p for p in parts if not p.startswith("@")), "?").split(".")[0]
            by_op[op] += num(r[stall])
    print("stall samples by opcode:")
    for op, v in by_op.most_common(20):
        print(f"  {op:10s} {v / max(total, 1) * 100:5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
