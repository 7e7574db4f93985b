// What a run measured, and the summary statistics users read.
//
// The collector is write-only from the simulation's side: engines report
// tokens, finishes, rejections and iterations; nothing here feeds back into
// a decision.
//
// Definitions (README "Metrics" repeats them):
//  - TTFT: first token time - arrival.
//  - TBT: every gap between two consecutive tokens of one request, pooled
//    over requests (a preempted request's stall is one long gap).
//  - TPOT: (E2E - TTFT) / (output_tokens - 1); undefined for 1-token
//    answers, which are left out of TPOT statistics.
//  - E2E: finish - arrival.
//  - SLO attainment: fraction of ALL arrived requests (rejected ones count as
//    misses) with TTFT <= slo.ttft_s and TPOT <= slo.tpot_s (1-token answers:
//    TTFT only). Goodput: those requests / makespan.
//  - Makespan: first arrival (0) to the last finish or rejection.
//  - Throughput: output tokens / makespan; requests/s: completed / makespan.
//  - Percentiles: linear interpolation between closest ranks (numpy's
//    default), over the sorted values, while a distribution has at most
//    output.exact_percentile_max_samples samples (default 8M); above, from
//    a log-bucket quantile sketch (DDSketch, Masson et al., VLDB 2019) whose
//    every estimate is within kSketchRelativeError (1e-4) of the exact
//    value; max stays exact, the mean is a running sum.
//  - Batch size: mean and max over iterations of requests in the batch.
//  - KV utilisation: blocks used / capacity after each iteration's
//    scheduling; mean weighted by iteration duration, and max.
//  - Energy: device energy of every iteration (compute, device memory,
//    links); per token = energy / output tokens.
//
// Memory is bounded by the requests in flight, not the run's length:
//  - a request's record lives from its arrival until it and every request
//    with a smaller id are final; then it goes to the RecordSink
//    (requests.csv, in id order) and into streaming sums;
//  - iterations go to the sink in (start, replica) order through a k-way
//    merge of per-replica buffers: engines run ahead of one another between
//    arrivals (cluster/simulation.cc), so a record waits until no replica
//    can still record an earlier one (bounded by that run-ahead);
//  - sums over requests and iterations are taken in those orders, the
//    orders the whole-run vectors were summed in, so they are bit-identical.
#ifndef SERVESIM_CLUSTER_METRICS_H_
#define SERVESIM_CLUSTER_METRICS_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "scheduler/batching.h"
#include "scheduler/planner.h"

namespace servesim::cluster {

enum class RequestStatus : uint8_t { kPending, kDone, kRejectedTooLong, kRejectedKv };

struct RequestRecord {
  int64_t id = 0;
  double arrival_s = 0;
  double first_token_s = -1;
  double finish_s = -1;
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  int32_t replica = -1;
  int32_t preemptions = 0;
  RequestStatus status = RequestStatus::kPending;
};

struct IterationRecord {
  int32_t replica = 0;
  double start_s = 0;
  double duration_s = 0;
  int32_t batch_size = 0;
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;
  int64_t kv_blocks_used = 0;
  double energy_j = 0;
  scheduler::BatchBound bound = scheduler::BatchBound::kNone;
  int64_t batch_cap = 0;  // SLO cap in force (0: none)
  double xpu_busy_s = 0, device_busy_s = 0;  // for report.html's utilisation
};

// Energy of the whole run by where it went, joules.
struct EnergyParts {
  double xpu_compute = 0, xpu_memory = 0, device_compute = 0, device_memory = 0, links = 0;
  // The attention device's work over the run (busy seconds, summed over
  // replicas; bytes read from its memory).
  double device_busy_s = 0, device_dram_bytes = 0;
};

// A sampled iteration's schedule for timeline.json.
struct TimelineIteration {
  int32_t replica = 0;
  int64_t index = 0;  // the replica's iteration number
  double start_s = 0, duration_s = 0;
  int32_t batch_size = 0;
  int64_t prefill_tokens = 0, decode_tokens = 0;
  std::vector<scheduler::Span> spans;  // times from start_s
};

// Relative error of the quantile sketch: every estimate v' of a value v
// has |v' - v| <= kSketchRelativeError * v.
inline constexpr double kSketchRelativeError = 1e-4;

// DDSketch-style quantile sketch of non-negative samples: bucket i counts
// the samples in (gamma^(i-1), gamma^i], gamma = (1 + a) / (1 - a), and
// answers with 2 gamma^i / (gamma + 1), within relative error a of any
// sample of the bucket. Samples below kMinPositive count as 0. At most
// kMaxBuckets buckets (8 MiB): beyond, the lowest collapse into one, which
// only loosens the smallest values' error. Mergeable.
class QuantileSketch {
 public:
  static constexpr double kMinPositive = 1e-12;
  static constexpr int64_t kMaxBuckets = int64_t{1} << 20;

