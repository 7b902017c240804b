// flash_attn_with_kvcache's append + rotary step on CUDA (sm80+). Interim: not yet written.
#include <stdexcept>

#include "sm80_backend.h"

namespace flashattn::sm80 {

void run_kvcache_append(const FwdParams&, const KvAppendParams&, void*) {
  throw std::runtime_error("flashattn: the CUDA kvcache append is not built yet");
}

}  // namespace flashattn::sm80
