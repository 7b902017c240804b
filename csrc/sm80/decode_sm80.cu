// Split-KV attention over a KV cache (sm80+). Interim: not yet written.
#include <stdexcept>

#include "sm80_backend.h"

namespace flashattn::sm80 {

WorkspaceSizes fwd_kvcache_workspace(const FwdParams&) { return {}; }

void run_fwd_kvcache(const FwdParams&, void*) {
  throw std::runtime_error("flashattn: the CUDA kvcache attention is not built yet");
}

}  // namespace flashattn::sm80
