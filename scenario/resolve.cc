// Resolving a scenario: every value checked against its allowed range and
// the configuration as a whole, then what the run needs derived (model
// dimensions, KV capacity, devices, agents).
//
// This file is the driver: Resolve runs the steps of resolve_internal.h in
// order (the checks, the xPU, the memory plan, where the KV cache lives,
// the scheduler, power, KV tiers, agents), and fills in the small parts
// itself. CreateAttentionDevice is here too.
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "devices/model.h"
#include "devices/moe_routing.h"
#include "devices/pool.h"
#include "devices/registry.h"
#include "scenario/resolve_internal.h"
#include "scenario/scenario.h"
#include "scheduler/batching.h"
#include "scheduler/kv_cache.h"
#include "scheduler/planner.h"
#include "scheduler/router.h"
#include "servesim/v1/scenario.pb.h"

namespace servesim::scenario {

namespace {

using internal::Layout;

// MoE models: the planner's data-parallel ranks and expert parallelism,
// and the expected load of the experts' routing (devices/moe_routing.h).
absl::Status ResolveExpertRouting(const LoadedScenario& sc, const Layout& layout,
                                  ResolvedScenario* out) {
  const auto& p = sc.proto;
  const auto& m = p.model();
  const auto& c = p.cluster();
  const int64_t tp = layout.tp, dp = layout.dp;
  const bool moe = layout.moe;
  out->planner.data_parallel = dp;
  out->planner.expert_parallel = c.expert_parallel();
  if (moe) {
    auto routing =
        devices::ExpertRouting::Create(m.num_experts(), m.experts_per_token(), m.routing_skew(),
                                       p.seed(), c.expert_parallel() ? dp * tp : 1);
    if (!routing.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(sc.Where("model.num_experts"), ": ", routing.status().message()));
    }
    out->planner.routing = std::make_shared<const devices::ExpertRouting>(*std::move(routing));
  }
  return absl::OkStatus();
}

// The scheduler's policies and limits: batching (with the KV capacity in
// blocks), admission, the step overhead, routing.
void ResolveScheduler(const servesim::v1::Scenario& p, ResolvedScenario* out) {
  const auto& m = p.model();
  const auto& s = p.scheduler();
  out->batching.policy = s.batching() == servesim::v1::BATCHING_POLICY_CHUNKED_PREFILL
                             ? scheduler::BatchingPolicy::kChunkedPrefill
                         : s.batching() == servesim::v1::BATCHING_POLICY_VLLM_V1
                             ? scheduler::BatchingPolicy::kVllmV1
                             : scheduler::BatchingPolicy::kPrefillFirst;
  out->batching.prefix_caching = s.prefix_caching();
  out->reject_late = s.admission() == servesim::v1::ADMISSION_POLICY_REJECT_LATE;
  out->batching.long_prefill_token_threshold = s.long_prefill_token_threshold();
  out->step_overhead_s = s.step_overhead_s();
  out->batching.max_batch_size = s.max_batch_size();
  out->batching.max_tokens_per_iteration = s.max_tokens_per_iteration();
  out->batching.kv_block_tokens = s.kv_block_tokens();
  out->batching.kv_capacity_blocks = out->kv.blocks;
  out->batching.kv_watermark = s.kv_watermark();
  out->batching.max_context_tokens = m.max_context_tokens();
  switch (s.routing()) {
    case servesim::v1::ROUTING_POLICY_LEAST_OUTSTANDING:
      out->routing = scheduler::RoutingPolicy::kLeastOutstanding;
      break;
    case servesim::v1::ROUTING_POLICY_LEAST_KV_LOAD:
      out->routing = scheduler::RoutingPolicy::kLeastKvLoad;
      break;
    case servesim::v1::ROUTING_POLICY_PREFIX_AFFINITY:
      out->routing = scheduler::RoutingPolicy::kPrefixAffinity;
      break;
    default:
      out->routing = scheduler::RoutingPolicy::kRoundRobin;
  }
}

// Power (docs/energy.md): the xPU's figures, the host's share per replica,
// the cap, the attention device's static power where set.
void ResolvePower(const servesim::v1::Scenario& p, ResolvedScenario* out) {
  const auto& pw = p.cluster().power();
  out->xpu_idle_power_w = p.cluster().xpu().idle_power_w();
  out->xpu_active_power_w = p.cluster().xpu().active_power_w();
  out->xpu_tdp_w = p.cluster().xpu().tdp_w();
  const int64_t per_node = p.cluster().xpus_per_node();
  out->host_power_w =
      pw.host_w_per_node() *
      (per_node > 0 ? static_cast<double>(out->xpus_per_replica()) / per_node : 1.0);
  out->xpu_power_cap_w = pw.xpu_cap_w();
  if (pw.has_attention_device_static_w()) out->attention_static_w = pw.attention_device_static_w();
}

}  // namespace

