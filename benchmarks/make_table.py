"""Markdown tables from a bench_attn.py JSON file (the benchmarks/results/*.md files).

  python benchmarks/make_table.py benchmarks/results/h200.json > benchmarks/results/h200.md

Per mode a table of the cells: TFLOP/s per implementation, our speed-up over the reference
peer (sdpa_flash) and over the best peer of the cell (and, with flashattn_det, our
deterministic backward's speed over our default one); then a summary of those ratios, and
of our speed over sdpa_cudnn and FlashAttention-4 (fa4) where they ran, (median and min)
over the cells with d in {64, 128} and N >= 2048, and over all cells.
Needs only the JSON (no torch, no flashattn build).
"""

import argparse
import json
import statistics

OURS = "flashattn"
OURS_DET = "flashattn_det"  # ours with deterministic=True (bench_attn.py --deterministic)
# Ours with an option (bench_attn.py --deterministic / --dropout / --sink): ratio column titles.
VARIANTS = {OURS_DET: "det ÷ default", "flashattn_drop": "dropout ÷ default",
            "flashattn_sink": "sink ÷ default"}
OURS_ALL = (OURS, *VARIANTS)
REFERENCE = "sdpa_flash"
FA4 = "fa4"
SUMMARY_PEERS = ("sdpa_cudnn", FA4)  # the strongest peers: the summary has ours over each


def implementations(rows: list) -> list:
    """Every implementation named in the rows (a name with a _ms_median key), in order."""
    return list(dict.fromkeys(key.removesuffix("_ms_median") for row in rows for key in row
                              if key.endswith("_ms_median")))


def variant_ratio(row: dict, name: str):
    """Our speed with an option (VARIANTS) over our default (None where either is missing)."""
    with_option, default = row.get(name), row.get(OURS)
    return with_option / default if with_option and default else None


def det_ratio(row: dict):
    """Our deterministic speed over our default speed (None where either is missing)."""
    return variant_ratio(row, OURS_DET)


def over(row: dict, peer):
    """Our TFLOP/s over the peer's (None where either is missing)."""
    ours = row.get(OURS)
    return ours / row[peer] if ours and peer and row.get(peer) else None


def speedups(row: dict, peers: list, reference: str) -> tuple:
    """Our TFLOP/s over the reference peer's and over the best peer's (None where missing),
    and the best peer's name."""
    ran = [peer for peer in peers if row.get(peer)]
    best = max(ran, key=lambda peer: row[peer]) if ran else None
    return over(row, reference), over(row, best), best


def fmt(value, spec: str = ".4g") -> str:
    return "—" if value is None else format(value, spec)


