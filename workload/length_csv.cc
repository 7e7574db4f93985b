// Length-only CSVs (ShareGPT-style statistics; trace_formats.h).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "workload/text_reader.h"
#include "workload/trace_formats.h"

namespace servesim::workload {
namespace {

constexpr absl::string_view kLengthColumns[] = {"num_prefill_tokens",
                                                "num_decode_tokens"};

absl::StatusOr<std::vector<LengthPair>> ReadLengths(CsvReader& csv) {
  RETURN_IF_ERROR(csv.ReadHeader(kLengthColumns));
  std::vector<LengthPair> pairs;
  while (true) {
    ASSIGN_OR_RETURN(const bool more, csv.Next());
    if (!more) break;
    const int64_t line = csv.line_number();
    LengthPair pair;
    ASSIGN_OR_RETURN(
        pair.input_tokens,
        ParseCount(csv.path(), line, kLengthColumns[0], csv.field(0), 1));
    ASSIGN_OR_RETURN(
        pair.output_tokens,
        ParseCount(csv.path(), line, kLengthColumns[1], csv.field(1), 1));
    pairs.push_back(pair);
  }
  return pairs;
}

}  // namespace

absl::StatusOr<std::vector<LengthPair>> ParseLengthCsvContent(absl::string_view content,
                                                              const std::string& name) {
  CsvReader csv(name, MemoryLines(content));
  return ReadLengths(csv);
}

absl::StatusOr<std::vector<LengthPair>> ReadLengthCsv(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<LineReader> lines, FileLines(path));
  CsvReader csv(path, std::move(lines));
  return ReadLengths(csv);
}

}  // namespace servesim::workload
