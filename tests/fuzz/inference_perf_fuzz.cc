// libFuzzer target: an inference-perf config (studies/inference_perf.h
// ParseInferencePerfConfig, over the YAML subset of studies/yaml_subset.h)
// on arbitrary contents. A config it refuses is refused with the file's
// name; one it accepts plans its requests (when there are few) with
// positive lengths, sends in time order within each stage and a shared
// prefix no longer than the prompt.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "studies/inference_perf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  auto c = servesim::studies::ParseInferencePerfConfig(text, "fuzz.yml");
  if (!c.ok()) {
    if (c.status().message().find("fuzz.yml") == absl::string_view::npos) std::abort();
    return 0;
  }
  if (c->stages.empty()) return 0;  // a sweep: its rates come from the reports
  int64_t requests = 0;
  for (const auto& s : c->stages) requests += s.requests();
  int64_t prompts = c->data_type == "shared_prefix" ? c->groups * c->prompts_per_group
                                                    : c->input_count + c->output_count;
  if (requests > 20000 || prompts > 20000) return 0;
  auto plan = servesim::studies::PlanRequests(*c, 1);
  if (!plan.ok()) {
    if (plan.status().message().find("fuzz.yml") == absl::string_view::npos) std::abort();
    return 0;
  }
  double previous = -1;
  int stage = -1;
  for (const auto& r : *plan) {
    if (r.input_tokens < 1 || r.output_tokens < 1) std::abort();
    if (r.prefix_tokens > r.input_tokens) std::abort();
    if (r.stage == stage && r.offset_s < previous) std::abort();
    stage = r.stage;
    previous = r.offset_s;
  }
  return 0;
}
