// Replaying a measured serving run: a folder holding
//   setup.json   the engine, model, GPU, parallelism and engine knobs
//                (scalars, or {"value": ..., "recorded": false, "basis": ...}
//                where the run did not record the knob itself);
//   trace.csv    arrival_s,input_tokens,output_tokens, one row per request;
//   truth.csv    optional: the measured per-request latencies (request_id,
//                arrival_s, ttft_s, e2e_s, tpot_s, tokens, input_tokens,
//                finish_s, ...), in the trace's order;
//   timeseries.csv or raw/timeseries.csv  optional: the engine's running
//                and waiting requests over time (t, running, waiting).
// PrepareReplay maps it to a scenario (model and GPU presets, vLLM v1
// engine knobs) and the workload to run; CompareWithTruth and the charts
// set the simulated run's requests.csv beside the measured one.
// `servesim replay` (services/commands/replay.cc) runs it; docs/fidelity.md
// shows the results. The parts: replay_setup.cc (setup.json to scenario),
// replay_workload.cc (the trace the scenario reads), replay_compare.cc and
// replay_plots.cc, over replay_files.h (the files and CSV tables).
#ifndef SERVESIM_STUDIES_REPLAY_H_
#define SERVESIM_STUDIES_REPLAY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace servesim::studies {

struct ReplaySetup {
  std::string scenario_text;  // protobuf text of the scenario to run
  // What the run did not record and the replay assumed (knob defaults, the
  // basis a setup gives for an unrecorded value, a shared prefix): listed
  // in run_info.json and warned about.
  std::vector<std::string> assumptions;
  std::string workload_note;  // a workload the replay built: where it came from
  std::string workload_path;  // the trace the scenario reads
  std::string truth_path;       // empty: none
  std::string timeseries_path;  // empty: none
  int64_t requests = 0;
  bool token_ids = false;  // prompts' token ids found (prefix caching sees them)
};

// Reads `run_dir`'s setup.json and trace.csv and writes the workload the
// scenario reads into `out_dir` where it needs one (the trace merged with
// the prompts' token ids when the run's workload file is found beside the
// run, or with a shared prefix the client generated). `sets` are the
// --set overrides the run will apply: with model.preset or
// cluster.xpu.preset among them, setup.json's model or GPU is not needed
// (e.g. a run that did not record its GPU). Errors name the file and the
// field.
// A workload the replay built itself instead of the run's trace.csv (from
// an inference-perf config, studies/inference_perf.h): a CSV trace
// (arrival_s, input_tokens, output_tokens, prefix_group, prefix_tokens,
// prompt_id), where it came from, and the client's concurrency limit
// (workload.max_in_flight; 0: none).
struct BuiltWorkload {
  std::string trace_path;
  std::string note;
  int64_t max_in_flight = 0;
};
struct ReplayOptions {
  const BuiltWorkload* built = nullptr;  // null: the run's trace.csv
  // Where else the prompts' token-id file setup.json names may be
  // (`servesim replay --workloads DIR`): as named, then by its file name.
  std::string workloads_dir;
};
absl::StatusOr<ReplaySetup> PrepareReplay(const std::string& run_dir, const std::string& out_dir,
                                          const std::vector<std::string>& sets,
                                          const ReplayOptions& options = {});

// One line of replay_compare.csv.
struct CompareRow {
  std::string metric, stat;  // e.g. "ttft_s", "p90"; "makespan_s", "value"
  double measured = 0, simulated = 0;
  double error_pct() const;  // 100 (simulated - measured) / measured
};

// truth.csv read and checked against the trace as CompareWithTruth does,
// before a replay simulates: a bad truth.csv fails before any output.
absl::Status CheckTruth(const std::string& truth_path, const std::string& trace_path);

// The measured (truth.csv) and simulated (requests.csv) runs compared:
// ttft_s, tpot_s, e2e_s x mean, p50, p90, p99 (percentiles as numpy's
// default, over requests with a TPOT: more than one output token), then
// makespan_s (last finish) and output_tokens_per_s. The files must hold the
// same requests in the same order (truth's arrival_s and input_tokens
// against the trace's): INVALID_ARGUMENT names the first mismatch.
absl::StatusOr<std::vector<CompareRow>> CompareWithTruth(const std::string& truth_path,
                                                         const std::string& trace_path,
                                                         const std::string& requests_path);

// replay_compare.csv's text, and the table `servesim replay` prints.
std::string CompareCsv(const std::vector<CompareRow>& rows);
std::string CompareTable(const std::vector<CompareRow>& rows);

// SVG: each request's simulated against measured end-to-end latency, with
// the y = x line.
absl::StatusOr<std::string> E2eScatterSvg(const std::string& truth_path,
                                          const std::string& requests_path);
// SVG: running and waiting requests over time, simulated (iterations.csv,
// sampled each second as the engine's logger does) and measured.
absl::StatusOr<std::string> QueueOverTimeSvg(const std::string& iterations_path,
                                             const std::string& timeseries_path);

}  // namespace servesim::studies

#endif  // SERVESIM_STUDIES_REPLAY_H_
