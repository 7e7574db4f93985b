// Trace files as a SortedSource: one pass, through a bounded reorder buffer.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "workload/row_reader.h"
#include "workload/sources.h"
#include "workload/text_reader.h"
#include "workload/workload.h"

namespace servesim::workload {
namespace {

constexpr absl::string_view kKnownFormats =
    "known formats: azure (CSV header TIMESTAMP,ContextTokens,"
    "GeneratedTokens), burstgpt (CSV with Timestamp, Request tokens and "
    "Response tokens columns), csv (columns arrival_s, input_tokens, "
    "output_tokens), mooncake (JSONL with timestamp, input_length, "
    "output_length), token ids (JSONL, .jsonl or .jsonl.gz, with input_toks, "
    "output_toks, arrival_time_ns); or set workload.trace.format";

// Picks the format from the file name and the first line: JSON lines are
// Mooncake or token ids by their keys, CSV files are told apart by their
// header.
absl::StatusOr<servesim::v1::TraceFormat> InferFormat(const std::string& path,
                                                      LineReader& lines) {
  const std::string lower = absl::AsciiStrToLower(path);
  absl::string_view header;
  ASSIGN_OR_RETURN(const bool found, lines.NextNonBlank(header));
  if (!found) {
    return LineError(path, 1,
                     absl::StrCat("file is empty (", kKnownFormats, ")"));
  }
  // A compressed file whose name does not say so.
  if (absl::StartsWith(header, "\x1f\x8b")) {
    return absl::InvalidArgumentError(absl::StrCat(
        path,
        ": is gzip-compressed but its name does not end in .gz; rename it (servesim reads "
        "NAME.csv.gz and NAME.jsonl.gz as they are) or gunzip it"));
  }
  if (absl::EndsWith(lower, ".jsonl") || absl::EndsWith(lower, ".json") ||
      absl::EndsWith(lower, ".jsonl.gz") || absl::EndsWith(lower, ".json.gz")) {
    return absl::StrContains(header, "\"input_toks\"") ? servesim::v1::TRACE_FORMAT_TOKEN_IDS
                                                        : servesim::v1::TRACE_FORMAT_MOONCAKE;
  }
  std::vector<absl::string_view> columns;
  for (absl::string_view column : absl::StrSplit(header, ',')) {
    columns.push_back(absl::StripAsciiWhitespace(column));
  }
  if (columns.size() >= 3 && columns[0] == kAzureColumns[0] &&
      columns[1] == kAzureColumns[1] && columns[2] == kAzureColumns[2]) {
    return servesim::v1::TRACE_FORMAT_AZURE;
  }
  auto has = [&](absl::string_view name) {
    return std::find(columns.begin(), columns.end(), name) != columns.end();
  };
  if (has("Timestamp") && has("Response tokens")) {
    return servesim::v1::TRACE_FORMAT_BURSTGPT;
  }
  if (has("arrival_s") && has("input_tokens") && has("output_tokens")) {
    return servesim::v1::TRACE_FORMAT_CSV;
  }
  // A header with some of a format's columns: the missing ones named.
  struct Known {
    const char* format;
    std::vector<absl::string_view> columns;
  };
  const Known known[] = {
      {"azure", {kAzureColumns[0], kAzureColumns[1], kAzureColumns[2]}},
      {"burstgpt", {"Timestamp", "Request tokens", "Response tokens"}},
      {"csv", {"arrival_s", "input_tokens", "output_tokens"}},
  };
  for (const Known& k : known) {
    std::vector<absl::string_view> missing;
    for (absl::string_view c : k.columns) {
      if (!has(c)) missing.push_back(c);
    }
    if (!missing.empty() && missing.size() < k.columns.size()) {
      return LineError(path, lines.line_number(),
                       absl::StrCat("header ", Quoted(header), " looks like a ", k.format,
                                    " trace but lacks the column", missing.size() > 1 ? "s " : " ",
                                    absl::StrJoin(missing, ", "), " (", kKnownFormats, ")"));
    }
  }
  return LineError(path, lines.line_number(),
                   absl::StrCat("cannot infer the trace format from header ",
                                Quoted(header), " (", kKnownFormats, ")"));
}

// A trace file read in one pass. Rows go through a min-heap of at most
// kReorderWindowRows + 1 rows keyed on (rate-scaled time, file position),
// so a file sorted by time comes out unchanged and one out of order by at
// most the window comes out as the whole-file stable sort ordered it. A
// Mooncake millisecond bucket is complete once a later millisecond leaves
// the heap; its rows are then spread over it.
class TraceSource : public SortedSource {
 public:
  TraceSource(std::string path, std::string format_name,
              std::unique_ptr<RowReader> rows, bool mooncake, double rate_scale)
      : path_(std::move(path)),
        format_name_(std::move(format_name)),
        rows_(std::move(rows)),
        mooncake_(mooncake),
        rate_scale_(rate_scale) {}

