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
//    default), over the sorted values.
//  - Batch size: mean and max over iterations of requests in the batch.
//  - KV utilisation: blocks used / capacity after each iteration's
//    scheduling; mean weighted by iteration duration, and max.
//  - Energy: device energy of every iteration (compute, device memory,
//    links); per token = energy / output tokens.
#ifndef SERVESIM_CLUSTER_METRICS_H_
#define SERVESIM_CLUSTER_METRICS_H_

#include <cstdint>
#include <memory>
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

class MetricsCollector {
 public:
  explicit MetricsCollector(const std::vector<scheduler::RequestSpec>& requests);
  ~MetricsCollector();

  // The observer an engine passes to its scheduler.
  scheduler::RequestObserver* ObserverFor(int replica);

  void AddIteration(const IterationRecord& it) { iterations_.push_back(it); }
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
  // Puts iterations and timeline samples in (start, replica) order. Engines
  // run ahead of one another between arrivals (see cluster/simulation.cc),
  // so the order they are added in is not the order they happened in.
  void SortByStart();
  void NoteEvent(double t_s) {
    if (t_s > last_event_s_) last_event_s_ = t_s;
  }

  const std::vector<RequestRecord>& requests() const { return requests_; }
  const std::vector<IterationRecord>& iterations() const { return iterations_; }
  const std::vector<double>& tbt_gaps() const { return gaps_; }
  double last_event_s() const { return last_event_s_; }

 private:
  class ReplicaObserver;
  std::vector<RequestRecord> requests_;
  std::vector<IterationRecord> iterations_;
  std::vector<TimelineIteration> timeline_;
  EnergyParts energy_;
  std::vector<double> gaps_;
  std::vector<std::unique_ptr<ReplicaObserver>> observers_;
  double last_event_s_ = 0;
};

struct Distribution {
  int64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};
// Sorts `values` in place.
Distribution Summarize(std::vector<double>& values);

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

Summary ComputeSummary(const MetricsCollector& metrics, double ttft_slo_s,
                       double tpot_slo_s, int64_t kv_capacity_blocks);

}  // namespace servesim::cluster

#endif  // SERVESIM_CLUSTER_METRICS_H_
