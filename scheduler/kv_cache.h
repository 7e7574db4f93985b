// Paged KV cache accounting (vLLM's PagedAttention, SOSP'23): the cache is
// `capacity` blocks of `block_tokens` positions; a request holds
// ceil(positions / block_tokens) blocks. Blocks are interchangeable (no
// prefix sharing yet), so the pool only counts.
#ifndef SERVESIM_SCHEDULER_KV_CACHE_H_
#define SERVESIM_SCHEDULER_KV_CACHE_H_

#include <cstdint>

namespace servesim::scheduler {

class KvBlockPool {
 public:
  explicit KvBlockPool(int64_t capacity) : capacity_(capacity) {}
  int64_t capacity() const { return capacity_; }
  int64_t used() const { return used_; }
  int64_t free() const { return capacity_ - used_; }
  bool TryAllocate(int64_t n) {
    if (n > free()) return false;
    used_ += n;
    return true;
  }
  void Release(int64_t n) { used_ -= n; }

 private:
  int64_t capacity_;
  int64_t used_ = 0;
};

// Inputs of the KV-capacity computation, all per replica.
struct KvCapacityInputs {
  double memory_bytes_per_xpu = 0;
  int64_t xpus = 1;                // tensor-parallel degree
  double memory_utilization = 0.9; // fraction the engine may use
  double weight_bytes = 0;         // whole model
  double activation_bytes_per_xpu = 0;
  int64_t kv_bytes_per_token_per_xpu = 0;
  int64_t block_tokens = 16;
};

struct KvCapacity {
  double usable_bytes_per_xpu = 0;  // after weights and activations
  int64_t blocks = 0;               // per replica (same on every xPU)
  int64_t tokens = 0;               // blocks * block_tokens
};

// The most KV blocks a pool counts: 2^52 (4.5e15), so that blocks x
// block_tokens (at most 1024) stays below 2^62. It guards the conversion,
// not the model: with the scenario's memory limits (1e15 bytes per xPU or
// attention unit, 1 TiB per AttAcc stack) only a toy model (a few bytes of
// KV per token) on petabytes of memory reaches it, and then holds 4.5e15
// blocks, more than any trace can fill.
inline constexpr int64_t kMaxKvBlocks = int64_t{1} << 52;

// floor(bytes / block_bytes) as a block count in [0, kMaxKvBlocks]: 0 when
// either is not positive (or is NaN), kMaxKvBlocks when the quotient is
// larger (or infinite). A double past int64's range never reaches the cast.
int64_t KvBlocksIn(double bytes, double block_bytes);

// blocks = floor((memory * utilization - weights / xpus - activations)
//                / (block_tokens * kv_bytes_per_token_per_xpu)),
// through KvBlocksIn. Negative usable memory gives 0 blocks (the caller
// reports the shortfall).
KvCapacity ComputeKvCapacity(const KvCapacityInputs& in);

}  // namespace servesim::scheduler

#endif  // SERVESIM_SCHEDULER_KV_CACHE_H_
