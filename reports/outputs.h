// Writes a finished (or partial) run's files into its output folder:
// summary.json, run_info.json, timeline.json and report.html.
// requests.csv and iterations.csv come from a CsvRecordWriter during the
// run (reports/csv_writer.h).
#ifndef SERVESIM_REPORTS_OUTPUTS_H_
#define SERVESIM_REPORTS_OUTPUTS_H_

#include <string>

#include "absl/status/status.h"
#include "metrics/collector.h"
#include "reports/summary.h"
#include "scenario/scenario.h"
#include "workload/workload.h"

namespace servesim::reports {

// Creates `dir` if missing.
absl::Status WriteOutputs(const std::string& dir, const scenario::ResolvedScenario& sc,
                          const workload::Workload& wl, const metrics::MetricsCollector& metrics,
                          const metrics::Summary& s, const RunInfo& info);

}  // namespace servesim::reports

#endif  // SERVESIM_REPORTS_OUTPUTS_H_
