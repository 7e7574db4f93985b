#include "scheduler/pipeline.h"

#include <algorithm>

namespace servesim::scheduler {

std::vector<int64_t> PipelineLayers(int64_t layers, int64_t stages) {
  std::vector<int64_t> out(static_cast<size_t>(std::max<int64_t>(stages, 1)), 0);
  if (stages < 1 || layers < stages) return out;
  std::fill(out.begin(), out.end(), layers / stages);
  const int64_t rest = layers % stages;
  for (int64_t i = 2; i < rest + 2; ++i) ++out[static_cast<size_t>(stages - i)];
  return out;
}

PipelineCycle SteadyCycle(absl::Span<const PipelineStep> steps, int64_t stages) {
  PipelineCycle c;
  if (steps.empty() || stages < 1) return c;
  const size_t s = static_cast<size_t>(stages);
  std::vector<double> per_stage(s, 0);
  double work = 0;
  for (const PipelineStep& p : steps) {
    double trip = static_cast<double>(stages - 1) * p.transfer_s;
    for (size_t j = 0; j < s && j < p.stage_s.size(); ++j) {
      per_stage[j] += p.stage_s[j];
      trip += p.stage_s[j];
      work += p.stage_s[j];
    }
    c.round_trip_s = std::max(c.round_trip_s, trip);
  }
  c.busiest_stage_s = *std::max_element(per_stage.begin(), per_stage.end());
  c.time_s = std::max(c.busiest_stage_s, c.round_trip_s);
  c.bubble = c.time_s > 0 ? 1 - work / (static_cast<double>(stages) * c.time_s) : 0;
  return c;
}

double StageTransferBytes(const PipelineConfig& config, int64_t tokens) {
  // vLLM sends the hidden states and the residual.
  return 2.0 * static_cast<double>(tokens) * config.d_model * config.act_bytes;
}

PipelineStep StepOf(const PipelineConfig& config, const IterationCost& cost, int64_t tokens) {
  PipelineStep p;
  const size_t s = config.layers.size();
  p.stage_s.assign(s, 0);
  if (s == 0) return p;
  auto stage_time = [&](devices::Stage st) { return cost.stages[static_cast<int>(st)].time_s; };
  const double first = stage_time(devices::Stage::kEmbedding);
  const double last = stage_time(devices::Stage::kFinalNorm) + stage_time(devices::Stage::kLmHead);
  const double layers = std::max(0.0, cost.time_s - first - last);
  for (size_t j = 0; j < s; ++j) {
    p.stage_s[j] = layers * static_cast<double>(config.layers[j]) /
                   static_cast<double>(std::max<int64_t>(config.num_layers, 1));
  }
  p.stage_s.front() += first;
  p.stage_s.back() += last;
  if (s > 1 && tokens > 0 && config.link_bytes_per_s > 0) {
    // Each TP rank sends its 1/tp share over its own link.
    p.transfer_s = config.link_latency_s +
                   StageTransferBytes(config, tokens) /
                       (static_cast<double>(config.tensor_parallel) * config.link_bytes_per_s);
  }
  return p;
}

}  // namespace servesim::scheduler
