// What a run measured, and the summary statistics users read.
//
// The collector is write-only from the simulation's side: engines report
// tokens, finishes, rejections and iterations; nothing here feeds back into
// a decision.
//
// Definitions (the README's "Metrics" section repeats them):
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
//    default) while exact; above output.exact_percentile_max_samples
//    stored runs of equal consecutive samples, from a quantile sketch
//    within 1e-4 (metrics/quantiles.h).
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
//    merge of per-replica buffers: engines advance apart from one another
//    between arrivals (cluster/engine.h), so a record waits until no
//    replica can still record an earlier one (bounded by how far apart);
//  - sums over requests and iterations are taken in those orders, the
//    orders the whole-run vectors were summed in, so they are bit-identical.
#ifndef SERVESIM_METRICS_COLLECTOR_H_
#define SERVESIM_METRICS_COLLECTOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "devices/ops.h"
#include "metrics/key_heap.h"
#include "metrics/quantiles.h"
#include "metrics/records.h"
#include "metrics/time_series.h"
#include "scheduler/batching.h"
#include "scheduler/planner.h"

namespace servesim::metrics {

struct MetricsOptions {
  int64_t exact_percentile_max_samples = 4'000'000;
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
  // goes out, timeline samples are put in (start, replica) order and
  // transfers in (start, decode replica, request) order.
  void Finish();

  void AddTimeline(TimelineIteration it) { timeline_.push_back(std::move(it)); }
  void AddTimelineTransfer(const TimelineTransfer& t) { transfers_.push_back(t); }
  // `total`: the iteration's whole cost; `device`: the attention device's
  // part of it; `xpu_active_j`: the xPUs' active power over their busy time.
  void AddEnergy(const devices::Cost& total, const devices::Cost& device, double xpu_active_j) {
    energy_.xpu_active += xpu_active_j;
    energy_.device_compute += device.compute_energy_pj * 1e-12;
    energy_.device_memory += device.dram_energy_pj * 1e-12;
    energy_.xpu_compute += (total.compute_energy_pj - device.compute_energy_pj) * 1e-12;
    energy_.xpu_memory += (total.dram_energy_pj - device.dram_energy_pj) * 1e-12;
    energy_.links += total.link_energy_pj * 1e-12;
    energy_.device_busy_s += device.time_s;
    energy_.device_dram_bytes += device.dram_bytes;
  }
  const EnergyParts& energy() const { return energy_; }
  // Disaggregation: request `id`'s prefill ended on `prefill_replica` at
  // `t_s` and its KV (`bytes`) left for the decode pool; the whole KV
  // reached the decode replica at `t_s` (OnKvReady).
  void OnHandoff(int64_t id, int prefill_replica, double t_s, double bytes) {
    RequestRecord& rec = Live(id);
    rec.prefill_replica = prefill_replica;
    rec.prefill_end_s = t_s;
    ++handoffs_;
    kv_bytes_ += bytes;
  }
  void OnKvReady(int64_t id, double t_s) { Live(id).kv_ready_s = t_s; }
  // Energy of KV moved between the pools (the NICs' per-byte energy), J;
  // in the run's energy and its links part.
  void AddTransferEnergy(double j) {
    transfer_energy_j_ += j;
    energy_.links += j;
  }
  double transfer_energy_j() const { return transfer_energy_j_; }
  // A replica's static energy over the run, J (its xPUs' idle power, its
  // attention device's static power, its host share), and the iterations
  // the xPU power cap slowed; added once per replica as the run ends.
  void AddStaticEnergy(double xpu_j, double device_j, double host_j, int64_t capped,
                       int64_t tdp_limited) {
    energy_.xpu_idle += xpu_j;
    energy_.device_static += device_j;
    energy_.host += host_j;
    power_capped_ += capped;
    tdp_limited_ += tdp_limited;
  }
  int64_t power_capped_iterations() const { return power_capped_; }
  int64_t tdp_limited_iterations() const { return tdp_limited_; }
  int64_t handoffs() const { return handoffs_; }
  // Collectives on the fabric (cluster::FabricFlows::Collectives): a step's
  // bytes out of its nodes' NICs, whether they went as a flow (shared the
  // link), and the time the step lost to the sharing.
  void AddCollectives(double bytes, bool flow, double extra_s) {
    collective_bytes_ += bytes;
    collective_flows_ += flow ? 1 : 0;
    collective_extra_s_ += extra_s;
  }
  // A cluster store's loads over the network (cluster::FabricFlows::StoreFlows):
  // a step's bytes from other replicas' nodes and the time it lost.
  void AddStoreFlows(double bytes, double extra_s) {
    store_network_bytes_ += bytes;
    store_contention_s_ += extra_s;
    ++store_network_steps_;
  }
  double collective_bytes() const { return collective_bytes_; }
  int64_t collective_flows() const { return collective_flows_; }
  double collective_extra_s() const { return collective_extra_s_; }
  double kv_bytes() const { return kv_bytes_; }
  // The platform's links and their traffic, set at the end of the run.
  // The platform's links and their traffic, binned every `bin_s`.
  void SetLinkLoads(std::vector<LinkLoad> links, double bin_s) {
    links_ = std::move(links);
    link_bin_s_ = bin_s;
  }
  double link_bin_s() const { return link_bin_s_; }
  const std::vector<LinkLoad>& link_loads() const { return links_; }
  // TTFT's parts over completed requests that were handed off: arrival to
  // prefill end, prefill end to KV ready (the transfer not hidden behind
  // the prefill), KV ready to the first token (decode queue and step).
  const QuantileAccumulator& ttft_prefill() const { return ttft_prefill_; }
  const QuantileAccumulator& ttft_transfer() const { return ttft_transfer_; }
  const QuantileAccumulator& ttft_decode() const { return ttft_decode_; }
  double ttft_transfer_sum_s() const { return ttft_transfer_sum_; }
  double ttft_handed_off_sum_s() const { return ttft_handed_off_sum_; }

