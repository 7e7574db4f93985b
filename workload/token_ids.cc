// Token-id JSONL traces (trace_formats.h): one request per line with
// input_toks, output_toks, arrival_time_ns and optionally input_tok_ids.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "workload/prefix.h"
#include "workload/row_reader.h"
#include "workload/text_reader.h"
#include "workload/trace_formats.h"

namespace servesim::workload {
namespace {

constexpr absl::string_view kFormat =
    "expected one JSON object per line with keys input_toks, output_toks, arrival_time_ns "
    "(ns) and optionally input_tok_ids";

class TokenIdsRows : public RowReader {
 public:
  TokenIdsRows(const std::string& path, std::unique_ptr<LineReader> lines)
      : path_(path), lines_(std::move(lines)) {}

  absl::StatusOr<bool> Next(RawRow& row) override {
    absl::string_view line;
    ASSIGN_OR_RETURN(const bool found, lines_->NextNonBlank(line));
    if (!found) {
      if (rows_ == 0) {
        return LineError(path_, lines_->line_number() + 1,
                         absl::StrCat("no data rows (", kFormat, ")"));
      }
      return false;
    }
    const int64_t n = lines_->line_number();
    static constexpr absl::string_view kKeys[4] = {"input_toks", "output_toks", "arrival_time_ns",
                                                   "input_tok_ids"};
    RETURN_IF_ERROR(ReadJsonObject(path_, n, line, kKeys, kFormat, &values_));
    for (int i = 0; i < 3; ++i) {
      if (values_[i].empty()) {
        return LineError(path_, n, absl::StrCat("no \"", kKeys[i], "\" key (", kFormat, ")"));
      }
    }
    ASSIGN_OR_RETURN(row.input_tokens, ParseCount(path_, n, kKeys[0], values_[0], 1));
    ASSIGN_OR_RETURN(row.output_tokens, ParseCount(path_, n, kKeys[1], values_[1], 1));
    int64_t ns = 0;
    if (!ParseInt64(values_[2], ns) || ns < 0) {
      return LineError(path_, n,
                       absl::StrCat("arrival_time_ns is ", Quoted(values_[2]),
                                    "; expected an integer number of nanoseconds >= 0"));
    }
    // Whole seconds and the remainder apart, so large times keep their
    // nanoseconds through the one conversion.
    row.timestamp_s =
        static_cast<double>(ns / 1000000000) + static_cast<double>(ns % 1000000000) * 1e-9;
    row.content = PromptContent{};
    if (!values_[3].empty()) {
      row.content.kind = PromptContent::Kind::kUnits;
      row.content.unit_tokens = 1;
      if (!ParseIdArray(values_[3], &row.content.ids)) {
        return LineError(path_, n, absl::StrCat("input_tok_ids is ", Quoted(values_[3]),
                                                "; expected an array of integers >= 0"));
      }
      if (static_cast<int64_t>(row.content.ids.size()) != row.input_tokens) {
        return LineError(path_, n,
                         absl::StrCat("input_tok_ids has ", row.content.ids.size(),
                                      " tokens but input_toks is ", row.input_tokens,
                                      "; expected one id per prompt token"));
      }
    }
    row.line = n;
    ++rows_;
    return true;
  }

 private:
  std::string path_;
  std::unique_ptr<LineReader> lines_;
  std::vector<absl::string_view> values_;
  int64_t rows_ = 0;
};

}  // namespace

std::unique_ptr<RowReader> OpenTokenIdsRows(const std::string& path,
                                            std::unique_ptr<LineReader> lines) {
  return std::make_unique<TokenIdsRows>(path, std::move(lines));
}

absl::StatusOr<TraceFile> ParseTokenIdsTrace(absl::string_view content, const std::string& name) {
  TokenIdsRows rows(name, MemoryLines(content));
  return DrainRows(rows);
}

absl::StatusOr<TraceFile> ReadTokenIdsTrace(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<LineReader> lines, FileLines(path));
  TokenIdsRows rows(path, std::move(lines));
  return DrainRows(rows);
}

}  // namespace servesim::workload
