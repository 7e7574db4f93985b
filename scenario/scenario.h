// Scenario files: parse -> override -> normalise -> validate -> resolve
// (Triton's model-config pipeline). load.cc parses and applies overrides,
// normalize.cc fills presets and defaults, resolve.cc checks and derives.
//
//  - Load: protobuf text format; syntax errors and unknown fields are
//    errors naming file:line:column. The parser records where each field
//    was written, so later errors name the line too.
//  - ApplyOverride: `field.path=value` for any scalar, enum (by value name,
//    with or without its type prefix) or string field; setting a field
//    inside a oneof selects that oneof member.
//  - Normalize: fills presets (model, xPU, links) and documented defaults,
//    so the resolved scenario shows every value the run uses.
//  - Resolve: checks every value against its allowed range and the
//    configuration as a whole (weights must fit the replica's memory, say
//    required against available bytes), then derives what the run needs.
// Every error is INVALID_ARGUMENT (NOT_FOUND for a missing file or preset)
// and reads `<file>:<line>: <field.path> = <value>: <problem>; <allowed>`.
#ifndef SERVESIM_SCENARIO_SCENARIO_H_
#define SERVESIM_SCENARIO_SCENARIO_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agents/client_options.h"
#include "devices/gpu/profile.h"
#include "devices/model.h"
#include "google/protobuf/text_format.h"
#include "scheduler/batching.h"
#include "scheduler/kv_cache.h"
#include "scheduler/pipeline.h"
#include "scheduler/planner.h"
#include "scheduler/router.h"
#include "servesim/v1/hardware.pb.h"
#include "servesim/v1/scenario.pb.h"

namespace servesim::agents {
class RemoteDevice;
}  // namespace servesim::agents

namespace servesim::scenario {

struct LoadedScenario {
  servesim::v1::Scenario proto;
  std::string path;      // as given
  std::string base_dir;  // folder of `path`, for relative trace paths
  std::shared_ptr<google::protobuf::TextFormat::ParseInfoTree> locations;
  std::set<std::string> overridden;  // paths set by --set
  // A disaggregated cluster's pool, normalised and resolved as a scenario
  // of its own: "cluster.disaggregation.prefill" or "...decode"; Where()
  // then names a cluster.* or scheduler.* field where the pool sets it.
  std::string pool_path;
  // servesim run --agent KIND=HOST:PORT,...: endpoints by device kind; they
  // replace the scenario's xpu_endpoints / attention_endpoints for devices
  // of that kind. How to reach the agents (TLS, token, deadline).
  std::map<std::string, std::vector<std::string>> agent_endpoints;
  agents::ClientOptions agent_client;

