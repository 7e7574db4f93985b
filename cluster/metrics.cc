#include "cluster/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <memory>
#include <utility>

#include "absl/base/casts.h"

namespace servesim::cluster {
namespace {

// Invariants of the run (ids in order, observers on live requests).
void Check(bool ok, const char* what) {
  if (!ok) {
    std::cerr << "servesim: metrics invariant violated: " << what << "\n";
    std::abort();
  }
}

// The bin of `x` among `bins` bins of `width`: clamped to [0, bins - 1]
// before the conversion, so a point far past the span (a partial run's
// fast-forwarded iterations end after the clock), a zero width or a NaN
// never converts an out-of-range double.
int BinOf(double x, double width, int bins) {
  const double b = x / width;
  if (!(b >= 0)) return 0;
  if (b >= bins - 1) return bins - 1;
  return static_cast<int>(b);
}

}  // namespace

// ------------------------------------------------------------ sketch ----

QuantileSketch::QuantileSketch(double relative_error)
    : relative_error_(relative_error),
      gamma_((1 + relative_error) / (1 - relative_error)),
      log_gamma_(std::log(gamma_)) {}

int64_t QuantileSketch::Index(double value) const {
  // +inf counts in the largest finite value's bucket (its index is ~35,000
  // at 1% error), never a cast of inf.
  return static_cast<int64_t>(
      std::ceil(std::log(std::min(value, std::numeric_limits<double>::max())) / log_gamma_));
}

double QuantileSketch::Estimate(int64_t index) const {
  return 2 * std::exp(static_cast<double>(index) * log_gamma_) / (gamma_ + 1);
}

void QuantileSketch::Add(double value) {
  if (count_ == 0) {
    min_ = max_ = value;
  } else {
    min_ = std::min(min_, value);
    max_ = std::max(max_, value);
  }
  ++count_;
  if (!(value >= kMinPositive)) {
    ++zero_count_;
    return;
  }
  // log() may round a value on a bucket's edge into its neighbour, which
  // is off by at most an ulp more than the stated error.
  int64_t i = Index(value);
  if (counts_.empty()) {
    offset_ = i;
    counts_.assign(1, 0);
  }
  if (i < offset_) {
    const int64_t grow = offset_ - i;
    if (static_cast<int64_t>(counts_.size()) + grow > kMaxBuckets) {
      i = offset_;  // collapsed into the lowest bucket
    } else {
      counts_.insert(counts_.begin(), static_cast<size_t>(grow), 0);
      offset_ = i;
    }
  } else if (i >= offset_ + static_cast<int64_t>(counts_.size())) {
    const int64_t size = i - offset_ + 1;
    if (size > kMaxBuckets) {
      // Collapse the lowest buckets into the new lowest one.
      const int64_t drop = size - kMaxBuckets;
      const int64_t keep_from = std::min<int64_t>(drop, static_cast<int64_t>(counts_.size()));
      int64_t folded = 0;
      for (int64_t k = 0; k < keep_from; ++k) folded += counts_[static_cast<size_t>(k)];
      counts_.erase(counts_.begin(), counts_.begin() + keep_from);
      offset_ += drop;
      if (counts_.empty()) counts_.assign(1, 0);
      counts_[0] += folded;
    }
    counts_.resize(static_cast<size_t>(i - offset_ + 1), 0);
  }
  ++counts_[static_cast<size_t>(i - offset_)];
}

void QuantileSketch::Merge(const QuantileSketch& other) {
  Check(other.gamma_ == gamma_, "sketches of different accuracy merged");
  if (other.count_ == 0) return;
  if (count_ == 0) {
    *this = other;
    return;
  }
  min_ = std::min(min_, other.min_);
  max_ = std::max(max_, other.max_);
  count_ += other.count_;
  zero_count_ += other.zero_count_;
  if (other.counts_.empty()) return;
  if (counts_.empty()) {
    counts_ = other.counts_;
    offset_ = other.offset_;
    return;
  }
  const int64_t lo = std::min(offset_, other.offset_);
  const int64_t hi = std::max(offset_ + static_cast<int64_t>(counts_.size()),
                              other.offset_ + static_cast<int64_t>(other.counts_.size()));
  std::vector<int64_t> merged(static_cast<size_t>(hi - lo), 0);
  for (size_t k = 0; k < counts_.size(); ++k) merged[k + static_cast<size_t>(offset_ - lo)] += counts_[k];
  for (size_t k = 0; k < other.counts_.size(); ++k) {
    merged[k + static_cast<size_t>(other.offset_ - lo)] += other.counts_[k];
  }
  counts_ = std::move(merged);
  offset_ = lo;
  if (static_cast<int64_t>(counts_.size()) > kMaxBuckets) {
    const size_t drop = counts_.size() - static_cast<size_t>(kMaxBuckets);
    int64_t folded = 0;
    for (size_t k = 0; k < drop; ++k) folded += counts_[k];
    counts_.erase(counts_.begin(), counts_.begin() + static_cast<std::ptrdiff_t>(drop));
    offset_ += static_cast<int64_t>(drop);
    counts_[0] += folded;
  }
}

double QuantileSketch::ValueAtRank(int64_t rank) const {
  if (count_ == 0) return 0;
  if (rank <= 0) return min_;
  if (rank >= count_ - 1) return max_;
  double value = 0;
  if (rank < zero_count_) {
    value = std::max(0.0, min_);
  } else {
    int64_t seen = zero_count_;
    for (size_t k = 0; k < counts_.size(); ++k) {
      seen += counts_[k];
      if (rank < seen) {
        value = Estimate(offset_ + static_cast<int64_t>(k));
        break;
      }
    }
  }
  return std::clamp(value, min_, max_);
}

double QuantileSketch::Quantile(double q) const {
  if (count_ == 0) return 0;
  const double pos = q * static_cast<double>(count_ - 1);
  const int64_t lo = static_cast<int64_t>(std::floor(pos));
  const int64_t hi = std::min(lo + 1, count_ - 1);
  const double a = ValueAtRank(lo), b = ValueAtRank(hi);
  return a + (b - a) * (pos - static_cast<double>(lo));
}

// ------------------------------------------------------- accumulator ----

void SortValues(std::vector<double>* values) {
  std::vector<double>& v = *values;
  const size_t n = v.size();
  if (n < 4096) {
    std::sort(v.begin(), v.end());
    return;
  }
  // Order-preserving keys: flip every bit of negatives, the sign bit of the
  // rest. Then stable passes of 11 bits (counts fit in L1), least
  // significant first; a pass whose digit is the same everywhere is
  // skipped. The keys' bits stay in `v` between passes (moved as bits,
  // never used as numbers), so one extra buffer is all the sort needs.
  auto bits = [](double d) { return absl::bit_cast<uint64_t>(d); };
  auto as_double = [](uint64_t u) { return absl::bit_cast<double>(u); };
  for (double& x : v) {
    const uint64_t u = bits(x);
    x = as_double((u >> 63) != 0 ? ~u : u | (uint64_t{1} << 63));
  }
  std::vector<uint64_t> tmp(n);
  bool in_v = true;  // where the keys are now
  constexpr int kBits = 11;
  constexpr uint64_t kMask = (uint64_t{1} << kBits) - 1;
  std::vector<size_t> count(size_t{1} << kBits);
  auto key = [&](size_t i) { return in_v ? bits(v[i]) : tmp[i]; };
  for (int shift = 0; shift < 64; shift += kBits) {
    std::fill(count.begin(), count.end(), 0);
    for (size_t i = 0; i < n; ++i) ++count[(key(i) >> shift) & kMask];
    if (count[(key(0) >> shift) & kMask] == n) continue;  // one digit: nothing moves
    size_t at = 0;
    for (size_t& c : count) {
      const size_t here = c;
      c = at;
      at += here;
    }
    if (in_v) {
      for (double x : v) {
        const uint64_t k = bits(x);
        tmp[count[(k >> shift) & kMask]++] = k;
      }
    } else {
      for (uint64_t k : tmp) v[count[(k >> shift) & kMask]++] = as_double(k);
    }
    in_v = !in_v;
  }
  for (size_t i = 0; i < n; ++i) {
    const uint64_t k = in_v ? bits(v[i]) : tmp[i];
    v[i] = as_double((k >> 63) != 0 ? k & ~(uint64_t{1} << 63) : ~k);
  }
}

Distribution Summarize(std::vector<double>& v) {
  SortValues(&v);
  return SummarizeSorted(v);
}

Distribution SummarizeSorted(const std::vector<double>& v) {
  Distribution d;
  d.count = static_cast<int64_t>(v.size());
  if (v.empty()) return d;
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

QuantileAccumulator::QuantileAccumulator(int64_t exact_max_samples)
    : exact_max_samples_(exact_max_samples) {}

const std::vector<double>& QuantileAccumulator::sorted_values() const {
  if (!sorted_valid_) {
    sorted_.assign(values_.begin(), values_.end());
    SortValues(&sorted_);
    sorted_valid_ = true;
  }
  return sorted_;
}

void QuantileAccumulator::Add(double value) {
  ++count_;
  if (sorted_valid_) {
    sorted_valid_ = false;
    std::vector<double>().swap(sorted_);
  }
  if (sketch_ == nullptr) {
    values_.push_back(value);
    if (static_cast<int64_t>(values_.size()) <= exact_max_samples_) return;
    sketch_ = std::make_unique<QuantileSketch>();
    for (double v : values_) {
      sketch_->Add(v);
      sum_ += v;
      max_ = std::max(max_, v);
    }
    std::deque<double>().swap(values_);
    return;
  }
  sketch_->Add(value);
  sum_ += value;
  max_ = std::max(max_, value);
}

Distribution QuantileAccumulator::ToDistribution() const {
  if (sketch_ == nullptr) return SummarizeSorted(sorted_values());
  Distribution d;
  d.exact = false;
  d.count = count_;
  d.mean = sum_ / static_cast<double>(count_);
  d.p50 = sketch_->Quantile(0.50);
  d.p90 = sketch_->Quantile(0.90);
  d.p99 = sketch_->Quantile(0.99);
  d.max = max_;
  return d;
}

// ------------------------------------------------------- time series ----

void TimeSeries::Add(const IterationRecord& it) {
  const Point p{it.start_s, it.duration_s, it.xpu_busy_s, it.device_busy_s,
                it.decode_tokens, it.batch_size, it.replica};
  if (fine_width_s_ == 0) {
    points_.push_back(p);
    if (static_cast<int64_t>(points_.size()) <= kExactIterations) return;
    // Too many to keep: fine bins wide enough for twice the time so far.
    double width = 1.0 / 1024;
    while (width * kFineBins <= 2 * p.start_s) width *= 2;
    fine_width_s_ = width;
    f_tokens_.assign(kFineBins, 0);
    f_batch_time_.assign(kFineBins, 0);
    f_batch_w_.assign(kFineBins, 0);
    f_xpu_.assign(kShownReplicas, std::vector<double>(kFineBins, 0));
    f_dev_.assign(kShownReplicas, std::vector<double>(kFineBins, 0));
    for (const Point& q : points_) AddFine(q);
    std::deque<Point>().swap(points_);
    return;
  }
  AddFine(p);
}

void TimeSeries::AddFine(const Point& p) {
  while (p.start_s >= fine_width_s_ * kFineBins) {
    // Double the width: bin j of the new series is bins 2j and 2j+1.
    auto halve = [](std::vector<double>& v) {
      for (int j = 0; j < kFineBins / 2; ++j) v[j] = v[2 * j] + v[2 * j + 1];
      std::fill(v.begin() + kFineBins / 2, v.end(), 0.0);
    };
    halve(f_tokens_);
    halve(f_batch_time_);
    halve(f_batch_w_);
    for (auto& v : f_xpu_) halve(v);
    for (auto& v : f_dev_) halve(v);
    fine_width_s_ *= 2;
  }
  const int b = BinOf(p.start_s, fine_width_s_, kFineBins);
  f_tokens_[b] += static_cast<double>(p.decode_tokens);
  f_batch_time_[b] += p.batch_size * p.duration_s;
  f_batch_w_[b] += p.duration_s;
  if (p.replica < kShownReplicas) {
    f_xpu_[p.replica][b] += p.xpu_busy_s;
    f_dev_[p.replica][b] += p.device_busy_s;
  }
}

TimeSeries::Binned TimeSeries::Bin(double span_s, int bins, int64_t replicas) const {
  Binned out;
  const double bw = span_s / bins;
  out.tokens.assign(bins, 0);
  out.batch_time.assign(bins, 0);
  out.batch_w.assign(bins, 0);
  out.xpu_busy.assign(replicas, std::vector<double>(bins, 0));
  out.dev_busy.assign(replicas, std::vector<double>(bins, 0));
  if (fine_width_s_ == 0) {
    // The arithmetic report.html always did, in the same order.
    for (const Point& p : points_) {
      const int b = BinOf(p.start_s, bw, bins);
      out.tokens[b] += static_cast<double>(p.decode_tokens);
      out.batch_time[b] += p.batch_size * p.duration_s;
      out.batch_w[b] += p.duration_s;
      if (p.replica < replicas) {
        out.xpu_busy[p.replica][b] += p.xpu_busy_s;
        out.dev_busy[p.replica][b] += p.device_busy_s;
      }
    }
    return out;
  }
  for (int j = 0; j < kFineBins; ++j) {
    const double mid = (j + 0.5) * fine_width_s_;
    const int b = BinOf(mid, bw, bins);
    out.tokens[b] += f_tokens_[j];
    out.batch_time[b] += f_batch_time_[j];
    out.batch_w[b] += f_batch_w_[j];
    for (int64_t r = 0; r < std::min<int64_t>(replicas, kShownReplicas); ++r) {
      out.xpu_busy[r][b] += f_xpu_[r][j];
      out.dev_busy[r][b] += f_dev_[r][j];
    }
  }
  return out;
}

// --------------------------------------------------------- collector ----

class MetricsCollector::ReplicaObserver : public scheduler::RequestObserver {
 public:
  ReplicaObserver(MetricsCollector* m, int replica) : m_(m), replica_(replica) {}
  void OnToken(const scheduler::RequestState& r, double now_s,
               double gap_s) override {
    RequestRecord& rec = m_->Live(r.spec.id);
    rec.replica = replica_;
    if (rec.first_token_s < 0) rec.first_token_s = now_s;
    if (gap_s >= 0) m_->tbt_.Add(gap_s);
  }
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
    rec.status = why == scheduler::RejectReason::kTooLong
                     ? RequestStatus::kRejectedTooLong
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
      ttft_(options.exact_percentile_max_samples),
      tbt_(options.exact_percentile_max_samples),
      tpot_(options.exact_percentile_max_samples),
      e2e_(options.exact_percentile_max_samples) {}

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
  ++buffered_;
  max_buffered_ = std::max(max_buffered_, buffered_);
  FlushIterations(false);
}

void MetricsCollector::MarkIdle(int replica, double now_s) {
  ReplicaIterations& r = replicas_[static_cast<size_t>(replica)];
  r.watermark_s = std::max(r.watermark_s, now_s);
  r.idle = true;
  FlushIterations(false);
}

void MetricsCollector::MarkDone(int replica) {
  ReplicaIterations& r = replicas_[static_cast<size_t>(replica)];
  r.watermark_s = std::numeric_limits<double>::infinity();
  r.idle = false;
  FlushIterations(false);
}

void MetricsCollector::FlushIterations(bool all) {
  const double floor = floor_ && !all ? floor_() : -std::numeric_limits<double>::infinity();
  const int n = static_cast<int>(replicas_.size());
  while (true) {
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
  if (options_.time_series) series_.Add(it);
  if (options_.sink != nullptr) options_.sink->OnIteration(it);
}

void MetricsCollector::Finish() {
  FlushIterations(true);
  RetireFinished(true);
  std::stable_sort(timeline_.begin(), timeline_.end(), [](const auto& a, const auto& b) {
    return a.start_s != b.start_s ? a.start_s < b.start_s : a.replica < b.replica;
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
  s.energy_j = it.energy_j;
  if (s.iterations > 0) s.batch_size_mean = it.batch_sum / static_cast<double>(s.iterations);
  s.device_busy_s = metrics.energy().device_busy_s;
  s.device_dram_bytes = metrics.energy().device_dram_bytes;
  if (it.busy_s > 0) s.kv_utilization_mean = it.kv_weighted / it.busy_s;
  if (s.output_tokens > 0) {
    s.energy_per_token_j = s.energy_j / static_cast<double>(s.output_tokens);
  }
  return s;
}

}  // namespace servesim::cluster
