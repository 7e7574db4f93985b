#include "scheduler/kv_cache.h"

#include <cmath>

namespace servesim::scheduler {

KvCapacity ComputeKvCapacity(const KvCapacityInputs& in) {
  KvCapacity out;
  out.usable_bytes_per_xpu = in.memory_bytes_per_xpu * in.memory_utilization -
                             in.weight_bytes / static_cast<double>(in.xpus) -
                             in.activation_bytes_per_xpu;
  const double block_bytes =
      static_cast<double>(in.block_tokens) * in.kv_bytes_per_token_per_xpu;
  if (out.usable_bytes_per_xpu > 0 && block_bytes > 0) {
    out.blocks = static_cast<int64_t>(std::floor(out.usable_bytes_per_xpu / block_bytes));
  }
  out.tokens = out.blocks * in.block_tokens;
  return out;
}

}  // namespace servesim::scheduler
