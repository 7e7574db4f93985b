#include "scheduler/kv_cache.h"

#include <cmath>

namespace servesim::scheduler {

int64_t KvBlocksIn(double bytes, double block_bytes) {
  if (!(bytes > 0) || !(block_bytes > 0)) return 0;
  const double blocks = std::floor(bytes / block_bytes);
  if (!(blocks < static_cast<double>(kMaxKvBlocks))) return kMaxKvBlocks;
  return static_cast<int64_t>(blocks);
}

KvCapacity ComputeKvCapacity(const KvCapacityInputs& in) {
  KvCapacity out;
  out.usable_bytes_per_xpu = in.memory_bytes_per_xpu * in.memory_utilization -
                             in.weight_bytes / static_cast<double>(in.xpus) -
                             in.activation_bytes_per_xpu;
  const double block_bytes =
      static_cast<double>(in.block_tokens) * in.kv_bytes_per_token_per_xpu;
  out.blocks = KvBlocksIn(out.usable_bytes_per_xpu, block_bytes);
  out.tokens = out.blocks * in.block_tokens;
  return out;
}

}  // namespace servesim::scheduler