def cell_table(rows: list, names: list, reference: str) -> list:
    peers = [name for name in names if name not in OURS_ALL]
    variants = [v for v in VARIANTS if v in names and any(row.get(v) for row in rows)]
    lines = ["| d | causal | N | B | H | path | " + " | ".join(names)
             + f" | ×{reference} | ×best | best peer |"
             + "".join(f" {VARIANTS[v]} |" for v in variants),
             "|" + "---:|" * 5 + ":---|" + "---:|" * (len(names) + 2) + ":---|"
             + "---:|" * len(variants)]
    for row in sorted(rows, key=lambda r: (r["d"], r["causal"], r["N"])):
        over_ref, over_best, best = speedups(row, peers, reference)
        cells = [row["d"], "yes" if row["causal"] else "no", row["N"], row["B"], row["H"],
                 row.get("path") or "—"] + [fmt(row.get(name)) for name in names] + \
                [fmt(over_ref, ".2f"), fmt(over_best, ".2f"), best or "—"] + \
                [fmt(variant_ratio(row, v), ".2f") for v in variants]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def summary_table(rows: list, names: list, reference: str) -> list:
    """Per mode and subset: median and min of ours over the reference, the best peer and
    each of SUMMARY_PEERS in the rows (each ratio over the cells where both ran)."""
    peers = [name for name in names if name not in OURS_ALL]
    extra = [peer for peer in SUMMARY_PEERS if peer in peers and peer != reference]
    subsets = (("d ∈ {64, 128}, N ≥ 2048", lambda r: r["d"] in (64, 128) and r["N"] >= 2048),
               ("whole grid", lambda r: True))
    lines = [f"| mode | subset | cells (ours missing) | median ×{reference} | min ×{reference} "
             "| median ×best | min ×best |"
             + "".join(f" median ×{peer} | min ×{peer} |" for peer in extra),
             "|---|---|---:|" + "---:|---:|" * (2 + len(extra))]
    partial = []  # a peer that rejects cells: its ratios are over fewer cells than ×best's
    for mode in sorted({row["mode"] for row in rows}, key=["fwd", "bwd"].index):
        for label, keep in subsets:
            cells = [r for r in rows if r["mode"] == mode and keep(r)]
            best = [speedups(r, peers, reference)[1] for r in cells]
            columns = {reference: [over(r, reference) for r in cells], "best": best,
                       **{peer: [over(r, peer) for r in cells] for peer in extra}}
            ran = sum(ratio is not None for ratio in best)  # cells with ours and a peer
            stats = []
            for peer, ratios in columns.items():
                values = [ratio for ratio in ratios if ratio is not None]
                stats += [statistics.median(values), min(values)] if values else [None, None]
                if peer != "best" and len(values) < ran:
                    partial.append(f"×{peer} {mode} {label}: {len(values)} of {ran}")
            missing = sum(1 for r in cells if r[OURS] is None)
            lines.append(f"| {mode} | {label} | {len(cells)} ({missing}) | "
                         + " | ".join(fmt(s, ".2f") for s in stats) + " |")
    if partial:
        lines += ["", "Ratios over fewer cells (the peer rejects the others): "
                  + "; ".join(partial) + "."]
    return lines


def variant_summary(rows: list) -> list:
    """Dropout / sink over default speed, per mode: median and min over the cells with
    d = 128 and N >= 2048 (issue 15's cost targets) and over every cell."""
    lines = []
    for name in ("flashattn_drop", "flashattn_sink"):
        for mode in ("fwd", "bwd"):
            for label, keep in (("d 128, N ≥ 2048", lambda r: r["d"] == 128 and r["N"] >= 2048),
                                ("every cell", lambda r: True)):
                values = [variant_ratio(r, name) for r in rows if r["mode"] == mode and keep(r)]
                values = [v for v in values if v is not None]
                if values:
                    lines.append(f"{VARIANTS[name]}, {mode}, {label}: median "
                                 f"{statistics.median(values):.2f}, min {min(values):.2f} "
                                 f"({len(values)} cells).")
    return lines


def det_summary(rows: list) -> list:
    """Deterministic over default backward speed: median, min and the cells below 0.8."""
    ratios = [(det_ratio(r), r) for r in rows if r["mode"] == "bwd" and det_ratio(r)]
    if not ratios:
        return []
    values = [ratio for ratio, _ in ratios]
    low = [f"d {r['d']}{' causal' if r['causal'] else ''} N {r['N']} ({ratio:.2f})"
           for ratio, r in sorted(ratios, key=lambda x: x[0]) if ratio < 0.8]
    return [f"Deterministic backward over the default, {len(values)} cells: median "
            f"{statistics.median(values):.2f}, min {min(values):.2f}; below 0.8: "
            + (", ".join(low) if low else "none") + "."]


def memory_table(rows: list) -> list:
    names = [key for key in rows[0] if key not in ("N", "B", "H", "d", "causal")]
    lines = ["| N | " + " | ".join(names) + " |", "|" + "---:|" * (1 + len(names))]
    lines += ["| " + " | ".join([str(r["N"])] + [fmt(r[n], ".0f") for n in names]) + " |"
              for r in rows]
    return lines


def spread_note(rows: list, names: list) -> str:
    spreads = [row[f"{name}_ms_spread"] for row in rows for name in names
               if row.get(f"{name}_ms_spread") is not None]
    if not spreads:
        return ""
    return (f"Spread of the per-call times, (p90 − p10) / median: median "
            f"{statistics.median(spreads):.1%}, max {max(spreads):.1%}.")


SDPA_PEERS = ("sdpa_flash", "sdpa_cudnn", "sdpa_eff")


