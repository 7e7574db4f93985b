#include "scheduler/batching.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

namespace servesim::scheduler {
namespace {

int64_t FinalTokens(const RequestSpec& spec) { return spec.input_tokens + spec.output_tokens; }

}  // namespace

const char* BatchBoundName(BatchBound b) {
  switch (b) {
    case BatchBound::kNone: return "none";
    case BatchBound::kCapacity: return "capacity";
    case BatchBound::kSlo: return "slo";
    case BatchBound::kMaxBatch: return "max_batch";
    case BatchBound::kTokenBudget: return "token_budget";
  }
  return "unknown";
}

Batch UniformBatch(int64_t b, int64_t new_tokens, int64_t past_tokens) {
  Batch batch;
  const bool prefill = new_tokens > 1;
  batch.entries.assign(b, BatchEntry{0, new_tokens, past_tokens, prefill, true, {}});
  (prefill ? batch.prefill_tokens : batch.decode_tokens) = b * new_tokens;
  batch.emitting = b;
  return batch;
}

double KvTierWaitS(const Batch& b, double compute_s, int64_t layers, bool layerwise,
                   double load_extra_s) {
  double load = b.kv_tier_load_s + load_extra_s;
  if (layerwise && load > 0 && layers > 0) {
    const double l = static_cast<double>(layers);
    load = std::max(0.0,
                    load / l + (l - 1) / l * std::max(load, compute_s) + compute_s / l - compute_s);
  }
  return b.kv_tier_store_s + load;
}

ReplicaScheduler::ReplicaScheduler(const BatchingConfig& config)
    : config_(config),
      kv_(config.kv_capacity_blocks),
      watermark_blocks_(static_cast<int64_t>(
          std::floor(config.kv_watermark * config.kv_capacity_blocks))) {
  if (config.placement_stacks > 0) {
    placement_ = std::make_unique<StackPlacement>(
        config.placement_stacks, config.placement_capacity_tokens,
        config.placement_kv_heads);
  }
  if (config.prefix_caching) {
    prefix_ = std::make_unique<PrefixCache>(&kv_, config.kv_tiers, config.kv_tier_write_through,
                                            config.kv_store.get(), config.kv_store_home);
  }
}

namespace {

// splitmix64's finaliser (as workload/prefix.h mixes trace hashes).
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A block's name in the prefix cache: its hash, 0 excepted (0 marks a
// private block).
uint64_t CacheKey(uint64_t hash) { return hash == 0 ? 1 : hash; }

}  // namespace

uint64_t ReplicaScheduler::BlockKey(int32_t slot, int64_t b) const {
  const RequestState& r = table_[slot];
  uint64_t key;
  if (r.spec.block_hashes != nullptr && b < static_cast<int64_t>(r.spec.block_hashes->size())) {
    key = (*r.spec.block_hashes)[static_cast<size_t>(b)];
  } else {
    // Past what the trace says (or without it): the request's own content,
    // which only this request, re-prefilling after a preemption, can find.
    key = Mix(Mix(static_cast<uint64_t>(r.spec.id) ^ 0x6f7c0ffeeULL) ^ static_cast<uint64_t>(b));
  }
  return CacheKey(key);
}

int64_t ReplicaScheduler::CachedPrefixBlocks(const RequestSpec& spec) const {
  if (prefix_ == nullptr || spec.block_hashes == nullptr) return 0;
  const int64_t max_blocks = std::min<int64_t>((spec.input_tokens - 1) / config_.kv_block_tokens,
                                               static_cast<int64_t>(spec.block_hashes->size()));
  std::vector<uint64_t> keys;
  keys.reserve(static_cast<size_t>(std::max<int64_t>(max_blocks, 0)));
  for (int64_t b = 0; b < max_blocks; ++b) {
    keys.push_back(CacheKey((*spec.block_hashes)[static_cast<size_t>(b)]));
  }
  return prefix_->Lookup(keys, max_blocks).blocks;
}

PrefixCache::Match ReplicaScheduler::PrefixMatch(int32_t slot) {
  const RequestState& r = table_[slot];
  // Leave at least one token to compute (vLLM recomputes the last).
  const int64_t max_blocks = (r.prompt_tokens - 1) / config_.kv_block_tokens;
  key_scratch_.clear();
  for (int64_t b = 0; b < max_blocks; ++b) key_scratch_.push_back(BlockKey(slot, b));
  return prefix_->Lookup(key_scratch_, max_blocks);
}

void ReplicaScheduler::TakePrefix(int32_t slot, const PrefixCache::Match& match) {
  RequestState& r = table_[slot];
  prefix_->Acquire(key_scratch_, match);
  r.block_keys.assign(key_scratch_.begin(), key_scratch_.begin() + match.blocks);
  r.blocks = match.blocks;
  r.hashed_blocks = match.blocks;
  const int64_t cached = match.blocks * config_.kv_block_tokens;
  r.prefilled = cached;
  r.context_tokens = cached;
  prefix_hit_tokens_ += cached;
  prefix_query_tokens_ += r.prompt_tokens;
  for (int k = 0; k < kMaxKvTiers; ++k) {
    tier_hit_tokens_[k] += match.from_tier[k] * config_.kv_block_tokens;
  }
}

bool ReplicaScheduler::Grow(int32_t slot, int64_t tokens) {
  RequestState& r = table_[slot];
  const int64_t need = BlocksFor(tokens) - r.blocks;
  if (need <= 0) return true;
  if (prefix_ != nullptr) {
    if (!prefix_->AllocateFresh(need)) return false;
    r.block_keys.resize(r.block_keys.size() + static_cast<size_t>(need), 0);
  } else if (!kv_.TryAllocate(need)) {
    return false;
  }
  r.blocks += need;
  return true;
}

void ReplicaScheduler::RegisterFull(int32_t slot, int64_t tokens) {
  RequestState& r = table_[slot];
  const int64_t full = std::min<int64_t>(tokens / config_.kv_block_tokens, r.blocks);
  // A prefill chunk fills many blocks at once: their entries are fetched a
  // few blocks ahead, so that the cache misses overlap.
  constexpr int64_t kAhead = 4;
  for (int64_t b = r.hashed_blocks; b < std::min(full, r.hashed_blocks + kAhead); ++b) {
    prefix_->Prefetch(BlockKey(slot, b));
  }
  for (int64_t b = r.hashed_blocks; b < full; ++b) {
    if (b + kAhead < full) prefix_->Prefetch(BlockKey(slot, b + kAhead));
    uint64_t& k = r.block_keys[static_cast<size_t>(b)];
    if (k != 0) continue;
    const uint64_t key = BlockKey(slot, b);
    if (prefix_->Register(key)) k = key;
  }
  r.hashed_blocks = std::max(r.hashed_blocks, full);
}

int32_t ReplicaScheduler::NewSlot(const RequestSpec& spec) {
  int32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = static_cast<int32_t>(table_.size());
    table_.emplace_back();
  }
  RequestState& r = table_[slot];
  std::vector<uint64_t> keys = std::move(r.block_keys);  // keep the capacity
  r = RequestState{};
  keys.clear();
  r.block_keys = std::move(keys);
  r.spec = spec;
  r.prompt_tokens = spec.input_tokens;
  r.ready_tokens = spec.kv_ready_tokens;
  return slot;
}

