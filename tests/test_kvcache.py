"""flash_attn_with_kvcache and paged KV: out, softmax_lse and the caches after the append
against the float64 reference (tests/reference.py kvcache_ref), over flash-attn's kvcache
parametrisation as a pairwise covering set plus hard corners; paged prefill through
flash_attn_varlen_func(block_table=...). Wrong metadata, argument errors, torch.compile and
opcheck: tests/test_kvcache_edges.py."""
import math

import pytest
import torch

import flashattn
from helpers import (DEVICES, DTYPES, assert_close, case_id, covering_set, dtypes_for, rand,
                     skip_if_no_kernel)
from reference import paged_varlen_ref, ref_and_lowp_kvcache

BATCH = 2
HEADS = {"mha": (6, 6), "gqa": (6, 3), "mqa": (6, 1)}
# (seqlen_q, cache capacity), flash-attn's test_flash_attn_kvcache list with its longest
# caches shortened for the CPU (the (16, 20000) corner below keeps one long cache).
SEQLENS = [(1, 128), (1, 339), (3, 1024), (64, 800), (64, 256), (3, 799), (64, 2048),
           (128, 128)]


def _factors(device):
    return dict(
        dtype=dtypes_for(device),
        hd=[(32, 32), (59, 59), (64, 64), (80, 80), (128, 128), (256, 256), (96, 64)],
        sl=SEQLENS,
        heads=list(HEADS),
        new_kv=[False, True],
        new_eq_q=[True, False],  # seqlen_new == seqlen_q, or a random 1..seqlen_q
        rotary=[0.0, 0.5, 1.0],  # fraction of the head dim rotated
        interleaved=[False, True],
        paged=[None, 16, 64, 256],
        causal=[False, True],
        local=[False, True],
        softcap=[0.0, 2.0],
        alibi=[False, True],
        leftpad=[False, True],
        batch_idx=[False, True],
        num_splits=[0, 1, 3],
    )


def _valid(c):
    # As flash-attn: no cache_batch_idx or cache_leftpad with a paged cache.
    return c["paged"] is None or not (c["leftpad"] or c["batch_idx"])


HARD_CORNERS = [
    # flash-attn's longest decode cache (128k), MQA, 256-row pages
    dict(dtype="fp16", hd=(64, 64), sl=(1, 128 * 1024), heads="mqa", new_kv=True,
         new_eq_q=True, rotary=1.0, interleaved=True, paged=256, causal=True, local=False,
         softcap=0.0, alibi=True, leftpad=False, batch_idx=False, num_splits=0),
    # one long cache, GQA, paged with small pages, rotary over half the dims
    dict(dtype="bf16", hd=(128, 128), sl=(16, 20000), heads="gqa", new_kv=True, new_eq_q=True,
         rotary=0.5, interleaved=False, paged=16, causal=True, local=False, softcap=0.0,
         alibi=False, leftpad=False, batch_idx=False, num_splits=0),
    # everything a contiguous cache takes at once, MQA, odd head dim
    dict(dtype="fp16", hd=(59, 59), sl=(3, 799), heads="mqa", new_kv=True, new_eq_q=False,
         rotary=1.0, interleaved=True, paged=None, causal=True, local=True, softcap=2.0,
         alibi=True, leftpad=True, batch_idx=True, num_splits=3),
    # the append fills the cache to its last row (cache_seqlens = capacity - seqlen_new)
    dict(dtype="bf16", hd=(64, 64), sl=(64, 256), heads="gqa", new_kv=True, new_eq_q=True,
         rotary=1.0, interleaved=False, paged=64, causal=True, local=False, softcap=0.0,
         alibi=False, leftpad=False, batch_idx=False, num_splits=1, full=True),
    # rotary of q alone (no append; flash-attn requires k there, the contract does not)
    dict(dtype="fp16", hd=(80, 80), sl=(3, 1024), heads="mha", new_kv=False, new_eq_q=True,
         rotary=0.5, interleaved=True, paged=256, causal=False, local=True, softcap=0.0,
         alibi=True, leftpad=False, batch_idx=False, num_splits=0),
    # non-contiguous q, caches and new rows (every stride but the last differs)
    dict(dtype="bf16", hd=(96, 64), sl=(64, 800), heads="gqa", new_kv=True, new_eq_q=False,
         rotary=1.0, interleaved=True, paged=None, causal=False, local=False, softcap=2.0,
         alibi=False, leftpad=True, batch_idx=True, num_splits=0, noncontig=True),
    dict(dtype="fp32", hd=(111, 111), sl=(128, 128), heads="gqa", new_kv=True, new_eq_q=False,
         rotary=0.5, interleaved=False, paged=16, causal=True, local=True, softcap=2.0,
         alibi=True, leftpad=False, batch_idx=False, num_splits=0, noncontig=True),
]