def decode_table(rows: list) -> list:
    """The decode rows (bench_attn.py --decode): TB/s of K / V read per implementation, our
    speed over the best SDPA backend and over FA4, then the targets' summary lines."""
    names = implementations(rows)
    peers = [n for n in names if n != OURS]
    out = ["| B | N | Sq | page | " + " | ".join(names) + " | ×best SDPA | ×fa4 |",
           "|" + "---|" * (len(names) + 6)]
    best_ratios, big = [], []
    for r in rows:
        sdpa = [r[p] for p in SDPA_PEERS if r.get(p)]
        best = max(sdpa) if sdpa else None
        x_best = r[OURS] / best if r.get(OURS) and best else None
        if x_best is not None:
            best_ratios.append((x_best, r))
        if r.get(OURS) and r["kv_bytes"] >= 256 * 2**20 and r["Sq"] == 1:
            big.append(r[OURS])
        page = (f"{r['page']} in order" if r.get("page_order") == "sequential" else r['page']) \
            if r['page'] else '-'
        out.append(f"| {r['B']} | {r['N']} | {r['Sq']} | {page} | "
                   + " | ".join(fmt(r.get(n), ".3g") for n in names)
                   + f" | {fmt(x_best, '.2f')} | {fmt(over(r, FA4 if FA4 in peers else None), '.2f')} |")
    out.append("")
    if big:
        out.append(f"Ours over the one-token cells reading >= 256 MiB: median "
                   f"{statistics.median(big):.2f} TB/s, min {min(big):.2f} ({len(big)} cells).")
    if best_ratios:
        low, at = min(best_ratios, key=lambda x: x[0])
        out.append(f"Ours over the best SDPA backend: median "
                   f"{statistics.median(x for x, _ in best_ratios):.2f}, min {low:.2f} "
                   f"(B={at['B']} N={at['N']} Sq={at['Sq']} page={at['page']}); "
                   f"{sum(x < 1 for x, _ in best_ratios)} of {len(best_ratios)} cells below 1.")
    if any(r.get("peers_from") for r in rows):
        out.append("Paged rows: the peers' numbers are their contiguous-cache timings of the "
                   "same run (they have no paged layout); pages in a random order over the "
                   "pool unless \"in order\" (the pool's page i is the cache's i-th).")
    return out


def sparse_table(rows: list) -> list:
    """The block-sparse rows (bench_attn.py --sparse): effective TFLOP/s of ours (its mask
    compressed once, and compressed at every call), Flex and our dense kernel, our speed over
    Flex and over dense, |ours - Flex| of one forward; then issue 16's targets per mode (x flex: fwd >= 1.4, bwd >= 1.25; x dense >= 0.9 where a query
    block row keeps >= 8 blocks on average)."""
    out = ["| mode | mask | d | N | B | H | path | density | blocks / row | flashattn | "
           "mask per call | flex | dense | ×flex | ×dense | max abs diff to flex |",
           "|" + "---|" * 16]
    for r in rows:
        out.append(f"| {r['mode']} | {r['mask']} | {r['d']} | {r['N']} | {r['B']} | {r['H']} | "
                   f"{r.get('path') or '—'} | "
                   f"{r['density']:.3f} | {r['kept_per_row']:.1f} | {fmt(r.get(OURS))} | "
                   f"{fmt(r.get('flashattn_mask_per_call'))} | "
                   f"{fmt(r.get('flex'))} | {fmt(r.get('dense'))} | "
                   f"{fmt(over(r, 'flex'), '.2f')} | {fmt(over(r, 'dense'), '.2f')} | "
                   f"{fmt(r.get('flex_max_diff'), '.2g')} |")
    out.append("")
    for mode, need in (("fwd", 1.4), ("bwd", 1.25)):
        cells = [r for r in rows if r["mode"] == mode]
        x_flex = [over(r, "flex") for r in cells if over(r, "flex") is not None]
        x_dense = [over(r, "dense") for r in cells
                   if r["kept_per_row"] >= 8 and over(r, "dense") is not None]
        if x_flex:
            out.append(f"{mode}: ×flex median {statistics.median(x_flex):.2f}, min "
                       f"{min(x_flex):.2f}, {sum(x < need for x in x_flex)} of {len(x_flex)} "
                       f"cells below {need}" + (
                           f"; ×dense (>= 8 blocks per row) median "
                           f"{statistics.median(x_dense):.2f}, min {min(x_dense):.2f}, "
                           f"{sum(x < 0.9 for x in x_dense)} of {len(x_dense)} below 0.9"
                           if x_dense else "") + ".")
    return out