RejectReason ReplicaScheduler::Add(const RequestSpec& spec, double now_s,
                                   RequestObserver* observer) {
  RejectReason why = RejectReason::kNone;
  const int64_t total = spec.input_tokens + spec.output_tokens;
  if (total > config_.max_context_tokens) {
    why = RejectReason::kTooLong;
  } else if (BlocksFor(total) > kv_.capacity() - watermark_blocks_ ||
             (placement_ != nullptr && !placement_->CouldEverFit(total))) {
    // Its full KV (prompt + every output token but the last, plus the
    // block the last decode reserves) can never be held: reject up front
    // rather than preempt it forever.
    why = RejectReason::kExceedsKvCapacity;
  }
  if (why != RejectReason::kNone) {
    if (observer != nullptr) observer->OnReject(spec, why, now_s);
    return why;
  }
  const int32_t slot = NewSlot(spec);
  waiting_.push_back(slot);
  queued_blocks_ += BlocksFor(table_[slot].prompt_tokens);
  return RejectReason::kNone;
}

bool ReplicaScheduler::TryAdmit(int32_t slot, int64_t tokens_so_far) {
  RequestState& r = table_[slot];
  const int64_t running = static_cast<int64_t>(running_.size());
  if (running >= config_.max_batch_size) {
    batch_.bound = BatchBound::kMaxBatch;
    return false;
  }
  if (batch_cap_ > 0 && running >= batch_cap_) {
    batch_.bound = BatchBound::kSlo;
    return false;
  }
  PrefixCache::Match match;
  if (prefix_ != nullptr) match = PrefixMatch(slot);
  const int64_t cached = match.blocks * config_.kv_block_tokens;
  const int64_t computed = ComputedAtAdmission(slot, cached);
  if (config_.policy == BatchingPolicy::kPrefillFirst && tokens_so_far > 0 &&
      tokens_so_far + r.prompt_tokens - computed > config_.max_tokens_per_iteration) {
    batch_.bound = BatchBound::kTokenBudget;
    return false;
  }
  // Blocks loaded from a lower tier need fresh HBM blocks too.
  const int64_t need = BlocksFor(r.prompt_tokens) - match.blocks + match.loads;
  if (kv_.free() - match.evictable - need < watermark_blocks_) {
    batch_.bound = BatchBound::kCapacity;
    return false;
  }
  if (placement_ != nullptr &&
      !placement_->Place(slot, r.spec.input_tokens + r.spec.output_tokens)) {
    batch_.bound = BatchBound::kCapacity;
    return false;
  }
  queued_blocks_ -= BlocksFor(r.prompt_tokens);
  r.prefilled = 0;
  r.context_tokens = 0;
  if (prefix_ != nullptr) TakePrefix(slot, match);
  r.prefilled = r.context_tokens = computed;
  Grow(slot, r.prompt_tokens);  // checked above
  r.running = true;
  running_.push_back(slot);
  return true;
}

