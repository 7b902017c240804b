// The end of a row's online softmax, shared by the CUDA forwards (sm80, sm90): from the row's
// sum of exp(s - m) and its max m (natural-log units; the sum is 0 when the row saw no key),
// the factor that normalises its accumulated output and its lse, with the attention sink of
// params.h when there is one: e^sink joins the sum, taken against max(m, sink) so that neither
// side overflows; lse = M + ln(sum e^(m - M) + e^(sink - M)), out = acc e^(m - M) / that sum.
// out_scale: the dropout's 1 / (1 - p) (1 without).
#pragma once
#include <cmath>

#include "seqlen.h"  // FLASHATTN_HOST_DEVICE

namespace flashattn {

struct RowFinish {
  float inv;  // out = acc * inv
  float lse;
};

FLASHATTN_HOST_DEVICE RowFinish finish_row(float sum, float m, bool has_sink, float sink,
                                           float out_scale) {
  if (!has_sink || sink == -INFINITY) {
    if (sum == 0.f) return RowFinish{0.f, -INFINITY};
    return RowFinish{out_scale / sum, m + logf(sum)};
  }
  const float big = sum == 0.f ? sink : fmaxf(m, sink);
  const float a = sum == 0.f ? 0.f : expf(m - big);
  const float total = sum * a + expf(sink - big);
  return RowFinish{out_scale * a / total, big + logf(total)};
}

}  // namespace flashattn
