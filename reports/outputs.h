// Writes a finished (or partial) run's files into its output folder:
// summary.json, run_info.json, timeline.json and report.html, each whole
// (reports/output_dir.h). requests.csv and iterations.csv come from a
// CsvRecordWriter during the run (reports/csv_writer.h). A partial run
// (info.partial) says so in every one of them: summary.json and
// run_info.json ("partial": true, and why), timeline.json (otherData) and
// report.html (its title and first line).
#ifndef SERVESIM_REPORTS_OUTPUTS_H_
#define SERVESIM_REPORTS_OUTPUTS_H_

#include <string>

#include "absl/status/status.h"
#include "metrics/collector.h"
#include "reports/output_dir.h"
#include "reports/summary.h"
#include "scenario/scenario.h"
#include "workload/workload.h"

namespace servesim::reports {

// links.csv: a row per bin of output.link_bin_s simulated seconds (the
// last one ends with the run), a column per link and direction (a
// split-duplex uplink's "up" and "down"): the fraction of the link's
// bandwidth the transfers used in the bin (docs/outputs.md).
std::string LinksCsv(const metrics::MetricsCollector& metrics, double makespan_s);

absl::Status WriteOutputs(const OutputDir& dir, const scenario::ResolvedScenario& sc,
                          const workload::Workload& wl, const metrics::MetricsCollector& metrics,
                          const metrics::Summary& s, const RunInfo& info);

}  // namespace servesim::reports

#endif  // SERVESIM_REPORTS_OUTPUTS_H_