void ReplicaScheduler::ReleaseResources(RequestState& r, int32_t slot, bool finished) {
  if (prefix_ != nullptr) {
    // Last block first, so that a prompt's leading blocks are evicted last.
    // The entries are fetched eight blocks ahead (their misses overlap).
    constexpr size_t kAhead = 8;
    const size_t n = r.block_keys.size();
    auto key = [&](size_t i) { return r.block_keys[n - 1 - i]; };  // i-th released
    // Blocks from here on hold the request's own content (BlockKey).
    const size_t hashed =
        r.spec.block_hashes == nullptr ? 0 : std::min(n, r.spec.block_hashes->size());
    for (size_t i = 0; i < std::min(n, kAhead); ++i) {
      if (key(i) != 0) prefix_->Prefetch(key(i));
    }
    for (size_t i = 0; i < n; ++i) {
      if (i + kAhead < n && key(i + kAhead) != 0) prefix_->Prefetch(key(i + kAhead));
      if (key(i) == 0) {
        kv_.Release(1);
      } else if (finished && n - 1 - i >= hashed) {
        prefix_->ReleaseUnreachable(key(i));
      } else {
        prefix_->Release(key(i));
      }
    }
    r.block_keys.clear();
    r.hashed_blocks = 0;
  } else {
    kv_.Release(r.blocks);
  }
  r.blocks = 0;
  if (placement_ != nullptr) placement_->Release(slot);
}

void ReplicaScheduler::Preempt(int32_t slot) {
  RequestState& r = table_[slot];
  ReleaseResources(r, slot, /*finished=*/false);
  r.running = false;
  r.prefilled = 0;
  r.context_tokens = 0;
  // Recompute: the prompt now includes every token generated so far.
  r.prompt_tokens = r.spec.input_tokens + r.generated;
  r.ready_tokens = 0;
  ++r.preemptions;
  ++total_preemptions_;
  queued_blocks_ += BlocksFor(r.prompt_tokens);
  waiting_.push_front(slot);
}

bool ReplicaScheduler::ReserveDecodeSlot(int32_t slot) {
  while (!Grow(slot, table_[slot].context_tokens + 1)) {
    // Victim: the most recently admitted running request.
    const int32_t victim = running_.back();
    running_.pop_back();
    Preempt(victim);
    if (victim == slot) return false;
  }
  return true;
}

void ReplicaScheduler::ScheduleDecodes() {
  // Iterate by index: preemption pops from the back of running_.
  for (size_t i = 0; i < running_.size(); ++i) {
    const int32_t slot = running_[i];
    if (table_[slot].prefilled < table_[slot].prompt_tokens) continue;
    if (!ReserveDecodeSlot(slot)) break;  // slot was the last one; done
  }
  for (int32_t slot : running_) {
    const RequestState& r = table_[slot];
    if (r.prefilled < r.prompt_tokens) continue;
    batch_.entries.push_back(BatchEntry{slot, 1, r.context_tokens, false, true, Stacks(slot),
                                        table_[slot].spec.id, FinalTokens(table_[slot].spec)});
    ++batch_.decode_tokens;
    ++batch_.emitting;
  }
}

