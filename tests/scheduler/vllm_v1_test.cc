// The vLLM v1 engine's scheduling step and automatic prefix caching,
// computed by hand.
#include <algorithm>
#include <cstdint>
#include <list>
#include <memory>
#include <random>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gtest/gtest.h"
#include "scheduler/batching.h"
#include "scheduler/kv_store.h"
#include "scheduler/prefix_cache.h"
#include "workload/prefix.h"

namespace servesim::scheduler {
namespace {

BatchingConfig V1Config(int64_t blocks, int64_t budget) {
  BatchingConfig c;
  c.policy = BatchingPolicy::kVllmV1;
  c.kv_block_tokens = 16;
  c.kv_capacity_blocks = blocks;
  c.kv_watermark = 0;
  c.max_context_tokens = 1 << 20;
  c.max_batch_size = 8;
  c.max_tokens_per_iteration = budget;
  return c;
}

RequestSpec Req(int64_t id, int64_t in, int64_t out,
                std::vector<uint64_t> hashes = {}) {
  RequestSpec r{id, 0.0, in, out, {}};
  if (!hashes.empty()) {
    r.block_hashes = std::make_shared<const std::vector<uint64_t>>(std::move(hashes));
  }
  return r;
}

// (request id, new tokens, past tokens, prefill, emits) of each entry.
struct E {
  int64_t id, n, past;
  bool prefill, emits;
  bool operator==(const E& o) const {
    return id == o.id && n == o.n && past == o.past && prefill == o.prefill && emits == o.emits;
  }
};
std::ostream& operator<<(std::ostream& os, const E& e) {
  return os << "{" << e.id << ", " << e.n << ", " << e.past << ", " << e.prefill << ", "
            << e.emits << "}";
}
std::vector<E> Entries(const Batch& b) {
  std::vector<E> out;
  for (const BatchEntry& e : b.entries) {
    out.push_back({e.request_id, e.new_tokens, e.past_tokens, e.prefill, e.emits_token});
  }
  return out;
}

// One token budget per step, running requests first (their decodes and
// prefill remainders), then waiting ones, prompts chunked to the budget.
TEST(VllmV1SchedulerTest, OneTokenBudgetRunningFirstThenWaiting) {
  ReplicaScheduler s(V1Config(1000, 100));
  s.Add(Req(0, 150, 3), 0, nullptr);
  s.Add(Req(1, 40, 2), 0, nullptr);
  // Step 1: A's first 100 prompt tokens use the whole budget; B waits.
  const Batch& b1 = s.Schedule(0);
  EXPECT_EQ(Entries(b1), (std::vector<E>{{0, 100, 0, true, false}}));
  EXPECT_EQ(b1.bound, BatchBound::kTokenBudget);
  EXPECT_EQ(b1.emitting, 0);
  s.Complete(1, nullptr);
  // Step 2: A's remaining 50 (its first token), then B's whole prompt (40 of
  // the 50 left).
  const Batch& b2 = s.Schedule(1);
  EXPECT_EQ(Entries(b2), (std::vector<E>{{0, 50, 100, true, true}, {1, 40, 0, true, true}}));
  EXPECT_EQ(b2.prefill_tokens, 90);
  EXPECT_EQ(b2.emitting, 2);
  s.Complete(2, nullptr);
  // Step 3: both decode.
  const Batch& b3 = s.Schedule(2);
  EXPECT_EQ(Entries(b3), (std::vector<E>{{0, 1, 150, false, true}, {1, 1, 40, false, true}}));
  EXPECT_EQ(s.kv().used(), 10 + 3);  // ceil(151 / 16) + ceil(41 / 16)
}

// A request whose prompt's KV arrives with it (a disaggregated cluster's
// decode side) holds blocks for the whole prompt but computes only its last
// token, which yields the first output token, whatever the token budget.
TEST(VllmV1SchedulerTest, KvThatArrivesWithTheRequestIsNotComputedAgain) {
  ReplicaScheduler s(V1Config(1000, 100));
  RequestSpec r = Req(0, 150, 3);
  r.kv_ready_tokens = 150;
  s.Add(r, 0, nullptr);
  const Batch& b1 = s.Schedule(0);
  EXPECT_EQ(Entries(b1), (std::vector<E>{{0, 1, 149, true, true}}));
  EXPECT_EQ(b1.prefill_tokens, 1);
  EXPECT_EQ(s.kv().used(), 10);  // ceil(150 / 16)
  s.Complete(1, nullptr);
  EXPECT_EQ(Entries(s.Schedule(1)), (std::vector<E>{{0, 1, 150, false, true}}));
}

// The prompt tokens still to compute, admitted or waiting (early
// rejection's queue): a partly prefilled prompt counts its remainder.
TEST(VllmV1SchedulerTest, PrefillTokensAheadCountsWhatIsLeftToCompute) {
  ReplicaScheduler s(V1Config(1000, 100));
  s.Add(Req(0, 150, 3), 0, nullptr);
  s.Add(Req(1, 40, 2), 0, nullptr);
  EXPECT_EQ(s.PrefillTokensAhead(Req(2, 30, 1)), 150 + 40 + 30);
  s.Schedule(0);  // 100 of A's 150
  s.Complete(1, nullptr);
  EXPECT_EQ(s.PrefillTokensAhead(Req(2, 30, 1)), 50 + 40 + 30);
  s.Schedule(1);  // A's last 50 and B's 40
  s.Complete(2, nullptr);
  EXPECT_EQ(s.PrefillTokensAhead(Req(2, 30, 1)), 30);
}

// With prefix caching, blocks that are cached, or that a prompt ahead will
// have computed, are not counted again: a lower bound.
TEST(VllmV1SchedulerTest, PrefillTokensAheadDiscountsSharedPrefixes) {
  BatchingConfig c = V1Config(1000, 100);
  c.prefix_caching = true;
  ReplicaScheduler s(c);
  s.Add(Req(0, 64, 1, {1, 2, 3, 4}), 0, nullptr);
  s.Schedule(0);
  s.Complete(1, nullptr);                             // blocks 1..4 cached
  s.Add(Req(1, 80, 1, {1, 2, 7, 8, 9}), 1, nullptr);  // 2 cached blocks: 48 to compute
  // Shares 1, 2 (cached) and 7 (B computes it) but not 5: 80 - 3 x 16.
  EXPECT_EQ(s.PrefillTokensAhead(Req(2, 80, 1, {1, 2, 7, 5, 9})), 48 + 32);
  // A prompt with KV of its own computes only its last token.
  RequestSpec d = Req(3, 80, 1);
  d.kv_ready_tokens = 80;
  EXPECT_EQ(s.PrefillTokensAhead(d), 48 + 1);
}

// Preempted, such a request has lost its KV: it recomputes its prompt and
// the tokens it generated, from the first.
TEST(VllmV1SchedulerTest, APreemptedRequestRecomputesTheKvItWasGiven) {
  ReplicaScheduler s(V1Config(20, 1000));
  RequestSpec a = Req(0, 160, 3), b = Req(1, 150, 3);
  a.kv_ready_tokens = 160;
  b.kv_ready_tokens = 150;
  s.Add(a, 0, nullptr);
  s.Add(b, 0, nullptr);
  EXPECT_EQ(Entries(s.Schedule(0)),
            (std::vector<E>{{0, 1, 159, true, true}, {1, 1, 149, true, true}}));
  EXPECT_EQ(s.kv().used(), 20);
  s.Complete(1, nullptr);
  // A's 161st token needs an 11th block: B, the newest, is preempted.
  const Batch& b2 = s.Schedule(1);
  EXPECT_EQ(Entries(b2), (std::vector<E>{{0, 1, 160, false, true}}));
  EXPECT_EQ(b2.bound, BatchBound::kCapacity);
  s.Complete(2, nullptr);
  EXPECT_EQ(Entries(s.Schedule(2)), (std::vector<E>{{0, 1, 161, false, true}}));
  s.Complete(3, nullptr);  // A's third and last token
  // B: its 150 prompt tokens and the one it generated, computed again.
  EXPECT_EQ(Entries(s.Schedule(3)), (std::vector<E>{{1, 151, 0, true, true}}));
}

// vLLM's long_prefill_token_threshold caps each prompt's chunk.
TEST(VllmV1SchedulerTest, LongPrefillThresholdCapsEachChunk) {
  BatchingConfig c = V1Config(1000, 100);
  c.long_prefill_token_threshold = 30;
  ReplicaScheduler s(c);
  s.Add(Req(0, 70, 1), 0, nullptr);
  s.Add(Req(1, 70, 1), 0, nullptr);
  const Batch& b = s.Schedule(0);
  EXPECT_EQ(Entries(b), (std::vector<E>{{0, 30, 0, true, false}, {1, 30, 0, true, false}}));
}

// When a running request cannot grow, the newest running request is
// preempted (recompute: its KV freed, its prompt now input + generated), and
// no waiting request is scheduled that step.
TEST(VllmV1SchedulerTest, PreemptsTheNewestRunningRequestWhenBlocksRunOut) {
  ReplicaScheduler s(V1Config(7, 1000));
  s.Add(Req(0, 64, 10), 0, nullptr);  // 4 blocks; its first decode needs a 5th
  s.Add(Req(1, 48, 10), 0, nullptr);  // 3 blocks
  const Batch& b1 = s.Schedule(0);
  EXPECT_EQ(Entries(b1), (std::vector<E>{{0, 64, 0, true, true}, {1, 48, 0, true, true}}));
  EXPECT_EQ(s.kv().used(), 7);
  s.Complete(1, nullptr);
  s.Add(Req(2, 16, 1), 1, nullptr);  // waits: no waiting request after a preemption
  const Batch& b2 = s.Schedule(1);
  EXPECT_EQ(Entries(b2), (std::vector<E>{{0, 1, 64, false, true}}));
  EXPECT_EQ(b2.bound, BatchBound::kCapacity);
  EXPECT_EQ(s.total_preemptions(), 1);
  EXPECT_EQ(s.num_running(), 1);
  EXPECT_EQ(s.num_waiting(), 2);
  EXPECT_EQ(s.kv().used(), 5);
  s.Complete(2, nullptr);
  // Step 3: request 1 re-prefills 48 + 1 generated = 49 tokens (4 blocks)
  // but only 2 are free: it waits at the head, and request 2 behind it.
  const Batch& b3 = s.Schedule(2);
  EXPECT_EQ(Entries(b3), (std::vector<E>{{0, 1, 65, false, true}}));
  EXPECT_EQ(b3.bound, BatchBound::kCapacity);
}

// ----------------------------------------------------------- prefix cache --

// Hand-made prompts: A = blocks (a1, a2), B = (a1, b2), C = (a1, a2) + 8 more
// tokens, D = exactly (a1, a2). After A's prefill registers its two full
// blocks, B finds one (16 tokens), C two (32), and D one: vLLM recomputes a
// fully cached prompt's last block (at least one token is computed).
TEST(PrefixCachingTest, LaterPromptsReuseTheFullBlocksTheyShare) {
  BatchingConfig c = V1Config(100, 1000);
  c.prefix_caching = true;
  ReplicaScheduler s(c);
  const uint64_t a1 = 11, a2 = 12, b2 = 22;
  s.Add(Req(0, 40, 5, {a1, a2}), 0, nullptr);
  ASSERT_EQ(Entries(s.Schedule(0)), (std::vector<E>{{0, 40, 0, true, true}}));
  s.Complete(1, nullptr);
  EXPECT_EQ(s.prefix_cache()->cached_blocks(), 2);
  s.Add(Req(1, 40, 5, {a1, b2}), 1, nullptr);
  s.Add(Req(2, 40, 5, {a1, a2}), 1, nullptr);
  s.Add(Req(3, 32, 5, {a1, a2}), 1, nullptr);
  const Batch& b = s.Schedule(1);
  EXPECT_EQ(Entries(b), (std::vector<E>{{0, 1, 40, false, true},
                                        {1, 24, 16, true, true},
                                        {2, 8, 32, true, true},
                                        {3, 16, 16, true, true}}));
  EXPECT_EQ(s.prefix_hit_tokens(), 16 + 32 + 16);
  EXPECT_EQ(s.prefix_query_tokens(), 40 + 40 + 40 + 32);
  // Blocks in use: A 3, B 2 new + a1, C 1 new + (a1, a2), D 1 new + a1:
  // shared blocks count once.
  EXPECT_EQ(s.kv().used(), 3 + 2 + 1 + 1);
}

// Freed cached blocks stay reusable until evicted, least recently freed
// first, and only when fresh blocks are needed.
TEST(PrefixCachingTest, FreedBlocksAreEvictedLeastRecentlyFreedFirst) {
  KvBlockPool pool(4);
  PrefixCache cache(&pool);
  ASSERT_TRUE(cache.AllocateFresh(3));
  ASSERT_TRUE(cache.Register(101));
  ASSERT_TRUE(cache.Register(102));
  ASSERT_TRUE(cache.Register(103));
  EXPECT_FALSE(cache.Register(101));  // one copy per content
  cache.Release(102);                 // freed first
  cache.Release(101);
  cache.Release(103);
  EXPECT_EQ(pool.used(), 0);
  EXPECT_EQ(cache.evictable_blocks(), 3);
  const uint64_t hit[] = {101, 102}, miss[] = {101, 104};
  EXPECT_EQ(cache.Lookup(hit, 2).blocks, 2);
  EXPECT_EQ(cache.Lookup(hit, 1).blocks, 1);  // at most max_blocks
  EXPECT_EQ(cache.Lookup(miss, 2).blocks, 1);  // the leading run only
  // Two fresh blocks: one never-cached free block, then 102 is evicted.
  ASSERT_TRUE(cache.AllocateFresh(2));
  EXPECT_EQ(cache.evictions(), 1);
  const uint64_t p102[] = {102};
  const uint64_t p101[] = {101};
  EXPECT_EQ(cache.Lookup(p102, 1).blocks, 0);
  EXPECT_EQ(cache.Lookup(p101, 1).blocks, 1);
  EXPECT_EQ(cache.Lookup(p101, 1).evictable, 1);
  // Taking the hit back uses capacity again.
  cache.Acquire(p101, cache.Lookup(p101, 1));
  EXPECT_EQ(pool.used(), 3);
  EXPECT_FALSE(cache.AllocateFresh(2));  // 103 is the only evictable block
  EXPECT_TRUE(cache.AllocateFresh(1));
  EXPECT_EQ(cache.evictions(), 2);
}

// The free order against a linked-list LRU written the obvious way, over
// random hits, releases (some of them of blocks nothing can hit again:
// ReleaseUnreachable), new blocks and evictions. A few blocks are taken
// back and freed again and again while older freed blocks wait, so the
// ring fills with stale slots and is compacted, and it grows past its
// first size (with this seed it compacts once and doubles twice); the
// victims, the counts and what stays cached must match. With a tier that
// HBM writes on eviction, every victim, unreachable or not, is stored.
void CheckFreeOrder(bool write_on_evict) {
  constexpr int64_t kBlocks = 3000;
  KvBlockPool pool(kBlocks);
  KvTierConfig tier;
  tier.name = "host_dram";
  tier.capacity_blocks = 1 << 20;  // keeps every victim
  PrefixCache cache =
      write_on_evict ? PrefixCache(&pool, {tier}, /*write_through=*/false) : PrefixCache(&pool);
  struct Freed {
    uint64_t hash;
    bool unreachable;
  };
  struct Ref {
    absl::flat_hash_map<uint64_t, int> refs;  // blocks in the hash map
    std::list<Freed> lru;                     // evictable, least recently freed first
    int64_t used = 0, evictions = 0;
  } ref;
  std::mt19937_64 rng(11);
  struct Held {
    uint64_t hash;
    bool own;  // a request's own content: released as unreachable
  };
  std::vector<Held> held;  // one reference each
  uint64_t next_hash = 1;
  auto release = [&](size_t i) {
    const Held h = held[i];
    held[i] = held.back();
    held.pop_back();
    if (h.own) {
      cache.ReleaseUnreachable(h.hash);
      ref.refs.erase(h.hash);
    } else {
      cache.Release(h.hash);
      if (--ref.refs[h.hash] > 0) return;
    }
    ref.lru.push_back({h.hash, h.own});
    --ref.used;
  };
  for (int step = 0; step < 200000; ++step) {
    const uint64_t r = rng() % 100;
    if (r < 40 && !held.empty()) {
      release(rng() % held.size());
    } else if (r < 75) {
      // A hit on a block freed among the last few (so hits leave stale slots
      // near the ring's tail while its head waits).
      if (ref.lru.empty()) continue;
      const size_t back = std::min<size_t>(ref.lru.size() - 1, rng() % 8);
      const auto at = std::prev(ref.lru.end(), static_cast<std::ptrdiff_t>(back) + 1);
      const uint64_t one[] = {at->hash};
      const PrefixCache::Match m = cache.Lookup(one, 1);
      if (at->unreachable) {
        ASSERT_EQ(m.blocks, 0);  // not in the hash map, and not yet evicted to a tier
        continue;
      }
      ASSERT_EQ(m.blocks, 1);
      ASSERT_EQ(m.evictable, 1);
      if (!cache.CanAllocate(m, 0)) continue;
      cache.Acquire(one, m);
      ref.lru.erase(at);
      ++ref.refs[one[0]];
      ++ref.used;
      held.push_back({one[0], false});
    } else {
      const int64_t n = 1 + static_cast<int64_t>(rng() % 3);
      const int64_t free = kBlocks - ref.used;
      const bool ok = cache.AllocateFresh(n);
      ASSERT_EQ(ok, n <= free);
      if (!ok) continue;
      const int64_t never_cached = free - static_cast<int64_t>(ref.lru.size());
      for (int64_t k = n - never_cached; k > 0; --k) {
        ASSERT_FALSE(cache.InHbm(ref.lru.front().hash)) << "step " << step;  // the victim
        ref.refs.erase(ref.lru.front().hash);
        ref.lru.pop_front();
        ++ref.evictions;
      }
      ref.used += n;
      for (int64_t k = 0; k < n; ++k) {
        const uint64_t h = next_hash++;
        ASSERT_TRUE(cache.Register(h));
        ref.refs[h] = 1;
        held.push_back({h, rng() % 4 == 0});
      }
    }
    ASSERT_EQ(pool.used(), ref.used) << "step " << step;
    ASSERT_EQ(cache.evictable_blocks(), static_cast<int64_t>(ref.lru.size())) << "step " << step;
    ASSERT_EQ(cache.evictions(), ref.evictions) << "step " << step;
    ASSERT_EQ(cache.cached_blocks(), static_cast<int64_t>(ref.refs.size())) << "step " << step;
    if (write_on_evict) {
      ASSERT_EQ(cache.tier_stats(0).stored, ref.evictions) << "step " << step;
    }
  }
  EXPECT_GT(ref.evictions, 30000);
  for (const auto& [h, n] : ref.refs) ASSERT_TRUE(cache.InHbm(h));
  // Free everything: the blocks leave in the reference's order.
  while (!held.empty()) release(held.size() - 1);
  const std::list<Freed> last = ref.lru;
  ASSERT_TRUE(cache.AllocateFresh(kBlocks));
  EXPECT_EQ(cache.evictions(), ref.evictions + static_cast<int64_t>(last.size()));
  EXPECT_EQ(cache.cached_blocks(), 0);
  if (write_on_evict) {
    // Every victim went to the tier: the last of them are its most recent.
    for (const Freed& f : last) EXPECT_TRUE(cache.Contains(f.hash));
  }
}

TEST(PrefixCachingTest, TheFreeOrderMatchesAListLruThroughCompactionsAndGrowth) {
  CheckFreeOrder(/*write_on_evict=*/false);
}

TEST(PrefixCachingTest, TheFreeOrderMatchesAListLruWithATierWrittenOnEviction) {
  CheckFreeOrder(/*write_on_evict=*/true);
}

// Per-block hashes of a hand-made group prefix: two prompts of one group
// share the blocks their common tokens fill, chained like vLLM's.
TEST(PrefixCachingTest, GroupPrefixesHashTheirCommonFullBlocksAlike) {
  workload::PromptContent g;
  g.kind = workload::PromptContent::Kind::kGroup;
  g.group = 7;
  g.group_tokens = 40;
  const auto a = workload::PromptBlockHashes(g, 100, 16, /*request_key=*/1);
  const auto b = workload::PromptBlockHashes(g, 64, 16, /*request_key=*/2);
  ASSERT_EQ(a.size(), 6u);  // floor(100 / 16)
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(a[0], b[0]);  // tokens 0-15 and 16-31 are the group's
  EXPECT_EQ(a[1], b[1]);
  EXPECT_NE(a[2], b[2]);  // 32-47 holds 8 tokens of each request's own
  EXPECT_NE(a[3], b[3]);
}

}  // namespace
}  // namespace servesim::scheduler
