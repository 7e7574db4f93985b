// Iteration-level (continuous) batching for one replica (Orca, OSDI'22;
// vLLM, SOSP'23; Sarathi-Serve, OSDI'24), with a paged KV cache.
//
// Contract: ReplicaScheduler is plain code. It never reads a clock: the
// caller passes `now_s` in, so tests drive it with a fake clock and the
// SimGrid engine actor drives it with simulated time. It is deterministic.
//
// Request life: Add() at arrival -> waiting (FCFS) -> admitted (KV blocks for
// the whole prompt reserved) -> prefilled, in one iteration or in chunks ->
// the prefill's last chunk yields the first output token -> one decode step
// per iteration per further token -> finished (blocks freed). A decode step
// that needs a new block when none is free preempts the most recently
// admitted running request (vLLM's recompute preemption): its blocks are
// freed and it rejoins the FRONT of the waiting queue; on re-admission it
// prefills its prompt plus the tokens it had generated, and that prefill
// yields its next token.
//
// PARAMETERS AND BEHAVIOR
//  - kPrefillFirst (vLLM): when prompts are waiting and can be admitted, the
//    iteration prefills them only (whole prompts, FCFS, up to
//    max_tokens_per_iteration tokens; the first prompt of a batch is taken
//    even if longer than the budget, so no prompt starves); otherwise it
//    decodes every running request.
//  - kChunkedPrefill (Sarathi): every iteration decodes all running requests
//    that finished their prompt, then spends the remaining token budget on
//    prompt chunks: first of admitted, partly prefilled requests, then of
//    newly admitted ones.
//  - max_batch_size caps running requests; kv_watermark keeps that fraction
//    of blocks free at admission (not for decode growth).
//  - kVllmV1 (vLLM's v1 engine scheduler, vllm/v1/core/sched/scheduler.py):
//    one token budget (max_tokens_per_iteration, vLLM's
//    max_num_batched_tokens) per step. Running requests go first, in
//    admission order: each takes what it still needs (1 for a decode, the
//    rest of its prompt for a prefill, capped by long_prefill_token_threshold
//    and by the budget left). Its KV blocks are allocated for the tokens
//    scheduled, not reserved for the whole prompt; when one cannot be had,
//    the newest running request is preempted (recompute; it rejoins the
//    front of the waiting queue), repeatedly, and a step that preempted
//    admits nobody. Then waiting requests, FCFS, while the running count is
//    under max_batch_size (max_num_seqs) and budget is left: each takes its
//    prefix-cache hits and a chunk of the rest of its prompt, and admission
//    stops at the first that cannot get its blocks. A request appears at
//    most once per step; a prompt whose last chunk runs yields its first
//    token in that step. No watermark.
//  - prefix_caching (any policy; scheduler/prefix_cache.h): an admitted
//    request first takes the cached blocks its prompt's leading block hashes
//    name (leaving at least one token to compute), then computes the rest;
//    every block that fills is cached.
//  - kv_tiers (with prefix_caching; scheduler/prefix_cache.h): lower tiers
//    keep blocks HBM no longer holds; a prompt's leading blocks found only
//    there are loaded into fresh HBM blocks as it is admitted. The step
//    that admits it waits for the loads (Batch::kv_tier_load_s: per tier, its
//    latency plus blocks x seconds per block, the tiers one after the
//    other), and under write-on-evict for the stores of the blocks its
//    allocations evict; write-through stores overlap the steps.
//    kv_tier_async (kVllmV1, vLLM's WAITING_FOR_REMOTE_KVS): a waiting
//    request whose leading blocks need loads takes its blocks and starts
//    them instead, queued behind the loads already on the xPU's link, and
//    computes nothing in that step; until they are done later steps pass
//    over it (it keeps its place, blocks nobody and counts against no
//    limit but KV), then it is admitted as a request whose prompt is
//    partly computed.
//  - A request whose KV arrives with it (RequestSpec::kv_ready_tokens)
//    needs blocks for its whole prompt at admission, as any other, but
//    computes only the rest (at least its last prompt token); preempted, it
//    recomputes everything.
//  - Requests whose prompt + output exceed max_context_tokens, or whose full
//    KV could never fit (capacity minus watermark), are rejected at Add().
#ifndef SERVESIM_SCHEDULER_BATCHING_H_
#define SERVESIM_SCHEDULER_BATCHING_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "scheduler/kv_cache.h"
#include "scheduler/placement.h"
#include "scheduler/prefix_cache.h"
#include "scheduler/request.h"