const Batch& ReplicaScheduler::Schedule(double now_s) {
  batch_.Clear();
  now_s_ = now_s;  // asynchronous tier loads: what has loaded by now
  SchedulePolicy();
  if (prefix_ != nullptr && prefix_->num_tiers() > 0) CostTierMoves();
  if (placement_ != nullptr) batch_.stacks_generation = placement_->generation();
  return batch_;
}

void ReplicaScheduler::CostTierMoves() {
  PrefixCache::Moved moved = prefix_->TakeMoved();
  for (int k = 0; k < prefix_->num_tiers(); ++k) {
    // Asynchronous loads run beside the step (StartLoads).
    moved.loads[k] -= async_loads_[k];
    async_loads_[k] = 0;
    const KvTierConfig& t = prefix_->tier_config(k);
    if (moved.loads[k] > 0) {
      batch_.kv_tier_load_s +=
          t.latency_s + static_cast<double>(moved.loads[k]) * t.seconds_per_block;
    }
    batch_.kv_tier_loads += moved.loads[k];
  }
  // Asynchronous loads keep their link's time (StartLoads).
  if (!config_.kv_tier_async) batch_.kv_store_from = std::move(moved.store_from);
  if (!config_.kv_tier_write_through && moved.stores > 0) {
    const KvTierConfig& t = prefix_->tier_config(0);
    batch_.kv_tier_store_s = t.latency_s + static_cast<double>(moved.stores) * t.seconds_per_block;
  }
}

void ReplicaScheduler::SchedulePolicy() {
  const int64_t budget = config_.max_tokens_per_iteration;
  if (config_.policy == BatchingPolicy::kVllmV1) {
    ScheduleVllmV1();
    return;
  }

  if (config_.policy == BatchingPolicy::kPrefillFirst) {
    // Whole prompts of newly admitted requests, FCFS.
    int64_t tokens = 0;
    while (!waiting_.empty()) {
      const int32_t slot = waiting_.front();
      if (!TryAdmit(slot, tokens)) break;  // head-of-line blocks: FCFS
      waiting_.pop_front();
      const RequestState& r = table_[slot];
      const int64_t p = r.prompt_tokens - r.prefilled;  // less what the cache held
      batch_.entries.push_back(BatchEntry{slot, p, r.prefilled, true, true, Stacks(slot), r.spec.id,
                                          FinalTokens(r.spec)});
      tokens += p;
      batch_.prefill_tokens += p;
      ++batch_.emitting;
    }
    if (batch_.empty()) {
      const BatchBound bound = batch_.bound;
      ScheduleDecodes();
      batch_.bound = bound;
    }
    return;
  }

  // Chunked prefill: decodes first, then prompt chunks.
  ScheduleDecodes();
  int64_t left = budget - batch_.decode_tokens;
  for (int32_t slot : running_) {
    if (left <= 0) break;
    const RequestState& r = table_[slot];
    if (r.prefilled >= r.prompt_tokens) continue;
    const int64_t chunk = std::min(r.prompt_tokens - r.prefilled, left);
    const bool last = r.prefilled + chunk == r.prompt_tokens;
    batch_.entries.push_back(BatchEntry{slot, chunk, r.prefilled, true, last, Stacks(slot),
                                        table_[slot].spec.id, FinalTokens(table_[slot].spec)});
    batch_.prefill_tokens += chunk;
    batch_.emitting += last ? 1 : 0;
    left -= chunk;
  }
  while (!waiting_.empty()) {
    if (left <= 0) {
      batch_.bound = BatchBound::kTokenBudget;
      break;
    }
    const int32_t slot = waiting_.front();
    if (!TryAdmit(slot, 0)) break;
    waiting_.pop_front();
    const RequestState& r = table_[slot];
    const int64_t chunk = std::min(r.prompt_tokens - r.prefilled, left);
    const bool last = r.prefilled + chunk == r.prompt_tokens;
    batch_.entries.push_back(BatchEntry{slot, chunk, r.prefilled, true, last, Stacks(slot),
                                        r.spec.id, FinalTokens(r.spec)});
    batch_.prefill_tokens += chunk;
    batch_.emitting += last ? 1 : 0;
    left -= chunk;
  }
}

