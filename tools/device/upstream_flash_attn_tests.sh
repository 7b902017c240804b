#!/usr/bin/env bash
# flash-attn's own tests (tests/test_flash_attn.py of Dao-AILab/flash-attention) against our
# API, through a shim package `flash_attn` that re-exports flashattn (issue 15's check that
# flash-attn's dropout tests read our S unchanged). Two steps:
#   prepare (this machine, network and the fetched mirror): bash tools/device/upstream_flash_attn_tests.sh prepare
#     -> .upstream/ (ignored by git): their test file and flash_attn/bert_padding.py taken from
#        the mirror's snapshot at run time (not committed here), einops (a wheel, pure Python),
#        and our shim (flash_attn/__init__.py, flash_attn_interface.py, layers/rotary.py).
#   run (the H200, the package built; carry .upstream): bash tools/device/upstream_flash_attn_tests.sh run [pytest -k expr]
#     default -k: the dropout cases (0.17) of the output / qkvpacked / varlen tests.
set -uo pipefail
MIRROR="${MIRROR:-/work/.mirror/Dao-AILab+flash-attention/repo}"
U=.upstream
case "${1:-}" in
prepare)
  rm -rf $U && mkdir -p $U/tests $U/shim/flash_attn/layers $U/site
  git --git-dir="$MIRROR" show HEAD:tests/test_flash_attn.py > $U/tests/test_flash_attn.py
  git --git-dir="$MIRROR" show HEAD:flash_attn/bert_padding.py > $U/shim/flash_attn/bert_padding.py
  git --git-dir="$MIRROR" log -1 --format='%H %cs' > $U/UPSTREAM_COMMIT
  python3 -m pip download --no-deps --only-binary=:all: -d $U/wheels einops > /dev/null &&
    (cd $U/site && python3 -m zipfile -e ../wheels/einops-*.whl .)
  cat > $U/shim/flash_attn/__init__.py <<'PY'
"""Test shim: flash-attn's public names served by flashattn (tools/device/upstream_flash_attn_tests.sh)."""
from flashattn import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,  # noqa: F401
                       flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                       flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache)
PY
  cat > $U/shim/flash_attn/flash_attn_interface.py <<'PY'
from flashattn.interface import _get_block_size_n  # noqa: F401
USE_TRITON_ROCM = False
PY
  touch $U/shim/flash_attn/layers/__init__.py
  cat > $U/shim/flash_attn/layers/rotary.py <<'PY'
"""apply_rotary_emb as flash-attn's tests call it (x (b, s, h, d), cos / sin (s, rd / 2)), in
plain torch (theirs is a Triton kernel); only its reference role in test_flash_attn_kvcache."""
import torch


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0,
                     cu_seqlens=None, max_seqlen=None):
    assert cu_seqlens is None, "the shim's rotary takes the padded layout only"
    rd = cos.shape[-1] * 2
    s = x.shape[1]
    if isinstance(seqlen_offsets, torch.Tensor):
        pos = seqlen_offsets.view(-1, 1) + torch.arange(s, device=x.device).view(1, s)
    else:
        pos = (seqlen_offsets + torch.arange(s, device=x.device)).view(1, s).expand(x.shape[0], s)
    c, si = cos[pos].unsqueeze(2).float(), sin[pos].unsqueeze(2).float()  # (b, s, 1, rd / 2)
    xr = x[..., :rd].float()
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        out = torch.stack([x1 * c - x2 * si, x1 * si + x2 * c], dim=-1).flatten(-2)
    else:
        x1, x2 = xr[..., :rd // 2], xr[..., rd // 2:]
        out = torch.cat([x1 * c - x2 * si, x1 * si + x2 * c], dim=-1)
    res = torch.cat([out.to(x.dtype), x[..., rd:]], dim=-1)
    if inplace:
        x.copy_(res)
        return x
    return res
PY
  echo "prepared $U from $(cat $U/UPSTREAM_COMMIT)"
  ;;
run)
  [ -f $U/tests/test_flash_attn.py ] || { echo "no $U: run '$0 prepare' first and carry $U" >&2; exit 2; }
  K="${2:-(test_flash_attn_output or test_flash_attn_qkvpacked or test_flash_attn_varlen_output or test_flash_attn_varlen_qkvpacked or race_condition) and 0.17}"
  cd $U/tests && PYTHONPATH=$OLDPWD/$U/shim:$OLDPWD/$U/site:$OLDPWD${PYTHONPATH:+:$PYTHONPATH} \
    timeout "${UPSTREAM_LIMIT:-300}" python3 -m pytest -q -p no:cacheprovider -n 8 -x -k "$K" test_flash_attn.py 2>&1 | tail -25
  ;;
*)
  echo "usage: $0 prepare | run [pytest -k expression]" >&2; exit 2 ;;
esac