namespace servesim::scheduler {

enum class BatchingPolicy { kPrefillFirst, kChunkedPrefill, kVllmV1 };

struct BatchingConfig {
  BatchingPolicy policy = BatchingPolicy::kPrefillFirst;
  int64_t max_batch_size = 256;
  int64_t max_tokens_per_iteration = 8192;
  int64_t kv_block_tokens = 16;
  int64_t kv_capacity_blocks = 0;
  double kv_watermark = 0.01;
  int64_t max_context_tokens = 0;
  bool prefix_caching = false;
  int64_t long_prefill_token_threshold = 0;  // kVllmV1; 0: none
  // Lower KV tiers, fastest first (prefix_caching only), and when blocks
  // enter the first: as they are cached (true) or as HBM evicts them.
  std::vector<KvTierConfig> kv_tiers;
  bool kv_tier_write_through = true;
  // kVllmV1 only: tier loads run beside the steps (vLLM's
  // WAITING_FOR_REMOTE_KVS) instead of inside the step that admits.
  bool kv_tier_async = false;
  // The pool's cluster store, which a last tier with cluster_store uses;
  // the engine creates one per pool and run (shared by its schedulers).
  // The blocks this scheduler stores there live at `kv_store_home` (its
  // replica's index), and its batches say where their loads come from.
  std::shared_ptr<BlockLru> kv_store;
  int32_t kv_store_home = 0;
  // Head-wise placement on attention-device stacks (AttAcc); off when
  // placement_stacks == 0. Capacity is per stack, in KV positions of one
  // head across all layers.
  int placement_stacks = 0;
  int64_t placement_capacity_tokens = 0;
  int placement_kv_heads = 0;
};

// What stopped admission in the last Schedule() call.
enum class BatchBound : uint8_t {
  kNone,         // every waiting request was admitted (or none waited)
  kCapacity,     // KV blocks or stack placement ran out
  kSlo,          // the SLO batch cap (SetBatchCap) was reached
  kMaxBatch,     // max_batch_size was reached
  kTokenBudget,  // max_tokens_per_iteration was reached
};
const char* BatchBoundName(BatchBound b);

// kLate: refused at arrival, its TTFT predicted past the SLO (the engine's
// early rejection; the scheduler never rejects for it).
enum class RejectReason { kNone, kTooLong, kExceedsKvCapacity, kLate };

// One request's share of an iteration.
struct BatchEntry {
  int32_t slot = 0;          // index into the scheduler's request table
  int64_t new_tokens = 0;    // 1 for decode, chunk length for prefill
  int64_t past_tokens = 0;   // tokens already in the KV cache
  bool prefill = false;
  bool emits_token = false;  // decode, or the prompt's last chunk
  // Stacks of the request's KV heads when placement is on; else empty.
  absl::Span<const int32_t> kv_stacks;
  int64_t request_id = -1;   // RequestSpec::id; -1 in hypothetical batches
  int64_t final_tokens = 0;  // prompt + output tokens (AttentionSeq::final_tokens); 0: unknown
};

struct Batch {
  std::vector<BatchEntry> entries;
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;
  int64_t emitting = 0;  // entries that produce a token (LM-head rows)
  BatchBound bound = BatchBound::kNone;
  // KV tiers: the time the blocks moved between the tiers and HBM as the
  // step was scheduled take (loads of cache hits; stores of evicted blocks
  // under write-on-evict, which precede the step), and the blocks loaded.
  double kv_tier_load_s = 0, kv_tier_store_s = 0;
  int64_t kv_tier_loads = 0;
  // Of the loads from a cluster store (blocking or layer-wise): (home,
  // blocks) per home replica (BatchingConfig::kv_store_home).
  std::vector<std::pair<int32_t, int64_t>> kv_store_from;
  // The placement's StackPlacement::generation() the entries' kv_stacks were
  // read at; 0: unknown (no placement, or a batch built by hand). Two
  // batches with the same nonzero generation and the same slots in the same
  // order hold the same kv_stacks.
  uint64_t stacks_generation = 0;
  bool empty() const { return entries.empty(); }
  // Back to an empty batch, keeping the entries' storage.
  void Clear() {
    entries.clear();
    prefill_tokens = decode_tokens = emitting = 0;
    bound = BatchBound::kNone;
    kv_tier_load_s = kv_tier_store_s = 0;
    kv_tier_loads = 0;
    kv_store_from.clear();
    stacks_generation = 0;
  }
};

// A batch of `b` identical sequences with `past_tokens` cached tokens each,
// decoding (new_tokens == 1) or prefilling `new_tokens` tokens; for costing
// hypothetical iterations (SLO caps, saturated studies).
Batch UniformBatch(int64_t b, int64_t new_tokens, int64_t past_tokens);

// How much longer a step of `compute_s` is for its KV-tier moves
// (docs/kv_tiers.md): stores of evicted blocks precede it; loads too, or,
// `layerwise`, stream one layer's KV ahead of that layer: a two-stage
// pipeline of `layers` equal stages, which ends at load/L + (L-1)/L x
// max(load, compute) + compute/L. `load_extra_s`: how much longer the
// loads took than their links' time (a cluster store's loads sharing the
// network; cluster::FabricFlows::StoreFlows).
double KvTierWaitS(const Batch& b, double compute_s, int64_t layers, bool layerwise,
                   double load_extra_s = 0);

// Per-request state the scheduler keeps; observers read it.
struct RequestState {
  RequestSpec spec;
  int64_t prompt_tokens = 0;  // tokens to prefill (input + regenerated)
  int64_t prefilled = 0;      // of prompt_tokens, already in the KV cache
  int64_t context_tokens = 0; // KV positions held (after the last iteration)
  int64_t generated = 0;      // output tokens produced so far
  int64_t blocks = 0;
  // With prefix caching: per block held, its cached hash, or 0 for a
  // private block.
  std::vector<uint64_t> block_keys;
  int64_t hashed_blocks = 0;  // leading blocks already cached or tried
  int32_t preemptions = 0;
  // Prompt tokens whose KV came with the request (RequestSpec::
  // kv_ready_tokens); 0 once preempted (the KV is gone).
  int64_t ready_tokens = 0;
  double first_token_s = -1;
  double last_token_s = -1;
  double finish_s = -1;
  bool running = false;
  // Asynchronous tier loads (BatchingConfig::kv_tier_async): when its
  // loaded blocks are in HBM; -1 when it is not loading.
  double load_ready_s = -1;
};

// Receives what happens to requests; metrics implement it.
class RequestObserver {
 public:
  virtual ~RequestObserver() = default;
  // A request's first token, at now_s. Its later tokens come as OnGaps.
  virtual void OnFirstToken(const RequestState& r, double now_s) = 0;
  // `count` tokens at now_s, of as many requests past their first, each
  // `gap_s` after its request's previous token. A step's tokens come in
  // batch order, and consecutive ones with equal gaps in one call: in
  // iteration-level batching every request that decoded in the step before
  // too sees the same gap, that step's duration, so a step makes one call
  // or a few, not one per token.
  virtual void OnGaps(double now_s, double gap_s, int64_t count) = 0;
  virtual void OnFinish(const RequestState& r, double now_s) = 0;
  virtual void OnReject(const RequestSpec& r, RejectReason why, double now_s) = 0;
};

class ReplicaScheduler {
 public:
  explicit ReplicaScheduler(const BatchingConfig& config);

