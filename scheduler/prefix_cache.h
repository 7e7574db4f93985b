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
//    evicts from the LRU head (the blocks freed longest ago). The LRU is a
//    ring of hashes in the order they were freed, not a linked list:
//    eviction reads it front to back, so walking it is no chain of cache
//    misses, and the victims' entries can be fetched ahead. A block taken
//    back (a hit) leaves its slot behind, stale; stale slots are skipped,
//    and compacted away once they outnumber the live ones. A block that
//    nothing can hit any more (ReleaseUnreachable) keeps its slot, marked,
//    and leaves the hash map at once.
//  - The pool (KvBlockPool) counts the blocks in use: private blocks plus
//    cached blocks with references. Evictable blocks are free in the pool's
//    count; the cache keeps how many of them there are.
//  - Lower tiers (KvTier; docs/kv_tiers.md): host DRAM, CXL or SSD below
//    the device memory, each an LRU of block hashes with its own capacity,
//    inclusive (a block may be in HBM and in a tier at once). A block
//    enters the first tier when it is cached (write-through: vLLM's CPU
//    offloading connector, LMCache) or when HBM evicts it (write-on-evict:
//    SGLang's HiCache write-back); a tier that is full moves its least
//    recently used block to the next tier down, or drops it from the last.
//    A prompt's leading blocks match in HBM or in any tier; a block found
//    only in a tier is loaded into a fresh HBM block (from the highest tier
//    holding it) and cached there again.
//  - The last tier may be a cluster store (KvTierConfig::cluster_store):
//    one BlockLru (scheduler/kv_store.h) that every replica of the pool
//    shares, so a block one replica stores the others find. A block lives
//    where the replica that stored it is (`home`); loads say from where.
#ifndef SERVESIM_SCHEDULER_PREFIX_CACHE_H_
#define SERVESIM_SCHEDULER_PREFIX_CACHE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "scheduler/kv_cache.h"
#include "scheduler/kv_store.h"

namespace servesim::scheduler {

// The most lower tiers below the device memory.
inline constexpr int kMaxKvTiers = 4;

// A lower tier's size, in blocks (each xPU holds its shard of a block, as
// in HBM).
struct KvTierConfig {
  std::string name;  // "host_dram", "cxl", "ssd"
  int64_t capacity_blocks = 0;
  // Cost of moving blocks between the tier and the xPUs: a batch of n
  // blocks takes latency_s + n * seconds_per_block; bytes_per_block and
  // energy_pj_per_block are the whole replica's (every xPU's shard).
  double seconds_per_block = 0;
  double latency_s = 0;
  double bytes_per_block = 0;
  double energy_pj_per_block = 0;
  // The pool's shared cluster store (the last tier only): its capacity is
  // the pool's, capacity_blocks this scheduler's share of it.
  bool cluster_store = false;
};

// Per tier, over the run, in blocks.
struct KvTierStats {
  int64_t loaded = 0;   // read back into HBM on a prompt's hit
  int64_t stored = 0;   // written into this tier (from HBM or the tier above)
  int64_t dropped = 0;  // evicted from this tier (to the next, or gone)
};

class PrefixCache {
 public:
  // `tiers`: the lower tiers, fastest first (none: HBM only).
  // `write_through`: store a block into the first tier as it is cached;
  // else as HBM evicts it. `store`: the pool's shared cluster store, which
  // a last tier with cluster_store uses (borrowed; required then); `home`:
  // this replica's index, where the blocks it stores there live.
  explicit PrefixCache(KvBlockPool* pool, std::vector<KvTierConfig> tiers = {},
                       bool write_through = true, BlockLru* store = nullptr, int32_t home = 0);

  // How many of `hashes`' leading blocks are cached (at most `max_blocks`),
  // in HBM or in a lower tier; how many of the HBM ones are evictable now
  // (taking them uses capacity); and how many come from each tier (each
  // needs a fresh HBM block and a load).
  struct Match {
    int64_t blocks = 0;
    int64_t evictable = 0;
    int64_t loads = 0;  // sum of from_tier
    int64_t from_tier[kMaxKvTiers] = {0, 0, 0, 0};
  };
  Match Lookup(absl::Span<const uint64_t> hashes, int64_t max_blocks) const;