absl::StatusOr<ResolvedScenario> Resolve(const LoadedScenario& sc) {
  if (sc.proto.cluster().has_disaggregation()) return internal::ResolveDisaggregated(sc);
  const auto& p = sc.proto;
  const Layout layout = internal::LayoutOf(p);
  RETURN_IF_ERROR(internal::CheckScenario(sc, layout));
  const auto& m = p.model();
  const auto& c = p.cluster();
  const auto& s = p.scheduler();
  const int64_t tp = layout.tp;

  ResolvedScenario out;
  out.proto = p;
  out.base_dir = sc.base_dir;
  out.model = devices::ModelDimsFromSpec(m);
  out.replicas = c.replicas();
  out.tensor_parallel = tp;
  out.seed = p.seed();
  out.ttft_slo_s = p.slo().ttft_s();
  out.tpot_slo_s = p.slo().tpot_s();
  out.tbt_slo_s = p.slo().has_tbt_s() ? p.slo().tbt_s() : 0.0;
  RETURN_IF_ERROR(internal::ResolveXpuDevice(sc, layout, &out));

  out.data_parallel = layout.dp;
  out.cuda_graph_max_tokens = s.cuda_graph_max_tokens();
  RETURN_IF_ERROR(ResolveExpertRouting(sc, layout, &out));

  const scheduler::KvCapacityInputs kin = internal::PlanMemory(sc, layout, &out);
  out.planner.tensor_parallel = tp;
  // Only with an attention device (checked above); the list schedule otherwise.
  out.planner.overlap_rule = c.overlap_rule() == servesim::v1::OVERLAP_RULE_ATTACC_SIMULATOR
                                 ? scheduler::OverlapRule::kAttAccSimulator
                                 : scheduler::OverlapRule::kListSchedule;
  if (c.has_attacc()) {
    RETURN_IF_ERROR(internal::ResolveAttAcc(sc, layout, &out));
  } else if (c.has_attention_pool()) {
    RETURN_IF_ERROR(internal::ResolveAttentionPool(sc, layout, &out));
  } else {
    internal::ResolveXpuKvCache(sc, layout, kin, &out);
  }
  RETURN_IF_ERROR(internal::CheckKvFits(sc, layout, kin, out));

  ResolveScheduler(p, &out);
  ResolvePower(p, &out);
  if (c.has_kv_tiers()) {
    RETURN_IF_ERROR(
        internal::ResolveKvTiers(sc, static_cast<double>(kin.kv_bytes_per_token_per_xpu), &out));
  }
  RETURN_IF_ERROR(internal::ConnectAgents(sc, &out));
  return out;
}

absl::StatusOr<std::unique_ptr<devices::Device>> CreateAttentionDevice(const ResolvedScenario& sc) {
  if (sc.attention_shared != nullptr) {
    return absl::FailedPreconditionError("the attention pool is shared: use attention_shared");
  }
  ASSIGN_OR_RETURN(auto device, devices::CreateDevice(sc.attention_device));
  if (sc.attention_units <= 0) return device;
  return std::unique_ptr<devices::Device>(std::make_unique<devices::PooledDevice>(
      std::move(device), sc.attention_units, sc.attention_memory_per_unit));
}

}  // namespace servesim::scenario
