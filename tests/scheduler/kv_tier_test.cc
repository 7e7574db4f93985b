// Lower KV tiers under the prefix cache (scheduler/prefix_cache.h,
// docs/kv_tiers.md): where blocks go, what a hit loads and what the step
// waits for, by hand.
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "scheduler/batching.h"
#include "scheduler/kv_store.h"
#include "scheduler/prefix_cache.h"

namespace servesim::scheduler {
namespace {

KvTierConfig Tier(const char* name, int64_t blocks) {
  KvTierConfig t;
  t.name = name;
  t.capacity_blocks = blocks;
  t.seconds_per_block = 1e-3;
  t.latency_s = 5e-4;
  t.bytes_per_block = 1000;
  t.energy_pj_per_block = 1e4;
  return t;
}

// The slab list keeps least recently used first through erases from the
// middle, moves to the back, and reused nodes.
TEST(KvTierCacheTest, HashLruKeepsItsOrder) {
  HashLru l;
  const int32_t a = l.PushBack(10), b = l.PushBack(20), c = l.PushBack(30);
  l.MoveToBack(a);  // 20, 30, 10
  l.Erase(c);       // 20, 10
  const int32_t d = l.PushBack(40);
  EXPECT_EQ(d, c);  // its node again
  std::vector<uint64_t> order;
  while (!l.empty()) {
    order.push_back(l.hash(l.front()));
    l.Erase(l.front());
  }
  EXPECT_EQ(order, (std::vector<uint64_t>{20, 10, 40}));
  (void)b;
}

// Write-through into a 2-block tier over a 2-block tier: the third block
// pushes the first down; HBM's evictions leave every block findable below;
// a fourth and fifth push the first out of the last tier.
TEST(KvTierCacheTest, FullTiersMoveTheirLeastRecentlyUsedBlockDown) {
  KvBlockPool pool(3);
  PrefixCache cache(&pool, {Tier("host_dram", 2), Tier("ssd", 2)}, /*write_through=*/true);
  ASSERT_TRUE(cache.AllocateFresh(3));
  for (uint64_t h : {1, 2, 3}) ASSERT_TRUE(cache.Register(h));
  EXPECT_EQ(cache.tier_blocks(0), 2);  // 2, 3
  EXPECT_EQ(cache.tier_blocks(1), 1);  // 1
  EXPECT_EQ(cache.tier_stats(0).stored, 3);
  EXPECT_EQ(cache.tier_stats(0).dropped, 1);
  EXPECT_EQ(cache.tier_stats(1).stored, 1);
  for (uint64_t h : {3, 2, 1}) cache.Release(h);
  ASSERT_TRUE(cache.AllocateFresh(3));  // evicts 3, 2, 1 from HBM
  EXPECT_EQ(cache.evictions(), 3);
  EXPECT_EQ(cache.cached_blocks(), 0);
  const uint64_t prompt[] = {1, 2, 3};
  const PrefixCache::Match m = cache.Lookup(prompt, 3);
  EXPECT_EQ(m.blocks, 3);
  EXPECT_EQ(m.loads, 3);
  EXPECT_EQ(m.evictable, 0);
  EXPECT_EQ(m.from_tier[0], 2);
  EXPECT_EQ(m.from_tier[1], 1);
  EXPECT_FALSE(cache.CanAllocate(m, 0));  // its loads need 3 free blocks
  // Two new blocks (HBM holds them privately, then caches them): 4 pushes
  // 2 to the SSD tier, 5 pushes 3, and the SSD tier drops 1.
  pool.Release(3);
  ASSERT_TRUE(cache.AllocateFresh(2));
  ASSERT_TRUE(cache.Register(4));
  ASSERT_TRUE(cache.Register(5));
  EXPECT_EQ(cache.tier_stats(1).dropped, 1);
  EXPECT_FALSE(cache.Contains(1));
  EXPECT_TRUE(cache.Contains(2));
  EXPECT_EQ(cache.Lookup(prompt, 3).blocks, 0);  // the leading block is gone
  const uint64_t tail[] = {2, 3};
  EXPECT_EQ(cache.Lookup(tail, 2).from_tier[1], 2);
}

// Loading takes fresh HBM blocks and caches the block there again; the
// tier keeps its copy (inclusive) and counts the load.
TEST(KvTierCacheTest, AHitLoadsIntoAFreshBlockAndKeepsTheTiersCopy) {
  KvBlockPool pool(4);
  PrefixCache cache(&pool, {Tier("host_dram", 8)}, /*write_through=*/true);
  ASSERT_TRUE(cache.AllocateFresh(2));
  ASSERT_TRUE(cache.Register(7));
  ASSERT_TRUE(cache.Register(8));
  cache.Release(8);
  cache.Release(7);
  ASSERT_TRUE(cache.AllocateFresh(4));  // evicts 8, then 7
  pool.Release(4);
  (void)cache.TakeMoved();
  const uint64_t prompt[] = {7, 8};
  const PrefixCache::Match m = cache.Lookup(prompt, 2);
  ASSERT_TRUE(cache.CanAllocate(m, 1));
  cache.Acquire(prompt, m);
  EXPECT_EQ(pool.used(), 2);
  EXPECT_TRUE(cache.InHbm(7));
  EXPECT_TRUE(cache.InHbm(8));
  EXPECT_EQ(cache.tier_blocks(0), 2);
  EXPECT_EQ(cache.tier_stats(0).loaded, 2);
  const PrefixCache::Moved moved = cache.TakeMoved();
  EXPECT_EQ(moved.loads[0], 2);
  EXPECT_EQ(moved.stores, 0);
  // A second prompt with the same blocks now finds them in HBM, in use.
  const PrefixCache::Match again = cache.Lookup(prompt, 2);
  EXPECT_EQ(again.blocks, 2);
  EXPECT_EQ(again.loads, 0);
}

// Write-on-evict: caching a block writes nothing; HBM's eviction does.
TEST(KvTierCacheTest, WriteOnEvictStoresAsHbmEvicts) {
  KvBlockPool pool(2);
  PrefixCache cache(&pool, {Tier("cxl", 4)}, /*write_through=*/false);
  ASSERT_TRUE(cache.AllocateFresh(2));
  ASSERT_TRUE(cache.Register(1));
  ASSERT_TRUE(cache.Register(2));
  EXPECT_EQ(cache.tier_blocks(0), 0);
  cache.Release(2);
  cache.Release(1);
  ASSERT_TRUE(cache.AllocateFresh(1));  // evicts 2
  EXPECT_EQ(cache.tier_blocks(0), 1);
  EXPECT_TRUE(cache.Contains(2));
  EXPECT_FALSE(cache.InHbm(2));
  EXPECT_EQ(cache.TakeMoved().stores, 1);
}

BatchingConfig V1(bool write_through) {
  BatchingConfig c;
  c.policy = BatchingPolicy::kVllmV1;
  c.kv_block_tokens = 16;
  c.kv_capacity_blocks = 6;
  c.kv_watermark = 0;
  c.max_context_tokens = 1 << 20;
  c.max_batch_size = 8;
  c.max_tokens_per_iteration = 1000;
  c.prefix_caching = true;
  c.kv_tiers = {Tier("host_dram", 16)};
  c.kv_tier_write_through = write_through;
  return c;
}

RequestSpec Req(int64_t id, int64_t in, std::vector<uint64_t> hashes) {
  RequestSpec r{id, 0.0, in, 1, {}};
  r.block_hashes = std::make_shared<const std::vector<uint64_t>>(std::move(hashes));
  return r;
}

// A = (a1, a2, a3) prefills and finishes; B's six blocks (95 tokens) evict A's from
// the 6-block HBM; C, A's prompt again, finds a1 and a2 in host DRAM (its
// last block is computed, as vLLM leaves at least one token): 2 blocks
// loaded, 0.5 ms + 2 x 1 ms, before its 16-token chunk.
TEST(KvTierSchedulerTest, APromptEvictedFromHbmLoadsItsPrefixFromTheTier) {
  for (bool write_through : {true, false}) {
    SCOPED_TRACE(write_through ? "write-through" : "write-on-evict");
    ReplicaScheduler s(V1(write_through));
    s.Add(Req(0, 48, {1, 2, 3}), 0, nullptr);
    const Batch& a = s.Schedule(0);
    EXPECT_EQ(a.kv_tier_load_s, 0);
    EXPECT_EQ(a.kv_tier_store_s, 0);
    s.Complete(1, nullptr);
    s.Add(Req(1, 95, {11, 12, 13, 14, 15}), 1, nullptr);
    const Batch& b = s.Schedule(1);
    ASSERT_EQ(b.entries.size(), 1u);
    EXPECT_EQ(b.entries[0].new_tokens, 95);
    EXPECT_EQ(b.kv_tier_load_s, 0);
    // Write-on-evict: B's allocation evicts A's 3 blocks, which the step
    // writes out first (0.5 ms + 3 x 1 ms); write-through wrote them as A
    // cached them, off the steps.
    EXPECT_DOUBLE_EQ(b.kv_tier_store_s, write_through ? 0.0 : 5e-4 + 3e-3);
    s.Complete(2, nullptr);
    s.Add(Req(2, 48, {1, 2, 3}), 2, nullptr);
    const Batch& c = s.Schedule(2);
    ASSERT_EQ(c.entries.size(), 1u);
    EXPECT_EQ(c.entries[0].past_tokens, 32);
    EXPECT_EQ(c.entries[0].new_tokens, 16);
    EXPECT_EQ(c.kv_tier_loads, 2);
    EXPECT_DOUBLE_EQ(c.kv_tier_load_s, 5e-4 + 2e-3);
    EXPECT_EQ(s.prefix_hit_tokens(), 32);
    EXPECT_EQ(s.tier_hit_tokens(0), 32);
    EXPECT_EQ(s.prefix_cache()->tier_stats(0).loaded, 2);
    EXPECT_EQ(s.kv().used(), 3);
    // Its 3 fresh blocks (2 loads, 1 computed) take B's private block and
    // evict 2 of B's 5 cached ones, which write-on-evict writes out first.
    EXPECT_DOUBLE_EQ(c.kv_tier_store_s, write_through ? 0.0 : 5e-4 + 2e-3);
    EXPECT_DOUBLE_EQ(KvTierWaitS(c, 1.0, 80, false), c.kv_tier_store_s + 5e-4 + 2e-3);
  }
}

// Asynchronous loads (vLLM's WAITING_FOR_REMOTE_KVS): as above, C finds
// A's first two blocks in host DRAM, but takes them and starts loading
// them (0.5 ms + 2 x 1 ms, ready at 2.0025 s) instead of computing; D,
// behind it, is admitted in the same step, which waits for nothing. A
// step before the loads end passes over C (D decodes alone); the first
// step at or after 2.0025 s admits C with its 32 tokens in place.
TEST(KvTierSchedulerTest, AsynchronousLoadsRunBesideTheSteps) {
  BatchingConfig config = V1(true);
  config.kv_tier_async = true;
  ReplicaScheduler s(config);
  s.Add(Req(0, 48, {1, 2, 3}), 0, nullptr);
  ASSERT_EQ(s.Schedule(0).entries.size(), 1u);
  s.Complete(1, nullptr);
  s.Add(Req(1, 95, {11, 12, 13, 14, 15}), 1, nullptr);
  ASSERT_EQ(s.Schedule(1).entries.size(), 1u);  // evicts A's blocks from HBM
  s.Complete(2, nullptr);
  EXPECT_EQ(s.NextLoadReady(), std::numeric_limits<double>::infinity());
  s.Add(Req(2, 48, {1, 2, 3}), 2, nullptr);
  RequestSpec d = Req(3, 16, {41});
  d.output_tokens = 3;
  s.Add(d, 2, nullptr);
  const Batch& first = s.Schedule(2);
  ASSERT_EQ(first.entries.size(), 1u);
  EXPECT_EQ(first.entries[0].request_id, 3);  // D; C loads
  EXPECT_EQ(first.kv_tier_loads, 0);
  EXPECT_EQ(first.kv_tier_load_s, 0);
  EXPECT_EQ(s.kv().used(), 3);  // C's 2 loading blocks, D's 1
  EXPECT_EQ(s.num_waiting(), 1);
  EXPECT_DOUBLE_EQ(s.NextLoadReady(), 2 + 5e-4 + 2e-3);
  EXPECT_EQ(s.tier_hit_tokens(0), 32);
  EXPECT_EQ(s.prefix_cache()->tier_stats(0).loaded, 2);
  s.Complete(2.001, nullptr);
  const Batch& second = s.Schedule(2.001);
  ASSERT_EQ(second.entries.size(), 1u);  // D decodes; C is still loading
  EXPECT_FALSE(second.entries[0].prefill);
  s.Complete(2.002, nullptr);
  const Batch& third = s.Schedule(2.0025);
  ASSERT_EQ(third.entries.size(), 2u);
  EXPECT_EQ(third.entries[1].request_id, 2);
  EXPECT_EQ(third.entries[1].past_tokens, 32);
  EXPECT_EQ(third.entries[1].new_tokens, 16);
  EXPECT_EQ(third.kv_tier_load_s, 0);
  EXPECT_EQ(s.NextLoadReady(), std::numeric_limits<double>::infinity());
  EXPECT_EQ(s.prefix_hit_tokens(), 32);
}

// Two prompts loading in one step queue on the xPU's link: the second's
// loads start when the first's end. Alone, a waiting request that is
// loading leaves nothing to schedule.
TEST(KvTierSchedulerTest, AsynchronousLoadsQueueOnTheLink) {
  BatchingConfig config = V1(true);
  config.kv_tier_async = true;
  config.kv_capacity_blocks = 12;
  config.kv_tiers = {Tier("host_dram", 32)};
  ReplicaScheduler s(config);
  s.Add(Req(0, 48, {1, 2, 3}), 0, nullptr);
  s.Add(Req(1, 48, {4, 5, 6}), 0, nullptr);
  ASSERT_EQ(s.Schedule(0).entries.size(), 2u);
  s.Complete(1, nullptr);
  // A long prompt's twelve blocks evict all six from HBM (the tier keeps
  // them all).
  s.Add(Req(2, 190, {}), 1, nullptr);
  ASSERT_EQ(s.Schedule(1).entries.size(), 1u);
  s.Complete(2, nullptr);
  s.Add(Req(3, 48, {1, 2, 3}), 2, nullptr);
  s.Add(Req(4, 48, {4, 5, 6}), 2, nullptr);
  EXPECT_TRUE(s.Schedule(2).empty());
  EXPECT_DOUBLE_EQ(s.NextLoadReady(), 2 + 2.5e-3);
  s.Complete(2, nullptr);
  const Batch& next = s.Schedule(2 + 2.5e-3);
  ASSERT_EQ(next.entries.size(), 1u);
  EXPECT_EQ(next.entries[0].request_id, 3);
  EXPECT_DOUBLE_EQ(s.NextLoadReady(), 2 + 2 * 2.5e-3);
}

// A cluster store shared by two replicas: the prompt replica 0 computed,
// replica 1 loads from the store (0.5 ms + 2 x 1 ms) instead of computing;
// new blocks push the least recently used one out for all.
TEST(KvTierSchedulerTest, ReplicasShareAClusterStore) {
  BatchingConfig c = V1(true);
  KvTierConfig store = Tier("cluster_store", 3);
  store.cluster_store = true;
  c.kv_tiers = {store};
  c.kv_store = std::make_shared<BlockLru>(6);  // 2 replicas x 3
  BatchingConfig c1 = c;
  c1.kv_store_home = 1;
  ReplicaScheduler r0(c), r1(c1);
  r0.Add(Req(0, 48, {1, 2, 3}), 0, nullptr);
  ASSERT_EQ(r0.Schedule(0).entries.size(), 1u);
  r0.Complete(1, nullptr);  // caches 1, 2, 3: into the store
  EXPECT_EQ(c.kv_store->blocks(), 3);
  r1.Add(Req(1, 48, {1, 2, 3}), 1, nullptr);
  EXPECT_EQ(r1.CachedPrefixBlocks(Req(1, 48, {1, 2, 3})), 2);  // routing sees it
  const Batch& b = r1.Schedule(1);
  ASSERT_EQ(b.entries.size(), 1u);
  EXPECT_EQ(b.entries[0].past_tokens, 32);
  EXPECT_EQ(b.kv_tier_loads, 2);
  EXPECT_DOUBLE_EQ(b.kv_tier_load_s, 5e-4 + 2e-3);
  // Both blocks live where replica 0 is.
  EXPECT_EQ(b.kv_store_from, (std::vector<std::pair<int32_t, int64_t>>{{0, 2}}));
  EXPECT_EQ(r1.tier_hit_tokens(0), 32);
  r1.Complete(2, nullptr);
  EXPECT_EQ(c.kv_store->blocks(), 3);  // block 3 again: refreshed, not new
  EXPECT_EQ(r1.prefix_cache()->tier_stats(0).stored, 0);
  // A 64-token prompt from replica 1 caches four new blocks (three the
  // trace names, one of its own): the store's 6 overflow by one, and the
  // least recently used block, 1, leaves (2 was read after it, 3 cached
  // again).
  r1.Add(Req(2, 64, {21, 22, 23}), 2, nullptr);
  ASSERT_EQ(r1.Schedule(2).entries.size(), 1u);
  r1.Complete(3, nullptr);
  EXPECT_EQ(c.kv_store->blocks(), 6);
  EXPECT_EQ(r1.prefix_cache()->tier_stats(0).stored, 4);
  EXPECT_EQ(r1.prefix_cache()->tier_stats(0).dropped, 1);
  EXPECT_FALSE(c.kv_store->Contains(1));
  EXPECT_TRUE(c.kv_store->Contains(2));
  // Stored again, a block stays where it lives; new ones live at replica 1.
  EXPECT_EQ(c.kv_store->home(3), 0);
  EXPECT_EQ(c.kv_store->home(21), 1);
  // Replica 0 still has block 1 in its own HBM.
  EXPECT_TRUE(r0.prefix_cache()->InHbm(1));
  EXPECT_EQ(r0.CachedPrefixBlocks(Req(3, 48, {1, 2, 3})), 2);
}

// Layer-wise loads over L layers: the first layer's share when the loads
// are faster than the compute, else all but the compute's last L-1
// layers; stores of evicted blocks always come first.
TEST(KvTierSchedulerTest, LayerwiseLoadsHideBehindTheCompute) {
  Batch b;
  b.kv_tier_load_s = 2;
  EXPECT_DOUBLE_EQ(KvTierWaitS(b, 4, 4, true), 0.5);
  EXPECT_DOUBLE_EQ(KvTierWaitS(b, 4, 4, false), 2);
  b.kv_tier_load_s = 8;
  EXPECT_DOUBLE_EQ(KvTierWaitS(b, 4, 4, true), 8 - 3);
  b.kv_tier_store_s = 1;
  EXPECT_DOUBLE_EQ(KvTierWaitS(b, 4, 4, true), 1 + 5);
  b.kv_tier_load_s = 0;
  EXPECT_DOUBLE_EQ(KvTierWaitS(b, 4, 4, true), 1);
  // Loads that took 6 s longer than their links' time (a cluster store's
  // over shared links) wait as loads of 2 + 6 would.
  b.kv_tier_store_s = 0;
  b.kv_tier_load_s = 2;
  EXPECT_DOUBLE_EQ(KvTierWaitS(b, 4, 4, true, 6), 8 - 3);
  EXPECT_DOUBLE_EQ(KvTierWaitS(b, 4, 4, false, 6), 8);
}

}  // namespace
}  // namespace servesim::scheduler
