#include "scheduler/prefix_cache.h"

#include <algorithm>
#include <utility>

namespace servesim::scheduler {

PrefixCache::PrefixCache(KvBlockPool* pool, std::vector<KvTierConfig> tiers, bool write_through,
                         BlockLru* store, int32_t home)
    : pool_(pool), write_through_(write_through), home_(home) {
  for (KvTierConfig& c : tiers) {
    Tier t;
    t.config = std::move(c);
    if (t.config.cluster_store && store != nullptr) {
      t.lru = store;
    } else {
      t.own = std::make_unique<BlockLru>(t.config.capacity_blocks);
      t.lru = t.own.get();
    }
    tiers_.push_back(std::move(t));
  }
}

int PrefixCache::TierOf(uint64_t hash) const {
  for (size_t k = 0; k < tiers_.size(); ++k) {
    if (tiers_[k].lru->Contains(hash)) return static_cast<int>(k);
  }
  return -1;
}

bool PrefixCache::Contains(uint64_t hash) const {
  return entries_.contains(hash) || TierOf(hash) >= 0;
}

PrefixCache::Match PrefixCache::Lookup(absl::Span<const uint64_t> hashes,
                                       int64_t max_blocks) const {
  Match m;
  const int64_t n = std::min<int64_t>(max_blocks, static_cast<int64_t>(hashes.size()));
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t h = hashes[static_cast<size_t>(i)];
    auto it = entries_.find(h);
    if (it != entries_.end()) {
      ++m.blocks;
      if (it->second.refs == 0) ++m.evictable;
      continue;
    }
    const int k = TierOf(h);
    if (k < 0) break;
    ++m.blocks;
    ++m.loads;
    ++m.from_tier[k];
  }
  return m;
}

void PrefixCache::Acquire(absl::Span<const uint64_t> hashes, const Match& match) {
  // HBM hits first, so that the loads' fresh blocks cannot evict them.
  for (int64_t i = 0; i < match.blocks; ++i) {
    auto it = entries_.find(hashes[static_cast<size_t>(i)]);
    if (it == entries_.end()) continue;
    Entry& e = it->second;
    if (e.refs == 0) {
      --evictable_;           // its slot in the ring turns stale
      pool_->TryAllocate(1);  // back in use (it was free in the pool's count)
    }
    ++e.refs;
  }
  if (match.loads == 0) return;
  // The loads read their tiers before the fresh blocks' evictions write
  // into them (a block pushed out of a tier meanwhile is already read).
  for (int64_t i = 0; i < match.blocks; ++i) {
    const uint64_t h = hashes[static_cast<size_t>(i)];
    if (entries_.contains(h)) continue;
    Tier& t = tiers_[static_cast<size_t>(TierOf(h))];
    t.lru->Touch(h);  // used: most recent
    ++t.stats.loaded;
    ++moved_.loads[&t - tiers_.data()];
    if (t.config.cluster_store) {
      const int32_t from = t.lru->home(h);
      auto it = std::find_if(moved_.store_from.begin(), moved_.store_from.end(),
                             [&](const auto& e) { return e.first == from; });
      if (it == moved_.store_from.end()) {
        moved_.store_from.emplace_back(from, 1);
      } else {
        ++it->second;
      }
    }
  }
  AllocateFresh(match.loads);  // CanAllocate said so
  for (int64_t i = 0; i < match.blocks; ++i) {
    const uint64_t h = hashes[static_cast<size_t>(i)];
    auto [it, inserted] = entries_.try_emplace(h);
    if (inserted) it->second.refs = 1;
  }
}

void PrefixCache::Store(int k, uint64_t hash) {
  Tier& t = tiers_[static_cast<size_t>(k)];
  uint64_t victim = 0;
  bool evicted = false;
  if (!t.lru->Put(hash, &victim, &evicted, home_)) return;  // there already
  ++t.stats.stored;
  if (k == 0) ++moved_.stores;
  if (!evicted) return;
  ++t.stats.dropped;
  if (k + 1 < num_tiers()) Store(k + 1, victim);
}