void ReplicaScheduler::ScheduleVllmV1() {
  int64_t budget = config_.max_tokens_per_iteration;
  const int64_t threshold = config_.long_prefill_token_threshold;
  bool preempted = false;
  // Running requests first, in admission order (index loop: preemption pops
  // from the back).
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    const int32_t slot = running_[i];
    const RequestState& r = table_[slot];
    const bool prefill = r.prefilled < r.prompt_tokens;
    int64_t n = prefill ? r.prompt_tokens - r.prefilled : 1;
    if (prefill && threshold > 0) n = std::min(n, threshold);
    n = std::min(n, budget);
    const int64_t past = prefill ? r.prefilled : r.context_tokens;
    bool scheduled = true;
    while (!Grow(slot, past + n)) {
      const int32_t victim = running_.back();
      running_.pop_back();
      Preempt(victim);
      preempted = true;
      if (victim == slot) {
        scheduled = false;
        break;
      }
    }
    if (!scheduled) break;  // it was the last running request
    const bool emits = !prefill || past + n == r.prompt_tokens;
    batch_.entries.push_back(
        BatchEntry{slot, n, past, prefill, emits, Stacks(slot), r.spec.id, FinalTokens(r.spec)});
    (prefill ? batch_.prefill_tokens : batch_.decode_tokens) += n;
    batch_.emitting += emits ? 1 : 0;
    budget -= n;
  }
  if (preempted) {
    batch_.bound = BatchBound::kCapacity;
    return;
  }
  // Then waiting requests, FCFS. One loading its KV from a lower tier
  // (kv_tier_async) is passed over until its loads are done: it keeps its
  // place (vLLM's skipped_waiting_requests).
  size_t i = 0;
  while (i < waiting_.size()) {
    if (budget <= 0) {
      batch_.bound = BatchBound::kTokenBudget;
      break;
    }
    const int64_t running = static_cast<int64_t>(running_.size());
    if (running >= config_.max_batch_size) {
      batch_.bound = BatchBound::kMaxBatch;
      break;
    }
    if (batch_cap_ > 0 && running >= batch_cap_) {
      batch_.bound = BatchBound::kSlo;
      break;
    }
    const int32_t slot = waiting_[i];
    RequestState& r = table_[slot];
    if (r.load_ready_s >= 0) {
      if (r.load_ready_s > now_s_) {
        ++i;  // still loading
        continue;
      }
      // Loaded: its prompt's leading blocks are in place.
      if (!AdmitChunk(i, r.prefilled, &budget)) {
        batch_.bound = BatchBound::kCapacity;
        break;
      }
      r.load_ready_s = -1;
      continue;
    }
    PrefixCache::Match match;
    if (prefix_ != nullptr) match = PrefixMatch(slot);
    const int64_t cached = ComputedAtAdmission(slot, match.blocks * config_.kv_block_tokens);
    if (config_.kv_tier_async && match.loads > 0) {
      // Blocks for the hits only; it computes nothing in this step.
      if (!prefix_->CanAllocate(match, 0)) {
        batch_.bound = BatchBound::kCapacity;
        break;
      }
      StartLoads(i, match, cached, now_s_);
      ++i;
      continue;
    }
    int64_t n = r.prompt_tokens - cached;
    if (threshold > 0) n = std::min(n, threshold);
    n = std::min(n, budget);
    const int64_t fresh = BlocksFor(cached + n) - match.blocks;
    const bool fits = prefix_ != nullptr ? prefix_->CanAllocate(match, fresh)
                                         : fresh <= kv_.free() - watermark_blocks_;
    if (!fits || (placement_ != nullptr &&
                  !placement_->Place(slot, r.spec.input_tokens + r.spec.output_tokens))) {
      batch_.bound = BatchBound::kCapacity;
      break;
    }
    queued_blocks_ -= BlocksFor(r.prompt_tokens);
    r.prefilled = 0;
    r.context_tokens = 0;
    if (prefix_ != nullptr) TakePrefix(slot, match);
    AdmitChunk(i, cached, &budget);  // checked above
  }
}

