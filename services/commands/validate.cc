// `servesim validate SCENARIO`: parse and check; print the resolved scenario
// (every default and preset value filled in) and the replica memory plan.
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cluster/simulation.h"
#include "google/protobuf/text_format.h"
#include "services/commands/commands.h"
#include "services/commands/scenario_args.h"

namespace servesim::services {

int ValidateCommand(const Args& args) {
  ScenarioArgs o;
  FlagParser flags;
  AddScenarioFlags(flags, &o);
  AddAgentFlags(flags, &o);
  if (auto exit = ParseFlags(flags, args)) return *exit;
  if (o.scenario.empty()) return UsageError("validate needs a scenario file");
  auto loaded = LoadAndResolve(o);
  if (!loaded.ok()) return Fail(loaded.status());
  for (const std::string& f : InapplicableFields(*loaded)) {
    std::cerr << "servesim: warning: " << f << " (ignored here; `servesim run` refuses it)\n";
  }
  auto wl = ScanWorkloadOf(*loaded);
  if (!wl.ok()) return Fail(wl.status());
  const scenario::ResolvedScenario* sc = &loaded->resolved;
  std::string text;
  google::protobuf::TextFormat::PrintToString(sc->proto, &text);
  std::cout << "# resolved scenario (every default and preset value filled in)\n" << text << "\n";
  if (sc->has_attention_device) {
    std::cout << absl::StrFormat(
        "# attention device: %s, %s in all (FF partitions %s); KV lives there\n",
        sc->attention_label, FormatGb(sc->device_memory_bytes),
        FormatGb(sc->device_ff_weight_bytes));
  }
  if (sc->model.moe()) {
    const int64_t group = sc->data_parallel * sc->tensor_parallel;
    const bool ep = sc->proto.cluster().expert_parallel();
    std::cout << absl::StrFormat(
        "# experts: %d routed (top-%d) + %d shared per MoE layer, %d MoE layers; split over "
        "%d xPUs (data_parallel %d x tensor_parallel %d) %s\n",
        sc->model.num_experts, sc->model.experts_per_token, sc->model.shared_experts,
        sc->model.MoeLayers(), group, sc->data_parallel, sc->tensor_parallel,
        ep ? absl::StrFormat("by expert: %d experts per xPU", sc->model.num_experts / group)
           : absl::StrFormat("by width: every expert, %d of its %d columns per xPU",
                             sc->model.expert_d_ff / group, sc->model.expert_d_ff));
  }
  if (const int per_node = sc->proto.cluster().xpus_per_node(); per_node > 0) {
    const int64_t group = sc->data_parallel * sc->tensor_parallel;
    const int64_t xpus = group * sc->pipeline_parallel;
    std::cout << absl::StrFormat(
        "# nodes: %d xPUs per replica over %d node(s) of %d; collectives among more than %d "
        "xPUs cross nodes over %s (%s each way per xPU)\n",
        xpus, (xpus + per_node - 1) / per_node, per_node, per_node,
        sc->proto.cluster().internode().preset().empty() ? std::string("cluster.internode")
                                                         : sc->proto.cluster().internode().preset(),
        FormatGb(sc->proto.cluster().internode().bandwidth_bytes_per_s()) + "/s");
  }
  if (sc->pipeline_parallel > 1) {
    std::cout << absl::StrFormat(
        "# pipeline: %d stages of %s layers, %d batches in flight; per xPU the fullest stage's "
        "weights and KV\n",
        sc->pipeline_parallel, absl::StrJoin(sc->pipeline.layers, "+"), sc->pipeline_parallel);
  }
  if (sc->model.sliding_window > 0) {
    const devices::ModelDims& m = sc->model;
    std::cout << absl::StrFormat(
        "# attention: %d sliding-window layers (the last %d tokens) and %d full; the KV cache "
        "is sized for every layer's every token\n",
        m.SlidingLayers(), m.sliding_window, m.FullAttentionLayers());
  }
  if (sc->model.mla()) {
    const devices::ModelDims& m = sc->model;
    std::cout << absl::StrFormat(
        "# attention: multi-head latent, %d heads over a latent of %d + a RoPE key of %d per "
        "token and layer: %d bytes of %s KV per token on every xPU of a tensor-parallel group\n",
        m.num_heads, m.kv_lora_rank, m.rope_head_dim, m.KvBytesPerToken(),
        devices::DTypeName(m.kv_dtype));
  }
  if (sc->disaggregated()) {
    // Each pool's plan; the lines above are the decode pool's.
    for (const auto* pool : {sc->prefill_pool.get(), sc->decode_pool.get()}) {
      const auto& c = pool->proto.cluster();
      std::cout << absl::StrFormat(
          "# %s pool: %d replica(s) of %d x %s; memory plan per xPU: weights %s, activations "
          "%s, KV %s; KV capacity per replica %d tokens; NIC %s per xPU\n",
          pool == sc->prefill_pool.get() ? "prefill" : "decode", pool->replicas,
          pool->tensor_parallel * pool->ranks(), c.xpu().preset(),
          FormatGb(pool->weight_bytes_per_xpu), FormatGb(pool->activation_bytes_per_xpu),
          FormatGb(pool->kv.usable_bytes_per_xpu), pool->kv.tokens * pool->ranks(),
          FormatGb(c.internode().bandwidth_bytes_per_s()) + "/s");
    }
    std::cout << absl::StrFormat("# KV hand-off: %d bytes per prompt token, %s\n",
                                 static_cast<int64_t>(sc->kv_bytes_per_token),
                                 sc->kv_layerwise ? "layer by layer" : "after the prefill");
    auto platform = cluster::CheckPlatformFile(*sc);
    if (!platform.ok())
      return Fail(scenario::AnnotateFieldError(loaded->loaded, platform.status()));
    std::cout << *platform;
  }
  std::cout << absl::StrFormat(
      "# memory plan per xPU: weights %s, activations %s, KV %s\n"
      "# KV capacity per replica: %s%d blocks x %d tokens = %d tokens\n"
      "# workload: %s, %d requests\n",
      FormatGb(sc->weight_bytes_per_xpu), FormatGb(sc->activation_bytes_per_xpu),
      FormatGb(sc->kv.usable_bytes_per_xpu),
      sc->data_parallel > 1 ? absl::StrFormat("%d data-parallel ranks x ", sc->data_parallel)
      : sc->pipeline_parallel > 1
          ? absl::StrFormat("%d in-flight batches x ", sc->pipeline_parallel)
          : std::string(),
      sc->kv.blocks, sc->batching.kv_block_tokens, sc->kv.tokens * sc->ranks(), wl->description,
      wl->num_requests);
  // Lower KV tiers (docs/kv_tiers.md), per scheduler.
  for (const scheduler::KvTierConfig& t : sc->batching.kv_tiers) {
    std::cout << absl::StrFormat(
        "# KV tier %s: %d blocks = %d tokens per replica; a block (%.2f MB over the xPUs) moves "
        "in %.3g us over each xPU's link\n",
        t.name, t.capacity_blocks, t.capacity_blocks * sc->batching.kv_block_tokens,
        t.bytes_per_block / 1e6, t.seconds_per_block * 1e6);
  }
  // Static power per replica (docs/energy.md); the attention device's
  // figure comes from its model unless the scenario gives one.
  for (const scenario::ResolvedScenario* pool :
       sc->disaggregated() ? std::vector<const scenario::ResolvedScenario*>{sc->prefill_pool.get(),
                                                                            sc->decode_pool.get()}
                           : std::vector<const scenario::ResolvedScenario*>{&*sc}) {
    std::string device;
    if (pool->has_attention_device) {
      double w = pool->attention_static_w;
      const char* whose = "cluster.power.attention_device_static_w";
      if (w < 0 && pool->attention_shared != nullptr) {
        w = pool->attention_shared->Describe().static_power_w;
        whose = "its model";
      } else if (w < 0 && pool->attention_endpoints.empty()) {
        auto d = scenario::CreateAttentionDevice(*pool);
        if (d.ok()) w = (*d)->Describe().static_power_w;
        whose = "its model";
      }
      device = w < 0 ? ", attention device: from its agent"
                     : absl::StrFormat(", attention device %.4g W (%s)", w, whose);
    }
    std::cout << absl::StrFormat(
        "# power per replica%s: %d xPUs x %.4g W idle (+%.4g W each while busy), host %.4g W%s; "
        "xPU cap %s\n",
        !sc->disaggregated()             ? ""
        : pool == sc->prefill_pool.get() ? " (prefill pool)"
                                         : " (decode pool)",
        pool->xpus_per_replica(), pool->xpu_idle_power_w, pool->xpu_active_power_w,
        pool->host_power_w, device,
        pool->xpu_power_cap_w > 0 ? absl::StrFormat("%.4g W", pool->xpu_power_cap_w) : "none");
  }
  std::cout << "OK\n";
  return 0;
}

}  // namespace servesim::services
