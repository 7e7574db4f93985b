// Mooncake JSONL traces (trace_formats.h).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "workload/row_reader.h"
#include "workload/text_reader.h"
#include "workload/trace_formats.h"

namespace servesim::workload {
namespace {

constexpr absl::string_view kMooncakeFormat =
    "expected one flat JSON object per line with keys timestamp (ms), "
    "input_length, output_length and optionally hash_ids";

// Tokens per hash id in the Mooncake traces (their KV block; Qin et al.,
// "Mooncake", FAST'25, §4 and the trace's README).
constexpr int64_t kMooncakeBlockTokens = 512;


// One flat JSON object per line.
class MooncakeRows : public RowReader {
 public:
  MooncakeRows(const std::string& path, std::unique_ptr<LineReader> lines,
               int64_t hash_block_tokens)
      : path_(path), lines_(std::move(lines)), hash_block_tokens_(hash_block_tokens) {}

  absl::StatusOr<bool> Next(RawRow& row) override {
    absl::string_view line;
    ASSIGN_OR_RETURN(const bool found, lines_->NextNonBlank(line));
    if (!found) {
      if (rows_ == 0) {
        return LineError(path_, lines_->line_number() + 1,
                         absl::StrCat("no data rows (", kMooncakeFormat, ")"));
      }
      return false;
    }
    const int64_t line_number = lines_->line_number();
    static constexpr absl::string_view kKeys[4] = {"timestamp", "input_length", "output_length",
                                                   "hash_ids"};
    RETURN_IF_ERROR(ReadJsonObject(path_, line_number, line, kKeys, kMooncakeFormat, &values_));
    const std::vector<absl::string_view>& values = values_;
    for (int i = 0; i < 3; ++i) {
      if (values[i].empty()) {
        return LineError(
            path_, line_number,
            absl::StrCat("no \"", kKeys[i], "\" key (", kMooncakeFormat, ")"));
      }
    }
    row.content = PromptContent{};
    if (!values[3].empty()) {
      row.content.kind = PromptContent::Kind::kUnits;
      row.content.unit_tokens = hash_block_tokens_;
      if (!ParseIdArray(values[3], &row.content.ids)) {
        return LineError(path_, line_number,
                         absl::StrCat("hash_ids is ", Quoted(values[3]),
                                      "; expected an array of integers >= 0"));
      }
    }
    if (!ParseInt64(values[0], row.timestamp_ms) || row.timestamp_ms < 0) {
      return LineError(path_, line_number,
                       absl::StrCat("timestamp is ", Quoted(values[0]),
                                    "; expected an integer number of "
                                    "milliseconds >= 0"));
    }
    ASSIGN_OR_RETURN(
        row.input_tokens,
        ParseCount(path_, line_number, "input_length", values[1], 1));
    ASSIGN_OR_RETURN(
        row.output_tokens,
        ParseCount(path_, line_number, "output_length", values[2], 1));
    row.timestamp_s = static_cast<double>(row.timestamp_ms) / 1000.0;
    row.line = line_number;
    ++rows_;
    return true;
  }

 private:
  std::string path_;
  std::unique_ptr<LineReader> lines_;
  int64_t hash_block_tokens_;
  std::vector<absl::string_view> values_;
  int64_t rows_ = 0;
};

// The whole file, rows in file order, each millisecond bucket spread in
// file order wherever its rows sit (the stream needs them within the
// reorder window; this whole-file form does not).
absl::StatusOr<TraceFile> DrainMooncake(RowReader& rows) {
  std::vector<RawRow> parsed;
  RawRow raw;
  while (true) {
    ASSIGN_OR_RETURN(const bool more, rows.Next(raw));
    if (!more) break;
    parsed.push_back(raw);
  }
  std::vector<size_t> order(parsed.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return parsed[a].timestamp_ms < parsed[b].timestamp_ms;
  });
  TraceFile trace;
  trace.rows.resize(parsed.size());
  for (size_t begin = 0; begin < order.size();) {
    const int64_t ms = parsed[order[begin]].timestamp_ms;
    size_t end = begin;
    while (end < order.size() && parsed[order[end]].timestamp_ms == ms) ++end;
    for (size_t k = begin; k < end; ++k) {
      const RawRow& p = parsed[order[k]];
      TraceRow& row = trace.rows[order[k]];
      row.timestamp_s = SpreadInBucket(ms, k - begin, end - begin);
      row.input_tokens = p.input_tokens;
      row.output_tokens = p.output_tokens;
      row.content = p.content;
    }
    begin = end;
  }
  return trace;
}

}  // namespace

double SpreadInBucket(int64_t ms, size_t k, size_t n) {
  return (static_cast<double>(ms) +
          static_cast<double>(k) / static_cast<double>(n)) /
         1000.0;
}

std::unique_ptr<RowReader> OpenMooncakeRows(const std::string& path,
                                            std::unique_ptr<LineReader> lines,
                                            int64_t hash_block_tokens) {
  return std::make_unique<MooncakeRows>(path, std::move(lines), hash_block_tokens);
}

std::unique_ptr<RowReader> OpenMooncakeRows(const std::string& path,
                                            std::unique_ptr<LineReader> lines) {
  return OpenMooncakeRows(path, std::move(lines), kMooncakeBlockTokens);
}

absl::StatusOr<TraceFile> ParseMooncakeTrace(absl::string_view content,
                                             const std::string& name) {
  MooncakeRows rows(name, MemoryLines(content), kMooncakeBlockTokens);
  return DrainMooncake(rows);
}

absl::StatusOr<TraceFile> ReadMooncakeTrace(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<LineReader> lines, FileLines(path));
  MooncakeRows rows(path, std::move(lines), kMooncakeBlockTokens);
  return DrainMooncake(rows);
}

}  // namespace servesim::workload
