// The score transform of params.h, written once for the CUDA forwards (sm80, sm90): on a
// scaled score x = q.k * softmax_scale, the softcap (cap * tanh(x / cap)), then the ALiBi bias
// of a key `dist` = i + sk - sq - j positions from the query's diagonal.
#pragma once
#include <cmath>

#include "seqlen.h"  // FLASHATTN_HOST_DEVICE

namespace flashattn {

FLASHATTN_HOST_DEVICE float score_mod(float x, bool has_cap, float cap, float inv_cap,
                                      float slope, int dist) {
  if (has_cap) x = cap * tanhf(x * inv_cap);
  return x - slope * static_cast<float>(dist < 0 ? -dist : dist);
}

}  // namespace flashattn
