// One trace row at a time, in file order (internal to workload/): the
// interface each trace format implements, so the whole-file readers
// (trace_formats.h) and the streamed run (trace_source.cc) share one parser
// per format.
#ifndef SERVESIM_WORKLOAD_ROW_READER_H_
#define SERVESIM_WORKLOAD_ROW_READER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "workload/text_reader.h"
#include "workload/trace_formats.h"

namespace servesim::workload {

// A row as a reader parses it, in file order.
struct RawRow {
  double timestamp_s = 0;    // Azure, BurstGPT; Mooncake: timestamp_ms / 1000
  int64_t timestamp_ms = 0;  // Mooncake
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  int64_t line = 0;
  PromptContent content;
};

class RowReader {
 public:
  virtual ~RowReader() = default;
  // False after the last row.
  virtual absl::StatusOr<bool> Next(RawRow& row) = 0;
  // Rows the format defines as failed requests, skipped so far.
  int64_t skipped_failed() const { return skipped_failed_; }

 protected:
  int64_t skipped_failed_ = 0;
};

// Drains `rows` into a TraceFile (file order).
absl::StatusOr<TraceFile> DrainRows(RowReader& rows);

// The Azure header, which also tells an Azure CSV apart from others.
inline constexpr absl::string_view kAzureColumns[] = {"TIMESTAMP", "ContextTokens",
                                                      "GeneratedTokens"};

// Each format's reader over `lines` (the header is read here, so a missing
// column is reported at once).
absl::StatusOr<std::unique_ptr<RowReader>> OpenAzureRows(const std::string& path,
                                                         std::unique_ptr<LineReader> lines);
std::unique_ptr<RowReader> OpenMooncakeRows(const std::string& path,
                                            std::unique_ptr<LineReader> lines);
absl::StatusOr<std::unique_ptr<RowReader>> OpenBurstGptRows(const std::string& path,
                                                            std::unique_ptr<LineReader> lines);
absl::StatusOr<std::unique_ptr<RowReader>> OpenCsvRows(const std::string& path,
                                                       std::unique_ptr<LineReader> lines);
std::unique_ptr<RowReader> OpenTokenIdsRows(const std::string& path,
                                            std::unique_ptr<LineReader> lines);
// Mooncake, with `hash_block_tokens` prompt tokens per hash id.
std::unique_ptr<RowReader> OpenMooncakeRows(const std::string& path,
                                            std::unique_ptr<LineReader> lines,
                                            int64_t hash_block_tokens);

// Mooncake: the k-th (0-based) of the n requests sharing millisecond `ms`
// arrives at ms + k/n ms, so equal timestamps do not become one burst.
double SpreadInBucket(int64_t ms, size_t k, size_t n);

}  // namespace servesim::workload

#endif  // SERVESIM_WORKLOAD_ROW_READER_H_
