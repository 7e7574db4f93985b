// Resolve's steps (scenario.h), one job each, for the files that implement
// them; not part of the scenario library's interface.
//
// Contract:
//  - Resolve (resolve.cc) runs a colocated scenario's steps in the order
//    declared here (its own small steps, expert routing, the scheduler's
//    settings and power, between them): CheckScenario first (every value
//    against its range and the configuration as a whole), then the
//    derivations. The first error found is the one the user sees, so the
//    steps and the checks within each keep their order. A disaggregated
//    scenario goes to ResolveDisaggregated instead.
//  - resolve_checks.cc: CheckScenario, the ranges and combinations, before
//    anything is derived.
//  - resolve_devices.cc: the xPU's device spec and profile bundle, the
//    attention device (AttAcc or a pool) with the KV cache it holds, and the
//    device agents (ConnectAgents, last).
//  - resolve_memory.cc: the memory plan (weights, activations, pipeline
//    stages), the xPUs' KV cache and whether one block fits, the KV tiers.
//  - resolve_disaggregated.cc: a prefill/decode disaggregated cluster, each
//    pool resolved by Resolve as a scenario of its own.
//  - Steps fill the ResolvedScenario they are given and may read what the
//    steps before them filled; on an error it is discarded.
// Errors read `<file>:<line>: <field.path> = <value>: <problem>` (scenario.h).
// Memory figures are bytes.
#ifndef SERVESIM_SCENARIO_RESOLVE_INTERNAL_H_
#define SERVESIM_SCENARIO_RESOLVE_INTERNAL_H_

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "scenario/scenario.h"
#include "scheduler/kv_cache.h"
#include "servesim/v1/scenario.pb.h"

namespace servesim::scenario::internal {

// Accumulates the first range error with its location.
class Checker {
 public:
  explicit Checker(const LoadedScenario& sc) : sc_(sc) {}

  template <typename T>
  void Range(absl::string_view path, T v, T lo, T hi) {
    if (!status_.ok()) return;
    if (!(v >= lo && v <= hi)) {
      Fail(path, v, absl::StrCat("allowed range [", lo, ", ", hi, "]"));
    }
  }
  void Positive(absl::string_view path, double v) {
    if (!status_.ok()) return;
    if (!(v > 0) || !std::isfinite(v)) Fail(path, v, "expected > 0");
  }
  // (0, hi]: a positive figure with an upper limit (e.g. a memory size
  // whose block count must fit an integer).
  void PositiveAtMost(absl::string_view path, double v, double hi) {
    if (!status_.ok()) return;
    if (!(v > 0 && v <= hi)) Fail(path, v, absl::StrCat("allowed range (0, ", hi, "]"));
  }
  void NonNegative(absl::string_view path, double v) {
    if (!status_.ok()) return;
    if (!(v >= 0) || !std::isfinite(v)) Fail(path, v, "expected >= 0");
  }
  void Fraction(absl::string_view path, double v) {
    if (!status_.ok()) return;
    if (!(v > 0 && v <= 1)) Fail(path, v, "allowed range (0, 1]");
  }
  template <typename T>
  void Fail(absl::string_view path, T v, absl::string_view what) {
    if (!status_.ok()) return;
    status_ =
        absl::InvalidArgumentError(absl::StrCat(sc_.Where(path), ": ", path, " = ", v, ": ", what));
  }
  void Require(bool has, absl::string_view path, absl::string_view why) {
    if (!status_.ok() || has) return;
    status_ =
        absl::InvalidArgumentError(absl::StrCat(sc_.Where(path), ": ", path, " is not set: ", why));
  }
  const absl::Status& status() const { return status_; }