  explicit QuantileSketch(double relative_error = kSketchRelativeError);
  void Add(double value);
  void Merge(const QuantileSketch& other);
  int64_t count() const { return count_; }
  // The estimate of the `rank`-th smallest sample (0-based), clamped to
  // the exact min and max.
  double ValueAtRank(int64_t rank) const;
  // Linear interpolation between closest ranks, as Summarize.
  double Quantile(double q) const;
  double relative_error() const { return relative_error_; }
  size_t num_buckets() const { return counts_.size(); }

 private:
  int64_t Index(double value) const;
  double Estimate(int64_t index) const;

  double relative_error_;
  double gamma_;
  double log_gamma_;
  int64_t count_ = 0;
  int64_t zero_count_ = 0;
  int64_t offset_ = 0;            // index of counts_[0]
  std::vector<int64_t> counts_;
  double min_ = 0, max_ = 0;
};

struct Distribution {
  int64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
  bool exact = true;  // false: percentiles from the sketch
};
// Sorts `values` in place.
Distribution Summarize(std::vector<double>& values);
// The same of values already sorted ascending.
Distribution SummarizeSorted(const std::vector<double>& sorted);
// Sorts ascending, as std::sort does (equal values are indistinguishable);
// large vectors by an LSD radix sort on the values' bits, O(n): a run's
// millions of TBT gaps sort in a few passes instead of n log n comparisons.
// NaNs are not expected (the simulator makes none).
void SortValues(std::vector<double>* values);

// One metric's samples: kept while there are at most `exact_max_samples`
// (percentiles exact, as Summarize), then folded into a QuantileSketch and
// dropped.
class QuantileAccumulator {
 public:
  explicit QuantileAccumulator(int64_t exact_max_samples);
  void Add(double value);
  Distribution ToDistribution() const;
  bool exact() const { return sketch_ == nullptr; }
  int64_t count() const { return count_; }
  // The samples (exact mode only), in the order added.
  const std::deque<double>& values() const { return values_; }
  // The same, sorted ascending: sorted on the first call after an Add and
  // kept, so the summary and the report sort millions of gaps once.
  const std::vector<double>& sorted_values() const;
  const QuantileSketch* sketch() const { return sketch_.get(); }

 private:
  int64_t exact_max_samples_;
  int64_t count_ = 0;
  std::deque<double> values_;  // chunked: no doubling spike as it grows
  mutable std::vector<double> sorted_;
  mutable bool sorted_valid_ = false;
  std::unique_ptr<QuantileSketch> sketch_;
  double sum_ = 0, max_ = 0;   // sketch mode
};

// What report.html plots over simulated time: per iteration, its decode
// tokens, batch-size x duration, duration and busy times, binned once the
// run's length is known. Exact (the iterations kept, 48 bytes each) while
// the run has at most kExactIterations iterations; beyond, added into
// kFineBins fixed-width bins whose width doubles as time goes on, and each
// fine bin goes to the output bin holding its midpoint.
class TimeSeries {
 public:
  static constexpr int64_t kExactIterations = int64_t{1} << 20;
  static constexpr int kFineBins = 8192;
  static constexpr int kShownReplicas = 4;  // report.html plots r0..r3

