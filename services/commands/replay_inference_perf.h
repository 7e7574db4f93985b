// `servesim replay` of an inference-perf run (replay_inference_perf.cc).
#ifndef SERVESIM_SERVICES_COMMANDS_REPLAY_INFERENCE_PERF_H_
#define SERVESIM_SERVICES_COMMANDS_REPLAY_INFERENCE_PERF_H_

#include <string>
#include <vector>

#include "reports/output_dir.h"
#include "services/commands/run.h"
#include "studies/inference_perf.h"
#include "studies/replay.h"

namespace servesim::services {

// Builds the run's requests from its config, places its stages after their
// simulated drains, runs it into `dir` (acquired by the caller) and, with
// stage reports, writes replay_stages.csv and prints the comparison.
// Returns the exit status.
int ReplayInferencePerf(const std::string& run_dir, studies::InferencePerfRun run, RunFlags o,
                        const reports::OutputDir& dir, studies::ReplayOptions options);

// `--strict`'s refusal of a replay that assumes what the run did not record.
int FailStrict(const std::vector<std::string>& assumptions);

}  // namespace servesim::services

#endif  // SERVESIM_SERVICES_COMMANDS_REPLAY_INFERENCE_PERF_H_
