"""Small CUDA cases for compute-sanitizer (memcheck / racecheck / synccheck): every kernel on
shapes with at least three K/V blocks, partial tiles, causal, window, GQA and varlen (with an
empty sequence). `--sm90`: only the Hopper cases (forced onto sm90, so a silent fallback
fails; the backward runs sm90 where it takes the call). `--decode`: only the split-KV decode
kernels (decoding-shaped calls, flash_attn_with_kvcache with appends, rotary, pages, and
wrong metadata that must be clamped). `--dropout`: only the dropout and attention-sink cases
(the sm80 dropout variants of the forward and backward, every pairing of their Philox blocks,
sinks on the main, sm90, decode and split-KV kernels, the dsink kernel, return_attn_probs' S).
Prints one line per case; exits non-zero on a Python-level failure."""
import os
import sys

import torch

import flashattn

torch.manual_seed(0)
dev = "cuda"


def run_padded(b, sq, sk, h, hk, d, dv, dtype, forward_only=False, **kw):
    q = torch.randn(b, sq, h, d, device=dev, dtype=dtype, requires_grad=True)
    k = torch.randn(b, sk, hk, d, device=dev, dtype=dtype, requires_grad=True)
    v = torch.randn(b, sk, hk, dv, device=dev, dtype=dtype, requires_grad=True)
    out = flashattn.flash_attn_func(q, k, v, **kw)
    if not forward_only:
        out.backward(torch.randn_like(out))
    torch.cuda.synchronize()
    print("padded", b, sq, sk, h, hk, d, dv, dtype, kw, "ok", flush=True)


def run_varlen(lens_q, lens_k, h, hk, d, dtype, **kw):
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), device=dev, dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), device=dev, dtype=torch.int32)
    q = torch.randn(sum(lens_q), h, d, device=dev, dtype=dtype, requires_grad=True)
    k = torch.randn(sum(lens_k), hk, d, device=dev, dtype=dtype, requires_grad=True)
    v = torch.randn(sum(lens_k), hk, d, device=dev, dtype=dtype, requires_grad=True)
    out = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), **kw)
    out.backward(torch.randn_like(out))
    torch.cuda.synchronize()
    print("varlen", lens_q, lens_k, h, hk, d, dtype, kw, "ok", flush=True)


