// Run outputs: the stdout summary table, summary.json, requests.csv and
// iterations.csv. Every number is printed with a fixed format, so the same
// run gives byte-identical files; wall time never enters them (it goes to
// the table and to run_info.json). requests.csv and iterations.csv are
// written row by row during the run (CsvRecordWriter), in id and (start,
// replica) order, so they need no memory for the whole run.
#ifndef SERVESIM_CLUSTER_REPORT_H_
#define SERVESIM_CLUSTER_REPORT_H_

#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

// requests.csv and iterations.csv as the scenario asks (output.requests_csv,
// output.iterations_csv), written as the collector hands rows on. A write
// error is kept and returned by Close.
class CsvRecordWriter : public RecordSink {
 public:
  // Creates `dir` if missing; nullptr (no error) when neither file is on.
  static absl::StatusOr<std::unique_ptr<CsvRecordWriter>> Open(const std::string& dir,
                                                               const ResolvedScenario& sc);
  ~CsvRecordWriter() override;
  void OnRequest(const RequestRecord& r) override;
  void OnIteration(const IterationRecord& it) override;
  absl::Status Close();

 private:
  struct File {
    std::string path;
    std::FILE* file = nullptr;
    std::string buffer;
  };
  CsvRecordWriter() = default;
  void Append(File& f, const std::string& row);
  void Flush(File& f);
  File requests_, iterations_;
  absl::Status status_;
};

// Writes summary.json, run_info.json, timeline.json and report.html into
// `dir` (created if missing); requests.csv and iterations.csv come from a
// CsvRecordWriter during the run.
absl::Status WriteOutputs(const std::string& dir, const ResolvedScenario& sc,
                          const Workload& wl, const MetricsCollector& metrics,
                          const Summary& s, const RunInfo& info);

}  // namespace servesim::cluster

#endif  // SERVESIM_CLUSTER_REPORT_H_
