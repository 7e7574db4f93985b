#include "scheduler/batching.h"

#include <algorithm>
#include <cassert>
#include <cmath>

namespace servesim::scheduler {

ReplicaScheduler::ReplicaScheduler(const BatchingConfig& config)
    : config_(config),
      kv_(config.kv_capacity_blocks),
      watermark_blocks_(static_cast<int64_t>(
          std::floor(config.kv_watermark * config.kv_capacity_blocks))) {}

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
  } else if (BlocksFor(total) > kv_.capacity() - watermark_blocks_) {
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

bool ReplicaScheduler::TryAdmit(int32_t slot) {
  RequestState& r = table_[slot];
  const int64_t need = BlocksFor(r.prompt_tokens);
  if (kv_.free() - need < watermark_blocks_) return false;
  kv_.TryAllocate(need);
  r.blocks = need;
  r.running = true;
  r.prefilled = 0;
  r.context_tokens = 0;
  queued_blocks_ -= need;
  running_.push_back(slot);
  return true;
}

void ReplicaScheduler::Preempt(int32_t slot) {
  RequestState& r = table_[slot];
  kv_.Release(r.blocks);
  r.blocks = 0;
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
    batch_.entries.push_back(BatchEntry{slot, 1, r.context_tokens, false, true});
    ++batch_.decode_tokens;
    ++batch_.emitting;
  }
}

const Batch& ReplicaScheduler::Schedule(double now_s) {
  (void)now_s;  // FCFS needs no clock; kept for SLO-aware policies.
  batch_ = Batch{};
  const int64_t budget = config_.max_tokens_per_iteration;

  if (config_.policy == BatchingPolicy::kPrefillFirst) {
    // Whole prompts of newly admitted requests, FCFS.
    int64_t tokens = 0;
    while (!waiting_.empty() &&
           static_cast<int64_t>(running_.size()) < config_.max_batch_size) {
      const int32_t slot = waiting_.front();
      const int64_t p = table_[slot].prompt_tokens;
      if (tokens > 0 && tokens + p > budget) break;
      if (!TryAdmit(slot)) break;  // head-of-line blocks: FCFS
      waiting_.pop_front();
      batch_.entries.push_back(BatchEntry{slot, p, 0, true, true});
      tokens += p;
      batch_.prefill_tokens += p;
      ++batch_.emitting;
    }
    if (batch_.empty()) ScheduleDecodes();
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
    batch_.entries.push_back(BatchEntry{slot, chunk, r.prefilled, true, last});
    batch_.prefill_tokens += chunk;
    batch_.emitting += last ? 1 : 0;
    left -= chunk;
  }
  while (left > 0 && !waiting_.empty() &&
         static_cast<int64_t>(running_.size()) < config_.max_batch_size) {
    const int32_t slot = waiting_.front();
    if (!TryAdmit(slot)) break;
    waiting_.pop_front();
    const RequestState& r = table_[slot];
    const int64_t chunk = std::min(r.prompt_tokens, left);
    const bool last = chunk == r.prompt_tokens;
    batch_.entries.push_back(BatchEntry{slot, chunk, 0, true, last});
    batch_.prefill_tokens += chunk;
    batch_.emitting += last ? 1 : 0;
    left -= chunk;
  }
  return batch_;
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
      kv_.Release(r.blocks);
      r.blocks = 0;
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
  batch_ = Batch{};
}

}  // namespace servesim::scheduler