def _params():
    out = []
    for device in DEVICES:
        # Two covering sets: every pair of factor values twice, more triples than one gives.
        for seed in (3, 11):
            for c in covering_set(_factors(device), seed=seed, valid=_valid):
                out.append(pytest.param(device, c, id=f"{device}-s{seed}-{case_id(c)}"))
        for c in HARD_CORNERS:
            if c["dtype"] in dtypes_for(device):
                out.append(pytest.param(device, c, id=f"{device}-corner-{case_id(c)}"))
    return out


def paged_cache(k_cache, page_size, batch, extra_pages=3):
    """A pool of pages holding each sequence's rows, shuffled: (pages, block_table), with
    extra_pages pages no sequence uses. k_cache (batch, capacity, ...), capacity a multiple of
    page_size."""
    n = k_cache.shape[1] // page_size
    pool = batch * n + extra_pages
    block_table = torch.randperm(pool, device=k_cache.device)[: batch * n].view(batch, n)
    pages = rand([pool, page_size, *k_cache.shape[2:]], k_cache.dtype, k_cache.device)
    pages[block_table.flatten()] = k_cache.reshape(batch * n, page_size, *k_cache.shape[2:])
    return pages, block_table.to(torch.int32)


def paged_kv(k_cache, v_cache, page_size, batch):
    """Both caches in pools of pages under one shuffled block table (paged_cache; the V pool's
    unused pages random too): (k_pages, v_pages, block_table)."""
    k_pages, bt = paged_cache(k_cache, page_size, batch)
    v_pages = rand([k_pages.shape[0], page_size, *v_cache.shape[2:]], v_cache.dtype,
                   v_cache.device)
    v_pages[bt.long().flatten()] = v_cache.reshape(-1, page_size, *v_cache.shape[2:])
    return k_pages, v_pages, bt