bool ReplicaScheduler::AdmitChunk(size_t i, int64_t computed, int64_t* budget) {
  const int32_t slot = waiting_[i];
  RequestState& r = table_[slot];
  int64_t n = r.prompt_tokens - computed;
  if (config_.long_prefill_token_threshold > 0) {
    n = std::min(n, config_.long_prefill_token_threshold);
  }
  n = std::min(n, *budget);
  r.prefilled = r.context_tokens = computed;
  if (!Grow(slot, computed + n)) return false;
  waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(i));
  r.running = true;
  running_.push_back(slot);
  const bool emits = computed + n == r.prompt_tokens;
  batch_.entries.push_back(
      BatchEntry{slot, n, computed, true, emits, Stacks(slot), r.spec.id, FinalTokens(r.spec)});
  batch_.prefill_tokens += n;
  batch_.emitting += emits ? 1 : 0;
  *budget -= n;
  return true;
}

void ReplicaScheduler::StartLoads(size_t i, const PrefixCache::Match& match, int64_t computed,
                                  double now_s) {
  const int32_t slot = waiting_[i];
  RequestState& r = table_[slot];
  queued_blocks_ -= BlocksFor(r.prompt_tokens);
  r.prefilled = 0;
  r.context_tokens = 0;
  TakePrefix(slot, match);
  r.prefilled = r.context_tokens = computed;
  // The loads queue on the xPU's link behind those already on it, the
  // tiers one after the other (as a blocking step takes them).
  double t = std::max(now_s, load_link_free_s_);
  for (int k = 0; k < prefix_->num_tiers(); ++k) {
    if (match.from_tier[k] == 0) continue;
    const KvTierConfig& tier = prefix_->tier_config(k);
    t += tier.latency_s + static_cast<double>(match.from_tier[k]) * tier.seconds_per_block;
    async_loads_[k] += match.from_tier[k];
  }
  load_link_free_s_ = t;
  r.load_ready_s = t;
}

double ReplicaScheduler::NextLoadReady() const {
  double t = std::numeric_limits<double>::infinity();
  if (!config_.kv_tier_async) return t;
  for (int32_t slot : waiting_) {
    if (table_[slot].load_ready_s >= 0) t = std::min(t, table_[slot].load_ready_s);
  }
  return t;
}

int64_t ReplicaScheduler::PrefillTokensAhead(const RequestSpec& spec) const {
  int64_t n = 0;
  for (int32_t slot : running_) n += table_[slot].prompt_tokens - table_[slot].prefilled;
  // Blocks the prompts ahead will have cached by the time a later one is
  // admitted.
  absl::flat_hash_set<uint64_t> ahead;
  auto waiting = [&](const RequestSpec& r, int64_t prompt_tokens) {
    int64_t taken = 0;
    if (prefix_ != nullptr && r.block_hashes != nullptr) {
      const int64_t hashed = std::min<int64_t>((prompt_tokens - 1) / config_.kv_block_tokens,
                                               static_cast<int64_t>(r.block_hashes->size()));
      bool leading = true;  // admission takes the leading run of hits only
      for (int64_t b = 0; b < hashed; ++b) {
        const uint64_t key = CacheKey((*r.block_hashes)[static_cast<size_t>(b)]);
        leading = leading && (ahead.contains(key) || prefix_->Contains(key));
        if (leading) ++taken;
        ahead.insert(key);
      }
    }
    return prompt_tokens - taken * config_.kv_block_tokens;
  };
  for (int32_t slot : waiting_) {
    const RequestState& r = table_[slot];
    n += waiting(r.spec, r.prompt_tokens - std::min(r.ready_tokens, r.prompt_tokens - 1));
  }
  return n +
         waiting(spec, spec.input_tokens - std::min(spec.kv_ready_tokens, spec.input_tokens - 1));
}

int64_t ReplicaScheduler::MeanContextTokens() const {
  int64_t sum = 0, n = 0;
  for (int32_t slot : running_) {
    sum += table_[slot].context_tokens + 1;
    ++n;
  }
  if (n == 0) {
    for (int32_t slot : waiting_) {
      sum += table_[slot].prompt_tokens + 1;
      ++n;
    }
  }
  return n == 0 ? 0 : (sum + n - 1) / n;
}

absl::Span<const int32_t> ReplicaScheduler::Stacks(int32_t slot) const {
  if (placement_ == nullptr) return {};
  return placement_->StacksOf(slot);
}