  absl::StatusOr<bool> Next(TraceRow& row) override {
    if (!mooncake_) {
      Pending p;
      ASSIGN_OR_RETURN(const bool more, NextSorted(p));
      if (!more) return false;
      row = {p.key, p.row.input_tokens, p.row.output_tokens, std::move(p.row.content)};
      ++emitted_;
      return true;
    }
    if (bucket_pos_ >= bucket_.size()) {
      bucket_.clear();
      bucket_pos_ = 0;
      if (!has_pending_) {
        ASSIGN_OR_RETURN(has_pending_, NextSorted(pending_));
        if (!has_pending_) return false;
      }
      const int64_t ms = pending_.row.timestamp_ms;
      bucket_.push_back(pending_.row);
      while (true) {
        ASSIGN_OR_RETURN(has_pending_, NextSorted(pending_));
        if (!has_pending_ || pending_.row.timestamp_ms != ms) break;
        bucket_.push_back(pending_.row);
      }
    }
    RawRow& raw = bucket_[bucket_pos_];
    double t = SpreadInBucket(raw.timestamp_ms, bucket_pos_, bucket_.size());
    if (rate_scale_ != 1.0) t /= rate_scale_;
    row = {t, raw.input_tokens, raw.output_tokens, std::move(raw.content)};
    ++bucket_pos_;
    ++emitted_;
    return true;
  }

  int64_t rows_read() const override {
    return read_ + rows_->skipped_failed();
  }
  int64_t skipped_failed() const override { return rows_->skipped_failed(); }

  std::string Describe() const override {
    std::string text = absl::StrCat(format_name_, " trace ", path_, " (",
                                    rows_read(), " rows");
    if (skipped_failed() > 0) {
      absl::StrAppend(&text, ", ", skipped_failed(), " failed skipped");
    }
    return text + ")";
  }

  absl::Status CheckNotEmpty() const override {
    if (emitted_ > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": all ", skipped_failed(),
        " rows are failed requests (0 response tokens); expected at least "
        "one request to simulate"));
  }

 private:
  struct Pending {
    double key = 0;  // Mooncake: the millisecond; others: scaled seconds
    int64_t seq = 0;
    RawRow row;
  };
  // std::push_heap keeps the largest first; this puts the earliest first.
  static bool Later(const Pending& a, const Pending& b) {
    return a.key != b.key ? a.key > b.key : a.seq > b.seq;
  }