def make_inputs(device, c):
    """The call's arguments (a dict for flash_attn_with_kvcache) from case c, fresh random."""
    dtype = DTYPES[c["dtype"]]
    d, dv = c["hd"]
    sq, sk = c["sl"]
    H, Hk = HEADS[c["heads"]]
    nc = c.get("noncontig", False)
    page = c["paged"]
    cap = sk if page is None else math.ceil(sk / page) * page
    new = sq if c["new_eq_q"] else int(torch.randint(1, sq + 1, ()))
    rd = int(c["rotary"] * d) // 2 * 2
    b_cache = 2 * BATCH + 1 if c["batch_idx"] else BATCH
    q = rand([BATCH, sq, H, d], dtype, device, nc)
    k_cache = rand([b_cache, cap, Hk, d], dtype, device, nc)
    v_cache = rand([b_cache, cap, Hk, dv], dtype, device, nc)
    args = dict(q=q, causal=c["causal"], softcap=c["softcap"], num_splits=c["num_splits"],
                rotary_interleaved=c["interleaved"])
    if c["new_kv"]:
        args.update(k=rand([BATCH, new, Hk, d], dtype, device, nc),
                    v=rand([BATCH, new, Hk, dv], dtype, device, nc))
    # As flash-attn's test: the new rows fit, and so do q's rotary positions.
    used = new if c["new_kv"] else 0
    room = cap - (sq if rd and (c["causal"] or c["local"]) else used)
    lo = 0 if c["new_kv"] else 1
    seqlens = torch.randint(lo, max(lo, room) + 1, (BATCH,), dtype=torch.int32)
    if c.get("full"):
        seqlens[:] = cap - used
    args["cache_seqlens"] = seqlens.to(device)
    if c["leftpad"]:
        args["cache_leftpad"] = (torch.rand(BATCH) * seqlens).to(torch.int32).to(device)
    if c["batch_idx"]:
        args["cache_batch_idx"] = torch.randperm(b_cache, device=device)[:BATCH].to(torch.int32)
    if c["local"]:
        args["window_size"] = tuple(int(x) for x in torch.randint(0, cap, (2,)))
    if c["alibi"]:
        args["alibi_slopes"] = torch.rand(BATCH, H, device=device) * 0.3
    if rd:
        # seqlen_ro above the capacity sometimes: positions index the table from row 0.
        angle = torch.rand(cap + int(torch.randint(0, 3, ())) * 17, rd // 2, device=device)
        args["rotary_cos"] = torch.cos(angle * 2 * math.pi).to(dtype)
        args["rotary_sin"] = torch.sin(angle * 2 * math.pi).to(dtype)
    if page is None:
        args.update(k_cache=k_cache, v_cache=v_cache)
    else:
        k_pages, v_pages, bt = paged_kv(k_cache, v_cache, page, BATCH)
        args.update(k_cache=k_pages, v_cache=v_pages, block_table=bt)
    return args


def _reference(args):
    kw = {n: x for n, x in args.items() if n not in ("num_splits",)}
    return ref_and_lowp_kvcache(**kw)


def check_kvcache_call(args, dtype, name=""):
    """Runs flash_attn_with_kvcache on fresh copies of the caches and checks out, lse and the
    caches (appended rows under the tolerance rule, bit-exact without rotary; every other row
    untouched). Returns (out, lse)."""
    ref, low = _reference(args)
    k0, v0 = args["k_cache"], args["v_cache"]
    call = dict(args, k_cache=k0.clone(), v_cache=v0.clone())
    out, lse = flashattn.flash_attn_with_kvcache(**call, return_softmax_lse=True)
    assert_close(f"{name}out", out, ref[0], low[0], dtype)
    assert_close(f"{name}lse", lse, ref[1], low[1], dtype)
    for which, before, after, r, lo in (("k_cache", k0, call["k_cache"], ref[2], low[2]),
                                        ("v_cache", v0, call["v_cache"], ref[3], low[3])):
        changed = (r != before.to(r.dtype)).any(-1).any(-1)  # the rows the append wrote
        same = ~changed
        assert torch.equal(after[same], before[same]), f"{which}: rows outside the append changed"
        if which == "v_cache" or "rotary_cos" not in args:
            assert torch.equal(after[changed], lo[changed]), f"{which}: appended rows differ"
        else:
            assert_close(f"{name}{which} (appended rows)", after[changed], r[changed],
                         lo[changed], dtype)
    return out, lse


@pytest.mark.parametrize("device,c", _params())
def test_kvcache(device, c):
    dtype = DTYPES[c["dtype"]]
    skip_if_no_kernel(device, dtype, *c["hd"], backward=False)
    args = make_inputs(device, c)
    check_kvcache_call(args, dtype)


# The CUDA combine's forms (kernel_decode_sm80.cuh: by default one CTA per row, launched as a
# programmatic dependent of the split kernel on Hopper; FLASHATTN_DECODE_COMBINE=serial, and
# FLASHATTN_DECODE_PDL=0 for a plain launch).
_COMBINE_ENV = {"default": {}, "serial": {"FLASHATTN_DECODE_COMBINE": "serial"},
                "nopdl": {"FLASHATTN_DECODE_PDL": "0"},
                "serial-nopdl": {"FLASHATTN_DECODE_COMBINE": "serial", "FLASHATTN_DECODE_PDL": "0"}}
_COMBINES = [(d, "default") for d in DEVICES] + \
    [("cuda", c) for c in _COMBINE_ENV if c != "default"] * ("cuda" in DEVICES)


def _set_combine(monkeypatch, combine):
    for name, value in _COMBINE_ENV[combine].items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize("device,combine", _COMBINES, ids=[f"{d}-{c}" for d, c in _COMBINES])
@pytest.mark.parametrize("paged", [None, 64])
@pytest.mark.parametrize("hd", [128, 64, 96, 192])  # value dims 64 / 96 / 192: partial lanes
def test_num_splits_same_result(device, combine, paged, hd, monkeypatch):
    """num_splits 1 and several give the same result within tolerance (bitwise on the CPU,
    which ignores it); the caches get the same rows. On CUDA with every combine form (splits
    past a short sequence's keys are empty: weight 0)."""
    _set_combine(monkeypatch, combine)
    c = dict(dtype="bf16", hd=(hd, hd), sl=(4, 2048), heads="gqa", new_kv=True,
             new_eq_q=True, rotary=1.0, interleaved=False, paged=paged, causal=True,
             local=False, softcap=0.0, alibi=False, leftpad=False, batch_idx=False,
             num_splits=0)
    skip_if_no_kernel(device, torch.bfloat16, hd, backward=False)
    args = make_inputs(device, c)
    runs = {}
    for n in (0, 1, 2, 7, 64):
        runs[n] = check_kvcache_call(dict(args, num_splits=n), torch.bfloat16, f"num_splits={n} ")
    if device == "cpu":
        for n, (out, lse) in runs.items():
            assert torch.equal(out, runs[1][0]) and torch.equal(lse, runs[1][1]), n


@pytest.mark.cuda
@pytest.mark.skipif("cuda" not in DEVICES, reason="the combine forms are CUDA kernels")
@pytest.mark.parametrize("combine", list(_COMBINE_ENV))
@pytest.mark.parametrize("hd,num_splits", [(64, 200), (128, 100), (128, 256), (256, 77)])
def test_combine_many_splits(combine, hd, num_splits, monkeypatch):
    """More splits than one pass of a combine takes (the default form: 128 / 64 / 32 splits a
    batch at value dims 64 / 128 / 256, so later batches rescale the earlier ones), a short
    sequence beside a long one (its splits past its keys empty), and a sink: out and lse
    against the float64 reference."""
    from reference import ref_and_lowp_ext
    _set_combine(monkeypatch, combine)
    c = dict(dtype="bf16", hd=(hd, hd), sl=(1, 16384), heads="gqa", new_kv=True,
             new_eq_q=True, rotary=0.0, interleaved=False, paged=None, causal=True,
             local=False, softcap=0.0, alibi=False, leftpad=False, batch_idx=False,
             num_splits=num_splits)
    args = make_inputs("cuda", c)
    args["cache_seqlens"] = torch.tensor([16000, 300], dtype=torch.int32, device="cuda")
    check_kvcache_call(args, torch.bfloat16, f"num_splits={num_splits} ")
    H, Hk = HEADS["gqa"]
    q = rand([2, 1, H, hd], torch.bfloat16, "cuda")
    k, v = (rand([2, 9000, Hk, hd], torch.bfloat16, "cuda") for _ in range(2))
    sink = torch.randn(H, device="cuda")
    assert flashattn.kernel_path(q, k, v, learnable_sink=sink) == "sm80-decode"
    out, lse, _ = flashattn.flash_attn_func(q, k, v, learnable_sink=sink, return_attn_probs=True)
    ref, low = ref_and_lowp_ext(q, k, v, sink=sink)
    assert_close("sink out", out, ref["out"], low["out"], torch.bfloat16)
    assert_close("sink lse", lse, ref["lse"], low["lse"], torch.bfloat16)


# Query rows per KV head (tokens x group) at the decode tiles' edges: a 16-row warp tile with
# its rows 8..15 all padding (8), some real (9, 12 x 3 tokens / 4 = 9), all real (16, 8 x 2
# tokens), and a second warp tile begun (17); a window cutting into the keys, two splits' worth
# of keys for one sequence and few for the other.
_ROWS = [(8, 1, 1), (9, 1, 1), (16, 1, 1), (8, 1, 2), (17, 1, 1), (12, 4, 3)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("H,Hk,sq", _ROWS, ids=[f"{h}x{hk}x{sq}" for h, hk, sq in _ROWS])
@pytest.mark.parametrize("hd", [64, 128, 256])
def test_decode_rows_per_kv_head(device, H, Hk, sq, hd):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    skip_if_no_kernel(device, dtype, hd, backward=False)
    B, cap = 2, 700
    args = dict(q=rand([B, sq, H, hd], dtype, device),
                k_cache=rand([B, cap, Hk, hd], dtype, device),
                v_cache=rand([B, cap, Hk, hd], dtype, device),
                cache_seqlens=torch.tensor([650, 37], dtype=torch.int32, device=device),
                causal=True, window_size=(100, 0), num_splits=0)
    check_kvcache_call(args, dtype)


# Windows whose edges fall inside a warp's slice of a key block (the decode kernel's blocks
# are 32-128 keys; a warp reads 16-64 of them), with a left pad that is no multiple of 64, so
# that the blocks inside the visible range and the two edge blocks take different code; with
# softcap + ALiBi (the score transform runs in both); and causal with more queries than keys
# (rows that see no key: out 0, lse -inf). GQA of 8 at 2 tokens: 16 rows a KV head.
_WINDOWS = [((37, 0), "plain", None), ((100, 5), "mod", None), ((37, 0), "mod", 16),
            ((100, 5), "plain", 32), ((-1, 0), "plain", None)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("window,mod,paged", _WINDOWS,
                         ids=[f"w{w[0]}_{w[1]}-{m}-p{p}" for w, m, p in _WINDOWS])
@pytest.mark.parametrize("hd", [64, 128, 256])
def test_decode_window_edges(device, window, mod, paged, hd):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    skip_if_no_kernel(device, dtype, hd, backward=False)
    B, H, Hk, sq, cap = 2, 16, 2, 2, 640
    k_cache, v_cache = (rand([B, cap, Hk, hd], dtype, device) for _ in range(2))
    seqlens = [613, 1] if window[0] < 0 else [613, 301]  # 1 key: a query row sees none
    args = dict(q=rand([B, sq, H, hd], dtype, device), causal=True, window_size=window,
                num_splits=0,
                cache_seqlens=torch.tensor(seqlens, dtype=torch.int32, device=device))
    if mod == "mod":
        args.update(softcap=2.0, alibi_slopes=torch.rand(B, H, device=device) * 0.3)
    if paged is None:
        args.update(k_cache=k_cache, v_cache=v_cache)
        if window[0] >= 0:  # as flash-attn: no left pad with a paged cache
            args["cache_leftpad"] = torch.tensor([77, 5], dtype=torch.int32, device=device)
    else:
        k_pages, v_pages, bt = paged_kv(k_cache, v_cache, paged, B)
        args.update(k_cache=k_pages, v_cache=v_pages, block_table=bt)
    out, lse = check_kvcache_call(args, dtype)
    if window[0] < 0:  # sequence 1: one key, 2 tokens, causal: token 0 sees nothing
        assert (out[1, 0] == 0).all() and torch.isneginf(lse[1, :, 0]).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_splits", [1, 0, 5])
@pytest.mark.parametrize("hd", [64, 128, 256])
def test_decode_peaky_rows(device, num_splits, hd):
    """A cache whose first key dominates the rows with positive queries (every later block
    leaves their maximum where it was) and whose last key dominates the rows with negative
    ones (their maximum moves in the last block), alternating by head, so that one warp's
    16-row tile holds both kinds; against the float64 reference."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    skip_if_no_kernel(device, dtype, hd, backward=False)
    B, H, Hk, sq, cap = 2, 16, 2, 2, 1100
    sign = torch.tensor([1.0, -1.0] * (H // 2), device=device).view(1, 1, H, 1)
    q = (rand([B, sq, H, hd], torch.float32, device).abs() * sign).to(dtype)
    k_cache, v_cache = (rand([B, cap, Hk, hd], dtype, device) for _ in range(2))
    seqlens = torch.tensor([1033, 700], dtype=torch.int32, device=device)
    for b, n in enumerate(seqlens.tolist()):
        k_cache[b, 0] = 0.5
        k_cache[b, n - 1] = -0.5
    args = dict(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=seqlens,
                num_splits=num_splits)
    check_kvcache_call(args, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_cache_seqlens_int_and_returns(device):
    """cache_seqlens as an int (every sequence), out alone without return_softmax_lse, and no
    cache_seqlens at all (the whole cache, flash-attn's default)."""
    dtype = torch.float16
    skip_if_no_kernel(device, dtype, 64, backward=False)
    q = rand([3, 2, 4, 64], dtype, device)
    k_cache, v_cache = rand([3, 50, 2, 64], dtype, device), rand([3, 50, 2, 64], dtype, device)
    k, v = rand([3, 2, 2, 64], dtype, device), rand([3, 2, 2, 64], dtype, device)
    seqlens = torch.full((3,), 17, dtype=torch.int32, device=device)
    ref, low = ref_and_lowp_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens,
                                    causal=True)
    kc, vc = k_cache.clone(), v_cache.clone()
    out = flashattn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=17, causal=True)
    assert isinstance(out, torch.Tensor)
    assert_close("out (int cache_seqlens)", out, ref[0], low[0], dtype)
    assert torch.equal(kc, ref[2].to(dtype)) and torch.equal(vc, ref[3].to(dtype))
    ref, low = ref_and_lowp_kvcache(q, k_cache, v_cache)
    out, lse = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, return_softmax_lse=True)
    assert_close("out (whole cache)", out, ref[0], low[0], dtype)
    assert_close("lse (whole cache)", lse, ref[1], low[1], dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_sequences_and_caches(device):
    """Sequences with no visible key (cache_seqlens 0, no append; leftpad past the end) give
    out 0 and lse -inf; a zero-capacity cache and an empty q run too."""
    dtype = torch.bfloat16
    skip_if_no_kernel(device, dtype, 32, backward=False)
    q = rand([3, 5, 2, 32], dtype, device)
    kc, vc = rand([3, 40, 1, 32], dtype, device), rand([3, 40, 1, 32], dtype, device)
    seqlens = torch.tensor([0, 12, 30], dtype=torch.int32, device=device)
    leftpad = torch.tensor([0, 12, 3], dtype=torch.int32, device=device)
    args = dict(q=q, k_cache=kc, v_cache=vc, cache_seqlens=seqlens, cache_leftpad=leftpad,
                causal=True)
    out, lse = check_kvcache_call(args, dtype)
    assert (out[:2] == 0).all() and torch.isneginf(lse[:2]).all()
    empty = rand([3, 0, 1, 32], dtype, device)
    out, lse = flashattn.flash_attn_with_kvcache(q, empty, empty, cache_seqlens=seqlens,
                                                 return_softmax_lse=True)
    assert (out == 0).all() and torch.isneginf(lse).all()
    k = rand([3, 2, 1, 32], dtype, device)
    out = flashattn.flash_attn_with_kvcache(q[:, :0], kc, vc, k, k, cache_seqlens=seqlens)
    assert out.shape == (3, 0, 2, 32)
    assert torch.equal(kc[1, 12:14], k[1]) and torch.equal(vc[2, 30:32], k[2])


# ---- paged prefill: flash_attn_varlen_func(..., block_table=...) ----

# (seqlens_q, seqlens_k) per sequence: a zero-length sequence, more queries than keys.
PAGED_VARLEN = [
    dict(dtype="bf16", lens=([113, 0, 1, 57], [203, 5, 239, 57]), page=16, heads="gqa",
         causal=True, window=(-1, -1), softcap=0.0, alibi=False, hd=(64, 64)),
    dict(dtype="fp16", lens=([64, 3], [64, 300]), page=256, heads="mqa", causal=False,
         window=(40, 7), softcap=2.0, alibi=True, hd=(128, 128)),
    dict(dtype="fp32", lens=([30, 17, 0], [0, 130, 20]), page=64, heads="mha", causal=True,
         window=(25, -1), softcap=0.0, alibi=True, hd=(59, 40)),
    dict(dtype="bf16", lens=([200], [100]), page=32, heads="gqa", causal=True,
         window=(-1, -1), softcap=2.0, alibi=False, hd=(96, 96)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("c", PAGED_VARLEN, ids=case_id)
def test_paged_varlen(device, c):
    if c["dtype"] not in dtypes_for(device):
        pytest.skip(f"{c['dtype']} is CPU only")
    dtype = DTYPES[c["dtype"]]
    skip_if_no_kernel(device, dtype, *c["hd"], backward=False)
    d, dv = c["hd"]
    H, Hk = HEADS[c["heads"]]
    lens_q, lens_k = c["lens"]
    B, page = len(lens_q), c["page"]
    n = max(math.ceil(max(lens_k) / page), 1) + 1  # one table entry past the longest
    pool = B * n + 2
    bt = torch.randperm(pool, device=device)[: B * n].view(B, n).to(torch.int32)
    k = rand([pool, page, Hk, d], dtype, device)
    v = rand([pool, page, Hk, dv], dtype, device)
    q = rand([sum(lens_q), H, d], dtype, device)
    cu = [torch.tensor([0] + torch.tensor(x).cumsum(0).tolist(), dtype=torch.int32,
                       device=device) for x in (lens_q, lens_k)]
    slopes = torch.rand(B, H, device=device) * 0.3 if c["alibi"] else None
    kw = dict(causal=c["causal"], window_size=c["window"], softcap=c["softcap"],
              alibi_slopes=slopes)
    out, lse, _ = flashattn.flash_attn_varlen_func(q, k, v, cu[0], cu[1], max(lens_q),
                                                   max(lens_k), block_table=bt,
                                                   return_attn_probs=True, **kw)
    ref = paged_varlen_ref(q, k, v, cu[0].cpu(), cu[1].cpu(), bt, **kw)
    low = paged_varlen_ref(q, k, v, cu[0].cpu(), cu[1].cpu(), bt, compute_dtype=dtype, **kw)
    assert_close("out", out, ref[0], low[0], dtype)
    assert_close("lse", lse, ref[1], low[1], dtype)