  // One scheduler's lower KV tier (docs/kv_tiers.md), added as its
  // replica ends: totals per tier name; the traffic's energy counts as
  // link energy.
  void AddKvTier(const scheduler::KvTierConfig& config, const scheduler::KvTierStats& stats,
                 int64_t hit_tokens) {
    KvTierTotals* t = nullptr;
    for (KvTierTotals& x : kv_tiers_) {
      if (x.name == config.name) t = &x;
    }
    if (t == nullptr) {
      kv_tiers_.push_back(KvTierTotals{});
      t = &kv_tiers_.back();
      t->name = config.name;
      t->cluster_store = config.cluster_store;
    }
    t->capacity_blocks += config.capacity_blocks;
    t->hit_tokens += hit_tokens;
    t->loaded_blocks += stats.loaded;
    t->stored_blocks += stats.stored;
    t->dropped_blocks += stats.dropped;
    t->loaded_bytes += static_cast<double>(stats.loaded) * config.bytes_per_block;
    t->stored_bytes += static_cast<double>(stats.stored) * config.bytes_per_block;
    const double j =
        static_cast<double>(stats.loaded + stats.stored) * config.energy_pj_per_block * 1e-12;
    t->energy_j += j;
    kv_tier_energy_j_ += j;
    energy_.links += j;
  }
  // The tiers, a cluster store's with its network traffic.
  std::vector<KvTierTotals> kv_tiers() const {
    std::vector<KvTierTotals> tiers = kv_tiers_;
    for (KvTierTotals& t : tiers) {
      if (!t.cluster_store) continue;
      t.network_bytes = store_network_bytes_;
      t.contention_s = store_contention_s_;
      t.network_steps = store_network_steps_;
    }
    return tiers;
  }
  double kv_tier_energy_j() const { return kv_tier_energy_j_; }
  // A replica's prefix-cache totals, added as it ends; `pool` 0 for a
  // prefill replica, 1 for a decode replica, -1 when colocated; `tiered`
  // when its cache has lower tiers (their hit rates count only the prompts
  // such replicas admitted: a disaggregated cluster may tier one pool).
  void AddPrefixCache(int64_t hit_tokens, int64_t query_tokens, int pool = -1,
                      bool tiered = false) {
    prefix_hit_tokens_ += hit_tokens;
    prefix_query_tokens_ += query_tokens;
    if (tiered) {
      tiered_hit_tokens_ += hit_tokens;
      tiered_query_tokens_ += query_tokens;
    }
    if (pool >= 0) {
      pool_prefix_hit_tokens_[pool] += hit_tokens;
      pool_prefix_query_tokens_[pool] += query_tokens;
    }
  }
  int64_t prefix_hit_tokens() const { return prefix_hit_tokens_; }
  int64_t prefix_query_tokens() const { return prefix_query_tokens_; }
  int64_t tiered_hit_tokens() const { return tiered_hit_tokens_; }
  int64_t tiered_query_tokens() const { return tiered_query_tokens_; }
  int64_t pool_prefix_hit_tokens(int pool) const { return pool_prefix_hit_tokens_[pool]; }
  int64_t pool_prefix_query_tokens(int pool) const { return pool_prefix_query_tokens_[pool]; }
  const std::vector<TimelineIteration>& timeline() const { return timeline_; }
  const std::vector<TimelineTransfer>& timeline_transfers() const { return transfers_; }
  void NoteEvent(double t_s) {
    if (t_s > last_event_s_) last_event_s_ = t_s;
  }
  double last_event_s() const { return last_event_s_; }
  const MetricsOptions& options() const { return options_; }