def markdown(result: dict, reference: str) -> str:
    head, rows = result["header"], result["rows"]
    names = implementations(rows)
    if reference not in names:
        reference = next((name for name in names if name not in OURS_ALL), reference)
    dirty = " (+ uncommitted changes)" if head.get("dirty") else ""
    fa4 = f"FlashAttention-4 {head['fa4']} (CuTe DSL {head.get('cutlass_dsl')}), " \
        if head.get("fa4") else ""
    out = [f"# flashattn vs SDPA{' and FlashAttention-4' if FA4 in names else ''} on "
           f"{head.get('gpu') or head.get('device')}", "",
           f"torch {head['torch']}, CUDA {head['cuda']}, cuDNN {head['cudnn']}, {fa4}"
           f"{head['date']}, commit {head['commit'][:12]}{dirty}"
           + (f" ({head['commit_note']})" if head.get("commit_note") else "") + ".", ""]
    if FA4 not in names and head.get("fa4_off") and str(head.get("device")).startswith("cuda"):
        out += [f"No fa4 column: {head['fa4_off']}.", ""]
    if rows:
        out += ["TFLOP/s (fwd 4·B·H·N²·d, halved when causal; bwd 2.5× fwd) of the median "
                "time; "
                "×peer = our speed over the peer's (> 1: faster); "
                f"H·d = {rows[0]['H'] * rows[0]['d']}, B·N = {rows[0]['B'] * rows[0]['N']}; "
                "— = the implementation rejects the cell.", ""]
    for mode in sorted({row["mode"] for row in rows}, key=["fwd", "bwd"].index):
        for dtype in sorted({row["dtype"] for row in rows}):
            cells = [r for r in rows if r["mode"] == mode and r["dtype"] == dtype]
            out += [f"## {mode}, {dtype}", ""] + cell_table(cells, names, reference) + [""]
    if rows:
        out += ["## Summary", ""] + summary_table(rows, names, reference)
        out += ["", spread_note(rows, names), ""]
        det = det_summary(rows) + variant_summary(rows)
        out += det + [""] if det else []
    if result.get("decode"):
        r0 = result["decode"][0]
        out += [f"## Decode, {r0['dtype']}, d={r0['d']}, GQA {r0['H']}/{r0['Hk']} (TB/s of "
                "K and V read)", ""] + decode_table(result["decode"]) + [""]
    if result.get("decode_step"):
        out += ["## Decode step (append one token + attention), eager and CUDA graph", "",
                "| B | N | eager µs | TB/s | graph µs | TB/s |", "|---|---|---|---|---|---|"]
        out += [f"| {r['B']} | {r['N']} | {r['eager_ms'] * 1e3:.1f} | {r['eager_tbs']:.2f} | "
                f"{r['graph_ms'] * 1e3:.1f} | {r['graph_tbs']:.2f} |" for r in result["decode_step"]]
        out += [""]
    if result.get("sparse"):
        out += ["## Block-sparse (effective TFLOP/s: 4·bm·bn·d per kept block, bwd 2.5×; dense: "
                "our dense kernel over the whole N×N)", ""] + sparse_table(result["sparse"]) + [""]
    if result.get("memory"):
        out += ["## Peak extra memory of fwd+bwd (MiB), B=1, H=16, d=128", ""]
        out += memory_table(result["memory"]) + [""]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", help="a file written by bench_attn.py --json")
    parser.add_argument("--reference", default=REFERENCE, help="the peer of the ×ref column")
    args = parser.parse_args()
    with open(args.json) as f:
        print(markdown(json.load(f), args.reference))


if __name__ == "__main__":
    main()
