#include "scheduler/prefix_cache.h"

#include <algorithm>

namespace servesim::scheduler {

PrefixCache::Match PrefixCache::Lookup(absl::Span<const uint64_t> hashes,
                                       int64_t max_blocks) const {
  Match m;
  const int64_t n = std::min<int64_t>(max_blocks, static_cast<int64_t>(hashes.size()));
  for (int64_t i = 0; i < n; ++i) {
    auto it = entries_.find(hashes[static_cast<size_t>(i)]);
    if (it == entries_.end()) break;
    ++m.blocks;
    if (it->second.refs == 0) ++m.evictable;
  }
  return m;
}

void PrefixCache::Acquire(absl::Span<const uint64_t> hashes, int64_t blocks) {
  for (int64_t i = 0; i < blocks; ++i) {
    Entry& e = entries_.at(hashes[static_cast<size_t>(i)]);
    if (e.refs == 0) {
      lru_.erase(e.lru);
      pool_->TryAllocate(1);  // back in use (it was free in the pool's count)
    }
    ++e.refs;
  }
}

bool PrefixCache::AllocateFresh(int64_t n) {
  if (n > pool_->free()) return false;
  // Never-cached free blocks first; then the least recently freed cached.
  const int64_t never_cached = pool_->free() - evictable_blocks();
  for (int64_t k = n - never_cached; k > 0; --k) {
    entries_.erase(lru_.front());
    lru_.pop_front();
    ++evictions_;
  }
  pool_->TryAllocate(n);
  return true;
}

bool PrefixCache::Register(uint64_t hash) {
  auto [it, inserted] = entries_.try_emplace(hash);
  if (!inserted) return false;
  it->second.refs = 1;  // the block is already in use (allocated fresh)
  return true;
}

void PrefixCache::Release(uint64_t hash) {
  Entry& e = entries_.at(hash);
  if (--e.refs > 0) return;
  lru_.push_back(hash);
  e.lru = std::prev(lru_.end());
  pool_->Release(1);
}

}  // namespace servesim::scheduler