  void Add(const IterationRecord& it);
  struct Binned {
    std::vector<double> tokens, batch_time, batch_w;
    std::vector<std::vector<double>> xpu_busy, dev_busy;  // [replica][bin]
  };
  Binned Bin(double span_s, int bins, int64_t replicas) const;
  bool exact() const { return fine_width_s_ == 0; }

 private:
  struct Point {
    double start_s, duration_s, xpu_busy_s, device_busy_s;
    int64_t decode_tokens;
    int32_t batch_size, replica;
  };
  void AddFine(const Point& p);
  std::deque<Point> points_;
  double fine_width_s_ = 0;  // 0: exact
  std::vector<double> f_tokens_, f_batch_time_, f_batch_w_;
  std::vector<std::vector<double>> f_xpu_, f_dev_;
};

// Where rows go once final: requests in id order, iterations in (start_s,
// replica) order (requests.csv and iterations.csv, cluster/report.h).
class RecordSink {
 public:
  virtual ~RecordSink() = default;
  virtual void OnRequest(const RequestRecord& r) = 0;
  virtual void OnIteration(const IterationRecord& it) = 0;
};

struct MetricsOptions {
  int64_t exact_percentile_max_samples = 8'000'000;
  double ttft_slo_s = 0, tpot_slo_s = 0;  // SLO attainment
  int64_t kv_capacity_blocks = 0;         // KV utilisation
  int replicas = 1;
  bool time_series = false;    // keep report.html's series
  RecordSink* sink = nullptr;  // borrowed; may be null
};

class MetricsCollector {
 public:
  explicit MetricsCollector(const MetricsOptions& options);
  ~MetricsCollector();

  // A request leaves the clients; ids come in order 0, 1, 2, ...
  void OnArrival(const scheduler::RequestSpec& r);
  // The observer an engine passes to its scheduler.
  scheduler::RequestObserver* ObserverFor(int replica);

  void AddIteration(const IterationRecord& it);
  // Replica `replica` waits for work from `now_s`: its next iteration
  // starts no earlier than now_s nor than arrival_floor() (below).
  void MarkIdle(int replica, double now_s);
  // Replica `replica` records no more iterations.
  void MarkDone(int replica);
  // The earliest time a request not yet received by an engine can reach
  // one (the simulation's next arrival, or now while one is on its way).
  void SetArrivalFloor(std::function<double()> floor) { floor_ = std::move(floor); }
  // Ends the run: every buffered iteration and request (pending ones too)
  // goes out, and timeline samples are put in (start, replica) order.
  void Finish();

  void AddTimeline(TimelineIteration it) { timeline_.push_back(std::move(it)); }
  // `total`: the iteration's whole cost; `device`: the attention device's
  // part of it.
  void AddEnergy(const devices::Cost& total, const devices::Cost& device) {
    energy_.device_compute += device.compute_energy_pj * 1e-12;
    energy_.device_memory += device.dram_energy_pj * 1e-12;
    energy_.xpu_compute += (total.compute_energy_pj - device.compute_energy_pj) * 1e-12;
    energy_.xpu_memory += (total.dram_energy_pj - device.dram_energy_pj) * 1e-12;
    energy_.links += total.link_energy_pj * 1e-12;
    energy_.device_busy_s += device.time_s;
    energy_.device_dram_bytes += device.dram_bytes;
  }
  const EnergyParts& energy() const { return energy_; }
  const std::vector<TimelineIteration>& timeline() const { return timeline_; }
  void NoteEvent(double t_s) {
    if (t_s > last_event_s_) last_event_s_ = t_s;
  }
  double last_event_s() const { return last_event_s_; }
  const MetricsOptions& options() const { return options_; }

