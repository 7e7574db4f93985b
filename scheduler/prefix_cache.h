// Automatic prefix caching over the paged KV cache (vLLM's APC, as its v1
// KVCacheManager keeps it; Kwon et al., SOSP'23, and the vLLM docs' "Automatic
// Prefix Caching" design).
//
// Contract: plain code, deterministic, not thread-safe (one per replica).
//
// Model:
//  - A full block of KV is named by a chained hash of the tokens up to its
//    end (workload/prefix.h), so two requests whose prompts start alike name
//    their first blocks alike. Only full blocks are cached.
//  - A cached block is referenced by the requests using it. When the last
//    reference goes, the block stays cached but becomes evictable, at the
//    tail of an LRU list: it still counts as free capacity, and a later
//    prompt with the same prefix takes it back (a hit) instead of computing
//    it again.
//  - Allocating fresh blocks takes never-cached free blocks first, then
//    evicts from the LRU head (the blocks freed longest ago).
//  - The pool (KvBlockPool) counts the blocks in use: private blocks plus
//    cached blocks with references. Evictable blocks are free in the pool's
//    count; the cache keeps how many of them there are.
#ifndef SERVESIM_SCHEDULER_PREFIX_CACHE_H_
#define SERVESIM_SCHEDULER_PREFIX_CACHE_H_

#include <cstdint>
#include <list>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "scheduler/kv_cache.h"

namespace servesim::scheduler {

class PrefixCache {
 public:
  explicit PrefixCache(KvBlockPool* pool) : pool_(pool) {}

  // How many of `hashes`' leading blocks are cached (at most `max_blocks`),
  // and how many of those are evictable now (taking them uses capacity).
  struct Match {
    int64_t blocks = 0;
    int64_t evictable = 0;
  };
  Match Lookup(absl::Span<const uint64_t> hashes, int64_t max_blocks) const;

  // Whether `fresh` new blocks can be allocated after taking `match`'s hits.
  bool CanAllocate(const Match& match, int64_t fresh) const {
    return fresh <= pool_->free() - match.evictable;
  }
  // References the first `blocks` of `hashes` (all cached: Lookup said so).
  void Acquire(absl::Span<const uint64_t> hashes, int64_t blocks);
  // Allocates `n` fresh (private) blocks, evicting cached ones as needed;
  // false, with nothing changed, if the pool cannot hold them.
  bool AllocateFresh(int64_t n);
  // A private block of a request became full with content `hash`: caches it
  // (with the request's reference). False if `hash` is already cached (the
  // block then stays private, as vLLM keeps one copy of a cached block).
  bool Register(uint64_t hash);
  // Drops one reference of the cached block `hash`; at zero it becomes
  // evictable (freed in the pool's count), at the LRU tail.
  void Release(uint64_t hash);

  bool Contains(uint64_t hash) const { return entries_.contains(hash); }
  int64_t cached_blocks() const { return static_cast<int64_t>(entries_.size()); }
  int64_t evictable_blocks() const { return static_cast<int64_t>(lru_.size()); }
  int64_t evictions() const { return evictions_; }

 private:
  struct Entry {
    int32_t refs = 0;
    std::list<uint64_t>::iterator lru;  // valid when refs == 0
  };
  KvBlockPool* pool_;
  absl::flat_hash_map<uint64_t, Entry> entries_;
  std::list<uint64_t> lru_;  // evictable hashes, least recently freed first
  int64_t evictions_ = 0;
};

}  // namespace servesim::scheduler

#endif  // SERVESIM_SCHEDULER_PREFIX_CACHE_H_
