#include "metrics/collector.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <utility>

namespace servesim::metrics {
namespace {

// Invariants of the run (ids in order, observers on live requests).
void Check(bool ok, const char* what) {
  if (!ok) {
    std::cerr << "servesim: metrics invariant violated: " << what << "\n";
    std::abort();
  }
}

}  // namespace

// --------------------------------------------------------- collector ----

class MetricsCollector::ReplicaObserver : public scheduler::RequestObserver {
 public:
  ReplicaObserver(MetricsCollector* m, int replica) : m_(m), replica_(replica) {}
  void OnFirstToken(const scheduler::RequestState& r, double now_s) override {
    RequestRecord& rec = m_->Live(r.spec.id);
    rec.replica = replica_;
    rec.first_token_s = now_s;
  }
  void OnGaps(double, double gap_s, int64_t count) override { m_->tbt_.Add(gap_s, count); }
  void OnFinish(const scheduler::RequestState& r, double now_s) override {
    RequestRecord& rec = m_->Live(r.spec.id);
    rec.finish_s = now_s;
    rec.preemptions = r.preemptions;
    rec.status = RequestStatus::kDone;
    m_->NoteEvent(now_s);
    m_->RetireFinished(false);
  }
  void OnReject(const scheduler::RequestSpec& r, scheduler::RejectReason why,
                double now_s) override {
    RequestRecord& rec = m_->Live(r.id);
    rec.replica = replica_;
    rec.status = why == scheduler::RejectReason::kTooLong ? RequestStatus::kRejectedTooLong
                 : why == scheduler::RejectReason::kLate  ? RequestStatus::kRejectedLate
                                                          : RequestStatus::kRejectedKv;
    m_->NoteEvent(now_s);
    m_->RetireFinished(false);
  }

