// Resolve's memory plan (resolve_internal.h): what an xPU holds besides
// the KV cache (weights, the activation workspace, the runtime's reserve),
// the pipeline stages' shares, the KV cache the rest holds on the xPUs, and
// the KV tiers below it (docs/kv_tiers.md).
//
// Contract: steps of Resolve, after CheckScenario; they read the normalised
// scenario and the ResolvedScenario the earlier steps filled, and fill
// theirs. Bytes are per xPU unless named per replica; KV capacity is in
// blocks of scheduler.kv_block_tokens tokens. The sizes come from the
// iteration planner (scheduler/planner.h) and scheduler::ComputeKvCapacity.
#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "devices/model.h"
#include "scenario/resolve_internal.h"
#include "scenario/scenario.h"
#include "scheduler/batching.h"
#include "scheduler/kv_cache.h"
#include "scheduler/pipeline.h"
#include "scheduler/planner.h"
#include "scheduler/prefix_cache.h"
#include "servesim/v1/scenario.pb.h"

namespace servesim::scenario::internal {

namespace {

// Pipeline stages (cluster.pipeline_parallel > 1): each stage's xPUs hold
// its layers' weights and KV; the first the embedding, the last the LM head
// (tied: each end its copy). The fullest stage bounds the memory plan.
void PlanPipelineStages(const LoadedScenario& sc, const Layout& layout,
                        const scheduler::IterationPlanner& sizes, scheduler::KvCapacityInputs* kin,
                        ResolvedScenario* out) {
  const auto& m = sc.proto.model();
  const auto& c = sc.proto.cluster();
  const int64_t tp = layout.tp, pp = layout.pp;
  const std::vector<int64_t> layers = scheduler::PipelineLayers(m.num_layers(), pp);
  const int64_t most = *std::max_element(layers.begin(), layers.end());
  const devices::ModelDims& d = out->model;
  const double matrix = static_cast<double>(d.vocab_size * d.d_model) *
                        (d.dtype == servesim::v1::DTYPE_FP8 ? 2.0 : double(d.bytes_per_element)) /
                        static_cast<double>(tp);
  const double in_layers = out->weight_bytes_per_xpu - (d.tied_embeddings ? 1.0 : 2.0) * matrix;
  double fullest = 0;
  for (size_t j = 0; j < layers.size(); ++j) {
    const double w = in_layers * static_cast<double>(layers[j]) / double(d.num_layers) +
                     (j == 0 ? matrix : 0.0) + (j + 1 == layers.size() ? matrix : 0.0);
    fullest = std::max(fullest, w);
  }
  out->weight_bytes_per_xpu = fullest;
  kin->weight_bytes = fullest * static_cast<double>(tp);
  kin->kv_bytes_per_token_per_xpu = sizes.KvBytesPerTokenPerXpu() / d.num_layers * most;
  auto& pc = out->pipeline;
  pc.layers = layers;
  pc.num_layers = d.num_layers;
  pc.tensor_parallel = tp;
  pc.d_model = static_cast<double>(d.d_model);
  pc.act_bytes = static_cast<double>(d.act_bytes_per_element);
  const bool across_nodes = c.xpus_per_node() > 0 && tp * pp > c.xpus_per_node();
  const auto& link = across_nodes ? c.internode() : c.interconnect();
  pc.link_bytes_per_s = link.bandwidth_bytes_per_s();
  pc.link_latency_s = link.latency_s();
  pc.link_energy_pj_per_byte = link.energy_pj_per_byte();
  pc.across_nodes = across_nodes;
}

}  // namespace

scheduler::KvCapacityInputs PlanMemory(const LoadedScenario& sc, const Layout& layout,
                                       ResolvedScenario* out) {
  const auto& m = sc.proto.model();
  const auto& c = sc.proto.cluster();
  const auto& s = sc.proto.scheduler();
  const auto& x = c.xpu();
  const int64_t tp = layout.tp, dp = layout.dp, pp = layout.pp;
  const bool moe = layout.moe, mla = layout.mla;
  // Memory: weights and the activation workspace must leave room for KV.
  scheduler::PlannerConfig size_config;
  size_config.tensor_parallel = tp;
  size_config.data_parallel = dp;
  size_config.expert_parallel = c.expert_parallel();
  scheduler::IterationPlanner sizes(out->model, size_config);
  out->weight_bytes_per_xpu = sizes.WeightBytesPerXpu();
  out->activation_bytes_per_xpu = sizes.ActivationBytesPerXpu(s.max_tokens_per_iteration());
  if (s.batching() == servesim::v1::BATCHING_POLICY_VLLM_V1) {
    // vLLM sizes the KV cache after a profiling forward pass of a full token
    // budget and a sampler pass of max_num_seqs dummy requests: the peak
    // holds the layer's activations and the logits in fp32 (vocab per
    // sequence, plus the softmax copy).
    out->activation_bytes_per_xpu += 2.0 * 4.0 * static_cast<double>(s.max_batch_size()) *
                                     static_cast<double>((m.vocab_size() + tp - 1) / tp);
  }
  out->runtime_reserve_bytes_per_xpu = s.runtime_reserve_bytes();
  scheduler::KvCapacityInputs kin;
  kin.memory_bytes_per_xpu = x.memory_bytes();
  kin.xpus = tp;
  kin.memory_utilization = c.memory_utilization();
  kin.weight_bytes =
      moe || mla ? out->weight_bytes_per_xpu * static_cast<double>(tp) : out->model.WeightBytes();
  kin.activation_bytes_per_xpu = out->activation_bytes_per_xpu + out->runtime_reserve_bytes_per_xpu;
  kin.kv_bytes_per_token_per_xpu = sizes.KvBytesPerTokenPerXpu();
  out->pipeline_parallel = pp;
  if (pp > 1) PlanPipelineStages(sc, layout, sizes, &kin, out);
  kin.block_tokens = s.kv_block_tokens();
  return kin;
}

void ResolveXpuKvCache(const LoadedScenario& sc, const Layout& layout,
                       const scheduler::KvCapacityInputs& kin, ResolvedScenario* out) {
  const auto& s = sc.proto.scheduler();
  const int64_t pp = layout.pp;
  out->kv = scheduler::ComputeKvCapacity(kin);
  if (s.num_kv_blocks() > 0) {
    // The engine's own figure (vLLM's num_gpu_blocks) replaces the memory
    // model's.
    out->kv.blocks = s.num_kv_blocks();
    out->kv.tokens = out->kv.blocks * s.kv_block_tokens();
    out->kv.usable_bytes_per_xpu =
        static_cast<double>(out->kv.blocks) * s.kv_block_tokens() * kin.kv_bytes_per_token_per_xpu;
  }
  if (pp > 1) {
    // One share per in-flight batch's scheduler.
    out->kv.blocks /= pp;
    out->kv.tokens = out->kv.blocks * s.kv_block_tokens();
  }
}

absl::Status CheckKvFits(const LoadedScenario& sc, const Layout& layout,
                         const scheduler::KvCapacityInputs& kin, const ResolvedScenario& out) {
  const auto& m = sc.proto.model();
  const auto& c = sc.proto.cluster();
  const auto& x = c.xpu();
  const int64_t tp = layout.tp;
  const double available = x.memory_bytes() * c.memory_utilization();
  const double required =
      out.weight_bytes_per_xpu + out.activation_bytes_per_xpu + out.runtime_reserve_bytes_per_xpu;
  if (out.kv.blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        sc.Where("cluster.tensor_parallel"), ": ", m.name(), " does not fit a replica of ", tp,
        " x ", x.preset().empty() ? "xPU" : x.preset(), ": required ", Gb(required),
        " per xPU (weights ", Gb(out.weight_bytes_per_xpu), " + activations ",
        Gb(out.activation_bytes_per_xpu),
        out.runtime_reserve_bytes_per_xpu > 0
            ? absl::StrCat(" + runtime reserve ", Gb(out.runtime_reserve_bytes_per_xpu))
            : std::string(),
        ") plus at least one KV block (",
        Gb(double(kin.block_tokens) * kin.kv_bytes_per_token_per_xpu), ") vs available ",
        Gb(available), " (memory ", Gb(x.memory_bytes()), " x cluster.memory_utilization ",
        c.memory_utilization(), "); raise cluster.tensor_parallel or use a larger xPU"));
  }
  return absl::OkStatus();
}