  // Whether `fresh` new blocks can be allocated after taking `match`'s hits
  // (its loads need fresh blocks too).
  bool CanAllocate(const Match& match, int64_t fresh) const {
    return fresh + match.loads <= pool_->free() - match.evictable;
  }
  // References the first `blocks` of `hashes`, as `match` found them (the
  // cache unchanged since): HBM hits first, then every block a tier holds
  // is loaded into a fresh HBM block and cached there. Needs
  // CanAllocate(match, 0).
  void Acquire(absl::Span<const uint64_t> hashes, const Match& match);
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
  // Release for a block no request can ask for again (a finished request's
  // own content, which only it could find): it keeps its place in the
  // eviction order, counting as free capacity until it is evicted in its
  // turn, as Release leaves it, but its entry goes now. Nothing looks it up
  // again, so no later step pays for it, and the hash map keeps to the
  // blocks that can still be hit. `hash` must have one reference.
  void ReleaseUnreachable(uint64_t hash);
  // Asks the memory system for `hash`'s entry ahead of a Release: a
  // request's blocks are released together, and each entry is otherwise a
  // cache miss of its own, one after another.
  void Prefetch(uint64_t hash) const { entries_.prefetch(hash); }

  // In HBM or in any tier.
  bool Contains(uint64_t hash) const;
  bool InHbm(uint64_t hash) const { return entries_.contains(hash); }
  int64_t cached_blocks() const { return static_cast<int64_t>(entries_.size()); }
  int64_t evictable_blocks() const { return evictable_; }
  int64_t evictions() const { return evictions_; }

  int num_tiers() const { return static_cast<int>(tiers_.size()); }
  const KvTierConfig& tier_config(int k) const { return tiers_[static_cast<size_t>(k)].config; }
  const KvTierStats& tier_stats(int k) const { return tiers_[static_cast<size_t>(k)].stats; }
  // Blocks in tier k (a cluster store's: the whole pool's).
  int64_t tier_blocks(int k) const { return tiers_[static_cast<size_t>(k)].lru->blocks(); }
  // Blocks moved between HBM and the tiers since the last call, per tier
  // (loads into HBM, stores out of HBM), then zeroed: the scheduler costs
  // them per step.
  struct Moved {
    int64_t loads[kMaxKvTiers] = {0, 0, 0, 0};
    int64_t stores = 0;  // HBM -> first tier
    // Of a cluster store's loads: (home, blocks) per home, in the order the
    // homes were first loaded from.
    std::vector<std::pair<int32_t, int64_t>> store_from;
  };
  Moved TakeMoved() {
    Moved m = std::move(moved_);
    moved_ = Moved{};
    return m;
  }

 private:
  struct Entry {
    int32_t refs = 0;
    uint32_t freed = 0;  // with refs == 0: its slot's sequence number in ring_
  };
  struct Tier {
    KvTierConfig config;
    std::unique_ptr<BlockLru> own;  // null for a cluster store
    BlockLru* lru = nullptr;        // own, or the shared store
    KvTierStats stats;
  };
  // The highest tier holding `hash`, or -1.
  int TierOf(uint64_t hash) const;
  // Stores `hash` into tier k (from HBM when k == 0, else from tier k-1),
  // making room by moving tier k's least recently used block down.
  void Store(int k, uint64_t hash);
  // Appends `hash` (entry `e`, now without references) as the most recently
  // freed.
  void PushFreed(uint64_t hash, Entry& e);
  // Appends a slot; returns its sequence number.
  uint32_t PushSlot(uint64_t hash, bool unreachable);
  // Whether ring slot `seq` holds its hash's current free position.
  bool Live(uint32_t seq, const Entry& e) const { return e.refs == 0 && e.freed == seq; }
  // Makes room for one more slot: drops the stale slots when they are at
  // least as many as the live ones (renumbering the live), else doubles.
  // Unreachable slots are live.
  void GrowRing();

  KvBlockPool* pool_;
  absl::flat_hash_map<uint64_t, Entry> entries_;
  // Evictable hashes, least recently freed first: slot seq of the ring is
  // ring_[seq & (ring_.size() - 1)], for seq from head_ to tail_ (uint32
  // arithmetic; the ring's size is a power of two). evictable_ of them are
  // live; unreachable_ marks the slots of ReleaseUnreachable's blocks.
  std::vector<uint64_t> ring_;
  std::vector<uint8_t> unreachable_;
  uint32_t head_ = 0, tail_ = 0;
  int64_t evictable_ = 0;
  int64_t evictions_ = 0;
  std::vector<Tier> tiers_;
  bool write_through_ = true;
  int32_t home_ = 0;
  Moved moved_;
};

}  // namespace servesim::scheduler

#endif  // SERVESIM_SCHEDULER_PREFIX_CACHE_H_