 private:
  MetricsCollector* m_;
  int replica_;
};

MetricsCollector::MetricsCollector(const MetricsOptions& options)
    : options_(options),
      replicas_(static_cast<size_t>(std::max(1, options.replicas))),
      order_(static_cast<int>(replicas_.size())),
      idle_(static_cast<int>(replicas_.size())),
      ttft_(options.exact_percentile_max_samples),
      tbt_(options.exact_percentile_max_samples),
      tpot_(options.exact_percentile_max_samples),
      e2e_(options.exact_percentile_max_samples),
      ttft_prefill_(options.exact_percentile_max_samples),
      ttft_transfer_(options.exact_percentile_max_samples),
      ttft_decode_(options.exact_percentile_max_samples) {
  for (int q = 0; q < static_cast<int>(replicas_.size()); ++q) Requeue(q);
}

MetricsCollector::~MetricsCollector() = default;

scheduler::RequestObserver* MetricsCollector::ObserverFor(int replica) {
  while (static_cast<int>(observers_.size()) <= replica) {
    observers_.push_back(std::make_unique<ReplicaObserver>(
        this, static_cast<int>(observers_.size())));
  }
  return observers_[replica].get();
}

void MetricsCollector::OnArrival(const scheduler::RequestSpec& r) {
  Check(r.id == front_id_ + static_cast<int64_t>(live_.size()),
        "request ids must arrive in order 0, 1, 2, ...");
  RequestRecord rec;
  rec.id = r.id;
  rec.arrival_s = r.arrival_s;
  rec.input_tokens = r.input_tokens;
  rec.output_tokens = r.output_tokens;
  live_.push_back(rec);
  max_live_ = std::max(max_live_, static_cast<int64_t>(live_.size()));
}

RequestRecord& MetricsCollector::Live(int64_t id) {
  Check(id >= front_id_ && id < front_id_ + static_cast<int64_t>(live_.size()),
        "an observer reported a request that is not in flight");
  return live_[static_cast<size_t>(id - front_id_)];
}

void MetricsCollector::RetireFinished(bool all) {
  while (!live_.empty() && (all || live_.front().status != RequestStatus::kPending)) {
    Fold(live_.front());
    if (options_.sink != nullptr) options_.sink->OnRequest(live_.front());
    live_.pop_front();
    ++front_id_;
  }
}

void MetricsCollector::Fold(const RequestRecord& r) {
  ++req_.requests;
  switch (r.status) {
    case RequestStatus::kRejectedTooLong:
      ++req_.rejected;
      ++req_.rejected_too_long;
      return;
    case RequestStatus::kRejectedKv:
      ++req_.rejected;
      ++req_.rejected_kv_capacity;
      return;
    case RequestStatus::kRejectedLate:
      ++req_.rejected;
      ++req_.rejected_late;
      return;
    case RequestStatus::kPending:
      return;
    case RequestStatus::kDone:
      break;
  }
  ++req_.completed;
  req_.preemptions += r.preemptions;
  req_.input_tokens += r.input_tokens;
  req_.output_tokens += r.output_tokens;
  const double t = r.first_token_s - r.arrival_s;
  ttft_.Add(t);
  if (r.kv_ready_s >= 0) {
    ttft_prefill_.Add(r.prefill_end_s - r.arrival_s);
    ttft_transfer_.Add(r.kv_ready_s - r.prefill_end_s);
    ttft_decode_.Add(r.first_token_s - r.kv_ready_s);
    ttft_transfer_sum_ += r.kv_ready_s - r.prefill_end_s;
    ttft_handed_off_sum_ += t;
  }
  e2e_.Add(r.finish_s - r.arrival_s);
  bool met = t <= options_.ttft_slo_s;
  if (r.output_tokens > 1) {
    const double per = (r.finish_s - r.first_token_s) /
                       static_cast<double>(r.output_tokens - 1);
    tpot_.Add(per);
    met = met && per <= options_.tpot_slo_s;
  }
  req_.slo_met += met ? 1 : 0;
}

void MetricsCollector::AddIteration(const IterationRecord& it) {
  Check(it.replica >= 0 && it.replica < static_cast<int>(replicas_.size()),
        "iteration of an unknown replica");
  ReplicaIterations& r = replicas_[static_cast<size_t>(it.replica)];
  r.pending.push_back(it);
  r.watermark_s = it.start_s;
  r.idle = false;
  Requeue(it.replica);
  ++buffered_;
  max_buffered_ = std::max(max_buffered_, buffered_);
  FlushIterations(false);
}

void MetricsCollector::MarkIdle(int replica, double now_s) {
  ReplicaIterations& r = replicas_[static_cast<size_t>(replica)];
  r.watermark_s = std::max(r.watermark_s, now_s);
  r.idle = true;
  Requeue(replica);
  FlushIterations(false);
}

void MetricsCollector::MarkDone(int replica) {
  ReplicaIterations& r = replicas_[static_cast<size_t>(replica)];
  r.watermark_s = std::numeric_limits<double>::infinity();
  r.idle = false;
  Requeue(replica);
  FlushIterations(false);
}

void MetricsCollector::Requeue(int replica) {
  const ReplicaIterations& r = replicas_[static_cast<size_t>(replica)];
  if (!r.pending.empty()) {
    idle_.Remove(replica);
    order_.Set(replica, r.pending.front().start_s);
  } else if (r.idle) {
    order_.Remove(replica);
    idle_.Set(replica, r.watermark_s);
  } else {
    idle_.Remove(replica);
    order_.Set(replica, r.watermark_s);
  }
}

// Folds buffered iterations in (start, replica) order while none can still
// come before them: the earliest buffered one goes when no replica without
// any has a watermark (an idle one's lifted to the floor) before it, a tie
// going to the lower replica. In O(log replicas) per iteration, with the
// heaps; `all` (the run's end) folds what is left.
void MetricsCollector::FlushIterations(bool all) {
  const double floor = floor_ && !all ? floor_() : -std::numeric_limits<double>::infinity();
  const int n = static_cast<int>(replicas_.size());
  while (!all && !order_.empty()) {
    // The least key over the replicas but the idle ones: a buffered
    // iteration, or a replica that may still record one before it.
    const int best = order_.top();
    ReplicaIterations& r = replicas_[static_cast<size_t>(best)];
    if (r.pending.empty()) return;
    const double s = r.pending.front().start_s;
    if (!idle_.empty()) {
      const double lifted = std::max(idle_.key(idle_.top()), floor);
      if (lifted < s) return;
      if (lifted == s) {
        // A tie: the lower replica goes first.
        for (int q = 0; q < best; ++q) {
          const ReplicaIterations& o = replicas_[static_cast<size_t>(q)];
          if (o.pending.empty() && o.idle && std::max(o.watermark_s, floor) == s) return;
        }
      }
    }
    FoldIteration(r.pending.front());
    r.pending.pop_front();
    --buffered_;
    Requeue(best);
  }
  while (all) {
    // The earliest head, (start, replica) order.
    int best = -1;
    for (int q = 0; q < n; ++q) {
      if (replicas_[q].pending.empty()) continue;
      if (best < 0 || replicas_[q].pending.front().start_s < replicas_[best].pending.front().start_s) {
        best = q;
      }
    }
    if (best < 0) return;
    const double s = replicas_[best].pending.front().start_s;
    if (!all) {
      // A replica with nothing buffered may still record an iteration that
      // sorts before this one.
      for (int q = 0; q < n; ++q) {
        const ReplicaIterations& r = replicas_[q];
        if (q == best || !r.pending.empty()) continue;
        const double w = r.idle ? std::max(r.watermark_s, floor) : r.watermark_s;
        if (w < s || (w == s && q < best)) return;
      }
    }
    FoldIteration(replicas_[best].pending.front());
    replicas_[best].pending.pop_front();
    --buffered_;
    Requeue(best);
  }
}

void MetricsCollector::FoldIteration(const IterationRecord& it) {
  ++iter_.iterations;
  ++iter_.bound_iterations[static_cast<int>(it.bound)];
  iter_.batch_sum += it.batch_size;
  iter_.batch_size_max = std::max<int64_t>(iter_.batch_size_max, it.batch_size);
  iter_.kv_blocks_max = std::max(iter_.kv_blocks_max, it.kv_blocks_used);
  const double util = options_.kv_capacity_blocks > 0
                          ? static_cast<double>(it.kv_blocks_used) /
                                static_cast<double>(options_.kv_capacity_blocks)
                          : 0;
  iter_.kv_weighted += util * it.duration_s;
  iter_.busy_s += it.duration_s;
  iter_.energy_j += it.energy_j;
  if (it.duration_s > 0) {
    iter_.power_peak_w = std::max(iter_.power_peak_w, it.static_w + it.energy_j / it.duration_s);
  }
  if (options_.time_series) series_.Add(it);
  if (options_.sink != nullptr) options_.sink->OnIteration(it);
}

void MetricsCollector::Finish() {
  FlushIterations(true);
  RetireFinished(true);
  std::stable_sort(timeline_.begin(), timeline_.end(), [](const auto& a, const auto& b) {
    return a.start_s != b.start_s ? a.start_s < b.start_s : a.replica < b.replica;
  });
  // The transfers by start, then decode replica and request: the order the
  // decode replicas took them in depends on how their engines advanced.
  std::sort(transfers_.begin(), transfers_.end(), [](const auto& a, const auto& b) {
    if (a.start_s != b.start_s) return a.start_s < b.start_s;
    return a.to != b.to ? a.to < b.to : a.request_id < b.request_id;
  });
}

Summary ComputeSummary(const MetricsCollector& metrics) {
  Summary s;
  const MetricsOptions& o = metrics.options();
  const auto& rq = metrics.request_totals();
  const auto& it = metrics.iteration_totals();
  s.slo_ttft_s = o.ttft_slo_s;
  s.slo_tpot_s = o.tpot_slo_s;
  s.requests = rq.requests;
  s.completed = rq.completed;
  s.rejected = rq.rejected;
  s.rejected_too_long = rq.rejected_too_long;
  s.rejected_kv_capacity = rq.rejected_kv_capacity;
  s.rejected_late = rq.rejected_late;
  s.preemptions = rq.preemptions;
  s.input_tokens = rq.input_tokens;
  s.output_tokens = rq.output_tokens;
  s.slo_met = rq.slo_met;
  s.ttft_s = metrics.ttft().ToDistribution();
  s.tpot_s = metrics.tpot().ToDistribution();
  s.e2e_s = metrics.e2e().ToDistribution();
  s.tbt_s = metrics.tbt().ToDistribution();
  s.makespan_s = metrics.last_event_s();
  if (s.makespan_s > 0) {
    s.throughput_tokens_per_s = static_cast<double>(s.output_tokens) / s.makespan_s;
    s.throughput_requests_per_s = static_cast<double>(s.completed) / s.makespan_s;
    s.goodput_requests_per_s = static_cast<double>(s.slo_met) / s.makespan_s;
  }
  if (s.requests > 0) {
    s.slo_attainment = static_cast<double>(s.slo_met) / static_cast<double>(s.requests);
  }
  s.iterations = it.iterations;
  for (int i = 0; i < 5; ++i) s.bound_iterations[i] = it.bound_iterations[i];
  s.batch_size_max = it.batch_size_max;
  // max(used / capacity) is max(used) / capacity: division by a positive
  // constant keeps the order.
  s.kv_utilization_max = o.kv_capacity_blocks > 0
                             ? static_cast<double>(it.kv_blocks_max) /
                                   static_cast<double>(o.kv_capacity_blocks)
                             : 0;
  // Dynamic energy: the iterations' ops and the KV moved between pools;
  // static: what the replicas draw over the run (docs/energy.md).
  s.energy_dynamic_j = it.energy_j + metrics.transfer_energy_j() + metrics.kv_tier_energy_j();
  s.energy_static_j = metrics.energy().static_total();
  s.energy_j = s.energy_dynamic_j + s.energy_static_j;
  s.energy_parts = metrics.energy();
  s.power_peak_replica_w = it.power_peak_w;
  s.power_capped_iterations = metrics.power_capped_iterations();
  s.tdp_limited_iterations = metrics.tdp_limited_iterations();
  if (s.iterations > 0) s.batch_size_mean = it.batch_sum / static_cast<double>(s.iterations);
  s.prefix_hit_tokens = metrics.prefix_hit_tokens();
  s.prefix_query_tokens = metrics.prefix_query_tokens();
  s.tiered_hit_tokens = metrics.tiered_hit_tokens();
  s.tiered_query_tokens = metrics.tiered_query_tokens();
  for (int p = 0; p < 2; ++p) {
    s.pool_prefix_hit_tokens[p] = metrics.pool_prefix_hit_tokens(p);
    s.pool_prefix_query_tokens[p] = metrics.pool_prefix_query_tokens(p);
  }
  s.kv_tiers = metrics.kv_tiers();
  s.device_busy_s = metrics.energy().device_busy_s;
  s.device_dram_bytes = metrics.energy().device_dram_bytes;
  if (it.busy_s > 0) s.kv_utilization_mean = it.kv_weighted / it.busy_s;
  s.handoffs = metrics.handoffs();
  s.kv_bytes = metrics.kv_bytes();
  s.collective_bytes = metrics.collective_bytes();
  s.collective_flows = metrics.collective_flows();
  s.collective_extra_s = metrics.collective_extra_s();
  s.ttft_prefill_s = metrics.ttft_prefill().ToDistribution();
  s.ttft_transfer_s = metrics.ttft_transfer().ToDistribution();
  s.ttft_decode_s = metrics.ttft_decode().ToDistribution();
  if (metrics.ttft_handed_off_sum_s() > 0) {
    s.ttft_transfer_share = metrics.ttft_transfer_sum_s() / metrics.ttft_handed_off_sum_s();
  }
  for (const LinkLoad& l : metrics.link_loads()) {
    Summary::LinkUse u;
    u.name = l.name;
    u.bytes = l.bytes;
    u.utilization = l.Utilization(s.makespan_s);
    if (l.bandwidth_bytes_per_s > 0) {
      for (const auto& dir : l.bins) {
        for (const double b : dir) {
          u.peak_utilization =
              std::max(u.peak_utilization, b / (l.bandwidth_bytes_per_s * metrics.link_bin_s()));
        }
      }
    }
    s.links.push_back(std::move(u));
  }
  if (s.output_tokens > 0) {
    s.energy_per_token_j = s.energy_j / static_cast<double>(s.output_tokens);
  }
  if (s.completed > 0) s.energy_per_request_j = s.energy_j / static_cast<double>(s.completed);
  if (s.slo_met > 0) s.energy_per_good_request_j = s.energy_j / static_cast<double>(s.slo_met);
  if (s.makespan_s > 0) s.power_mean_w = s.energy_j / s.makespan_s;
  return s;
}

void LinkLoad::AddFlow(int direction, double flow_bytes, double start_s, double end_s,
                       double bin_s) {
  direction_bytes[direction] += flow_bytes;
  std::vector<double>& v = bins[direction];
  const auto bin = [bin_s](double t) { return static_cast<size_t>(std::max(0.0, t / bin_s)); };
  const size_t first = bin(start_s);
  // A flow ending on a bin's edge ends in the bin before it.
  const size_t last =
      end_s > start_s ? std::max(first, static_cast<size_t>(std::ceil(end_s / bin_s)) - 1) : first;
  if (v.size() <= last) v.resize(last + 1, 0.0);
  if (last == first) {
    v[first] += flow_bytes;
    return;
  }
  const double rate = flow_bytes / (end_s - start_s);
  for (size_t k = first; k <= last; ++k) {
    const double lo = std::max(start_s, static_cast<double>(k) * bin_s);
    const double hi = std::min(end_s, static_cast<double>(k + 1) * bin_s);
    if (hi > lo) v[k] += rate * (hi - lo);
  }
}

double LinkLoad::Utilization(double seconds) const {
  if (!(seconds > 0) || !(bandwidth_bytes_per_s > 0)) return 0;
  const double busiest = split_duplex ? std::max(direction_bytes[0], direction_bytes[1]) : bytes;
  return busiest / (bandwidth_bytes_per_s * seconds);
}

}  // namespace servesim::metrics
