// requests.csv and iterations.csv, written row by row during the run as the
// metrics collector hands rows on (in id and (start, replica) order), so
// they need no memory for the whole run.
#ifndef SERVESIM_REPORTS_CSV_WRITER_H_
#define SERVESIM_REPORTS_CSV_WRITER_H_

#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "metrics/records.h"
#include "reports/output_dir.h"
#include "scenario/scenario.h"

namespace servesim::reports {

// requests.csv and iterations.csv as the scenario asks (output.requests_csv,
// output.iterations_csv), written as the collector hands rows on, under
// the folder's temporary names until Close renames them. Rows are only
// ever written whole. A write error is kept and returned by Close.
class CsvRecordWriter : public metrics::RecordSink {
 public:
  // nullptr (no error) when neither file is on. `dir` must outlive the
  // writer.
  static absl::StatusOr<std::unique_ptr<CsvRecordWriter>> Open(
      const OutputDir& dir, const scenario::ResolvedScenario& sc);
  ~CsvRecordWriter() override;
  void OnRequest(const metrics::RequestRecord& r) override;
  void OnIteration(const metrics::IterationRecord& it) override;
  absl::Status Close();

 private:
  struct File {
    std::string name;  // requests.csv
    std::string path;  // while written: the temporary name
    std::FILE* file = nullptr;
    std::string buffer;
  };
  explicit CsvRecordWriter(const OutputDir& dir) : dir_(dir) {}
  void Append(File& f, const std::string& row);
  void Flush(File& f);
  const OutputDir& dir_;
  File requests_, iterations_;
  bool disaggregated_ = false;  // requests.csv's hand-off columns
  absl::Status status_;
};

}  // namespace servesim::reports

#endif  // SERVESIM_REPORTS_CSV_WRITER_H_