absl::Status ResolveKvTiers(const LoadedScenario& sc, double kv_bytes_per_token_per_xpu,
                            ResolvedScenario* out) {
  const auto& c = sc.proto.cluster();
  const auto& kt = c.kv_tiers();
  auto fail = [&](absl::string_view path, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(sc.Where(path), ": ", path, ": ", what));
  };
  if (!out->batching.prefix_caching) {
    return fail("cluster.kv_tiers",
                "lower KV tiers keep prefix-cached blocks; set scheduler.prefix_caching: true");
  }
  if (out->has_attention_device) {
    return fail("cluster.kv_tiers",
                "not modelled with an attention device (its memory holds the KV cache, and "
                "the path from its stacks to a host tier is not described)");
  }
  if (kt.tier_size() < 1 || kt.tier_size() > scheduler::kMaxKvTiers) {
    return fail("cluster.kv_tiers.tier",
                absl::StrCat(kt.tier_size(), " tiers; allowed 1..", scheduler::kMaxKvTiers));
  }
  const double block_bytes =
      static_cast<double>(out->batching.kv_block_tokens) * kv_bytes_per_token_per_xpu;
  const double xpus = static_cast<double>(out->tensor_parallel);
  std::set<int> kinds;
  double host_per_xpu = 0;  // bytes of host DRAM the tiers take per xPU
  Checker ck(sc);
  for (int i = 0; i < kt.tier_size(); ++i) {
    const auto& t = kt.tier(i);
    const std::string base = absl::StrCat("cluster.kv_tiers.tier[", i, "]");
    if (t.kind() == servesim::v1::KV_TIER_KIND_UNSPECIFIED) {
      return fail(base + ".kind",
                  "not set; one of KV_TIER_HOST_DRAM, KV_TIER_CXL, KV_TIER_SSD, "
                  "KV_TIER_CLUSTER_STORE");
    }
    if (!kinds.insert(t.kind()).second) {
      return fail(base + ".kind",
                  absl::StrCat(servesim::v1::KvTierKind_Name(t.kind()), " appears twice"));
    }
    if (!t.link().has_bandwidth_bytes_per_s()) {
      return fail(base + ".link",
                  "not set: give a preset (\"pcie5\", ...) or bandwidth_bytes_per_s");
    }
    ck.PositiveAtMost(base + ".capacity_bytes_per_xpu", t.capacity_bytes_per_xpu(), 1e15);
    ck.Positive(base + ".link.bandwidth_bytes_per_s", t.link().bandwidth_bytes_per_s());
    ck.Range<double>(base + ".link.latency_s", t.link().latency_s(), 0, 1);
    ck.Range<double>(base + ".link.energy_pj_per_byte", t.link().energy_pj_per_byte(), 0, 1e6);
    RETURN_IF_ERROR(ck.status());
    const bool store = t.kind() == servesim::v1::KV_TIER_CLUSTER_STORE;
    if (store && i + 1 != kt.tier_size()) {
      return fail(base + ".kind", "KV_TIER_CLUSTER_STORE must be the last tier");
    }
    // Host DRAM holds a HOST_DRAM tier and the xPU's share of a cluster
    // store.
    const int64_t per_node = c.xpus_per_node();
    const double host = c.node().host_memory_bytes();
    if (t.kind() == servesim::v1::KV_TIER_HOST_DRAM || store) {
      host_per_xpu += t.capacity_bytes_per_xpu();
      if (host > 0 && per_node > 0 && host_per_xpu * static_cast<double>(per_node) > host) {
        return fail(
            base + ".capacity_bytes_per_xpu",
            absl::StrCat(host_per_xpu, " of host DRAM per xPU (the tiers in host memory) x ",
                         per_node, " xPUs per node = ", host_per_xpu * per_node,
                         " bytes exceeds the node's host memory (cluster.node."
                         "host_memory_bytes = ",
                         host, "); allowed at most ", host / per_node, " per xPU"));
      }
    }
    scheduler::KvTierConfig tc;
    tc.name = absl::AsciiStrToLower(
        absl::StripPrefix(servesim::v1::KvTierKind_Name(t.kind()), "KV_TIER_"));
    // Pipeline stages: the in-flight batches' schedulers share the xPUs'
    // tiers as they share HBM, a 1/S share each.
    const int64_t pp = std::max<int64_t>(1, out->pipeline_parallel);
    tc.capacity_blocks = scheduler::KvBlocksIn(t.capacity_bytes_per_xpu(), block_bytes) / pp;
    if (tc.capacity_blocks < 1) {
      return fail(
          base + ".capacity_bytes_per_xpu",
          absl::StrCat(
              t.capacity_bytes_per_xpu(), " holds no KV block of ", block_bytes, " bytes per xPU",
              pp > 1 ? absl::StrCat(" for each of ", pp, " in-flight batches") : std::string()));
    }
    tc.seconds_per_block = block_bytes / t.link().bandwidth_bytes_per_s();
    tc.latency_s = t.link().latency_s();
    tc.bytes_per_block = block_bytes * xpus;
    tc.energy_pj_per_block = tc.bytes_per_block * t.link().energy_pj_per_byte();
    tc.cluster_store = store;
    out->batching.kv_tiers.push_back(std::move(tc));
  }
  out->batching.kv_tier_write_through = kt.write() != servesim::v1::KV_TIER_WRITE_ON_EVICT;
  out->kv_tier_layerwise = kt.load() == servesim::v1::KV_TIER_LOAD_LAYERWISE;
  out->batching.kv_tier_async = kt.load() == servesim::v1::KV_TIER_LOAD_ASYNC;
  if (out->batching.kv_tier_async && out->batching.policy != scheduler::BatchingPolicy::kVllmV1) {
    return fail("cluster.kv_tiers.load",
                "KV_TIER_LOAD_ASYNC is vLLM v1's WAITING_FOR_REMOTE_KVS; set scheduler.batching: "
                "BATCHING_POLICY_VLLM_V1, or load BLOCKING or LAYERWISE");
  }
  return absl::OkStatus();
}

}  // namespace servesim::scenario::internal
