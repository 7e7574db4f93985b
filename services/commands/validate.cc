// `servesim validate SCENARIO`: parse and check; print the resolved scenario
// (every default and preset value filled in) and the replica memory plan.
#include <iostream>
#include <string>

#include "absl/strings/str_format.h"
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
  std::cout << absl::StrFormat(
      "# memory plan per xPU: weights %s, activations %s, KV %s\n"
      "# KV capacity per replica: %s%d blocks x %d tokens = %d tokens\n"
      "# workload: %s, %d requests\n",
      FormatGb(sc->weight_bytes_per_xpu), FormatGb(sc->activation_bytes_per_xpu),
      FormatGb(sc->kv.usable_bytes_per_xpu),
      sc->data_parallel > 1 ? absl::StrFormat("%d data-parallel ranks x ", sc->data_parallel)
                            : std::string(),
      sc->kv.blocks, sc->batching.kv_block_tokens, sc->kv.tokens * sc->data_parallel,
      wl->description, wl->num_requests);
  std::cout << "OK\n";
  return 0;
}

}  // namespace servesim::services