def run_sparse(b, sq, sk, h, hk, d, dv, dtype, block=(128, 128), compressed=False,
               forward_only=False, **kw):
    """block_sparse_attn_func on a random half of the blocks, the first query block's row
    all dropped; compressed: the pair form with counts and indices out of range (clamped)."""
    q = torch.randn(b, sq, h, d, device=dev, dtype=dtype, requires_grad=True)
    k = torch.randn(b, sk, hk, d, device=dev, dtype=dtype, requires_grad=True)
    v = torch.randn(b, sk, hk, dv, device=dev, dtype=dtype, requires_grad=True)
    nq, nk = -(-sq // block[0]), -(-sk // block[1])
    mask = torch.rand(b, h, nq, nk, device=dev) < 0.5
    mask[:, :, 0] = False
    if compressed:
        num = mask.sum(-1, dtype=torch.int32)
        idx = torch.argsort((~mask).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        num[:, :, -1] = nk + 7          # a count past n_kblocks
        idx[:, :, -1, 0] = -3           # and indices outside [0, n_kblocks)
        idx[:, :, -1, -1] = nk + 100
        mask = (num, idx)
    out = flashattn.block_sparse_attn_func(q, k, v, mask, block, **kw)
    if not forward_only:
        out.backward(torch.randn_like(out))
    torch.cuda.synchronize()
    print("sparse", b, sq, sk, h, hk, d, dv, dtype, block, compressed, kw, "ok", flush=True)


def run_fp8(b, sq, sk, h, hk, d, dv, lens=None, strided=False, **kw):
    """The FP8 forward (forward only) with per-(batch, KV head) descales; lens = (lens_q,
    lens_k): varlen; strided: q / v views with a row stride TMA cannot take (the staging
    pass packs q and reads v byte by byte)."""
    f8 = torch.float8_e4m3fn
    if lens is None:
        qs, ks, vs, nb = (b, sq, h, d), (b, sk, hk, d), (b, sk, hk, dv), b
    else:
        qs, ks, vs, nb = (sum(lens[0]), h, d), (sum(lens[1]), hk, d), (sum(lens[1]), hk, dv), \
            len(lens[0])
    q, k = torch.randn(*qs, device=dev).to(f8), torch.randn(*ks, device=dev).to(f8)
    v = torch.randn(*vs, device=dev).to(f8)
    if strided:
        q = torch.randn(*qs[:-1], d + 5, device=dev).to(f8)[..., :d]
        v = torch.randn(*vs[:-1], dv + 3, device=dev).to(f8)[..., :dv]
    ds = {n: torch.rand(nb, hk, device=dev) + 0.5 for n in ("q_descale", "k_descale", "v_descale")}
    if lens is None:
        flashattn.flash_attn_func(q, k, v, **ds, **kw)
    else:
        cu = [torch.tensor([0] + list(torch.tensor(x).cumsum(0)), device=dev, dtype=torch.int32)
              for x in lens]
        flashattn.flash_attn_varlen_func(q, k, v, *cu, max(lens[0]), max(lens[1]), **ds, **kw)
    torch.cuda.synchronize()
    print("fp8", b, sq, sk, h, hk, d, dv, lens, strided, kw, "ok", flush=True)


bf16, fp16 = torch.bfloat16, torch.float16


def sm90_cases():
    """The sm90 forward, forced: >= 3 key blocks, partial tiles, causal both ways, windows,
    GQA / MQA, rows with no key, no keys at all (its LSE feeds the sm80 backward); the sm90
    backward's variants; the FP8 forward."""
    os.environ["FLASHATTN_FORCE_BACKEND"] = "sm90"
    run_padded(1, 300, 420, 4, 2, 128, 128, bf16, causal=True)
    run_padded(2, 333, 200, 2, 2, 128, 128, fp16, causal=True)   # rows with no key
    run_padded(1, 700, 700, 3, 1, 128, 128, bf16, window_size=(100, 20))
    run_padded(1, 500, 640, 2, 2, 128, 128, fp16, window_size=(50, -1))
    run_padded(2, 1, 500, 4, 2, 128, 128, bf16)
    run_padded(1, 257, 1, 2, 2, 128, 128, bf16, forward_only=True)
    run_padded(2, 100, 0, 2, 1, 128, 128, bf16, forward_only=True)
    # The other head-dim variants (d64: three consumer warpgroups), dims loaded past the call's
    run_padded(1, 500, 650, 4, 2, 64, 64, bf16, causal=True)
    run_padded(1, 300, 420, 2, 1, 256, 256, fp16, window_size=(100, 20))
    run_padded(1, 260, 333, 2, 2, 192, 128, bf16, forward_only=True)
    run_padded(1, 260, 333, 2, 2, 40, 40, bf16, forward_only=True)
    # Varlen: packed rows, a block crossing into the next sequence, empty sequences
    run_varlen([130, 0, 257, 1], [300, 5, 0, 399], 4, 2, 128, bf16, causal=True)
    run_varlen([200, 3], [700, 64], 2, 2, 64, fp16)
    # The d 256 backward (kernel_bwd_d256_sm90.cuh): varlen with an empty sequence, causal GQA
    # with partial blocks, a head dim inside the bucket
    run_varlen([130, 0, 257], [300, 5, 199], 4, 2, 256, bf16, causal=True)
    run_padded(1, 333, 517, 4, 2, 256, 256, fp16, causal=True)
    run_padded(1, 150, 190, 2, 2, 200, 200, bf16)
    # Persistent grids with more tiles than the H200's 132 SMs, causal / window tiles dealt in
    # pairs (tile_order_sm90.h): odd query-block counts (a lone middle block per head)
    run_padded(2, 1100, 1100, 8, 2, 128, 128, bf16, causal=True)     # 9 blocks x 16 = 144 tiles
    run_padded(2, 1300, 1300, 12, 4, 64, 64, fp16, causal=True)      # 7 blocks x 24 = 168
    run_padded(2, 1100, 1100, 8, 8, 128, 128, bf16, window_size=(200, 0))
    # The transformed-score kernels: softcap and ALiBi, padded and varlen
    run_padded(2, 300, 420, 4, 2, 128, 128, bf16, causal=True, softcap=5.0,
               alibi_slopes=torch.rand(2, 4, device=dev))
    run_varlen([130, 0, 257], [300, 5, 199], 2, 2, 256, bf16, softcap=2.0,
               alibi_slopes=torch.rand(2, device=dev))
    # Block-sparse (the sm90 forward's tile lists; the sm90 backward's list where it takes the
    # call: d64 / d128 without dropout, softcap or ALiBi, else sm80): d128, d64, d192 x 128,
    # causal, partial tiles, clamped metadata, dropout and softcap (the switched kernel), a
    # persistent grid (more tiles than SMs), 256-key blocks (two kernel tiles per block)
    run_sparse(2, 300, 700, 4, 2, 128, 128, bf16, causal=True)
    run_sparse(1, 333, 520, 2, 1, 128, 128, fp16, compressed=True)
    run_sparse(1, 260, 333, 2, 2, 192, 128, bf16, forward_only=True)
    run_sparse(1, 390, 300, 4, 4, 64, 64, fp16, causal=True)  # d64's own 128 x 128 tile
    run_sparse(1, 300, 420, 4, 2, 128, 128, bf16, dropout_p=0.2, softcap=5.0)
    run_sparse(2, 1100, 1500, 8, 2, 128, 128, bf16, block=(256, 256), forward_only=True)
    # the backward's other launch order, L2 sections (FLASHATTN_SM90_SPARSE_PAIRS=0; the
    # pair-major order is the default since 2026-12-07)
    os.environ["FLASHATTN_SM90_SPARSE_PAIRS"] = "0"
    run_sparse(2, 300, 700, 4, 2, 128, 128, bf16, causal=True)
    run_sparse(2, 1100, 1500, 8, 2, 64, 64, bf16)
    del os.environ["FLASHATTN_SM90_SPARSE_PAIRS"]
    # The dropout forward at d128 (the consumers draw the keep mask): causal, varlen,
    # persistent grids with more tiles than SMs (the snake deal, and the pair deal's skipped
    # tiles: causal, odd query-block counts)
    run_padded(1, 300, 420, 4, 2, 128, 128, bf16, dropout_p=0.2, causal=True)
    run_padded(2, 1100, 1300, 8, 2, 128, 128, fp16, dropout_p=0.1, forward_only=True)
    run_padded(2, 300, 300, 24, 8, 128, 128, bf16, dropout_p=0.3, causal=True)  # 144 tiles
    run_varlen([130, 0, 257], [300, 5, 199], 4, 2, 128, bf16, dropout_p=0.15, causal=True)
    # The d 256 backward's dropout variant (off by default until verified: switched on here)
    os.environ["FLASHATTN_SM90_DROPOUT_BWD_D256"] = "1"
    run_padded(1, 333, 517, 4, 2, 256, 256, bf16, dropout_p=0.2, causal=True)
    run_varlen([130, 0, 257], [300, 5, 199], 4, 2, 256, fp16, dropout_p=0.15)
    del os.environ["FLASHATTN_SM90_DROPOUT_BWD_D256"]
    # The deterministic variant (the default on Hopper; set here all the same): dQ in key block
    # order, GQA's dK / dV in head order. First with one dQ warp in the index order
    # (FLASHATTN_SM90_DET_DIAG=0, _DQ2=0): causal, a window, varlen with an empty sequence;
    # then the defaults since 2026-12-07, the diagonal dQ order (causal, sk > sq and sq > sk, a
    # right-only window, varlen with an empty sequence) with two dQ warps, and two dQ warps in
    # the index order (a two-sided window, non-causal).
    os.environ["FLASHATTN_SM90_DET_BWD"] = "1"
    os.environ["FLASHATTN_SM90_DET_DIAG"] = "0"
    os.environ["FLASHATTN_SM90_DET_DQ2"] = "0"
    run_padded(1, 300, 420, 4, 2, 128, 128, bf16, causal=True, deterministic=True)
    run_padded(1, 500, 650, 4, 1, 64, 64, fp16, window_size=(100, 20), deterministic=True)
    run_varlen([130, 0, 257], [300, 5, 199], 4, 2, 256, bf16, causal=True, deterministic=True)
    del os.environ["FLASHATTN_SM90_DET_DIAG"], os.environ["FLASHATTN_SM90_DET_DQ2"]
    run_padded(1, 300, 420, 4, 2, 128, 128, bf16, causal=True, deterministic=True)
    run_padded(1, 517, 333, 4, 1, 64, 64, fp16, window_size=(-1, 20), deterministic=True)
    run_varlen([130, 0, 257], [300, 5, 199], 4, 2, 256, bf16, causal=True, deterministic=True)
    run_padded(1, 500, 650, 4, 1, 64, 64, fp16, window_size=(100, 20), deterministic=True)
    run_padded(1, 333, 517, 4, 2, 256, 256, bf16, deterministic=True)
    del os.environ["FLASHATTN_SM90_DET_BWD"]
    # The buckets 96 and 192 on the next backward kernel up (the default since 2026-12-06)
    run_padded(1, 333, 517, 4, 2, 80, 80, bf16, causal=True)
    run_varlen([130, 0, 257], [300, 5, 199], 4, 2, 160, fp16)
    # The FP8 forward (issue 14; its staging pass too): every head-dim variant, causal GQA with
    # partial blocks, a window, softcap, varlen with an empty sequence, a decoding shape (FP8
    # never takes the decode kernels), strided / odd-head-dim inputs (staged q, byte-read v),
    # an out of fp16, no keys
    run_fp8(1, 300, 420, 4, 2, 128, 128, causal=True)
    run_fp8(2, 333, 520, 6, 2, 64, 64, window_size=(100, 20))
    run_fp8(1, 260, 333, 2, 1, 256, 256, causal=True, softcap=5.0)
    run_fp8(1, 260, 333, 2, 2, 192, 128, out_dtype=fp16)
    run_fp8(1, 150, 290, 2, 2, 192, 192)
    run_fp8(0, 0, 0, 4, 2, 128, 128, lens=([130, 0, 257, 1], [300, 5, 0, 399]), causal=True)
    run_fp8(2, 1, 700, 8, 1, 128, 128)
    run_fp8(1, 200, 300, 2, 2, 59, 59, strided=True)
    run_fp8(0, 0, 0, 2, 2, 24, 40, lens=([70, 33], [90, 0]), strided=True)
    run_fp8(2, 100, 0, 2, 1, 128, 128)
    # ... and with V transposed on chip (kVChip; off by default: switched on here)
    os.environ["FLASHATTN_SM90_FP8_VCHIP"] = "1"
    run_fp8(1, 300, 420, 4, 2, 128, 128, causal=True)
    run_fp8(2, 333, 520, 6, 2, 64, 64, window_size=(100, 20))
    run_fp8(1, 260, 333, 2, 1, 256, 256, causal=True, softcap=5.0)
    run_fp8(1, 150, 290, 2, 2, 192, 192)
    run_fp8(0, 0, 0, 4, 2, 128, 128, lens=([130, 0, 257, 1], [300, 5, 0, 399]), causal=True)
    run_fp8(1, 200, 300, 2, 2, 59, 59, strided=True)
    del os.environ["FLASHATTN_SM90_FP8_VCHIP"]
    # ... and the long-key tiles (d128 128 x 192, d256 128 x 128): d 256 from 2048 keys by
    # default, then both switched on at every length
    run_fp8(1, 77, 2100, 4, 2, 256, 256)
    os.environ["FLASHATTN_SM90_FP8_LONG"] = "1"
    run_fp8(1, 300, 420, 4, 2, 128, 128, causal=True)
    run_fp8(1, 300, 420, 4, 2, 256, 256, causal=True)
    run_fp8(0, 0, 0, 4, 2, 240, 240, lens=([130, 0, 257, 1], [300, 5, 0, 399]), causal=True)
    run_fp8(0, 0, 0, 4, 2, 128, 128, lens=([130, 0, 257, 1], [300, 5, 0, 399]), causal=True)
    run_fp8(2, 1, 700, 8, 1, 112, 112, strided=True)
    del os.environ["FLASHATTN_SM90_FP8_LONG"]
    # ... and d64's short local tile (128 x 128, opt-in): causal with partial blocks, a window,
    # varlen with an empty sequence, strided d 40
    os.environ["FLASHATTN_SM90_FP8_SHORT"] = "1"
    run_fp8(1, 300, 420, 4, 2, 64, 64, causal=True)
    run_fp8(2, 333, 520, 6, 2, 64, 64, window_size=(100, 20))
    run_fp8(0, 0, 0, 4, 2, 64, 64, lens=([130, 0, 257, 1], [300, 5, 0, 399]), causal=True)
    run_fp8(1, 200, 300, 2, 2, 40, 40, strided=True, causal=True)
    del os.environ["FLASHATTN_SM90_FP8_SHORT"]
    del os.environ["FLASHATTN_FORCE_BACKEND"]


def run_kvcache(b, sq, cap, h, hk, d, dtype, new=0, page=0, rotary=False, seqlens=None,
                batch_idx=None, leftpad=None, table_fix=None, **kw):
    """flash_attn_with_kvcache on a (b, cap) cache (paged when page > 0, a shuffled table),
    `new` appended rows, metadata given as lists (wrong on purpose where a case says so)."""
    def i32(x):
        return None if x is None else torch.tensor(x, dtype=torch.int32, device=dev)
    q = torch.randn(b, sq, h, d, device=dev, dtype=dtype)
    if page:
        per = cap // page
        kc = torch.randn(b * per, page, hk, d, device=dev, dtype=dtype)
        table = torch.randperm(b * per, device=dev).view(b, per).to(torch.int32)
        if table_fix is not None:
            table_fix(table)
    else:
        kc = torch.randn(b, cap, hk, d, device=dev, dtype=dtype)
        table = None
    vc = torch.randn_like(kc)
    k = torch.randn(b, new, hk, d, device=dev, dtype=dtype) if new else None
    v = torch.randn_like(k) if new else None
    cos = sin = None
    if rotary:
        ang = torch.rand(cap, d // 4, device=dev) * 6.28
        cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    out = flashattn.flash_attn_with_kvcache(
        q, kc, vc, k, v, rotary_cos=cos, rotary_sin=sin,
        cache_seqlens=i32(seqlens if seqlens is not None else [cap - new] * b),
        cache_batch_idx=i32(batch_idx), cache_leftpad=i32(leftpad), block_table=table, **kw)
    torch.cuda.synchronize()
    print("kvcache", b, sq, cap, h, hk, d, dtype, dict(new=new, page=page, rotary=rotary,
          seqlens=seqlens, batch_idx=batch_idx, leftpad=leftpad), kw, "ok", flush=True)
    return out


def decode_cases():
    """The split-KV decode kernels: decoding-shaped flash_attn_func / varlen calls (several
    splits, GQA packing, masks, score mods, the small-smem d256 variant) and kvcache calls."""
    run_padded(2, 1, 700, 8, 2, 128, 128, bf16)
    run_padded(1, 4, 1000, 4, 4, 64, 64, fp16, causal=True)
    run_padded(1, 7, 900, 12, 2, 256, 256, bf16, window_size=(300, 0), softcap=4.0,
               alibi_slopes=torch.rand(12, device=dev))
    run_padded(3, 2, 600, 4, 1, 59, 59, fp16, forward_only=True)
    run_varlen([1, 2, 1], [700, 0, 1300], 8, 2, 128, bf16)
    os.environ["FLASHATTN_SMEM_LIMIT"] = str(99 * 1024)
    run_padded(1, 1, 800, 8, 2, 256, 256, bf16, forward_only=True)
    run_padded(1, 1, 800, 8, 2, 192, 192, fp16, forward_only=True)
    del os.environ["FLASHATTN_SMEM_LIMIT"]
    run_kvcache(2, 1, 1024, 8, 2, 128, bf16, new=1, rotary=True)
    run_kvcache(3, 3, 768, 4, 4, 64, fp16, new=3, page=16, rotary=True, causal=True,
                rotary_interleaved=False)
    run_kvcache(2, 1, 2048, 8, 1, 128, bf16, page=256, seqlens=[2000, 77])
    run_kvcache(2, 2, 512, 4, 2, 96, bf16, new=2, leftpad=[5, 100], seqlens=[300, 400],
                causal=True)
    run_kvcache(2, 1, 640, 4, 2, 64, bf16, new=1, batch_idx=[1, 0])
    # Wrong metadata (clamped: wrong numbers at worst, never an out-of-bounds access)
    run_kvcache(2, 1, 512, 4, 2, 64, bf16, new=2, seqlens=[600, -50])
    run_kvcache(2, 1, 512, 4, 2, 64, bf16, page=16, new=1, seqlens=[10**6, 3],
                table_fix=lambda t: (t.__setitem__((0, 0), 10**6), t.__setitem__((1, 1), -7)))
    run_kvcache(2, 1, 512, 4, 2, 64, bf16, new=1, batch_idx=[7, -3])
    run_kvcache(2, 1, 512, 4, 2, 64, bf16, leftpad=[600, -4], seqlens=[100, 200])
    run_kvcache(2, 1, 512, 4, 2, 64, bf16, num_splits=200)
    # The same at d 128 (its copy map differs from d 64's), contiguous and paged 16 / 64 / 256
    run_kvcache(2, 1, 512, 16, 2, 128, bf16, new=2, seqlens=[600, -50])
    for pg in (16, 64, 256):
        run_kvcache(2, 2, 512, 16, 2, 128, bf16, page=pg, new=1, seqlens=[10**6, 3],
                    table_fix=lambda t: (t.__setitem__((0, 0), 10**6),
                                         t.__setitem__((1, t.shape[1] - 1), -7)))
    # Multi-page key blocks at d 128: pages of 16 and of 32 (a 64-key block over two)
    run_kvcache(2, 2, 1024, 16, 2, 128, bf16, page=16, new=2, causal=True, seqlens=[1000, 333])
    run_kvcache(2, 1, 1024, 8, 2, 128, fp16, page=32, seqlens=[999, 64])
    # The combine (a CTA per row, launched as a programmatic dependent on Hopper): many
    # splits (several batches a slot), empty splits of a short sequence, a sink, d 256
    run_kvcache(2, 1, 16384, 8, 2, 128, bf16, seqlens=[16000, 300], num_splits=256)
    run_kvcache(2, 1, 4096, 8, 2, 64, bf16, page=16, seqlens=[4000, 1], num_splits=200)
    run_padded(2, 1, 5000, 8, 2, 256, 256, bf16, learnable_sink=torch.randn(8, device=dev),
               forward_only=True)
    # The serial combine, a plain launch
    os.environ["FLASHATTN_DECODE_COMBINE"] = "serial"
    os.environ["FLASHATTN_DECODE_PDL"] = "0"
    run_kvcache(2, 1, 4096, 8, 2, 64, bf16, page=16, seqlens=[4000, 1], num_splits=200)
    run_varlen([1, 2, 1], [700, 0, 1300], 8, 2, 128, bf16)
    del os.environ["FLASHATTN_DECODE_COMBINE"], os.environ["FLASHATTN_DECODE_PDL"]


def run_probs(b, sq, sk, h, hk, d, dtype, **kw):
    q = torch.randn(b, sq, h, d, device=dev, dtype=dtype)
    k = torch.randn(b, sk, hk, d, device=dev, dtype=dtype)
    v = torch.randn(b, sk, hk, d, device=dev, dtype=dtype)
    flashattn.flash_attn_func(q, k, v, return_attn_probs=True, **kw)
    torch.cuda.synchronize()
    print("attn_probs", b, sq, sk, h, hk, d, dtype, kw, "ok", flush=True)


def dropout_cases():
    """Dropout (sm80 variants; each head-dim bucket's backward tile pairs its Philox blocks
    differently: along the key tiles, the query tiles, or not at all at d 192 / 256) and
    sinks (every forward kernel, the dsink kernel, the split-KV combine)."""
    sink = lambda h: torch.randn(h, device=dev).requires_grad_()  # noqa: E731 (dsink too)
    for d in (32, 64, 96, 128, 192, 256):
        run_padded(1, 200, 333, 4, 2, d, d, bf16, dropout_p=0.2, causal=d in (64, 192))
    run_padded(2, 257, 390, 4, 2, 59, 59, fp16, dropout_p=0.1, window_size=(100, 20))
    run_padded(1, 200, 300, 2, 1, 128, 128, bf16, dropout_p=0.3, softcap=20.0,
               alibi_slopes=torch.rand(2, device=dev))
    run_varlen([130, 0, 257], [300, 5, 199], 4, 2, 64, bf16, dropout_p=0.15, causal=True)
    run_padded(1, 300, 420, 4, 2, 128, 128, bf16, dropout_p=0.2, learnable_sink=sink(4),
               deterministic=True)
    run_padded(1, 300, 333, 4, 2, 128, 128, bf16, learnable_sink=sink(4), causal=True)
    run_padded(1, 300, 333, 4, 2, 64, 64, fp16, learnable_sink=sink(4), window_size=(50, 50))
    run_varlen([130, 0, 257], [300, 5, 199], 4, 2, 128, bf16, learnable_sink=sink(4))
    run_padded(2, 1, 700, 8, 2, 128, 128, bf16, learnable_sink=sink(8))   # split-KV + combine
    run_padded(1, 2, 600, 4, 4, 64, 64, fp16, learnable_sink=sink(4), forward_only=True)
    run_padded(1, 64, 700, 4, 2, 128, 128, bf16, dropout_p=0.1, forward_only=True)  # not decode
    run_probs(2, 70, 90, 4, 2, 64, bf16, dropout_p=0.25, causal=True)
    run_probs(1, 33, 200, 2, 2, 128, fp16, dropout_p=0.5, learnable_sink=sink(2))


sm90 = (torch.cuda.get_device_capability() == (9, 0)
        and not flashattn.BUILD_CONFIG["FLASHATTN_DISABLE_SM90"])
if "--decode" in sys.argv:
    decode_cases()
    print("all cases ran")
    sys.exit(0)
if "--dropout" in sys.argv:
    dropout_cases()
    print("all cases ran")
    sys.exit(0)
if "--sm90" in sys.argv:
    if not sm90:
        sys.exit("--sm90: this GPU or build has no sm90 kernels")
    sm90_cases()
    print("all cases ran")
    sys.exit(0)
if sm90:
    sm90_cases()
decode_cases()
dropout_cases()
run_padded(1, 300, 333, 2, 1, 64, 64, bf16)
run_padded(1, 300, 333, 2, 2, 128, 128, fp16, causal=True)
os.environ["FLASHATTN_FORCE_BACKEND"] = "sm80"  # the d128 forward cases on sm80 too
run_padded(1, 300, 333, 2, 2, 128, 128, fp16, causal=True)
run_padded(1, 300, 420, 4, 2, 128, 128, bf16, window_size=(64, 64))
del os.environ["FLASHATTN_FORCE_BACKEND"]
run_padded(2, 257, 390, 4, 2, 59, 59, bf16, window_size=(100, 20))
run_padded(1, 200, 260, 2, 1, 192, 128, bf16, causal=True, softcap=30.0)
run_padded(1, 130, 300, 2, 2, 256, 256, fp16, alibi_slopes=torch.rand(2, device=dev))
run_padded(1, 129, 300, 2, 2, 32, 32, bf16, deterministic=True)
run_padded(1, 150, 300, 2, 2, 96, 96, fp16, causal=True)
run_padded(1, 200, 300, 2, 1, 59, 59, fp16, softcap=20.0,  # odd head dim + score mod
           alibi_slopes=torch.rand(2, device=dev))
run_padded(1, 200, 300, 4, 2, 256, 256, bf16, causal=True, deterministic=True)
run_varlen([130, 0, 257], [300, 5, 199], 4, 2, 64, bf16, causal=True)
run_padded(1, 130, 2100, 2, 1, 256, 256, bf16, causal=True)  # d256 forward's 128 x 64 tile
run_varlen([1, 250], [260, 0], 2, 1, 128, fp16)
# Deterministic causal at d128's default tile (four key blocks; varlen with a short one).
run_padded(1, 300, 420, 4, 2, 128, 128, bf16, causal=True, deterministic=True)
run_varlen([300, 1], [420, 130], 4, 2, 128, bf16, causal=True, deterministic=True)
# Deterministic without a window in rotation chunks of 2 key blocks (several chunks).
os.environ["FLASHATTN_BWD_DET_CHUNK"] = "2"
run_padded(1, 300, 700, 4, 2, 128, 128, bf16, deterministic=True)
run_varlen([300, 1, 200], [700, 130, 420], 4, 2, 64, bf16, deterministic=True)
del os.environ["FLASHATTN_BWD_DET_CHUNK"]
# The tiles of GPUs with 99 KB of shared memory per block (sm_86 / sm_89), picked by the cap.
os.environ["FLASHATTN_SMEM_LIMIT"] = str(99 * 1024)
for d in (32, 64, 96, 128, 192):
    run_padded(1, 200, 333, 4, 2, d, d, bf16, causal=d in (64, 192), deterministic=d == 128)
run_varlen([130, 0, 257], [300, 5, 199], 2, 2, 96, fp16)
run_padded(1, 200, 300, 2, 2, 256, 256, bf16, forward_only=True)
del os.environ["FLASHATTN_SMEM_LIMIT"]
print("all cases ran")
