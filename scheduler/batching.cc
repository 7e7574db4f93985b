#include "scheduler/batching.h"

#include <algorithm>
#include <cassert>
#include <cmath>

namespace servesim::scheduler {

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
  r = RequestState{};
  r.spec = spec;
  r.prompt_tokens = spec.input_tokens;
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
  if (config_.policy == BatchingPolicy::kPrefillFirst && tokens_so_far > 0 &&
      tokens_so_far + r.prompt_tokens > config_.max_tokens_per_iteration) {
    batch_.bound = BatchBound::kTokenBudget;
    return false;
  }
  const int64_t need = BlocksFor(r.prompt_tokens);
  if (kv_.free() - need < watermark_blocks_) {
    batch_.bound = BatchBound::kCapacity;
    return false;
  }
  if (placement_ != nullptr &&
      !placement_->Place(slot, r.spec.input_tokens + r.spec.output_tokens)) {
    batch_.bound = BatchBound::kCapacity;
    return false;
  }
  kv_.TryAllocate(need);
  r.blocks = need;
  r.running = true;
  r.prefilled = 0;
  r.context_tokens = 0;
  queued_blocks_ -= need;
  running_.push_back(slot);
  return true;
}

void ReplicaScheduler::ReleaseResources(RequestState& r, int32_t slot) {
  kv_.Release(r.blocks);
  r.blocks = 0;
  if (placement_ != nullptr) placement_->Release(slot);
}

void ReplicaScheduler::Preempt(int32_t slot) {
  RequestState& r = table_[slot];
  ReleaseResources(r, slot);
  r.running = false;
  r.prefilled = 0;
  r.context_tokens = 0;
  // Recompute: the prompt now includes every token generated so far.
  r.prompt_tokens = r.spec.input_tokens + r.generated;
  ++r.preemptions;
  ++total_preemptions_;
  queued_blocks_ += BlocksFor(r.prompt_tokens);
  waiting_.push_front(slot);
}

bool ReplicaScheduler::ReserveDecodeSlot(int32_t slot) {
  RequestState& r = table_[slot];
  const int64_t need = BlocksFor(r.context_tokens + 1) - r.blocks;
  if (need <= 0) return true;
  while (!kv_.TryAllocate(need)) {
    // Victim: the most recently admitted running request.
    const int32_t victim = running_.back();
    running_.pop_back();
    Preempt(victim);
    if (victim == slot) return false;
  }
  r.blocks += need;
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
    batch_.entries.push_back(BatchEntry{slot, 1, r.context_tokens, false, true, Stacks(slot), table_[slot].spec.id});
    ++batch_.decode_tokens;
    ++batch_.emitting;
  }
}

const Batch& ReplicaScheduler::Schedule(double now_s) {
  (void)now_s;  // FCFS needs no clock; kept for SLO-aware policies.
  batch_.Clear();
  const int64_t budget = config_.max_tokens_per_iteration;

  if (config_.policy == BatchingPolicy::kPrefillFirst) {
    // Whole prompts of newly admitted requests, FCFS.
    int64_t tokens = 0;
    while (!waiting_.empty()) {
      const int32_t slot = waiting_.front();
      const int64_t p = table_[slot].prompt_tokens;
      if (!TryAdmit(slot, tokens)) break;  // head-of-line blocks: FCFS
      waiting_.pop_front();
      batch_.entries.push_back(BatchEntry{slot, p, 0, true, true, Stacks(slot), table_[slot].spec.id});
      tokens += p;
      batch_.prefill_tokens += p;
      ++batch_.emitting;
    }
    if (batch_.empty()) {
      const BatchBound bound = batch_.bound;
      ScheduleDecodes();
      batch_.bound = bound;
    }
    return batch_;
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
    batch_.entries.push_back(BatchEntry{slot, chunk, r.prefilled, true, last, Stacks(slot), table_[slot].spec.id});
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
    const int64_t chunk = std::min(r.prompt_tokens, left);
    const bool last = chunk == r.prompt_tokens;
    batch_.entries.push_back(BatchEntry{slot, chunk, 0, true, last, Stacks(slot), table_[slot].spec.id});
    batch_.prefill_tokens += chunk;
    batch_.emitting += last ? 1 : 0;
    left -= chunk;
  }
  return batch_;
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

void ReplicaScheduler::Complete(double now_s, RequestObserver* observer) {
  bool any_finished = false;
  for (const BatchEntry& e : batch_.entries) {
    RequestState& r = table_[e.slot];
    if (e.prefill) {
      r.prefilled += e.new_tokens;
      r.context_tokens = r.prefilled;
    } else {
      r.context_tokens += 1;
    }
    if (!e.emits_token) continue;
    ++r.generated;
    const double gap = r.last_token_s < 0 ? -1.0 : now_s - r.last_token_s;
    if (r.first_token_s < 0) r.first_token_s = now_s;
    r.last_token_s = now_s;
    if (observer != nullptr) observer->OnToken(r, now_s, gap);
    if (r.generated >= r.spec.output_tokens) {
      r.finish_s = now_s;
      r.running = false;
      ReleaseResources(r, e.slot);
      any_finished = true;
      if (observer != nullptr) observer->OnFinish(r, now_s);
    }
  }
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
