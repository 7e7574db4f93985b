// Plain CSV traces (trace_formats.h): arrival_s, input_tokens,
// output_tokens, and optionally prefix_group, prefix_tokens, prompt_id.
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "workload/prefix.h"
#include "workload/row_reader.h"
#include "workload/text_reader.h"
#include "workload/trace_formats.h"

namespace servesim::workload {
namespace {

constexpr absl::string_view kColumns[] = {"arrival_s", "input_tokens", "output_tokens"};
constexpr absl::string_view kOptional[] = {"prefix_group", "prefix_tokens", "prompt_id"};

class CsvRows : public RowReader {
 public:
  static absl::StatusOr<std::unique_ptr<RowReader>> Open(const std::string& path,
                                                         std::unique_ptr<LineReader> lines) {
    auto reader = std::make_unique<CsvRows>(path, std::move(lines));
    RETURN_IF_ERROR(reader->csv_.ReadHeader(kColumns, kOptional));
    if (reader->csv_.has(3) != reader->csv_.has(4)) {
      return LineError(path, reader->csv_.line_number(),
                       "has one of prefix_group and prefix_tokens; expected both or neither");
    }
    return std::unique_ptr<RowReader>(std::move(reader));
  }
  CsvRows(const std::string& path, std::unique_ptr<LineReader> lines)
      : path_(path), csv_(path, std::move(lines)) {}

  absl::StatusOr<bool> Next(RawRow& row) override {
    ASSIGN_OR_RETURN(const bool more, csv_.Next());
    if (!more) return false;
    const int64_t line = csv_.line_number();
    if (!ParseDouble(csv_.field(0), row.timestamp_s) || row.timestamp_s < 0) {
      return LineError(path_, line,
                       absl::StrCat("arrival_s is ", Quoted(csv_.field(0)),
                                    "; expected a number of seconds >= 0"));
    }
    ASSIGN_OR_RETURN(row.input_tokens, ParseCount(path_, line, kColumns[1], csv_.field(1), 1));
    ASSIGN_OR_RETURN(row.output_tokens, ParseCount(path_, line, kColumns[2], csv_.field(2), 1));
    row.content = PromptContent{};
    if (csv_.has(3) && !csv_.field(3).empty()) {
      const absl::string_view group = csv_.field(3);
      ASSIGN_OR_RETURN(const int64_t tokens,
                       ParseCount(path_, line, kOptional[1], csv_.field(4), 0));
      if (tokens > row.input_tokens) {
        return LineError(path_, line,
                         absl::StrCat("prefix_tokens is ", tokens, "; expected at most "
                                      "input_tokens (", row.input_tokens, ")"));
      }
      row.content.kind = PromptContent::Kind::kGroup;
      row.content.group = KeyOf(group.data(), group.size());
      row.content.group_tokens = tokens;
    }
    if (csv_.has(5) && !csv_.field(5).empty()) {
      // The whole prompt is the prompt id's (past a group's tokens).
      const absl::string_view prompt = csv_.field(5);
      row.content.kind = PromptContent::Kind::kGroup;
      row.content.has_prompt = true;
      row.content.prompt = KeyOf(prompt.data(), prompt.size());
    }
    row.line = line;
    return true;
  }

 private:
  std::string path_;
  CsvReader csv_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RowReader>> OpenCsvRows(const std::string& path,
                                                       std::unique_ptr<LineReader> lines) {
  return CsvRows::Open(path, std::move(lines));
}

absl::StatusOr<TraceFile> ParseCsvTrace(absl::string_view content, const std::string& name) {
  ASSIGN_OR_RETURN(auto rows, CsvRows::Open(name, MemoryLines(content)));
  return DrainRows(*rows);
}

absl::StatusOr<TraceFile> ReadCsvTrace(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<LineReader> lines, FileLines(path));
  ASSIGN_OR_RETURN(auto rows, CsvRows::Open(path, std::move(lines)));
  return DrainRows(*rows);
}

}  // namespace servesim::workload