  // Enqueues an arriving request, or rejects it (reported to `observer`).
  RejectReason Add(const RequestSpec& spec, double now_s,
                   RequestObserver* observer);

  // Picks the next iteration's work. Empty when nothing can run (no work).
  // The batch is valid until the next Schedule or Complete call.
  const Batch& Schedule(double now_s);

  // The `steps` batches after the one Schedule returned, as they come if no
  // request arrives, none is admitted and none is preempted: every running
  // request whose prompt is done after that batch decodes once a step, in
  // admission order, until its output is done. Stops early when nobody is
  // left. For hints to devices (IterationPlanner::Expect); request_id is
  // set, kv_stacks point into the placement (valid until the next
  // Schedule or Complete).
  void Project(int steps, std::vector<Batch>* out) const;

  // Caps running requests at `cap` (SLO-limited batching; <= 0: no cap).
  // Running requests above a lowered cap keep running; admission stops.
  void SetBatchCap(int64_t cap) { batch_cap_ = cap; }

  // Applies the batch from Schedule as finished at `now_s`.
  void Complete(double now_s, RequestObserver* observer);

  bool Idle() const { return waiting_.empty() && running_.empty(); }
  // The earliest time a waiting request's asynchronous tier loads end;
  // infinity when none is loading. When Schedule finds nothing to run, the
  // replica waits for it (or an arrival).
  double NextLoadReady() const;
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  const KvBlockPool& kv() const { return kv_; }
  // Blocks the waiting requests' prompts would need.
  int64_t queued_block_demand() const { return queued_blocks_; }
  int64_t total_preemptions() const { return total_preemptions_; }
  // Prefix caching: prompt tokens taken from the cache and prompt tokens
  // admitted, over the run (their ratio is the hit rate); null cache: 0.
  int64_t prefix_hit_tokens() const { return prefix_hit_tokens_; }
  int64_t prefix_query_tokens() const { return prefix_query_tokens_; }
  // Of prefix_hit_tokens, those loaded from lower tier k.
  int64_t tier_hit_tokens(int k) const { return tier_hit_tokens_[k]; }
  const PrefixCache* prefix_cache() const { return prefix_.get(); }
  const StackPlacement* placement() const { return placement_.get(); }
  // Mean KV length the next decode step would see: over running requests
  // (cached tokens + 1), else over waiting prompts; 0 when idle.
  int64_t MeanContextTokens() const;
  // A lower bound on the prompt tokens this replica computes before an
  // arriving `spec` yields its first token (SLO-aware early rejection):
  // what admitted prompts have left, plus each waiting prompt and `spec`
  // less its leading blocks that are cached now or that a prompt ahead of
  // it will have computed (prefix caching; the trace's block hashes).
  int64_t PrefillTokensAhead(const RequestSpec& spec) const;
  const RequestState& state(int32_t slot) const { return table_[slot]; }
  const BatchingConfig& config() const { return config_; }

