// What a run records, one row at a time: requests (requests.csv), replica
// iterations (iterations.csv), the energy split, the sampled iteration
// schedules (timeline.json), and the sink rows go to once final.
#ifndef SERVESIM_METRICS_RECORDS_H_
#define SERVESIM_METRICS_RECORDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "scheduler/batching.h"
#include "scheduler/planner.h"

namespace servesim::metrics {

enum class RequestStatus : uint8_t {
  kPending,
  kDone,
  kRejectedTooLong,
  kRejectedKv,
  kRejectedLate
};

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
  // Disaggregated clusters: the prefill replica, when its prefill ended
  // (the KV left), and when the whole KV reached the decode replica.
  int32_t prefill_replica = -1;
  double prefill_end_s = -1;
  double kv_ready_s = -1;
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
  int64_t waiting = 0;    // requests still waiting after scheduling
  double xpu_busy_s = 0, device_busy_s = 0;  // for report.html's utilisation
  double static_w = 0;  // the replica's static power (docs/energy.md); not in the CSV
};

// Energy of the whole run by where it went, joules.
struct EnergyParts {
  double xpu_compute = 0, xpu_memory = 0, device_compute = 0, device_memory = 0, links = 0;
  double xpu_active = 0;  // cluster.xpu.active_power_w over the xPUs' busy time
  // Static power over the run (docs/energy.md): the xPUs' idle power, the
  // attention device's static power, the hosts' share.
  double xpu_idle = 0, device_static = 0, host = 0;
  double static_total() const { return xpu_idle + device_static + host; }
  // The attention device's work over the run (busy seconds, summed over
  // replicas; bytes read from its memory).
  double device_busy_s = 0, device_dram_bytes = 0;
};

// A link of the platform and what crossed it over the run.
struct LinkLoad {
  std::string name;
  double bandwidth_bytes_per_s = 0;  // per direction
  double bytes = 0;                  // both directions
  // A split-duplex link (a rack or pod uplink) has each direction's
  // bandwidth to itself, up (0) and down (1); a NIC link is one shared pipe
  // (direction 0 only).
  bool split_duplex = false;
  // Bytes per bin of `bin_s` simulated seconds, per direction, of the
  // transfers that ended: each one's bytes spread evenly over its life
  // (from leaving the sender to landing), so a bin holds what crossed the
  // link in it at the transfer's mean rate.
  std::vector<double> bins[2];
  double direction_bytes[2] = {0, 0};

  void AddFlow(int direction, double flow_bytes, double start_s, double end_s, double bin_s);
  // The busier direction's bytes over `seconds` at the link's bandwidth.
  double Utilization(double seconds) const;
};

// A lower KV tier over the run (docs/kv_tiers.md), summed over replicas.
struct KvTierTotals {
  std::string name;             // "host_dram", "cxl", "ssd"
  int64_t capacity_blocks = 0;  // summed over the replicas' caches
  int64_t hit_tokens = 0;       // prompt tokens loaded from it instead of computed
  int64_t loaded_blocks = 0, stored_blocks = 0, dropped_blocks = 0;
  double loaded_bytes = 0, stored_bytes = 0;  // the whole replicas' (every xPU's shard)
  double energy_j = 0;                        // of loads and stores over its link
  // A cluster store's loads over the network (cluster::FabricFlows::StoreFlows):
  // the bytes that crossed it (blocks from other replicas' nodes), the
  // steps whose loads did, and the time those steps lost to shared links.
  bool cluster_store = false;
  double network_bytes = 0, contention_s = 0;
  int64_t network_steps = 0;
};

// A sampled iteration's schedule for timeline.json.
struct TimelineIteration {
  int32_t replica = 0;
  int64_t index = 0;  // the replica's iteration number
  double start_s = 0, duration_s = 0;
  int32_t batch_size = 0;
  int64_t prefill_tokens = 0, decode_tokens = 0;
  double power_w = 0;                  // the replica's mean power over the iteration
  std::vector<scheduler::Span> spans;  // times from start_s
};
// The first layers of a sampled iteration that report.html's schedule
// draws span by span; the simulation folds the later ones past
// output.timeline_layers (IterationPlanner::Plan's fold_from_layer).
inline constexpr int32_t kScheduleLayers = 2;

// A request's KV on its way from a prefill to a decode replica
// (timeline.json, disaggregated clusters): from its first part leaving to
// its last landing.
struct TimelineTransfer {
  int64_t request_id = 0;
  int32_t from = 0, to = 0;  // prefill and decode replicas
  double start_s = 0, end_s = 0;
  double bytes = 0;
};

// Where rows go once final: requests in id order, iterations in (start_s,
// replica) order (requests.csv and iterations.csv, reports/csv_writer.h).
class RecordSink {
 public:
  virtual ~RecordSink() = default;
  virtual void OnRequest(const RequestRecord& r) = 0;
  virtual void OnIteration(const IterationRecord& it) = 0;
};

}  // namespace servesim::metrics

#endif  // SERVESIM_METRICS_RECORDS_H_
