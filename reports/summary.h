// The run's summary: the table printed on stdout, and summary.json. Every
// number is printed with a fixed format, so the same run gives
// byte-identical files; wall time never enters summary.json (it goes to
// the table and to run_info.json, reports/outputs.h).
#ifndef SERVESIM_REPORTS_SUMMARY_H_
#define SERVESIM_REPORTS_SUMMARY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "metrics/collector.h"
#include "scenario/scenario.h"
#include "workload/workload.h"

namespace servesim::reports {

struct RunInfo {
  double wall_s = 0;
  double simulated_s = 0;
  // The times the engines blocked in SimGrid (cluster::RunResult::
  // engine_waits); -1: not known.
  int64_t engine_waits = -1;
  // What the engines told remote devices of the batches they expect
  // (cluster::RunResult::hints): written when any is non-zero.
  int64_t hint_projections = 0, hint_renewals = 0, hint_renewals_alongside = 0;
  // A run that stopped early (e.g. no device agent left): its error. The
  // outputs then hold what was measured until then, and say so.
  bool partial = false;
  std::string error;
  // Device agents: a JSON object of their call counts (memo hits/misses,
  // retries, fail-overs), which differ between in-process and agent runs
  // and so stay out of summary.json. Empty: none.
  std::string agents_json;
  // The xPU's profile bundle: a JSON object of its folder, fingerprint and
  // lookups (answered, beyond the measured grid, with no measured layer).
  // Empty: none.
  std::string profile_json;
  // Collectives costed from measured tables (docs/collectives.md): a JSON
  // object of the preset, the answers within the tables and outside them.
  // Empty: the ring model only.
  std::string collectives_json;
  // workload.max_in_flight: a JSON object of the limit and the requests the
  // clients held back (cluster::RunResult::held). Empty: no limit.
  std::string client_json;
  // Where each class of the xPU's ops takes its time from (profile, fitted
  // or default roofline; collectives' tables or ring). Empty: no xPU spec.
  std::string op_costs_json;
  // Every fallback the run took (ResolvedScenario::fallbacks, and a
  // replay's unrecorded knobs).
  std::vector<std::string> fallbacks;
};

// A JSON string literal for `s` (quotes and control characters escaped).
std::string JsonString(const std::string& s);

std::string FormatSummaryTable(const scenario::ResolvedScenario& sc, const workload::Workload& wl,
                               const metrics::Summary& s, const RunInfo& info);
// `partial`: the run stopped early; the file then starts with
// "partial": true (complete runs never have the key).
std::string SummaryJson(const scenario::ResolvedScenario& sc, const workload::Workload& wl,
                        const metrics::Summary& s, double simulated_s, bool partial = false);

// A figure as the JSON outputs print it: "%.9g" (nine significant digits
// keep every figure meaningful and the text stable); `null` for NaN or an
// infinity, which JSON has no token for (the run's checks keep them out;
// this keeps the file valid JSON should one slip through).
std::string FormatFigure(double v);

}  // namespace servesim::reports

#endif  // SERVESIM_REPORTS_SUMMARY_H_
