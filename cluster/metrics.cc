#include "cluster/metrics.h"

#include <algorithm>
#include <cmath>
#include <memory>

namespace servesim::cluster {

class MetricsCollector::ReplicaObserver : public scheduler::RequestObserver {
 public:
  ReplicaObserver(MetricsCollector* m, int replica) : m_(m), replica_(replica) {}
  void OnToken(const scheduler::RequestState& r, double now_s,
               double gap_s) override {
    RequestRecord& rec = m_->requests_[r.spec.id];
    rec.replica = replica_;
    if (rec.first_token_s < 0) rec.first_token_s = now_s;
    if (gap_s >= 0) m_->gaps_.push_back(gap_s);
  }
  void OnFinish(const scheduler::RequestState& r, double now_s) override {
    RequestRecord& rec = m_->requests_[r.spec.id];
    rec.finish_s = now_s;
    rec.preemptions = r.preemptions;
    rec.status = RequestStatus::kDone;
    m_->NoteEvent(now_s);
  }
  void OnReject(const scheduler::RequestSpec& r, scheduler::RejectReason why,
                double now_s) override {
    RequestRecord& rec = m_->requests_[r.id];
    rec.replica = replica_;
    rec.status = why == scheduler::RejectReason::kTooLong
                     ? RequestStatus::kRejectedTooLong
                     : RequestStatus::kRejectedKv;
    m_->NoteEvent(now_s);
  }

 private:
  MetricsCollector* m_;
  int replica_;
};

MetricsCollector::MetricsCollector(
    const std::vector<scheduler::RequestSpec>& requests) {
  requests_.reserve(requests.size());
  int64_t tokens = 0;
  for (const auto& r : requests) {
    RequestRecord rec;
    rec.id = r.id;
    rec.arrival_s = r.arrival_s;
    rec.input_tokens = r.input_tokens;
    rec.output_tokens = r.output_tokens;
    requests_.push_back(rec);
    tokens += r.output_tokens;
  }
  gaps_.reserve(static_cast<size_t>(tokens));
}

MetricsCollector::~MetricsCollector() = default;

scheduler::RequestObserver* MetricsCollector::ObserverFor(int replica) {
  while (static_cast<int>(observers_.size()) <= replica) {
    observers_.push_back(std::make_unique<ReplicaObserver>(
        this, static_cast<int>(observers_.size())));
  }
  return observers_[replica].get();
}

void MetricsCollector::SortByStart() {
  auto by_start = [](const auto& a, const auto& b) {
    return a.start_s != b.start_s ? a.start_s < b.start_s : a.replica < b.replica;
  };
  std::stable_sort(iterations_.begin(), iterations_.end(), by_start);
  std::stable_sort(timeline_.begin(), timeline_.end(), by_start);
}

Distribution Summarize(std::vector<double>& v) {
  Distribution d;
  d.count = static_cast<int64_t>(v.size());
  if (v.empty()) return d;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  d.mean = sum / static_cast<double>(v.size());
  auto pct = [&](double q) {
    const double pos = q * static_cast<double>(v.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(pos));
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
  };
  d.p50 = pct(0.50);
  d.p90 = pct(0.90);
  d.p99 = pct(0.99);
  d.max = v.back();
  return d;
}

Summary ComputeSummary(const MetricsCollector& metrics, double ttft_slo_s,
                       double tpot_slo_s, int64_t kv_capacity_blocks) {
  Summary s;
  s.slo_ttft_s = ttft_slo_s;
  s.slo_tpot_s = tpot_slo_s;
  std::vector<double> ttft, tpot, e2e;
  for (const RequestRecord& r : metrics.requests()) {
    ++s.requests;
    switch (r.status) {
      case RequestStatus::kRejectedTooLong:
        ++s.rejected;
        ++s.rejected_too_long;
        continue;
      case RequestStatus::kRejectedKv:
        ++s.rejected;
        ++s.rejected_kv_capacity;
        continue;
      case RequestStatus::kPending:
        continue;
      case RequestStatus::kDone:
        break;
    }
    ++s.completed;
    s.preemptions += r.preemptions;
    s.input_tokens += r.input_tokens;
    s.output_tokens += r.output_tokens;
    const double t = r.first_token_s - r.arrival_s;
    ttft.push_back(t);
    e2e.push_back(r.finish_s - r.arrival_s);
    bool met = t <= ttft_slo_s;
    if (r.output_tokens > 1) {
      const double per = (r.finish_s - r.first_token_s) /
                         static_cast<double>(r.output_tokens - 1);
      tpot.push_back(per);
      met = met && per <= tpot_slo_s;
    }
    s.slo_met += met ? 1 : 0;
  }
  std::vector<double> gaps = metrics.tbt_gaps();
  s.ttft_s = Summarize(ttft);
  s.tpot_s = Summarize(tpot);
  s.e2e_s = Summarize(e2e);
  s.tbt_s = Summarize(gaps);
  s.makespan_s = metrics.last_event_s();
  if (s.makespan_s > 0) {
    s.throughput_tokens_per_s = static_cast<double>(s.output_tokens) / s.makespan_s;
    s.throughput_requests_per_s = static_cast<double>(s.completed) / s.makespan_s;
    s.goodput_requests_per_s = static_cast<double>(s.slo_met) / s.makespan_s;
  }
  if (s.requests > 0) {
    s.slo_attainment = static_cast<double>(s.slo_met) / static_cast<double>(s.requests);
  }
  double busy = 0, kv_weighted = 0, batch_sum = 0;
  for (const IterationRecord& it : metrics.iterations()) {
    ++s.iterations;
    ++s.bound_iterations[static_cast<int>(it.bound)];
    batch_sum += it.batch_size;
    s.batch_size_max = std::max<int64_t>(s.batch_size_max, it.batch_size);
    const double util = kv_capacity_blocks > 0
                            ? static_cast<double>(it.kv_blocks_used) /
                                  static_cast<double>(kv_capacity_blocks)
                            : 0;
    s.kv_utilization_max = std::max(s.kv_utilization_max, util);
    kv_weighted += util * it.duration_s;
    busy += it.duration_s;
    s.energy_j += it.energy_j;
  }
  if (s.iterations > 0) s.batch_size_mean = batch_sum / static_cast<double>(s.iterations);
  s.device_busy_s = metrics.energy().device_busy_s;
  s.device_dram_bytes = metrics.energy().device_dram_bytes;
  if (busy > 0) s.kv_utilization_mean = kv_weighted / busy;
  if (s.output_tokens > 0) {
    s.energy_per_token_j = s.energy_j / static_cast<double>(s.output_tokens);
  }
  return s;
}

}  // namespace servesim::cluster
