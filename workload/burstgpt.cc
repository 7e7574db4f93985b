// BurstGPT CSV traces (trace_formats.h).
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "workload/row_reader.h"
#include "workload/text_reader.h"
#include "workload/trace_formats.h"

namespace servesim::workload {
namespace {

constexpr absl::string_view kBurstGptColumns[] = {"Timestamp", "Request tokens",
                                                  "Response tokens"};


class BurstGptRows : public RowReader {
 public:
  static absl::StatusOr<std::unique_ptr<RowReader>> Open(
      const std::string& path, std::unique_ptr<LineReader> lines) {
    auto reader = std::make_unique<BurstGptRows>(path, std::move(lines));
    RETURN_IF_ERROR(reader->csv_.ReadHeader(kBurstGptColumns));
    return std::unique_ptr<RowReader>(std::move(reader));
  }
  BurstGptRows(const std::string& path, std::unique_ptr<LineReader> lines)
      : path_(path), csv_(path, std::move(lines)) {}

  absl::StatusOr<bool> Next(RawRow& row) override {
    while (true) {
      ASSIGN_OR_RETURN(const bool more, csv_.Next());
      if (!more) return false;
      const int64_t line = csv_.line_number();
      if (!ParseDouble(csv_.field(0), row.timestamp_s) || row.timestamp_s < 0) {
        return LineError(path_, line,
                         absl::StrCat("Timestamp is ", Quoted(csv_.field(0)),
                                      "; expected a number of seconds >= 0"));
      }
      // 0 is legal in both token columns here: it marks a failed request.
      ASSIGN_OR_RETURN(row.input_tokens,
                       ParseCount(path_, line, "Request tokens", csv_.field(1), 0));
      ASSIGN_OR_RETURN(
          row.output_tokens,
          ParseCount(path_, line, "Response tokens", csv_.field(2), 0));
      if (row.output_tokens == 0) {
        ++skipped_failed_;
        continue;
      }
      if (row.input_tokens == 0) {
        return LineError(
            path_, line,
            absl::StrCat("Request tokens is \"0\" but Response tokens is ",
                         row.output_tokens,
                         "; expected Request tokens >= 1 for a request that "
                         "produced a response (0 response tokens marks a "
                         "failed request)"));
      }
      row.line = line;
      return true;
    }
  }

 private:
  std::string path_;
  CsvReader csv_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RowReader>> OpenBurstGptRows(const std::string& path,
                                                            std::unique_ptr<LineReader> lines) {
  return BurstGptRows::Open(path, std::move(lines));
}

absl::StatusOr<TraceFile> ParseBurstGptTrace(absl::string_view content,
                                             const std::string& name) {
  ASSIGN_OR_RETURN(auto rows, BurstGptRows::Open(name, MemoryLines(content)));
  return DrainRows(*rows);
}

absl::StatusOr<TraceFile> ReadBurstGptTrace(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<LineReader> lines, FileLines(path));
  ASSIGN_OR_RETURN(auto rows, BurstGptRows::Open(path, std::move(lines)));
  return DrainRows(*rows);
}

}  // namespace servesim::workload