 private:
  const LoadedScenario& sc_;
  absl::Status status_;
};

inline std::string Gb(double bytes) { return absl::StrFormat("%.2f GB", bytes / 1e9); }

// A colocated replica's layout as the scenario asks for it, read once from
// the normalised scenario (unset degrees are 1) and checked by
// CheckScenario before any other step uses it.
struct Layout {
  int64_t tp = 1;    // cluster.tensor_parallel
  int64_t pp = 1;    // cluster.pipeline_parallel
  int64_t dp = 1;    // cluster.data_parallel
  bool moe = false;  // model.num_experts > 0
  bool mla = false;  // model.kv_lora_rank > 0 (multi-head latent attention)
};
Layout LayoutOf(const servesim::v1::Scenario& p);

// resolve_checks.cc: every value of a colocated scenario against its range
// and the configuration as a whole; the first error found.
absl::Status CheckScenario(const LoadedScenario& sc, const Layout& layout);

// resolve_collectives.cc: cluster.collectives and internode_collectives
// into `gpu` (the preset's and the files' tables read); a missing table is
// a fallback, a bad file an error naming it.
absl::Status ResolveCollectives(const LoadedScenario& sc, const Layout& layout,
                                servesim::v1::GpuDeviceSpec* gpu, ResolvedScenario* out);

// resolve_devices.cc: the xPU's device spec (out->xpu_device), its profile
// bundle and fallbacks; a roofline the device refuses is an error.
absl::Status ResolveXpuDevice(const LoadedScenario& sc, const Layout& layout,
                              ResolvedScenario* out);

// resolve_memory.cc: weights and activations per xPU, pipeline stages, and
// what sizes the xPUs' KV cache (the inputs returned). Fills
// weight_bytes_per_xpu, activation_bytes_per_xpu,
// runtime_reserve_bytes_per_xpu, pipeline_parallel and pipeline.
scheduler::KvCapacityInputs PlanMemory(const LoadedScenario& sc, const Layout& layout,
                                       ResolvedScenario* out);

// resolve_devices.cc: the attention device beside the xPUs, which holds
// the KV cache: cluster.attacc, or cluster.attention_pool. Each fills the
// device's fields, the planner's overlap settings and out->kv, and checks
// that the weights fit the xPUs.
absl::Status ResolveAttAcc(const LoadedScenario& sc, const Layout& layout, ResolvedScenario* out);
absl::Status ResolveAttentionPool(const LoadedScenario& sc, const Layout& layout,
                                  ResolvedScenario* out);

// resolve_memory.cc: without an attention device the xPUs hold the KV
// cache: out->kv from `kin` (or scheduler.num_kv_blocks), a 1/PP share
// per in-flight batch.
void ResolveXpuKvCache(const LoadedScenario& sc, const Layout& layout,
                       const scheduler::KvCapacityInputs& kin, ResolvedScenario* out);

// resolve_memory.cc: at least one KV block must fit, else the error says
// what the replica requires against what it has.
absl::Status CheckKvFits(const LoadedScenario& sc, const Layout& layout,
                         const scheduler::KvCapacityInputs& kin, const ResolvedScenario& out);

// resolve_memory.cc: cluster.kv_tiers (docs/kv_tiers.md): checks each tier
// and sizes it in blocks of `kv_bytes_per_token_per_xpu` x block tokens
// per xPU.
absl::Status ResolveKvTiers(const LoadedScenario& sc, double kv_bytes_per_token_per_xpu,
                            ResolvedScenario* out);

// resolve_devices.cc: --agent KIND=... replaces the scenario's list for
// devices of that kind.
std::vector<std::string> AgentEndpoints(
    const LoadedScenario& sc, const std::string& kind,
    const google::protobuf::RepeatedPtrField<std::string>& from_scenario);

// resolve_devices.cc: the devices that run on agents (cluster.*_endpoints
// or --agent), connected; the last step.
absl::Status ConnectAgents(const LoadedScenario& sc, ResolvedScenario* out);

// resolve_disaggregated.cc: cluster.disaggregation: both pools resolved,
// checked against each other, and combined.
absl::StatusOr<ResolvedScenario> ResolveDisaggregated(const LoadedScenario& sc);

}  // namespace servesim::scenario::internal

#endif  // SERVESIM_SCENARIO_RESOLVE_INTERNAL_H_