  absl::StatusOr<bool> NextSorted(Pending& out) {
    while (!eof_ && heap_.size() <= static_cast<size_t>(kReorderWindowRows)) {
      Pending p;
      ASSIGN_OR_RETURN(const bool more, rows_->Next(p.row));
      if (!more) {
        eof_ = true;
        break;
      }
      ++read_;
      p.seq = seq_++;
      p.key = mooncake_ ? static_cast<double>(p.row.timestamp_ms)
              : rate_scale_ != 1.0 ? p.row.timestamp_s / rate_scale_
                                   : p.row.timestamp_s;
      if (popped_ && p.key < last_key_) {
        return LineError(
            path_, p.row.line,
            absl::StrCat(
                "arrives at ", Num(p.row.timestamp_s), " s, before line ",
                last_line_, " (", Num(last_time_s_),
                " s), which is more than ", kReorderWindowRows,
                " rows earlier in the file; traces are read in one pass and "
                "must be in time order to within ",
                kReorderWindowRows, " rows (sort the file by time)"));
      }
      heap_.push_back(p);
      std::push_heap(heap_.begin(), heap_.end(), Later);
    }
    if (heap_.empty()) return false;
    std::pop_heap(heap_.begin(), heap_.end(), Later);
    out = heap_.back();
    heap_.pop_back();
    popped_ = true;
    last_key_ = out.key;
    last_line_ = out.row.line;
    last_time_s_ = out.row.timestamp_s;
    return true;
  }

  std::string path_;
  std::string format_name_;
  std::unique_ptr<RowReader> rows_;
  bool mooncake_;
  double rate_scale_;
  std::vector<Pending> heap_;
  bool eof_ = false;
  int64_t seq_ = 0;
  int64_t read_ = 0;     // rows parsed (failed ones excluded)
  int64_t emitted_ = 0;  // rows handed on
  bool popped_ = false;
  double last_key_ = 0;
  int64_t last_line_ = 0;
  double last_time_s_ = 0;
  // Mooncake: the current millisecond bucket and the first row after it.
  std::vector<RawRow> bucket_;
  size_t bucket_pos_ = 0;
  Pending pending_;
  bool has_pending_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SortedSource>> OpenTrace(
    const std::string& path, servesim::v1::TraceFormat format,
    double rate_scale, int64_t hash_block_tokens) {
  if (format == servesim::v1::TRACE_FORMAT_UNSPECIFIED) {
    ASSIGN_OR_RETURN(std::unique_ptr<LineReader> header, FileLines(path));
    ASSIGN_OR_RETURN(format, InferFormat(path, *header));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<LineReader> lines, FileLines(path));
  std::unique_ptr<RowReader> rows;
  std::string name;
  switch (format) {
    case servesim::v1::TRACE_FORMAT_AZURE: {
      ASSIGN_OR_RETURN(rows, OpenAzureRows(path, std::move(lines)));
      name = "azure";
      break;
    }
    case servesim::v1::TRACE_FORMAT_MOONCAKE: {
      rows = OpenMooncakeRows(path, std::move(lines), hash_block_tokens);
      name = "mooncake";
      break;
    }
    case servesim::v1::TRACE_FORMAT_CSV: {
      ASSIGN_OR_RETURN(rows, OpenCsvRows(path, std::move(lines)));
      name = "csv";
      break;
    }
    case servesim::v1::TRACE_FORMAT_TOKEN_IDS: {
      rows = OpenTokenIdsRows(path, std::move(lines));
      name = "token-id";
      break;
    }
    case servesim::v1::TRACE_FORMAT_BURSTGPT: {
      ASSIGN_OR_RETURN(rows, OpenBurstGptRows(path, std::move(lines)));
      name = "burstgpt";
      break;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "workload.trace.format = ", static_cast<int>(format),
          "; expected TRACE_FORMAT_UNSPECIFIED, TRACE_FORMAT_AZURE, "
          "TRACE_FORMAT_MOONCAKE, TRACE_FORMAT_BURSTGPT, TRACE_FORMAT_CSV or "
          "TRACE_FORMAT_TOKEN_IDS"));
  }
  return std::unique_ptr<SortedSource>(std::make_unique<TraceSource>(
      path, name, std::move(rows),
      format == servesim::v1::TRACE_FORMAT_MOONCAKE, rate_scale));
}

}  // namespace servesim::workload