  // Streaming results (final after Finish).
  struct RequestTotals {
    int64_t requests = 0, completed = 0, rejected = 0;
    int64_t rejected_too_long = 0, rejected_kv_capacity = 0;
    int64_t preemptions = 0, input_tokens = 0, output_tokens = 0, slo_met = 0;
  };
  struct IterationTotals {
    int64_t iterations = 0, batch_size_max = 0, kv_blocks_max = 0;
    int64_t bound_iterations[5] = {0, 0, 0, 0, 0};
    double batch_sum = 0, busy_s = 0, kv_weighted = 0, energy_j = 0;
  };
  const RequestTotals& request_totals() const { return req_; }
  const IterationTotals& iteration_totals() const { return iter_; }
  const QuantileAccumulator& ttft() const { return ttft_; }
  const QuantileAccumulator& tbt() const { return tbt_; }
  const QuantileAccumulator& tpot() const { return tpot_; }
  const QuantileAccumulator& e2e() const { return e2e_; }
  const TimeSeries& time_series() const { return series_; }

  // Memory bounds, for tests: records and buffered iterations now, and the
  // most there ever were.
  int64_t live_requests() const { return static_cast<int64_t>(live_.size()); }
  int64_t buffered_iterations() const { return buffered_; }
  int64_t max_live_requests() const { return max_live_; }
  int64_t max_buffered_iterations() const { return max_buffered_; }

 private:
  class ReplicaObserver;
  struct ReplicaIterations {
    std::deque<IterationRecord> pending;
    double watermark_s = 0;  // no later record starts before it
    bool idle = false;
  };
  RequestRecord& Live(int64_t id);
  void RetireFinished(bool all);
  void Fold(const RequestRecord& r);
  void FlushIterations(bool all);
  void FoldIteration(const IterationRecord& it);

  MetricsOptions options_;
  std::deque<RequestRecord> live_;  // ids front_id_, front_id_ + 1, ...
  int64_t front_id_ = 0;
  std::vector<ReplicaIterations> replicas_;
  int64_t buffered_ = 0;
  int64_t max_live_ = 0, max_buffered_ = 0;
  std::function<double()> floor_;
  RequestTotals req_;
  IterationTotals iter_;
  QuantileAccumulator ttft_, tbt_, tpot_, e2e_;
  TimeSeries series_;
  std::vector<TimelineIteration> timeline_;
  EnergyParts energy_;
  std::vector<std::unique_ptr<ReplicaObserver>> observers_;
  double last_event_s_ = 0;
};

struct Summary {
  int64_t requests = 0, completed = 0, rejected = 0;
  int64_t rejected_too_long = 0, rejected_kv_capacity = 0;
  int64_t preemptions = 0, iterations = 0;
  int64_t input_tokens = 0, output_tokens = 0;
  double makespan_s = 0;
  double throughput_tokens_per_s = 0, throughput_requests_per_s = 0;
  Distribution ttft_s, tbt_s, tpot_s, e2e_s;
  double slo_ttft_s = 0, slo_tpot_s = 0;
  int64_t slo_met = 0;
  double slo_attainment = 0, goodput_requests_per_s = 0;
  double batch_size_mean = 0;
  int64_t batch_size_max = 0;
  double kv_utilization_mean = 0, kv_utilization_max = 0;
  double energy_j = 0, energy_per_token_j = 0;
  // Iterations by what limited admission (BatchBound order).
  int64_t bound_iterations[5] = {0, 0, 0, 0, 0};
  // The attention device, when there is one: its busy time and memory
  // reads over the run, and what it reports of itself at the end (e.g. the
  // pruning ratios it measured; wall-clock figures excluded).
  double device_busy_s = 0, device_dram_bytes = 0;
  std::vector<std::pair<std::string, double>> device_parameters;
};

// From the collector's streaming results (after Finish); the SLOs and KV
// capacity are the MetricsOptions'.
Summary ComputeSummary(const MetricsCollector& metrics);

}  // namespace servesim::cluster

#endif  // SERVESIM_CLUSTER_METRICS_H_
