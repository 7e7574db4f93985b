// One step of an engine: schedule the ranks' batches, cost them, time the
// step, and record it (cluster/engine.h).
//
// Data-parallel ranks (MoE models) step in lockstep: every rank with work
// schedules a batch, the MoE layers see the group's tokens, a rank without
// work runs them for the others (PlanIdleRank), and the iteration lasts as
// long as the slowest rank. Pipeline stages keep one batch per stage in
// flight, one per rank (vLLM's virtual engines): the step is their
// steady-state cycle through the stages (scheduler/pipeline.h).
#include <algorithm>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "cluster/engine.h"
#include "common/status_macros.h"
#include "scheduler/planner.h"

namespace servesim::cluster {

namespace {

// The CUDA graph a step of `tokens` tokens runs under: vLLM's default
// capture sizes 1, 2, 4, multiples of 8 up to 256, multiples of 16 above.
int64_t CapturedTokens(int64_t tokens) {
  if (tokens <= 4) return tokens <= 1 ? 1 : tokens <= 2 ? 2 : 4;
  if (tokens <= 256) return (tokens + 7) / 8 * 8;
  return (tokens + 15) / 16 * 16;
}

}  // namespace

absl::StatusOr<double> Engine::Iteration(double start) {
  if (pool_->tbt_slo_s > 0) {
    ASSIGN_OR_RETURN(int64_t cap, SloCap());
    for (auto& r : ranks_) r->scheduler.SetBatchCap(std::max<int64_t>(1, cap));
  }
  int64_t group_tokens = 0, most_tokens = 0;
  Rank* lead = ScheduleRanks(start, &group_tokens, &most_tokens);
  // Under CUDA graphs every data-parallel rank runs the largest rank's
  // captured size.
  const bool lockstep = pool_->data_parallel > 1;
  const int64_t graph_max = pool_->cuda_graph_max_tokens;
  if (lockstep && graph_max > 0 && most_tokens <= graph_max) {
    group_tokens =
        static_cast<int64_t>(ranks_.size()) * std::min(graph_max, CapturedTokens(most_tokens));
  }
  if (lead == nullptr) {
    // Nothing runs until a request's asynchronous tier loads end (or a
    // request arrives): Run waits for either.
    double ready = std::numeric_limits<double>::infinity();
    for (const auto& r : ranks_) ready = std::min(ready, r->scheduler.NextLoadReady());
    if (ready < std::numeric_limits<double>::infinity()) {
      wait_until_ = ready;
      return 0.0;
    }
    return absl::InternalError(
        absl::StrCat("replica ", replica_, ": work queued but nothing schedulable at t=", start));
  }
  // A cluster store's loads from other replicas' nodes, as flows from
  // the step's start; the clock is then their end.
  const double load_extra = store_flows_ ? flows_.StoreFlows(ranks_, start) : 0;
  metrics::IterationRecord it;
  it.replica = replica_;
  it.start_s = start;
  it.bound = lead->batch->bound;
  it.batch_cap = batch_cap_;
  double tier_s = 0;  // waiting for KV tiers (the slowest rank's)
  ASSIGN_OR_RETURN(scheduler::IterationCost * step_cost,
                   CostRanks(lead, group_tokens, load_extra, &it, &tier_s));
  power_.ApplyCap(step_cost);
  const scheduler::IterationCost* cost = step_cost;
  // The engine's host time per step that does not overlap the xPUs, and
  // the wait for KV tiers.
  double duration = cost->time_s + pool_->step_overhead_s + tier_s;
  // A prefill replica's layer-wise KV leaves as the step starts; before
  // its collectives' flow, which it shares the NIC link with.
  const bool stream = role_ == Role::kPrefill && sh_->sc->kv_layerwise;
  bool streamed = false;
  if (cost->total.internode_bytes > 0 && sh_->fabric.HasCollectives(replica_)) {
    if (stream) {
      kv_out_->StreamLayers(ranks_, start);
      streamed = true;
    }
    duration += flows_.Collectives(start, duration, cost->total.internode_bytes);
  }
  power_.AddDeviceBusy(cost->device_busy_s);
  it.duration_s = duration;
  double active_j = power_.ActiveJoules(*cost);
  power_.LimitToTdp(step_cost, &active_j);
  it.energy_j = cost->total.energy_pj() * 1e-12 + active_j;
  it.xpu_busy_s = cost->xpu_busy_s;
  it.device_busy_s = cost->device_busy_s;
  it.static_w = power_.static_w();
  sh_->metrics->AddIteration(it);
  sh_->metrics->AddEnergy(cost->total, cost->device_total, active_j);
  RETURN_IF_ERROR(SampleTimeline(*lead, it));
  if (stream && !streamed) kv_out_->StreamLayers(ranks_, start);
  if (sh_->live != nullptr) ReportLive(start, duration, it, *cost, active_j);
  return duration;
}

Rank* Engine::ScheduleRanks(double start, int64_t* group_tokens, int64_t* most_tokens) {
  Rank* lead = nullptr;  // the first rank with a batch
  for (auto& r : ranks_) {
    r->batch = nullptr;
    if (r->scheduler.Idle()) continue;
    const scheduler::Batch& b = r->scheduler.Schedule(start);
    if (b.empty()) continue;
    r->batch = &b;
    *group_tokens += b.prefill_tokens + b.decode_tokens;
    *most_tokens = std::max(*most_tokens, b.prefill_tokens + b.decode_tokens);
    if (lead == nullptr) lead = r.get();
  }
  return lead;
}

absl::StatusOr<scheduler::IterationCost*> Engine::CostRanks(Rank* lead, int64_t group_tokens,
                                                            double load_extra,
                                                            metrics::IterationRecord* it,
                                                            double* tier_s) {
  const bool lockstep = pool_->data_parallel > 1;
  const bool pipeline = pool_->pipeline_parallel > 1;
  double time_s = 0, xpu_busy_s = 0, device_busy_s = 0;
  double busy_sum_s = 0, collective_sum_s = 0;  // over ranks: the collectives' share
  double pipe_bytes = 0;                        // hidden states between pipeline stages
  // The step's cost: the one rank's own (costed in place), or the ranks'
  // or stages' summed into cost_.
  const bool grouped = lockstep || pipeline;
  if (grouped) cost_ = scheduler::IterationCost{};
  scheduler::IterationCost& step_cost = grouped ? cost_ : lead->cost;
  // Idle ranks' planners are alike (same model, layout and device), so
  // one answers for all of them.
  const scheduler::IterationCost* idle = nullptr;
  steps_.clear();
  for (auto& r : ranks_) {
    if (r->batch == nullptr && pipeline) {
      r->cost = scheduler::IterationCost{};  // an empty slot of the pipeline
    } else if (r->batch == nullptr && idle != nullptr) {
      r->cost = *idle;
    } else if (r->batch != nullptr) {
      if (lockstep) r->planner.SetGroupTokens(group_tokens);
      if (!lockstep && !pipeline) hints_.Anticipate(*r);
      RETURN_IF_ERROR(r->planner.Plan(*r->batch, &r->cost));
      *tier_s = std::max(*tier_s,
                         scheduler::KvTierWaitS(*r->batch, r->cost.time_s, pool_->model.num_layers,
                                                pool_->kv_tier_layerwise, load_extra));
      it->batch_size += static_cast<int32_t>(r->batch->entries.size());
      it->prefill_tokens += r->batch->prefill_tokens;
      it->decode_tokens += r->batch->decode_tokens;
      if (pipeline) {
        steps_.push_back(scheduler::StepOf(pool_->pipeline, r->cost,
                                           r->batch->prefill_tokens + r->batch->decode_tokens));
        pipe_bytes += static_cast<double>(pool_->pipeline_parallel - 1) *
                      scheduler::StageTransferBytes(
                          pool_->pipeline, r->batch->prefill_tokens + r->batch->decode_tokens);
      }
    } else {
      ASSIGN_OR_RETURN(r->cost, r->planner.PlanIdleRank(group_tokens));
      idle = &r->cost;
    }
    it->kv_blocks_used += r->scheduler.kv().used();
    it->waiting += r->scheduler.num_waiting();
    time_s = std::max(time_s, r->cost.time_s);
    xpu_busy_s = std::max(xpu_busy_s, r->cost.xpu_busy_s);
    busy_sum_s += r->cost.xpu_busy_s;
    collective_sum_s += r->cost.xpu_collective_s;
    device_busy_s = std::max(device_busy_s, r->cost.device_busy_s);
    if (grouped) {
      cost_.total += r->cost.total;
      cost_.device_total += r->cost.device_total;
    }
  }
  if (pipeline) {
    // The in-flight batches' steady-state cycle (scheduler/pipeline.h);
    // the busiest stage's xPUs are busy for its share.
    const scheduler::PipelineCycle cycle = scheduler::SteadyCycle(steps_, pool_->pipeline_parallel);
    time_s = cycle.time_s;
    xpu_busy_s = cycle.busiest_stage_s;
    cost_.total.link_bytes += pipe_bytes;
    cost_.total.link_energy_pj += pipe_bytes * pool_->pipeline.link_energy_pj_per_byte;
    // Across nodes they leave through the NICs (FabricFlows::Collectives).
    if (pool_->pipeline.across_nodes) cost_.total.internode_bytes += pipe_bytes;
  }
  if (grouped) {
    cost_.time_s = time_s;
    cost_.total.time_s = time_s;
    cost_.xpu_busy_s = xpu_busy_s;
    cost_.device_busy_s = device_busy_s;
    // The busiest rank's or stage's busy time, with the ranks' share of
    // collectives in it.
    cost_.xpu_collective_s = busy_sum_s > 0 ? xpu_busy_s * collective_sum_s / busy_sum_s : 0;
  }
  return &step_cost;
}

void Engine::ReportLive(double start, double duration, const metrics::IterationRecord& it,
                        const scheduler::IterationCost& cost, double active_j) {
  metrics::LiveIteration li;
  li.replica = replica_;
  li.start_s = start;
  li.duration_s = duration;
  li.batch_size = it.batch_size;
  li.queue_length = it.waiting;
  li.kv_blocks_used = it.kv_blocks_used;
  for (const auto& r : ranks_) {
    li.kv_blocks_total += r->scheduler.kv().capacity();
    li.preemptions_total += r->scheduler.total_preemptions();
    li.prefix_hit_tokens_total += r->scheduler.prefix_hit_tokens();
    li.prefix_query_tokens_total += r->scheduler.prefix_query_tokens();
    if (const scheduler::PrefixCache* pc = r->scheduler.prefix_cache()) {
      li.num_kv_tiers = pc->num_tiers();
      for (int k = 0; k < pc->num_tiers(); ++k) {
        li.kv_tier_names[k] = pc->tier_config(k).name;
        li.kv_tier_hit_tokens_total[k] += r->scheduler.tier_hit_tokens(k);
      }
    }
  }
  li.xpu_busy_s = cost.xpu_busy_s;
  li.device_busy_s = cost.device_busy_s;
  li.xpu_static_w = power_.xpu_static_w();
  li.xpu_active_j = active_j;
  li.device_static_w = power_.device_static_w();
  li.host_w = power_.host_w();
  li.device = cost.device_total;
  li.xpu = cost.total;
  for (double devices::Cost::*f :
       {&devices::Cost::flops, &devices::Cost::dram_bytes, &devices::Cost::link_bytes,
        &devices::Cost::compute_energy_pj, &devices::Cost::dram_energy_pj,
        &devices::Cost::link_energy_pj, &devices::Cost::bg_bus_bytes, &devices::Cost::tsv_bytes,
        &devices::Cost::external_bytes}) {
    li.xpu.*f -= li.device.*f;
  }
  sh_->live->OnIteration(li);
}

// The SLO batch cap for the current mean context, memoised per 64-token
// bucket (rounded up, so the cap is never too generous) and shared by the
// pool's replicas. A new bucket's search starts from the nearest known
// bucket's cap. Data-parallel ranks share the first rank's cap.
absl::StatusOr<int64_t> Engine::SloCap() {
  const int64_t ctx = ranks_[0]->scheduler.MeanContextTokens();
  const int64_t bucket = (ctx + 63) / 64;
  std::map<int64_t, int64_t>& caps = sh_->slo_caps[pool_];
  auto it = caps.lower_bound(bucket);
  if (it == caps.end() || it->first != bucket) {
    int64_t hint = 0;
    if (it != caps.end()) hint = it->second;
    if (it != caps.begin() &&
        (it == caps.end() || bucket - std::prev(it)->first < it->first - bucket)) {
      hint = std::prev(it)->second;
    }
    ASSIGN_OR_RETURN(int64_t cap,
                     scheduler::MaxBatchWithinSlo(ranks_[0]->planner, pool_->tbt_slo_s,
                                                  std::max<int64_t>(1, bucket * 64),
                                                  pool_->batching.max_batch_size, hint));
    it = caps.emplace_hint(it, bucket, cap);
  }
  batch_cap_ = it->second;
  return it->second;
}

// With data-parallel ranks, the first busy rank's schedule.
absl::Status Engine::SampleTimeline(Rank& rank, const metrics::IterationRecord& it) {
  const auto& o = sh_->sc->proto.output();
  const int64_t index = iteration_index_++;
  if (!o.timeline() || !sh_->record_timeline || index % o.timeline_every() != 0 ||
      timeline_samples_ >= o.timeline_max_iterations() || it.start_s < o.timeline_start_s() ||
      it.start_s >= o.timeline_end_s()) {
    return absl::OkStatus();
  }
  ++timeline_samples_;
  metrics::TimelineIteration t;
  t.replica = replica_;
  t.index = index;
  t.start_s = it.start_s;
  t.duration_s = it.duration_s;
  t.batch_size = it.batch_size;
  t.prefill_tokens = it.prefill_tokens;
  t.decode_tokens = it.decode_tokens;
  t.power_w = it.duration_s > 0 ? it.static_w + it.energy_j / it.duration_s : it.static_w;
  // Layers past those drawn span by span are kept folded (one span per
  // track): the timeline draws them so, and a sample keeps 2-3% of its
  // spans instead of every layer's.
  RETURN_IF_ERROR(
      rank.planner
          .Plan(*rank.batch, &t.spans, std::max(o.timeline_layers(), metrics::kScheduleLayers))
          .status());
  sh_->metrics->AddTimeline(std::move(t));
  return absl::OkStatus();
}

}  // namespace servesim::cluster