  // Streaming results (final after Finish).
  struct RequestTotals {
    int64_t requests = 0, completed = 0, rejected = 0;
    int64_t rejected_too_long = 0, rejected_kv_capacity = 0, rejected_late = 0;
    int64_t preemptions = 0, input_tokens = 0, output_tokens = 0, slo_met = 0;
  };
  struct IterationTotals {
    int64_t iterations = 0, batch_size_max = 0, kv_blocks_max = 0;
    int64_t bound_iterations[5] = {0, 0, 0, 0, 0};
    double batch_sum = 0, busy_s = 0, kv_weighted = 0, energy_j = 0;
    // The most a replica drew over one iteration (static + dynamic), W.
    double power_peak_w = 0;
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
  void Requeue(int replica);

  MetricsOptions options_;
  std::deque<RequestRecord> live_;  // ids front_id_, front_id_ + 1, ...
  int64_t front_id_ = 0;
  std::vector<ReplicaIterations> replicas_;
  // The merge's order (FlushIterations): replicas with iterations buffered
  // keyed by their first one's start, and replicas with none and not idle
  // by their watermark, in one heap; idle replicas with none by their
  // watermark (the floor lifts it) in another.
  KeyHeap order_, idle_;
  int64_t buffered_ = 0;
  int64_t max_live_ = 0, max_buffered_ = 0;
  std::function<double()> floor_;
  RequestTotals req_;
  IterationTotals iter_;
  QuantileAccumulator ttft_, tbt_, tpot_, e2e_;
  TimeSeries series_;
  std::vector<TimelineIteration> timeline_;
  std::vector<TimelineTransfer> transfers_;
  EnergyParts energy_;
  std::vector<std::unique_ptr<ReplicaObserver>> observers_;
  double last_event_s_ = 0;
  int64_t prefix_hit_tokens_ = 0, prefix_query_tokens_ = 0;
  int64_t tiered_hit_tokens_ = 0, tiered_query_tokens_ = 0;
  int64_t pool_prefix_hit_tokens_[2] = {0, 0}, pool_prefix_query_tokens_[2] = {0, 0};
  int64_t handoffs_ = 0;
  double collective_bytes_ = 0, collective_extra_s_ = 0;
  int64_t collective_flows_ = 0;
  double store_network_bytes_ = 0, store_contention_s_ = 0;
  int64_t store_network_steps_ = 0;
  double kv_bytes_ = 0, transfer_energy_j_ = 0;
  std::vector<KvTierTotals> kv_tiers_;
  double kv_tier_energy_j_ = 0;
  int64_t power_capped_ = 0;
  int64_t tdp_limited_ = 0;
  std::vector<LinkLoad> links_;
  double link_bin_s_ = 1.0;
  QuantileAccumulator ttft_prefill_, ttft_transfer_, ttft_decode_;
  double ttft_transfer_sum_ = 0, ttft_handed_off_sum_ = 0;
};

struct Summary {
  int64_t requests = 0, completed = 0, rejected = 0;
  int64_t rejected_too_long = 0, rejected_kv_capacity = 0, rejected_late = 0;
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
  // Energy: static (the replicas' idle and background power over the run)
  // plus dynamic (the ops' and the KV transfers'); by part; per output
  // token, per completed request and per request that met the SLO. Mean
  // power over the makespan; the most one replica drew over an iteration;
  // iterations the xPU power cap slowed (docs/energy.md).
  double energy_j = 0, energy_per_token_j = 0;
  double energy_static_j = 0, energy_dynamic_j = 0;
  EnergyParts energy_parts;
  double energy_per_request_j = 0, energy_per_good_request_j = 0;
  double power_mean_w = 0, power_peak_replica_w = 0;
  int64_t power_capped_iterations = 0;
  // Iterations whose xPUs drew their TDP (the board's power limit): the
  // energy above it was not drawn.
  int64_t tdp_limited_iterations = 0;
  // Iterations by what limited admission (BatchBound order).
  int64_t bound_iterations[5] = {0, 0, 0, 0, 0};
  // The attention device, when there is one: its busy time and memory
  // reads over the run, and what it reports of itself at the end (e.g. the
  // pruning ratios it measured; wall-clock figures excluded).
  double device_busy_s = 0, device_dram_bytes = 0;
  std::vector<std::pair<std::string, double>> device_parameters;
  // Prefix caching: prompt tokens admissions found cached, and prompt
  // tokens admitted (hit rate = hit / query); both 0 without caching.
  int64_t prefix_hit_tokens = 0, prefix_query_tokens = 0;
  // The same per pool of a disaggregated cluster (prefill, decode).
  int64_t pool_prefix_hit_tokens[2] = {0, 0}, pool_prefix_query_tokens[2] = {0, 0};
  // Lower KV tiers, in the scenario's order (empty without), and the
  // prefix-cache totals of the replicas that have them (their hit rates'
  // denominator; the whole cluster's unless one pool alone is tiered).
  std::vector<KvTierTotals> kv_tiers;
  int64_t tiered_hit_tokens = 0, tiered_query_tokens = 0;
  // Disaggregation (handoffs > 0): requests handed from the prefill pool
  // to the decode pool, the KV bytes moved, TTFT's parts over completed
  // requests (MetricsCollector::ttft_prefill() and after), the transfer's
  // share of their summed TTFT, and each link's utilisation (a NIC link
  // is one pipe both ways share; a split-duplex uplink reads its busier
  // direction, each having the bandwidth to itself).
  int64_t handoffs = 0;
  double kv_bytes = 0;
  // Collectives on the fabric (docs/disaggregation.md): bytes out of the
  // nodes' NICs, steps whose bytes shared a link as a flow, and the time
  // those steps lost to the sharing (summed over replicas).
  double collective_bytes = 0, collective_extra_s = 0;
  int64_t collective_flows = 0;
  Distribution ttft_prefill_s, ttft_transfer_s, ttft_decode_s;
  double ttft_transfer_share = 0;
  struct LinkUse {
    std::string name;
    // Bytes both ways; utilisation of the busier direction over the
    // makespan and in its busiest bin (output.link_bin_s).
    double bytes = 0, utilization = 0, peak_utilization = 0;
  };
  std::vector<LinkUse> links;
};

// From the collector's streaming results (after Finish); the SLOs and KV
// capacity are the MetricsOptions'.
Summary ComputeSummary(const MetricsCollector& metrics);

}  // namespace servesim::metrics

#endif  // SERVESIM_METRICS_COLLECTOR_H_