  // With prefix caching: how many of `spec`'s leading prompt blocks (as
  // the trace names them) the cache holds now, leaving the last token to
  // compute as admission does; 0 without caching.
  int64_t CachedPrefixBlocks(const RequestSpec& spec) const;

  // Blocks needed to hold `tokens` KV positions.
  int64_t BlocksFor(int64_t tokens) const {
    return (tokens + config_.kv_block_tokens - 1) / config_.kv_block_tokens;
  }

 private:
  // Admits the head of the queue if every limit allows; else records the
  // limit that stopped it in batch_.bound and returns false.
  bool TryAdmit(int32_t slot, int64_t tokens_so_far);
  // Frees `slot`'s blocks. `finished`: the request is done, so the blocks
  // of its own content (past what the trace hashes) can never be hit again
  // (PrefixCache::ReleaseUnreachable); a preempted request may find them.
  void ReleaseResources(RequestState& r, int32_t slot, bool finished);
  absl::Span<const int32_t> Stacks(int32_t slot) const;
  void Preempt(int32_t slot);
  // Ensures `slot` has a block for one more token, preempting from the back
  // of running_ as needed. False if `slot` itself was preempted.
  bool ReserveDecodeSlot(int32_t slot);
  void ScheduleDecodes();
  void ScheduleVllmV1();
  // The policy's part of Schedule.
  void SchedulePolicy();
  // Batch::kv_tier_*_s of the blocks moved while scheduling (but for
  // asynchronous loads).
  void CostTierMoves();
  // kVllmV1: the waiting request at waiting_[i] joins the batch with
  // `computed` of its prompt's tokens in place and a chunk of the rest
  // (at most `*budget`), taking blocks for it; false (nothing changed)
  // when they cannot be had.
  bool AdmitChunk(size_t i, int64_t computed, int64_t* budget);
  // kv_tier_async: the request at waiting_[i] takes its leading blocks
  // (`match`; `computed` of its prompt's tokens are then in place) and
  // starts loading those only a tier holds at `now_s`.
  void StartLoads(size_t i, const PrefixCache::Match& match, int64_t computed, double now_s);
  int32_t NewSlot(const RequestSpec& spec);
  // Prefix caching: the hash naming block `b` of the request in `slot`
  // (its trace's, or one of its own past what the trace says).
  uint64_t BlockKey(int32_t slot, int64_t b) const;
  // The prompt's leading cached blocks admission could take now.
  PrefixCache::Match PrefixMatch(int32_t slot);
  // Takes `match`'s cached blocks for `slot` and counts them in the stats.
  void TakePrefix(int32_t slot, const PrefixCache::Match& match);
  // Prompt tokens admission finds computed: `cached` by the prefix cache,
  // or more when the request brought its KV (less the last token).
  int64_t ComputedAtAdmission(int32_t slot, int64_t cached) const {
    const RequestState& r = table_[slot];
    return std::max(cached, std::min(r.ready_tokens, r.prompt_tokens - 1));
  }
  // Ensures `slot` holds blocks for `tokens` KV positions, allocating fresh
  // ones; false (nothing changed) when the pool cannot.
  bool Grow(int32_t slot, int64_t tokens);
  // Caches the blocks of `slot` that are full after `tokens` positions.
  void RegisterFull(int32_t slot, int64_t tokens);

  BatchingConfig config_;
  KvBlockPool kv_;
  int64_t watermark_blocks_;
  std::vector<RequestState> table_;
  std::vector<int32_t> free_slots_;
  std::deque<int32_t> waiting_;
  std::vector<int32_t> running_;  // admission order
  int64_t queued_blocks_ = 0;
  int64_t total_preemptions_ = 0;
  Batch batch_;
  int64_t batch_cap_ = 0;
  std::unique_ptr<StackPlacement> placement_;
  std::unique_ptr<PrefixCache> prefix_;
  std::vector<uint64_t> key_scratch_;
  int64_t prefix_hit_tokens_ = 0, prefix_query_tokens_ = 0;
  int64_t tier_hit_tokens_[kMaxKvTiers] = {0, 0, 0, 0};
  // Asynchronous loads: when the xPU's link to the tiers is next free;
  // per tier, the blocks loaded asynchronously in this Schedule call.
  double load_link_free_s_ = 0;
  double now_s_ = 0;  // the time Schedule was called at
  int64_t async_loads_[kMaxKvTiers] = {0, 0, 0, 0};
};

}  // namespace servesim::scheduler

#endif  // SERVESIM_SCHEDULER_BATCHING_H_