  // "file:line" of `field_path` (or of its nearest written ancestor;
  // "file (--set)" for overridden fields; "file" if never written).
  std::string Where(absl::string_view field_path) const;
  // Whether the file writes `field_path` (or, for a message, any of it),
  // or --set does (the proto, once normalised, has every default filled
  // in).
  bool Written(absl::string_view field_path) const;
};

// A scenario is a few kilobytes of text; a file past this cap (or a device,
// a pipe, a folder) is refused before it is read (common/read_text.h).
inline constexpr int64_t kMaxScenarioBytes = int64_t{16} << 20;

absl::StatusOr<LoadedScenario> LoadScenarioFile(const std::string& path);
absl::StatusOr<LoadedScenario> ParseScenarioText(const std::string& text,
                                                 const std::string& path);

absl::Status ApplyOverride(LoadedScenario* scenario,
                           absl::string_view assignment);

absl::Status Normalize(LoadedScenario* scenario);

// Errors raised after parsing (e.g. by LoadWorkload) name the field path
// first: "workload.poisson.rate_rps = 0; expected > 0". This prefixes such
// a message with the field's "file:line: " so every scenario error reads
// the same way. Other statuses pass through unchanged.
absl::Status AnnotateFieldError(const LoadedScenario& scenario,
                                const absl::Status& status);

// Everything a run needs, derived from a normalised scenario.
struct ResolvedScenario {
  servesim::v1::Scenario proto;  // normalised
  std::string base_dir;
  devices::ModelDims model;
  servesim::v1::DeviceSpec xpu_device;  // gpu spec for the replica's xPUs
  // The xPU's measured profile bundle (cluster.profile); null: the roofline.
  std::shared_ptr<const devices::GpuProfile> profile;
  // What the run fell back to where the scenario asked for more (a profile
  // bundle that is not there, a knob a replayed run did not record): for
  // run_info.json and a warning on stderr.
  std::vector<std::string> fallbacks;
  int64_t replicas = 1;
  int64_t tensor_parallel = 1;
  // MoE models: data-parallel ranks per replica, stepping in lockstep
  // (cluster.data_parallel); each rank is a TP group with its own batch
  // and KV cache of `kv`.
  int64_t data_parallel = 1;
  // Pipeline stages (cluster.pipeline_parallel), and as many in-flight
  // batches, each with its own scheduler and a 1/S share of `kv`; the
  // stage split in `pipeline`.
  int64_t pipeline_parallel = 1;
  scheduler::PipelineConfig pipeline;
  // Schedulers per replica: data-parallel ranks or pipeline batches; `kv`
  // is each one's.
  int64_t ranks() const { return data_parallel * pipeline_parallel; }
  int64_t cuda_graph_max_tokens = 0;   // scheduler.cuda_graph_max_tokens
  scheduler::BatchingConfig batching;  // kv_capacity_blocks filled in
  scheduler::RoutingPolicy routing = scheduler::RoutingPolicy::kRoundRobin;
  scheduler::KvCapacity kv;
  double weight_bytes_per_xpu = 0;
  double activation_bytes_per_xpu = 0;
  double runtime_reserve_bytes_per_xpu = 0;  // scheduler.runtime_reserve_bytes
  double step_overhead_s = 0;                // scheduler.step_overhead_s, per iteration
  // cluster.kv_tiers.load LAYERWISE: a step's tier loads overlap its
  // layers (else they precede it); the tiers are batching.kv_tiers.
  bool kv_tier_layerwise = false;
  // Power (docs/energy.md): each xPU's idle and active power, the host's share per
  // replica (cluster.power.host_w_per_node x its share of nodes), the
  // per-xPU cap (0: none), and the attention device's static power when
  // the scenario sets it (< 0: the device model's own).
  double xpu_idle_power_w = 0, host_power_w = 0, xpu_power_cap_w = 0;
  double xpu_active_power_w = 0;  // each xPU's, over its busy time but collectives
  double xpu_tdp_w = 0;           // each xPU's power limit (0: unknown, not applied)
  double attention_static_w = -1;
  int64_t xpus_per_replica() const { return tensor_parallel * ranks(); }
  double ttft_slo_s = 0;
  double tpot_slo_s = 0;
  double tbt_slo_s = 0;  // 0: no SLO-limited batching
  // scheduler.admission REJECT_LATE: refuse at arrival a request whose
  // predicted TTFT exceeds ttft_slo_s.
  bool reject_late = false;
  uint64_t seed = 1;
  // Heterogeneous replicas (cluster.attacc set): the device spec, and the
  // planner settings (device pointers are filled per replica at run time).
  bool has_attention_device = false;
  servesim::v1::DeviceSpec attention_device;
  std::string attention_kind;       // "attacc", "topick", "spatten", "cta", "lad"
  std::string attention_label;      // e.g. "attacc_bank x 40 stacks"
  int attention_units = 0;          // > 0: a pool of that many accelerators
  double attention_memory_per_unit = 0;
  servesim::v1::LinkSpec attention_link;  // xPU <-> device, per xPU
  // Pools: the device, created (and calibrated) once at resolution and
  // shared by every replica's engine (devices are immutable, and per-
  // request state is keyed by request id).
  std::shared_ptr<devices::Device> attention_shared;
  scheduler::PlannerConfig planner;
  double device_memory_bytes = 0;      // the attention-device pool
  double device_ff_weight_bytes = 0;   // FF slices placed on it (§6.2)
  // Device agents: where the xPU and attention devices run when not in
  // process (cluster.xpu_endpoints / attention_endpoints, or --agent).
  std::vector<std::string> xpu_endpoints, attention_endpoints;
  // The remote xPU device, shared by every replica's engine (a device is
  // immutable), and the remote AttAcc device; pools of remote units are
  // attention_shared. Null: in process.
  std::shared_ptr<devices::Device> xpu_agent;
  std::shared_ptr<devices::Device> attention_agent;
  // Every remote device of the run (owned above), for their call counts.
  std::vector<const agents::RemoteDevice*> remote_devices;

  // Prefill/decode disaggregation (cluster.disaggregation;
  // docs/disaggregation.md): each pool resolved as a scenario of its own,
  // its cluster and scheduler the pool's. Null when colocated. The other
  // fields then are the decode pool's, but `proto` (the whole scenario)
  // and `replicas` (both pools': prefill replicas first).
  std::shared_ptr<const ResolvedScenario> prefill_pool, decode_pool;
  bool disaggregated() const { return decode_pool != nullptr; }
  // The block size prompts are hashed at for prefix caching: the first
  // pool's (prefill first) that caches, 0 when none does. (A disaggregated
  // scenario's own `batching` is its decode pool's.)
  int64_t prefix_block_tokens() const {
    for (const ResolvedScenario* p : {prefill_pool.get(), decode_pool.get(), this}) {
      if (p != nullptr && p->batching.prefix_caching) return p->batching.kv_block_tokens;
    }
    return 0;
  }
  bool kv_layerwise = true;       // disaggregation.kv_transfer
  double kv_bytes_per_token = 0;  // one copy of a token's KV, all layers
  // fabric.platform_file as a path from the working folder (empty: the
  // built-in fabric), and each replica's host there.
  std::string platform_file;
  std::vector<std::string> replica_hosts;
};

absl::StatusOr<ResolvedScenario> Resolve(const LoadedScenario& scenario);

// The replica's attention device (a pool when attention_units > 0).
absl::StatusOr<std::unique_ptr<devices::Device>> CreateAttentionDevice(
    const ResolvedScenario& scenario);

}  // namespace servesim::scenario

#endif  // SERVESIM_SCENARIO_SCENARIO_H_