bool PrefixCache::AllocateFresh(int64_t n) {
  if (n > pool_->free()) return false;
  // Never-cached free blocks first; then the least recently freed cached.
  const int64_t never_cached = pool_->free() - evictable_blocks();
  int64_t victims = n - never_cached;
  if (victims > 0) {
    // The slots are read in order, and the entries they name fetched a few
    // slots ahead, so that the entries' cache misses overlap.
    constexpr uint32_t kAhead = 8;
    const uint32_t mask = static_cast<uint32_t>(ring_.size()) - 1;
    uint32_t ahead = head_;
    auto fetch = [&](uint32_t seq) {
      if (!unreachable_[seq & mask]) entries_.prefetch(ring_[seq & mask]);
    };
    for (uint32_t i = 0; i < kAhead && ahead != tail_; ++i) fetch(ahead++);
    while (victims > 0) {  // evictable_ >= victims: a live slot lies ahead
      if (ahead != tail_) fetch(ahead++);
      const uint32_t seq = head_++;
      const uint64_t hash = ring_[seq & mask];
      if (!unreachable_[seq & mask]) {
        auto it = entries_.find(hash);
        if (it == entries_.end() || !Live(seq, it->second)) continue;  // stale
        entries_.erase(it);
      }
      --evictable_;
      --victims;
      ++evictions_;
      if (!write_through_ && !tiers_.empty()) Store(0, hash);
    }
  }
  pool_->TryAllocate(n);
  return true;
}

bool PrefixCache::Register(uint64_t hash) {
  auto [it, inserted] = entries_.try_emplace(hash);
  if (!inserted) return false;
  it->second.refs = 1;  // the block is already in use (allocated fresh)
  if (write_through_ && !tiers_.empty()) Store(0, hash);
  return true;
}

void PrefixCache::Release(uint64_t hash) {
  Entry& e = entries_.at(hash);
  if (--e.refs > 0) return;
  PushFreed(hash, e);
  pool_->Release(1);
}

void PrefixCache::ReleaseUnreachable(uint64_t hash) {
  auto it = entries_.find(hash);
  if (--it->second.refs > 0) return;
  entries_.erase(it);
  PushSlot(hash, /*unreachable=*/true);
  pool_->Release(1);
}

void PrefixCache::PushFreed(uint64_t hash, Entry& e) { e.freed = PushSlot(hash, false); }

uint32_t PrefixCache::PushSlot(uint64_t hash, bool unreachable) {
  if (tail_ - head_ == ring_.size()) GrowRing();
  const uint32_t seq = tail_++;
  ring_[seq & (ring_.size() - 1)] = hash;
  unreachable_[seq & (ring_.size() - 1)] = unreachable ? 1 : 0;
  ++evictable_;
  return seq;
}

void PrefixCache::GrowRing() {
  const uint32_t span = tail_ - head_;
  if (span > 0 && static_cast<int64_t>(span) - evictable_ >= evictable_) {
    // Keep the live slots in order, renumbered from head_ (in place: a
    // slot only moves towards the head).
    const uint32_t mask = static_cast<uint32_t>(ring_.size()) - 1;
    uint32_t w = head_;
    for (uint32_t r = head_; r != tail_; ++r) {
      const uint64_t hash = ring_[r & mask];
      const uint8_t unreachable = unreachable_[r & mask];
      if (!unreachable) {
        auto it = entries_.find(hash);
        if (it == entries_.end() || !Live(r, it->second)) continue;
        it->second.freed = w;
      }
      unreachable_[w & mask] = unreachable;
      ring_[w++ & mask] = hash;
    }
    tail_ = w;
    if (tail_ - head_ < ring_.size()) return;
  }
  std::vector<uint64_t> grown(std::max<size_t>(1024, 2 * ring_.size()));
  std::vector<uint8_t> grown_marks(grown.size());
  const size_t old_mask = ring_.size() - 1, new_mask = grown.size() - 1;
  for (uint32_t seq = head_; seq != tail_; ++seq) {
    grown[seq & new_mask] = ring_[seq & old_mask];
    grown_marks[seq & new_mask] = unreachable_[seq & old_mask];
  }
  ring_ = std::move(grown);
  unreachable_ = std::move(grown_marks);
}

}  // namespace servesim::scheduler
