// Replaying an inference-perf run (the benchmark client of the llm-d and
// Gateway API Inference Extension projects; its formats are defined by its
// documentation, github.com/kubernetes-sigs/inference-perf docs/config.md
// and docs/reports.md, and its load generator, inference_perf/loadgen/).
//
// The run is described by its config (load stages of constant or Poisson
// rate and duration; synthetic data: shared_prefix, random, synthetic) and
// measured by one stage_<N>_lifecycle_metrics.json per stage. What the
// client does, and the replay reproduces:
//  - stage k sends int(rate x duration) requests. "constant" load draws
//    exponential gaps and scales them to sum to the duration
//    (ConstantLoadTimer); "poisson" draws a Poisson count for each second
//    and spreads that many the same way over the second (PoissonLoadTimer);
//  - the next stage starts only when every request of this one has
//    finished, `load.interval` seconds later plus the one second the client
//    gives its workers to start (LoadGenerator.run_stage): the replay places
//    each stage after the simulated drain of the one before (see
//    StageStarts);
//  - each worker takes a request only with one of its
//    worker_max_concurrency slots free: at most num_workers x that in
//    flight (workload.max_in_flight), each timed from when it is sent;
//  - shared_prefix data: num_groups system prompts (system_prompt_len
//    tokens) each followed by num_prompts_per_group questions
//    (question_len), shuffled once; each stage sends them in that order from
//    the first, cycling; random / synthetic data: input and output lengths
//    from their distributions (total_count each), cycled likewise. Lengths
//    are fixed values or distributions (normal, lognormal, uniform, fixed;
//    clipped to [min, max] and rounded, as the client does). The client's
//    random numbers are its own (unseeded timers); the replay draws its own
//    from the scenario seed.
// Errors name the file (and line for the config) and the field, with the
// values allowed: unsupported load types (concurrent, trace replays),
// data types that need a dataset or a trace, multi-turn chat, distribution
// types the replay does not draw.
#ifndef SERVESIM_STUDIES_INFERENCE_PERF_H_
#define SERVESIM_STUDIES_INFERENCE_PERF_H_

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace servesim::studies {

// A length: a fixed value or a distribution, in tokens.
struct LengthDistribution {
  std::string type = "fixed";  // fixed, normal, lognormal, uniform
  double mean = 0, std_dev = 0;
  int64_t min = 0, max = 0;
};

struct InferencePerfStage {
  double rate = 0;        // requests per second
  double duration_s = 0;  // seconds
  int64_t requests() const { return static_cast<int64_t>(rate * duration_s); }
};

struct InferencePerfConfig {
  std::string path;                            // where it was read from (for messages)
  std::string load_type;                       // "constant" or "poisson"
  double interval_s = 1;                       // load.interval: the pause between stages
  std::vector<InferencePerfStage> stages;      // empty with a sweep until filled
  double sweep_stage_duration_s = 0;           // load.sweep.stage_duration; 0: no sweep
  std::string data_type;                       // shared_prefix, random or synthetic
  int64_t groups = 0, prompts_per_group = 0;   // shared_prefix
  LengthDistribution system_prompt, question;  // shared_prefix
  LengthDistribution input;                    // random, synthetic
  int64_t input_count = 0, output_count = 0;   // random, synthetic: total_count
  LengthDistribution output;
  bool ignore_eos = false;  // server.ignore_eos: outputs run to their length
  // The client's concurrency limit, load.num_workers x
  // load.worker_max_concurrency (100 by default): each worker takes a
  // request only with a free slot. 0: num_workers not given (its default,
  // the client machine's CPU count, is not recorded): no limit.
  int64_t max_in_flight = 0;
  // Settings read and not modelled, in words (listed in run_info.json).
  std::vector<std::string> notes;
};

// Reads the config's YAML. `path` names it in messages.
absl::StatusOr<InferencePerfConfig> ParseInferencePerfConfig(absl::string_view yaml,
                                                             const std::string& path);
// Whether `yaml` is an inference-perf config (top-level `load` and `data`).
bool LooksLikeInferencePerf(absl::string_view yaml);

// One stage's report (stage_<N>_lifecycle_metrics.json).
struct StageReport {
  int stage = 0;
  std::string path;
  double requested_rate = 0, achieved_rate = 0;  // load_summary; NaN when absent
  int64_t successes = 0, failures = 0;
  // latency figures: "e2e_s" (request_latency), "ttft_s", "tpot_s", "itl_s"
  // x {mean, median, p90, p99}; NaN where the report has none.
  std::map<std::string, std::array<double, 4>> latency;
  double output_tokens_per_s = 0, requests_per_s = 0;
  double prompt_len_mean = 0, output_len_mean = 0;  // NaN when absent
};

// The stage reports in `dir`, stage 0 first; NOT_FOUND when there are
// none, an error for a gap in the numbering or a report that does not
// parse (naming the file and the field).
absl::StatusOr<std::vector<StageReport>> ReadStageReports(const std::string& dir);

// A sweep's stages: the rate each report says was requested, for the
// sweep's stage duration. An error when the config has stages of its own
// that disagree in number with the reports.
absl::Status FillStagesFromReports(const std::vector<StageReport>& reports,
                                   InferencePerfConfig* config);

// One request the client sends: its stage, its send time from the stage's
// start, its lengths, its shared prefix (group -1: none) and its prompt
// (-1: a prompt of its own; shared_prefix data sends each prompt again
// once the client has cycled through them).
struct PlannedRequest {
  int stage = 0;
  double offset_s = 0;
  int64_t input_tokens = 0, output_tokens = 0;
  int64_t prefix_group = -1, prefix_tokens = 0;
  int64_t prompt = -1;
};

// Every request of every stage, in send order, drawn from `seed`.
absl::StatusOr<std::vector<PlannedRequest>> PlanRequests(const InferencePerfConfig& config,
                                                         uint64_t seed);

// The trace (arrival_s, input_tokens, output_tokens, prefix_group,
// prefix_tokens, prompt_id) with stage k's requests sent from
// `stage_start_s[k]`.
std::string StagedTraceCsv(const std::vector<PlannedRequest>& plan,
                           const std::vector<double>& stage_start_s);

// When each stage starts: stage 0 at 0, stage k+1 `interval + 1` s after
// the last request of stage k finished (`drain_s[k]`, simulated). Only a
// run knows the drains: a replay places the stages from provisional runs
// (services/commands/replay_inference_perf.cc) and checks the final run
// against this.
std::vector<double> StageStarts(const InferencePerfConfig& config,
                                const std::vector<double>& drain_s);

// The simulated run's stages (requests.csv, iterations.csv), as the
// client's report computes them: latencies over successful requests, TPOT
// over those with more than one token, inter-token latency as every gap
// between tokens (a step's duration, once for each sequence that got a
// later token in it), throughput over the first send to the last finish.
// `drain_s` gets each stage's last finish, in the trace's clock (the run's
// starts at its first arrival).
absl::StatusOr<std::vector<StageReport>> SimulatedStages(const std::vector<PlannedRequest>& plan,
                                                         int stages,
                                                         const std::string& requests_csv,
                                                         const std::string& iterations_csv,
                                                         std::vector<double>* drain_s);

// The drains alone (requests.csv), for the provisional runs.
absl::StatusOr<std::vector<double>> StageDrains(const std::vector<PlannedRequest>& plan, int stages,
                                                const std::string& requests_csv);

// replay_stages.csv (stage, rate, metric, stat, measured, simulated,
// error_pct) and the table `servesim replay` prints.
std::string StagesCsv(const InferencePerfConfig& config, const std::vector<StageReport>& measured,
                      const std::vector<StageReport>& simulated);
std::string StagesTable(const InferencePerfConfig& config, const std::vector<StageReport>& measured,
                        const std::vector<StageReport>& simulated);

// An inference-perf run to replay: its config and its stage reports.
struct InferencePerfRun {
  InferencePerfConfig config;
  std::vector<StageReport> reports;  // empty: none (nothing to compare)
  std::string config_source;         // the file, or "setup.json workload.profile_yaml"
};

// `run_dir` as an inference-perf run, or nullopt when it is a trace replay
// (it has trace.csv) or holds neither a config nor stage reports. The
// reports are read from the folder, results/, reports/,
// inference-perf-data/ or its one reports-* folder; the config from setup.json's
// workload.profile_yaml (or workload_profile_yaml) when that holds one, else config.yml,
// config.yaml, profile.yaml beside the run, else the reports' config.yaml. A sweep's stages are
// filled from the reports.
absl::StatusOr<std::optional<InferencePerfRun>> FindInferencePerfRun(const std::string& run_dir);

}  // namespace servesim::studies

#endif  // SERVESIM_STUDIES_INFERENCE_PERF_H_
