// What reaches an engine: arrivals, the ends of streams, KV parts; SLO-aware
// early rejection; the data-parallel rank a request joins; and the
// schedulers' events forwarded to the metrics (cluster/engine.h).
#include <algorithm>

#include "cluster/engine.h"
#include "scheduler/planner.h"

namespace servesim::cluster {

void Engine::Counting::OnFirstToken(const scheduler::RequestState& r, double t) {
  // A prefill replica's token is not the user's: the decode replica
  // computes the first one again (vLLM's KV connectors).
  if (e_->role_ == Role::kPrefill) return;
  e_->observer_->OnFirstToken(r, t);
  if (metrics::LiveSink* live = e_->sh_->live) {
    live->OnFirstToken(e_->replica_, t - r.spec.arrival_s);
  }
}

void Engine::Counting::OnGaps(double t, double gap, int64_t count) {
  if (e_->role_ == Role::kPrefill) return;
  e_->observer_->OnGaps(t, gap, count);
  if (metrics::LiveSink* live = e_->sh_->live) {
    for (int64_t k = 0; k < count; ++k) live->OnToken(e_->replica_, gap);
  }
}

void Engine::Counting::OnFinish(const scheduler::RequestState& r, double t) {
  ++e_->finished_;
  --e_->sh_->loads[e_->replica_].outstanding;
  if (e_->role_ == Role::kPrefill) {
    e_->kv_out_->HandOff(r.spec.id, t);
    return;
  }
  e_->observer_->OnFinish(r, t);
  if (metrics::LiveSink* live = e_->sh_->live) live->OnFinish(e_->replica_, t - r.spec.arrival_s);
  e_->sh_->ClientDone();
}

void Engine::Counting::OnReject(const scheduler::RequestSpec& r, scheduler::RejectReason why,
                                double t) {
  ++e_->finished_;
  --e_->sh_->loads[e_->replica_].outstanding;
  e_->observer_->OnReject(r, why, t);
  if (metrics::LiveSink* live = e_->sh_->live) live->OnReject(e_->replica_, why);
  e_->sh_->ClientDone();
}

void Engine::Receive(Message* msg, double now) {
  const int64_t before = finished_;
  // A prefill replica may hand off from now on: busy before the message
  // stops counting as in flight.
  if (role_ == Role::kPrefill) sh_->prefill_busy_until[replica_] = now;
  if (msg->end) {
    expected_ += msg->total_sent;
    ++ends_;
  } else if (msg->kv_parts >= 0) {
    --sh_->kv_in_flight;
    --sh_->kv_in_flight_to[static_cast<size_t>(replica_)];
    ReceiveKv(*msg, now);
  } else {
    --sh_->in_flight;
    if (sh_->live != nullptr) sh_->live->OnArrival(replica_);
    if (role_ == Role::kPrefill) {
      Prefill(msg->request, now);
    } else {
      Rank& rank = PickRank();
      if (!RejectedLate(rank, msg->request, now)) {
        rank.scheduler.Add(msg->request, now, &counting_);
      }
    }
  }
  done_ += finished_ - before;
  sh_->messages.Delete(msg);
  UpdateLoad();
}

// Refuses `spec`, reported as kLate, when the time it has waited plus the
// prefill of every prompt token queued on `rank` before it and of its own
// uncached tokens, in steps of the token budget with nothing else in them,
// exceeds the TTFT SLO (docs/disaggregation.md, "Early rejection"). That
// is a lower bound on its TTFT (to within a step's attention among the
// prompts that share it): only sure misses are refused.
bool Engine::RejectedLate(Rank& rank, const scheduler::RequestSpec& spec, double now) {
  if (!pool_->reject_late) return false;
  const int64_t tokens = rank.scheduler.PrefillTokensAhead(spec);
  const int64_t budget = std::max<int64_t>(1, pool_->batching.max_tokens_per_iteration);
  double t = now - spec.arrival_s;
  auto chunk = [&](int64_t n) -> double {
    auto it = chunk_s_.find(n);
    if (it != chunk_s_.end()) return it->second;
    // The step alone: a data-parallel group's MoE layers see its tokens
    // only (the setting is restored).
    const int64_t group = rank.planner.group_tokens();
    if (pool_->data_parallel > 1) rank.planner.SetGroupTokens(n);
    absl::StatusOr<scheduler::IterationCost> c =
        rank.planner.Plan(scheduler::UniformBatch(1, n, 0));
    rank.planner.SetGroupTokens(group);
    const double s = (c.ok() ? c->time_s : 0.0) + pool_->step_overhead_s;
    chunk_s_.emplace(n, s);
    return s;
  };
  t += static_cast<double>(tokens / budget) * chunk(budget);
  if (tokens % budget > 0) t += chunk(tokens % budget);
  if (!(t > pool_->ttft_slo_s)) return false;
  counting_.OnReject(spec, scheduler::RejectReason::kLate, now);
  return true;
}

// A request reaches the prefill pool: it prefills there and yields one
// token, then hands off. One whose whole answer could never fit the
// model's context is refused here, before the prefill is spent on it.
void Engine::Prefill(const scheduler::RequestSpec& spec, double now) {
  if (spec.input_tokens + spec.output_tokens > pool_->batching.max_context_tokens) {
    counting_.OnReject(spec, scheduler::RejectReason::kTooLong, now);
    return;
  }
  scheduler::RequestSpec p = spec;
  p.output_tokens = 1;
  Rank& rank = PickRank();
  if (RejectedLate(rank, spec, now)) return;
  if (rank.scheduler.Add(p, now, &counting_) == scheduler::RejectReason::kNone) {
    kv_out_->Track(spec);
  }
}

void Engine::ReceiveKv(const Message& msg, double now) {
  scheduler::RequestSpec spec;
  if (!kv_in_->Receive(msg, landed_s_, &spec)) return;
  if (sh_->live != nullptr) sh_->live->OnArrival(replica_);
  PickRank().scheduler.Add(spec, now, &counting_);
}

// vLLM's data-parallel load balancer picks the engine with the least 4 x
// waiting + running, the first on a tie (docs/moe.md).
Rank& Engine::PickRank() {
  Rank* best = ranks_[0].get();
  int64_t best_score = -1;
  for (auto& r : ranks_) {
    const int64_t score = 4 * r->scheduler.num_waiting() + r->scheduler.num_running();
    if (best_score < 0 || score < best_score) {
      best_score = score;
      best = r.get();
    }
  }
  return *best;
}

void Engine::UpdateLoad() {
  auto& l = sh_->loads[replica_];
  l.kv_blocks_used = 0;
  l.kv_blocks_queued = 0;
  for (const auto& r : ranks_) {
    l.kv_blocks_used += r->scheduler.kv().used();
    l.kv_blocks_queued += r->scheduler.queued_block_demand();
  }
}

int64_t Engine::CachedPrefixBlocks(const scheduler::RequestSpec& spec) const {
  int64_t most = 0;
  for (const auto& r : ranks_) most = std::max(most, r->scheduler.CachedPrefixBlocks(spec));
  return most;
}

}  // namespace servesim::cluster
