// What a running simulation tells the outside world while it runs: live
// metrics, a progress bar. Write-only: nothing a sink does can reach back
// into the simulation, so results never depend on whether one is attached.
//
// Calls come from the simulation's thread (SimGrid runs actors one at a
// time); a sink that is read from other threads synchronises itself.
#ifndef SERVESIM_METRICS_LIVE_SINK_H_
#define SERVESIM_METRICS_LIVE_SINK_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "devices/ops.h"
#include "scheduler/batching.h"

namespace servesim::metrics {

// One iteration of one replica, as applied.
struct LiveIteration {
  int replica = 0;
  double start_s = 0, duration_s = 0;
  int64_t batch_size = 0;
  int64_t queue_length = 0;  // waiting requests after scheduling
  int64_t kv_blocks_used = 0, kv_blocks_total = 0;
  int64_t preemptions_total = 0;  // replica's running total
  // Prefix caching: prompt tokens found cached, and prompt tokens of the
  // admitted requests, replica's running totals (0 when off).
  int64_t prefix_hit_tokens_total = 0, prefix_query_tokens_total = 0;
  // KV tiers (docs/kv_tiers.md): the replica's tiers' names, and the
  // prompt tokens loaded from each, running totals.
  int num_kv_tiers = 0;
  std::string_view kv_tier_names[scheduler::kMaxKvTiers];
  int64_t kv_tier_hit_tokens_total[scheduler::kMaxKvTiers] = {0, 0, 0, 0};
  // Busy time of the xPUs (one of the tensor-parallel group) and of the
  // attention device, and what each moved and spent, whole iteration.
  double xpu_busy_s = 0, device_busy_s = 0;
  devices::Cost xpu, device;  // device: zero without an attention device
  // Static power of the replica's xPUs, attention device and host share, W.
  double xpu_static_w = 0, device_static_w = 0, host_w = 0;
  double xpu_active_j = 0;  // the xPUs' active power over their busy time, J
};

class LiveSink {
 public:
  virtual ~LiveSink() = default;
  virtual void OnArrival(int replica) = 0;
  virtual void OnFirstToken(int replica, double ttft_s) = 0;
  virtual void OnToken(int replica, double gap_s) = 0;  // later tokens: TBT gap
  virtual void OnFinish(int replica, double e2e_s) = 0;
  virtual void OnReject(int replica, scheduler::RejectReason why) = 0;
  virtual void OnIteration(const LiveIteration& it) = 0;
  // Disaggregation: a request's whole KV (`bytes`) reached decode replica
  // `replica`, `exposed_s` after its prefill ended.
  virtual void OnKvTransfer(int replica, double bytes, double exposed_s) {
    (void)replica, (void)bytes, (void)exposed_s;
  }
  // Disaggregation: the platform's links as links.csv names them (a
  // split-duplex uplink as its ".up" and ".down" directions) with their
  // bandwidth per direction, once before the run; then, as each KV
  // transfer lands, the bytes it carried over each link of its route
  // (`link` indexes that list).
  virtual void OnLinks(const std::vector<std::pair<std::string, double>>& links) { (void)links; }
  virtual void OnLinkBytes(int link, double bytes) { (void)link, (void)bytes; }
  // Simulated time advanced to `simulated_s`; `wall_s` since the start.
  virtual void OnClock(double simulated_s, double wall_s) = 0;
  virtual void OnDone(double simulated_s, double wall_s) = 0;
};

}  // namespace servesim::metrics

#endif  // SERVESIM_METRICS_LIVE_SINK_H_