void ReplicaScheduler::Project(int steps, std::vector<Batch>* out) const {
  out->clear();
  // Each decoding request after the current batch: its context and the
  // tokens it has left.
  struct Next {
    int32_t slot;
    int64_t context, left;
  };
  std::vector<Next> next;
  next.reserve(running_.size());
  absl::flat_hash_map<int32_t, const BatchEntry*> in_batch;
  in_batch.reserve(batch_.entries.size());
  for (const BatchEntry& e : batch_.entries) in_batch.emplace(e.slot, &e);
  int64_t longest = 0;
  for (int32_t slot : running_) {
    const RequestState& r = table_[slot];
    int64_t prefilled = r.prefilled, context = r.context_tokens, generated = r.generated;
    if (auto it = in_batch.find(slot); it != in_batch.end()) {
      const BatchEntry& e = *it->second;
      if (e.prefill) {
        prefilled += e.new_tokens;
        context = prefilled;
      } else {
        context += 1;
      }
      if (e.emits_token) ++generated;
    }
    if (prefilled < r.prompt_tokens) continue;  // still prefilling
    const int64_t left = r.spec.output_tokens - generated;
    if (left <= 0) continue;  // finishes with the current batch
    next.push_back({slot, context, left});
    longest = std::max(longest, left);
  }
  const int n = static_cast<int>(std::min<int64_t>(steps, longest));
  out->resize(static_cast<size_t>(std::max(n, 0)));
  for (int s = 0; s < n; ++s) {
    Batch& b = (*out)[s];
    if (placement_ != nullptr) b.stacks_generation = placement_->generation();
    for (const Next& q : next) {
      if (q.left <= s) continue;
      b.entries.push_back(BatchEntry{q.slot, 1, q.context + s, false, true, Stacks(q.slot),
                                     table_[q.slot].spec.id, FinalTokens(table_[q.slot].spec)});
      ++b.decode_tokens;
      ++b.emitting;
    }
  }
}

void ReplicaScheduler::Complete(double now_s, RequestObserver* observer) {
  if (prefix_ != nullptr) {
    // The decode steps that fill a block register it below: their entries
    // are fetched first, all together, so that the cache misses overlap.
    for (const BatchEntry& e : batch_.entries) {
      if (e.prefill) continue;
      const RequestState& r = table_[e.slot];
      const int64_t tokens = r.context_tokens + 1;
      if (tokens % config_.kv_block_tokens == 0 && tokens / config_.kv_block_tokens <= r.blocks) {
        prefix_->Prefetch(BlockKey(e.slot, tokens / config_.kv_block_tokens - 1));
      }
    }
  }
  bool any_finished = false;
  // Consecutive later tokens with equal gaps, reported together (OnGaps).
  double run_gap = 0;
  int64_t run_count = 0;
  for (const BatchEntry& e : batch_.entries) {
    RequestState& r = table_[e.slot];
    if (e.prefill) {
      r.prefilled += e.new_tokens;
      r.context_tokens = r.prefilled;
    } else {
      r.context_tokens += 1;
    }
    if (prefix_ != nullptr) RegisterFull(e.slot, r.context_tokens);
    if (!e.emits_token) continue;
    ++r.generated;
    if (r.first_token_s < 0) {
      r.first_token_s = now_s;
      r.last_token_s = now_s;
      if (observer != nullptr) observer->OnFirstToken(r, now_s);
    } else {
      const double gap = now_s - r.last_token_s;
      r.last_token_s = now_s;
      if (run_count > 0 && gap == run_gap) {
        ++run_count;
      } else {
        if (run_count > 0 && observer != nullptr) observer->OnGaps(now_s, run_gap, run_count);
        run_gap = gap;
        run_count = 1;
      }
    }
    if (r.generated >= r.spec.output_tokens) {
      r.finish_s = now_s;
      r.running = false;
      ReleaseResources(r, e.slot, /*finished=*/true);
      any_finished = true;
      if (observer != nullptr) observer->OnFinish(r, now_s);
    }
  }
  if (run_count > 0 && observer != nullptr) observer->OnGaps(now_s, run_gap, run_count);
  if (any_finished) {
    // Drop finished requests from running_, keeping admission order.
    size_t out = 0;
    for (int32_t slot : running_) {
      if (table_[slot].running) {
        running_[out++] = slot;
      } else {
        free_slots_.push_back(slot);
      }
    }
    running_.resize(out);
  }
  batch_.Clear();
}

}  // namespace servesim::scheduler
