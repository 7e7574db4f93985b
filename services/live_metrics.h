// Live Prometheus metrics of a running simulation (prometheus-cpp), served
// with the dashboard by services/http_server.h. Names follow Prometheus'
// conventions: base units, `_seconds`, `_bytes`, `_joules`, `_total` for
// counters; labels `replica`, `device` (xpu, or the attention device's
// kind) and `kind` (the device kind). dashboards/README.md lists them.
//
// The simulation only writes here (metrics/live_sink.h); its results never read
// these metrics. Readers (the HTTP thread) go through prometheus-cpp's own
// synchronisation.
#ifndef SERVESIM_SERVICES_LIVE_METRICS_H_
#define SERVESIM_SERVICES_LIVE_METRICS_H_

#include <memory>
#include <string>
#include <vector>

#include "metrics/live_sink.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace servesim::services {

struct LiveMetricsConfig {
  std::string scenario;          // run_info label
  int replicas = 1;
  std::string xpu_kind = "gpu";  // device kind of the xPUs
  std::string device_kind;       // attention device kind; empty: none
  double trace_s = 0;            // arrival time of the last request
};

class LiveMetrics : public metrics::LiveSink {
 public:
  explicit LiveMetrics(const LiveMetricsConfig& config);

  // The Prometheus text exposition of every metric (thread-safe).
  std::string Render() const;

  void OnArrival(int replica) override;
  void OnFirstToken(int replica, double ttft_s) override;
  void OnToken(int replica, double gap_s) override;
  void OnFinish(int replica, double e2e_s) override;
  void OnReject(int replica, scheduler::RejectReason why) override;
  void OnIteration(const metrics::LiveIteration& it) override;
  void OnKvTransfer(int replica, double bytes, double exposed_s) override;
  void OnLinks(const std::vector<std::pair<std::string, double>> &links) override;
  void OnLinkBytes(int link, double bytes) override;
  void OnClock(double simulated_s, double wall_s) override;
  void OnDone(double simulated_s, double wall_s) override;

 private:
  struct Replica {
    prometheus::Counter *arrived, *finished, *rejected_too_long, *rejected_kv, *rejected_late,
        *preempted, *tokens, *iterations;
    prometheus::Gauge *queue, *batch, *kv_used, *kv_total;
    prometheus::Gauge *xpu_power = nullptr, *dev_power = nullptr, *host_power = nullptr;
    prometheus::Histogram *ttft, *tbt, *e2e;
    prometheus::Counter *xpu_busy, *dev_busy, *xpu_energy, *dev_energy;
    prometheus::Counter *xpu_dram, *xpu_link, *dev_dram, *dev_bg, *dev_tsv, *dev_ext;
    prometheus::Counter *prefix_hit, *prefix_query;
    prometheus::Counter *kv_bytes;
    prometheus::Histogram *kv_transfer;
    int64_t preemptions_seen = 0, prefix_hit_seen = 0, prefix_query_seen = 0;
    // Per KV tier, made at the replica's first iteration that names it.
    prometheus::Counter *tier_hit[scheduler::kMaxKvTiers] = {};
    int64_t tier_hit_seen[scheduler::kMaxKvTiers] = {};
  };
  std::shared_ptr<prometheus::Registry> registry_;
  std::vector<Replica> replicas_;
  prometheus::Family<prometheus::Counter> *tier_hit_ = nullptr;
  std::vector<prometheus::Counter *> link_bytes_;  // OnLinks' order
  prometheus::Gauge *simulated_, *rtf_, *trace_, *done_;
};

}  // namespace servesim::services

#endif  // SERVESIM_SERVICES_LIVE_METRICS_H_
