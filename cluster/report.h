// Run outputs: the stdout summary table, summary.json, requests.csv and
// iterations.csv. Every number is printed with a fixed format, so the same
// run gives byte-identical files; wall time never enters them (it goes to
// the table and to run_info.json).
#ifndef SERVESIM_CLUSTER_REPORT_H_
#define SERVESIM_CLUSTER_REPORT_H_

#include <string>

#include "absl/status/status.h"
#include "cluster/metrics.h"
#include "cluster/scenario.h"
#include "cluster/workload.h"

namespace servesim::cluster {

struct RunInfo {
  double wall_s = 0;
  double simulated_s = 0;
  // A run that stopped early (e.g. no device agent left): its error. The
  // outputs then hold what was measured until then, and say so.
  bool partial = false;
  std::string error;
  // Device agents: a JSON object of their call counts (memo hits/misses,
  // retries, fail-overs), which differ between in-process and agent runs
  // and so stay out of summary.json. Empty: none.
  std::string agents_json;
};

// A JSON string literal for `s` (quotes and control characters escaped).
std::string JsonString(const std::string& s);

std::string FormatSummaryTable(const ResolvedScenario& sc, const Workload& wl,
                               const Summary& s, const RunInfo& info);
// `partial`: the run stopped early; the file then starts with
// "partial": true (complete runs never have the key).
std::string SummaryJson(const ResolvedScenario& sc, const Workload& wl,
                        const Summary& s, double simulated_s, bool partial = false);

// Writes summary.json, run_info.json and, as the scenario asks,
// requests.csv and iterations.csv into `dir` (created if missing).
absl::Status WriteOutputs(const std::string& dir, const ResolvedScenario& sc,
                          const Workload& wl, const MetricsCollector& metrics,
                          const Summary& s, const RunInfo& info);

}  // namespace servesim::cluster

#endif  // SERVESIM_CLUSTER_REPORT_H_
