// Text input shared by the trace readers (internal to workload/): lines
// read incrementally from a file or from memory, plain comma-separated
// rows with columns found by header name, strict number parsing, and the
// `file:line: ...` error form every reader uses.
//
// Memory: a LineReader over a file holds one 64 KiB chunk plus the longest
// line (at most 64 MiB; a longer one is RESOURCE_EXHAUSTED naming the line),
// whatever the file's size.
#ifndef SERVESIM_WORKLOAD_TEXT_READER_H_
#define SERVESIM_WORKLOAD_TEXT_READER_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace servesim::workload {

// The most tokens one request may have in its prompt or its output: 2^31 - 1.
// Models allow at most 2^24 positions (longer requests are counted as
// rejected); the limit keeps sums and byte counts of token counts inside
// int64 (5e18 input tokens overflowed the request's wire size in bytes).
inline constexpr int64_t kMaxTokens = 2147483647;

// INVALID_ARGUMENT "path:line: what".
absl::Status LineError(absl::string_view path, int64_t line, absl::string_view what);

// A field as it appears in an error message: quoted, escaped so control
// bytes cannot garble the terminal, and cut short so one bad multi-megabyte
// line does not flood it.
std::string Quoted(absl::string_view field);

// Opens `path` for reading; the errors name the file and what is wrong
// (NOT_FOUND, PERMISSION_DENIED, ... from errno; a directory is
// INVALID_ARGUMENT).
absl::StatusOr<std::FILE*> OpenForReading(const std::string& path);

// Splits text into lines, dropping the `\n` or `\r\n` terminator, so the
// readers accept files written on Windows (the Azure traces use CRLF) and
// files with or without a final newline. Counts lines from 1. Reads either
// content already in memory or a file, 64 KiB at a time. A line is a view
// valid until the next call. A UTF-8 byte order mark is skipped.
class LineReader {
 public:
  explicit LineReader(absl::string_view content) : data_(content) {}
  // Takes ownership of `file`.
  LineReader(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {}
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // Next line that is not blank (blank lines, e.g. the empty line after a
  // final newline, carry no data); false at the end of the content.
  absl::StatusOr<bool> NextNonBlank(absl::string_view& line);

  // 1-based number of the line NextNonBlank returned last.
  int64_t line_number() const { return line_number_; }

 private:
  static constexpr size_t kChunkBytes = size_t{1} << 16;
  static constexpr size_t kMaxLineBytes = size_t{64} << 20;

  // Keeps the unread part and appends one chunk of the file.
  absl::Status Refill();

  std::string path_;
  std::FILE* file_ = nullptr;  // null: data_ is the whole content
  std::string buffer_;         // file: the unread part plus one chunk
  absl::string_view data_;
  size_t pos_ = 0;      // start of the unread part of data_
  size_t scanned_ = 0;  // bytes after pos_ known to hold no newline
  bool eof_ = false;
  bool bom_checked_ = false;
  int64_t line_number_ = 0;
};

std::unique_ptr<LineReader> MemoryLines(absl::string_view content);
absl::StatusOr<std::unique_ptr<LineReader>> FileLines(const std::string& path);

// Strict integer parse: the whole (whitespace-trimmed) field must be the
// number, so "12abc" or "1.5" is an error rather than 12 or 1.
bool ParseInt64(absl::string_view text, int64_t& value);
// The same for a finite double ("inf" and "nan" are refused).
bool ParseDouble(absl::string_view text, double& value);

// Parses a token count in [`min`, kMaxTokens], naming `column` on error.
absl::StatusOr<int64_t> ParseCount(absl::string_view path, int64_t line, absl::string_view column,
                                   absl::string_view field, int64_t min);

// Reads a comma-separated file without quoting, finding the wanted columns
// by header name (BurstGPT added columns over time; ShareGPT stats files
// carry extra ones). A `"` anywhere is rejected: a quoted field holding a
// comma would otherwise shift every later column silently.
class CsvReader {
 public:
  CsvReader(absl::string_view path, std::unique_ptr<LineReader> lines)
      : path_(path), lines_(std::move(lines)) {}

  // Reads the header line and locates `columns`; on error names them all.
  absl::Status ReadHeader(absl::Span<const absl::string_view> columns);

  // Advances to the next data row; false after the last. A file with a
  // header and no rows is an error: there is nothing to simulate.
  absl::StatusOr<bool> Next();

  // The i-th wanted column of the current row.
  absl::string_view field(size_t i) const { return fields_[index_[i]]; }
  int64_t line_number() const { return lines_->line_number(); }
  const std::string& path() const { return path_; }

 private:
  absl::Status Split(absl::string_view line);

  std::string path_;
  std::unique_ptr<LineReader> lines_;
  std::string header_;
  size_t num_fields_ = 0;
  std::vector<size_t> index_;
  std::vector<absl::string_view> fields_;
  int64_t data_rows_ = 0;
};

}  // namespace servesim::workload

#endif  // SERVESIM_WORKLOAD_TEXT_READER_H_
