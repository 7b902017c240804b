// Device helpers shared by the CUDA paths (sm80, sm90).
#pragma once
#include <cstdint>

namespace flashattn {

// Heavy-first launch order: the CTA's rank along gridDim.x when x is made the slowest index
// of the linear block order (every (y, z) at rank 0 first), and its (y, z). Grids of fewer
// than 2^31 blocks (heavy_first_ok).
struct GridCoord {
  int x_rank, y, z;
};
__device__ __forceinline__ GridCoord x_slowest_coord() {
  const int yz = gridDim.y * gridDim.z;
  const int lin = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  return GridCoord{lin / yz, (lin % yz) % int(gridDim.y), (lin % yz) / int(gridDim.y)};
}

__device__ __forceinline__ uint32_t smem_u32(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

}  // namespace flashattn
