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
#include "absl/strings/ascii.h"
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
  // Takes ownership of `file`; `gzip`: its bytes are gzip-compressed.
  LineReader(std::string path, std::FILE* file, bool gzip = false);
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

  // Reads up to n bytes of the file (decompressed for gzip) into out.
  absl::StatusOr<size_t> ReadChunk(char* out, size_t n);

  std::string path_;
  std::FILE* file_ = nullptr;  // null: data_ is the whole content
  void* gz_ = nullptr;         // zlib's gzFile over file_'s descriptor, for gzip
  std::string buffer_;         // file: the unread part plus one chunk
  absl::string_view data_;
  size_t pos_ = 0;      // start of the unread part of data_
  size_t scanned_ = 0;  // bytes after pos_ known to hold no newline
  bool eof_ = false;
  bool bom_checked_ = false;
  int64_t line_number_ = 0;
};

std::unique_ptr<LineReader> MemoryLines(absl::string_view content);
// Lines of the file at `path`; a name ending in ".gz" is read through gzip.
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
  // `optional` columns may be missing: has(i) says which are there (their
  // indices follow the required ones').
  absl::Status ReadHeader(absl::Span<const absl::string_view> columns,
                          absl::Span<const absl::string_view> optional = {});

  // Advances to the next data row; false after the last. A file with a
  // header and no rows is an error: there is nothing to simulate.
  absl::StatusOr<bool> Next();

  // The i-th wanted column of the current row.
  absl::string_view field(size_t i) const { return fields_[index_[i]]; }
  bool has(size_t i) const { return index_[i] != kMissing; }
  int64_t line_number() const { return lines_->line_number(); }
  const std::string& path() const { return path_; }

 private:
  absl::Status Split(absl::string_view line);
  static constexpr size_t kMissing = static_cast<size_t>(-1);

  std::string path_;
  std::unique_ptr<LineReader> lines_;
  std::string header_;
  size_t num_fields_ = 0;
  std::vector<size_t> index_;
  std::vector<absl::string_view> fields_;
  int64_t data_rows_ = 0;
};

// A cursor over one line of JSON. Mooncake lines are flat objects, so this
// handles exactly what they need (strings, numbers, arrays) plus nested
// values and literals so that unknown keys of any kind can be skipped.
class JsonCursor {
 public:
  explicit JsonCursor(absl::string_view text) : text_(text) {}

  void SkipSpace() {
    while (pos_ < text_.size() &&
           absl::ascii_isspace(static_cast<unsigned char>(text_[pos_]))) {
      ++pos_;
    }
  }
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }
  bool Consume(char c) {
    SkipSpace();
    if (Peek() != c) return false;
    ++pos_;
    return true;
  }

  // A string's raw content (escapes left as written: the keys we look for
  // have none).
  bool String(absl::string_view& out) {
    SkipSpace();
    if (Peek() != '"') return false;
    const size_t start = ++pos_;
    while (pos_ < text_.size() && text_[pos_] != '"') {
      pos_ += text_[pos_] == '\\' ? 2 : 1;
    }
    if (pos_ >= text_.size()) return false;
    out = text_.substr(start, pos_ - start);
    ++pos_;
    return true;
  }

  // Skips one value and returns its raw text.
  bool Value(absl::string_view& raw, int depth = 0) {
    SkipSpace();
    const size_t start = pos_;
    if (depth > 32) return false;  // bounds the recursion on hostile input
    const char c = Peek();
    if (c == '"') {
      absl::string_view ignored;
      if (!String(ignored)) return false;
    } else if (c == '[' || c == '{') {
      const bool object = c == '{';
      const char close = object ? '}' : ']';
      ++pos_;
      if (!Consume(close)) {
        do {
          absl::string_view ignored;
          if (object && (!String(ignored) || !Consume(':'))) return false;
          if (!Value(ignored, depth + 1)) return false;
        } while (Consume(','));
        if (!Consume(close)) return false;
      }
    } else {
      // Numbers and the literals true/false/null: a run of token bytes,
      // checked by whoever uses the value.
      while (pos_ < text_.size() &&
             (absl::ascii_isalnum(static_cast<unsigned char>(text_[pos_])) ||
              text_[pos_] == '-' || text_[pos_] == '+' || text_[pos_] == '.')) {
        ++pos_;
      }
      if (pos_ == start) return false;
    }
    raw = text_.substr(start, pos_ - start);
    return true;
  }

  size_t column() const { return pos_ + 1; }

 private:
  absl::string_view text_;
  size_t pos_ = 0;
};

// The raw values of `keys` in the flat JSON object `line` (line
// `line_number` of `path`): values[i] is empty when keys[i] is absent. Other
// keys, of any kind, are skipped. Errors (malformed JSON with its column, a
// duplicate key) name the file and line and end with `format`, what the file
// should hold.
absl::Status ReadJsonObject(absl::string_view path, int64_t line_number, absl::string_view line,
                            absl::Span<const absl::string_view> keys, absl::string_view format,
                            std::vector<absl::string_view>* values);

// A JSON array of integers in [0, 2^63) into `out`; false if `raw` is not one.
bool ParseIdArray(absl::string_view raw, std::vector<uint64_t>* out);

}  // namespace servesim::workload

#endif  // SERVESIM_WORKLOAD_TEXT_READER_H_
