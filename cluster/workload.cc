#include "cluster/workload.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/rng.h"
#include "common/status_macros.h"

namespace servesim::cluster {
namespace {

using scheduler::RequestSpec;

// A typo such as num_requests: 1000000000000 should be an error rather than
// a run that never ends. Ten million requests is far beyond what a run
// simulates (workload.repeat replays more).
constexpr int64_t kMaxGeneratedRequests = 10'000'000;
constexpr int64_t kMaxRepeat = 10'000;

// ------------------------------------------------------------ helpers ----

absl::Status LineError(absl::string_view path, int64_t line,
                       absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ":", line, ": ", what));
}

// A field as it appears in an error message: quoted, escaped so control
// bytes cannot garble the terminal, and cut short so one bad multi-megabyte
// line does not flood it.
std::string Quoted(absl::string_view field) {
  constexpr size_t kMaxShown = 60;
  if (field.size() > kMaxShown) {
    return absl::StrCat("\"", absl::CHexEscape(field.substr(0, kMaxShown)),
                        "...\"");
  }
  return absl::StrCat("\"", absl::CHexEscape(field), "\"");
}

// Reads the whole file at once: the readers then parse string_views into

// Opens `path` for reading; the errors name the file and what is wrong.
absl::StatusOr<std::FILE*> OpenForReading(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    const int err = errno;
    // ENOENT maps to NOT_FOUND, EACCES to PERMISSION_DENIED, and so on.
    return absl::Status(
        absl::ErrnoToStatusCode(err),
        absl::StrCat(path, ": cannot open: ",
                     std::error_code(err, std::generic_category()).message()));
  }
  struct stat info;
  // A directory opens fine with fopen on Linux; say what is wrong rather
  // than let a read fail with EISDIR.
  if (fstat(fileno(file), &info) == 0 && S_ISDIR(info.st_mode)) {
    std::fclose(file);
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": is a directory; expected a trace file"));
  }
  return file;
}

// Splits text into lines, dropping the `\n` or `\r\n` terminator, so the
// readers accept files written on Windows (the Azure traces use CRLF) and
// files with or without a final newline. Counts lines from 1. Reads either
// content already in memory or a file, 64 KiB at a time: memory is one
// chunk plus the longest line (at most kMaxLineBytes), whatever the file's
// size. A line is a view valid until the next call.
class LineReader {
 public:
  explicit LineReader(absl::string_view content) : data_(content) {}
  // Takes ownership of `file`.
  LineReader(std::string path, std::FILE* file)
      : path_(std::move(path)), file_(file) {}
  ~LineReader() {
    if (file_ != nullptr) std::fclose(file_);
  }
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // Next line that is not blank (blank lines, e.g. the empty line after a
  // final newline, carry no data); false at the end of the content.
  absl::StatusOr<bool> NextNonBlank(absl::string_view& line) {
    while (true) {
      const absl::string_view rest = data_.substr(pos_);
      const size_t newline = rest.find('\n', scanned_);
      if (newline == absl::string_view::npos && file_ != nullptr && !eof_) {
        scanned_ = rest.size();
        RETURN_IF_ERROR(Refill());
        continue;
      }
      scanned_ = 0;
      if (!bom_checked_) {
        // A UTF-8 byte order mark would otherwise stick to the first column
        // name. The first line is whole in data_ by now.
        bom_checked_ = true;
        if (absl::StartsWith(rest, "\xEF\xBB\xBF")) pos_ += 3;
        continue;
      }
      if (rest.empty()) return false;
      if (newline == absl::string_view::npos) {
        line = rest;
        pos_ = data_.size();
      } else {
        line = rest.substr(0, newline);
        pos_ += newline + 1;
      }
      ++line_number_;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (!absl::StripAsciiWhitespace(line).empty()) return true;
    }
  }

  // 1-based number of the line NextNonBlank returned last.
  int64_t line_number() const { return line_number_; }

 private:
  static constexpr size_t kChunkBytes = size_t{1} << 16;
  static constexpr size_t kMaxLineBytes = size_t{64} << 20;

  // Keeps the unread part and appends one chunk of the file.
  absl::Status Refill() {
    const size_t keep = data_.size() - pos_;
    if (keep > kMaxLineBytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          path_, ":", line_number_ + 1, ": line longer than ",
          kMaxLineBytes >> 20, " MiB; expected one trace row per line"));
    }
    buffer_.erase(0, pos_);
    pos_ = 0;
    buffer_.resize(keep + kChunkBytes);
    const size_t n = std::fread(buffer_.data() + keep, 1, kChunkBytes, file_);
    buffer_.resize(keep + n);
    data_ = buffer_;
    if (n < kChunkBytes) {
      if (std::ferror(file_) != 0) {
        const int err = errno;
        return absl::Status(
            absl::ErrnoToStatusCode(err),
            absl::StrCat(path_, ": cannot read: ",
                         std::error_code(err, std::generic_category()).message()));
      }
      eof_ = true;
    }
    return absl::OkStatus();
  }

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

std::unique_ptr<LineReader> MemoryLines(absl::string_view content) {
  return std::make_unique<LineReader>(content);
}

absl::StatusOr<std::unique_ptr<LineReader>> FileLines(const std::string& path) {
  ASSIGN_OR_RETURN(std::FILE* file, OpenForReading(path));
  return std::make_unique<LineReader>(path, file);
}


// Strict integer parse: the whole (whitespace-trimmed) field must be the
// number, so "12abc" or "1.5" is an error rather than 12 or 1.
bool ParseInt64(absl::string_view text, int64_t& value) {
  text = absl::StripAsciiWhitespace(text);
  if (text.empty()) return false;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  return ec == std::errc() && ptr == end;
}

bool ParseDouble(absl::string_view text, double& value) {
  text = absl::StripAsciiWhitespace(text);
  if (text.empty()) return false;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  // from_chars accepts "inf" and "nan"; no timestamp can be either.
  return ec == std::errc() && ptr == end && std::isfinite(value);
}

// The most tokens one request may have in its prompt or its output: 2^31 - 1.
// Models allow at most 2^24 positions (longer requests are counted as
// rejected); the limit keeps sums and byte counts of token counts inside
// int64 (5e18 input tokens overflowed the request's wire size in bytes).
constexpr int64_t kMaxTokens = 2147483647;

// Parses a token count in [`min`, kMaxTokens], naming `column` on error.
absl::StatusOr<int64_t> ParseCount(absl::string_view path, int64_t line,
                                   absl::string_view column,
                                   absl::string_view field, int64_t min) {
  int64_t value = 0;
  if (!ParseInt64(field, value) || value < min || value > kMaxTokens) {
    return LineError(path, line,
                     absl::StrCat(column, " is ", Quoted(field), "; expected an integer in [",
                                  min, ", ", kMaxTokens, "]"));
  }
  return value;
}

// ---------------------------------------------------------------- CSV ----

// Reads a comma-separated file without quoting, finding the wanted columns
// by header name (BurstGPT added columns over time; ShareGPT stats files
// carry extra ones). A `"` anywhere is rejected: a quoted field holding a
// comma would otherwise shift every later column silently.
class CsvReader {
 public:
  CsvReader(absl::string_view path, std::unique_ptr<LineReader> lines)
      : path_(path), lines_(std::move(lines)) {}

  // Reads the header line and locates `columns`; on error names them all.
  absl::Status ReadHeader(absl::Span<const absl::string_view> columns) {
    const std::string expected =
        absl::StrCat("expected columns ", absl::StrJoin(columns, ","));
    absl::string_view line;
    ASSIGN_OR_RETURN(const bool found, lines_->NextNonBlank(line));
    if (!found) {
      return LineError(path_, 1,
                       absl::StrCat("file is empty (", expected, ")"));
    }
    RETURN_IF_ERROR(Split(line));
    header_ = std::string(line);
    num_fields_ = fields_.size();
    index_.clear();
    for (absl::string_view column : columns) {
      const auto it = std::find(fields_.begin(), fields_.end(), column);
      if (it == fields_.end()) {
        return LineError(
            path_, lines_->line_number(),
            absl::StrCat("header ", Quoted(line), " has no ", Quoted(column),
                         " column (", expected, ")"));
      }
      index_.push_back(static_cast<size_t>(it - fields_.begin()));
    }
    return absl::OkStatus();
  }

  // Advances to the next data row; false after the last. A file with a
  // header and no rows is an error: there is nothing to simulate.
  absl::StatusOr<bool> Next() {
    absl::string_view line;
    ASSIGN_OR_RETURN(const bool found, lines_->NextNonBlank(line));
    if (!found) {
      if (data_rows_ == 0) {
        return LineError(path_, lines_->line_number() + 1,
                         "no data rows after the header (expected at least "
                         "one row)");
      }
      return false;
    }
    RETURN_IF_ERROR(Split(line));
    if (fields_.size() != num_fields_) {
      return LineError(
          path_, lines_->line_number(),
          absl::StrCat("row has ", fields_.size(), " fields; expected ",
                       num_fields_, " (one per header column: ", header_, ")"));
    }
    ++data_rows_;
    return true;
  }

  // The i-th wanted column of the current row.
  absl::string_view field(size_t i) const { return fields_[index_[i]]; }
  int64_t line_number() const { return lines_->line_number(); }
  const std::string& path() const { return path_; }

 private:
  absl::Status Split(absl::string_view line) {
    if (line.find('"') != absl::string_view::npos) {
      return LineError(path_, lines_->line_number(),
                       "contains '\"'; quoted CSV fields are not supported "
                       "(expected plain comma-separated values)");
    }
    // fields_ keeps its capacity, so this allocates only for the first rows.
    fields_.clear();
    for (absl::string_view field : absl::StrSplit(line, ',')) {
      fields_.push_back(absl::StripAsciiWhitespace(field));
    }
    return absl::OkStatus();
  }

  std::string path_;
  std::unique_ptr<LineReader> lines_;
  std::string header_;
  size_t num_fields_ = 0;
  std::vector<size_t> index_;
  std::vector<absl::string_view> fields_;
  int64_t data_rows_ = 0;
};

// -------------------------------------------------------------- Azure ----

constexpr absl::string_view kAzureColumns[] = {"TIMESTAMP", "ContextTokens",
                                               "GeneratedTokens"};

// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant,
// "chrono-Compatible Low-Level Date Algorithms"). Pure integer arithmetic:
// mktime/timegm would bring in the time zone and the C library's quirks.
int64_t DaysFromCivil(int64_t year, int64_t month, int64_t day) {
  year -= month <= 2 ? 1 : 0;
  const int64_t era = (year >= 0 ? year : year - 399) / 400;
  const int64_t year_of_era = year - era * 400;
  const int64_t day_of_year =
      (153 * (month > 2 ? month - 3 : month + 9) + 2) / 5 + day - 1;
  const int64_t day_of_era =
      year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
  return era * 146097 + day_of_era - 719468;
}

int DaysInMonth(int64_t year, int64_t month) {
  static constexpr int kDays[] = {31, 28, 31, 30, 31, 30,
                                  31, 31, 30, 31, 30, 31};
  const bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
  return month == 2 && leap ? 29 : kDays[month - 1];
}

// Reads `count` decimal digits at text[pos].
bool Digits(absl::string_view text, size_t pos, size_t count, int64_t& value) {
  if (pos + count > text.size()) return false;
  value = 0;
  for (size_t i = pos; i < pos + count; ++i) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(text[i]))) {
      return false;
    }
    value = value * 10 + (text[i] - '0');
  }
  return true;
}

// Parses `YYYY-MM-DD HH:MM:SS[.f]` (f: 1 to 9 digits) into whole seconds
// since 1970-01-01 and nanoseconds. Seconds and nanoseconds stay separate
// integers so that differences are exact before the one conversion to
// double.
bool ParseAzureTimestamp(absl::string_view text, int64_t& seconds,
                         int64_t& nanos) {
  int64_t year, month, day, hour, minute, second;
  if (text.size() < 19 || !Digits(text, 0, 4, year) || text[4] != '-' ||
      !Digits(text, 5, 2, month) || text[7] != '-' ||
      !Digits(text, 8, 2, day) || (text[10] != ' ' && text[10] != 'T') ||
      !Digits(text, 11, 2, hour) || text[13] != ':' ||
      !Digits(text, 14, 2, minute) || text[16] != ':' ||
      !Digits(text, 17, 2, second)) {
    return false;
  }
  if (month < 1 || month > 12 || day < 1 || day > DaysInMonth(year, month) ||
      hour > 23 || minute > 59 || second > 59) {
    return false;
  }
  nanos = 0;
  if (text.size() > 19) {
    const size_t digits = text.size() - 20;
    int64_t fraction = 0;
    if (text[19] != '.' || digits < 1 || digits > 9 ||
        !Digits(text, 20, digits, fraction)) {
      return false;
    }
    nanos = fraction;
    for (size_t i = digits; i < 9; ++i) nanos *= 10;
  }
  seconds = DaysFromCivil(year, month, day) * 86400 + hour * 3600 +
            minute * 60 + second;
  return true;
}

// A row as a reader parses it, in file order.
struct RawRow {
  double timestamp_s = 0;    // Azure, BurstGPT; Mooncake: timestamp_ms / 1000
  int64_t timestamp_ms = 0;  // Mooncake
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  int64_t line = 0;
};

// Parses a trace's rows one at a time, in file order.
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
absl::StatusOr<TraceFile> DrainRows(RowReader& rows) {
  TraceFile trace;
  RawRow raw;
  while (true) {
    ASSIGN_OR_RETURN(const bool more, rows.Next(raw));
    if (!more) break;
    trace.rows.push_back({raw.timestamp_s, raw.input_tokens, raw.output_tokens});
  }
  trace.skipped_failed = rows.skipped_failed();
  return trace;
}

// Arrival times are seconds after the first row (in file order).
class AzureRows : public RowReader {
 public:
  static absl::StatusOr<std::unique_ptr<RowReader>> Open(
      const std::string& path, std::unique_ptr<LineReader> lines) {
    auto reader = std::make_unique<AzureRows>(path, std::move(lines));
    RETURN_IF_ERROR(reader->csv_.ReadHeader(kAzureColumns));
    return std::unique_ptr<RowReader>(std::move(reader));
  }
  AzureRows(const std::string& path, std::unique_ptr<LineReader> lines)
      : path_(path), csv_(path, std::move(lines)) {}

  absl::StatusOr<bool> Next(RawRow& row) override {
    ASSIGN_OR_RETURN(const bool more, csv_.Next());
    if (!more) return false;
    const int64_t line = csv_.line_number();
    int64_t seconds = 0;
    int64_t nanos = 0;
    if (!ParseAzureTimestamp(csv_.field(0), seconds, nanos)) {
      return LineError(
          path_, line,
          absl::StrCat("TIMESTAMP is ", Quoted(csv_.field(0)),
                       "; expected YYYY-MM-DD HH:MM:SS with an optional "
                       ".fraction of 1 to 9 digits"));
    }
    if (first_) {
      first_ = false;
      first_seconds_ = seconds;
      first_nanos_ = nanos;
    }
    // Negative when a row is earlier than the first; the reorder buffer
    // sorts it and the workload shifts, so such files still load.
    row.timestamp_s = static_cast<double>(seconds - first_seconds_) +
                      static_cast<double>(nanos - first_nanos_) * 1e-9;
    row.line = line;
    ASSIGN_OR_RETURN(row.input_tokens,
                     ParseCount(path_, line, "ContextTokens", csv_.field(1), 1));
    ASSIGN_OR_RETURN(
        row.output_tokens,
        ParseCount(path_, line, "GeneratedTokens", csv_.field(2), 1));
    return true;
  }

 private:
  std::string path_;
  CsvReader csv_;
  bool first_ = true;
  int64_t first_seconds_ = 0;
  int64_t first_nanos_ = 0;
};

// The content-based forms (ParseAzure, ParseMooncake, ParseBurstGpt,
// ParseLengthCsv) read text already in memory, for tests and fuzzing; the
// Read*/OpenWorkload paths read files incrementally through the same code.
[[maybe_unused]] absl::StatusOr<TraceFile> ParseAzure(
    const std::string& path, absl::string_view content) {
  ASSIGN_OR_RETURN(auto rows, AzureRows::Open(path, MemoryLines(content)));
  return DrainRows(*rows);
}


// ----------------------------------------------------------- Mooncake ----

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

constexpr absl::string_view kMooncakeFormat =
    "expected one flat JSON object per line with keys timestamp (ms), "
    "input_length, output_length";


// One flat JSON object per line.
class MooncakeRows : public RowReader {
 public:
  MooncakeRows(const std::string& path, std::unique_ptr<LineReader> lines)
      : path_(path), lines_(std::move(lines)) {}

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
    JsonCursor cursor(line);
    auto malformed = [&](absl::string_view what) {
      return LineError(
          path_, line_number,
          absl::StrCat("malformed JSON at column ", cursor.column(), ": ", what,
                       " (", kMooncakeFormat, ")"));
    };
    if (!cursor.Consume('{')) return malformed("expected '{'");
    // Raw values of the three keys we need; empty when absent.
    absl::string_view values[3];
    static constexpr absl::string_view kKeys[3] = {"timestamp", "input_length",
                                                   "output_length"};
    if (!cursor.Consume('}')) {
      do {
        absl::string_view key;
        absl::string_view raw;
        if (!cursor.String(key)) return malformed("expected a quoted key");
        if (!cursor.Consume(':')) return malformed("expected ':' after a key");
        if (!cursor.Value(raw)) return malformed("expected a value");
        for (int i = 0; i < 3; ++i) {
          if (key != kKeys[i]) continue;
          if (!values[i].empty()) {
            return LineError(path_, line_number,
                             absl::StrCat("duplicate key \"", key, "\" (",
                                          kMooncakeFormat, ")"));
          }
          values[i] = raw;
        }
      } while (cursor.Consume(','));
      if (!cursor.Consume('}')) return malformed("expected ',' or '}'");
    }
    cursor.SkipSpace();
    if (!cursor.AtEnd()) return malformed("unexpected text after the object");
    for (int i = 0; i < 3; ++i) {
      if (values[i].empty()) {
        return LineError(
            path_, line_number,
            absl::StrCat("no \"", kKeys[i], "\" key (", kMooncakeFormat, ")"));
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
  int64_t rows_ = 0;
};

// The k-th (0-based) of the n requests sharing millisecond `ms` arrives at
// ms + k/n ms, so equal timestamps do not become one burst.
double SpreadInBucket(int64_t ms, size_t k, size_t n) {
  return (static_cast<double>(ms) +
          static_cast<double>(k) / static_cast<double>(n)) /
         1000.0;
}

// The whole file, rows in file order, each millisecond bucket spread in
// file order wherever its rows sit (the stream needs them within the
// reorder window; this whole-file form does not).
absl::StatusOr<TraceFile> DrainMooncake(MooncakeRows& rows) {
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
    }
    begin = end;
  }
  return trace;
}

[[maybe_unused]] absl::StatusOr<TraceFile> ParseMooncake(
    const std::string& path, absl::string_view content) {
  MooncakeRows rows(path, MemoryLines(content));
  return DrainMooncake(rows);
}


// ----------------------------------------------------------- BurstGPT ----

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

[[maybe_unused]] absl::StatusOr<TraceFile> ParseBurstGpt(
    const std::string& path, absl::string_view content) {
  ASSIGN_OR_RETURN(auto rows, BurstGptRows::Open(path, MemoryLines(content)));
  return DrainRows(*rows);
}

// ------------------------------------------------------- length CSV ----

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

[[maybe_unused]] absl::StatusOr<std::vector<LengthPair>> ParseLengthCsv(
    const std::string& path, absl::string_view content) {
  CsvReader csv(path, MemoryLines(content));
  return ReadLengths(csv);
}

// ------------------------------------------------------- LoadWorkload ----

std::string ResolvePath(const std::string& base_dir, const std::string& path) {
  if (base_dir.empty()) return path;
  // operator/ keeps an absolute `path` as it is.
  return (std::filesystem::path(base_dir) / path).string();
}

constexpr absl::string_view kKnownFormats =
    "known formats: azure (CSV header TIMESTAMP,ContextTokens,"
    "GeneratedTokens), burstgpt (CSV with Timestamp, Request tokens and "
    "Response tokens columns), mooncake (JSONL, file name ending in .jsonl "
    "or .json); or set workload.trace.format";

// Picks the format from the file name and the first line: JSON files are
// Mooncake, CSV files are told apart by their header.
// Picks the format from the file name and the first line: JSON files are
// Mooncake, CSV files are told apart by their header.
absl::StatusOr<servesim::v1::TraceFormat> InferFormat(const std::string& path,
                                                      LineReader& lines) {
  const std::string lower = absl::AsciiStrToLower(path);
  if (absl::EndsWith(lower, ".jsonl") || absl::EndsWith(lower, ".json")) {
    return servesim::v1::TRACE_FORMAT_MOONCAKE;
  }
  absl::string_view header;
  ASSIGN_OR_RETURN(const bool found, lines.NextNonBlank(header));
  if (!found) {
    return LineError(path, 1,
                     absl::StrCat("file is empty (", kKnownFormats, ")"));
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
  return LineError(path, lines.line_number(),
                   absl::StrCat("cannot infer the trace format from header ",
                                Quoted(header), " (", kKnownFormats, ")"));
}

std::string Num(double value) { return absl::StrFormat("%g", value); }

absl::Status CheckPositiveRate(absl::string_view field, double rate) {
  if (!(std::isfinite(rate) && rate > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " = ", Num(rate), "; expected > 0 (finite)"));
  }
  return absl::OkStatus();
}

absl::Status CheckCount(absl::string_view field, int64_t value, int64_t max) {
  if (value < 1 || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " = ", value, "; expected 1..", max));
  }
  return absl::OkStatus();
}

absl::Status CheckTokens(absl::string_view field, int64_t value) {
  if (value < 1 || value > kMaxTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " = ", value, "; expected 1..", kMaxTokens));
  }
  return absl::OkStatus();
}

// Synthetic source: arrivals and lengths come from separate streams, so

// ---------------------------------------------------------- streaming ----

// Rows of one pass in time order, before the window: a trace through its
// reorder buffer, or a generator.
class SortedSource {
 public:
  virtual ~SortedSource() = default;
  // `row.timestamp_s` is rate-scaled. False at the end.
  virtual absl::StatusOr<bool> Next(TraceRow& row) = 0;
  // Rows read so far, failed ones included.
  virtual int64_t rows_read() const = 0;
  virtual int64_t skipped_failed() const { return 0; }
  // For Workload::description; complete at the end.
  virtual std::string Describe() const = 0;
  // Called at the end when no row came out at all.
  virtual absl::Status CheckNotEmpty() const { return absl::OkStatus(); }
};

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
      row = {p.key, p.row.input_tokens, p.row.output_tokens};
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
    const RawRow& raw = bucket_[bucket_pos_];
    double t = SpreadInBucket(raw.timestamp_ms, bucket_pos_, bucket_.size());
    if (rate_scale_ != 1.0) t /= rate_scale_;
    row = {t, raw.input_tokens, raw.output_tokens};
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

absl::StatusOr<std::unique_ptr<SortedSource>> OpenTrace(
    const std::string& path, servesim::v1::TraceFormat format,
    double rate_scale) {
  if (format == servesim::v1::TRACE_FORMAT_UNSPECIFIED) {
    ASSIGN_OR_RETURN(std::unique_ptr<LineReader> header, FileLines(path));
    ASSIGN_OR_RETURN(format, InferFormat(path, *header));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<LineReader> lines, FileLines(path));
  std::unique_ptr<RowReader> rows;
  std::string name;
  switch (format) {
    case servesim::v1::TRACE_FORMAT_AZURE: {
      ASSIGN_OR_RETURN(rows, AzureRows::Open(path, std::move(lines)));
      name = "azure";
      break;
    }
    case servesim::v1::TRACE_FORMAT_MOONCAKE: {
      rows = std::make_unique<MooncakeRows>(path, std::move(lines));
      name = "mooncake";
      break;
    }
    case servesim::v1::TRACE_FORMAT_BURSTGPT: {
      ASSIGN_OR_RETURN(rows, BurstGptRows::Open(path, std::move(lines)));
      name = "burstgpt";
      break;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "workload.trace.format = ", static_cast<int>(format),
          "; expected TRACE_FORMAT_UNSPECIFIED, TRACE_FORMAT_AZURE, "
          "TRACE_FORMAT_MOONCAKE or TRACE_FORMAT_BURSTGPT"));
  }
  return std::unique_ptr<SortedSource>(std::make_unique<TraceSource>(
      path, name, std::move(rows),
      format == servesim::v1::TRACE_FORMAT_MOONCAKE, rate_scale));
}

// Synthetic arrivals, generated as they are pulled: arrivals and lengths
// come from separate streams, so changing the length distribution leaves
// the arrival times unchanged.
class SyntheticSource : public SortedSource {
 public:
  enum class Kind { kPoisson, kGamma, kConstant };
  SyntheticSource(Kind kind, double rate, double shape, double scale,
                  int64_t n, std::vector<LengthPair> samples, bool fixed,
                  std::string description, uint64_t seed, double rate_scale)
      : kind_(kind),
        rate_(rate),
        shape_(shape),
        scale_(scale),
        n_(n),
        samples_(std::move(samples)),
        fixed_(fixed),
        description_(std::move(description)),
        rate_scale_(rate_scale),
        arrivals_rng_(seed, "workload.arrivals"),
        lengths_rng_(seed, "workload.lengths") {}

  absl::StatusOr<bool> Next(TraceRow& row) override {
    if (i_ >= n_) return false;
    double arrival = 0;
    switch (kind_) {
      case Kind::kPoisson:
        t_ += arrivals_rng_.Exponential(1.0 / rate_);
        arrival = t_;
        break;
      case Kind::kGamma:
        t_ += arrivals_rng_.Gamma(shape_, scale_);
        arrival = t_;
        break;
      case Kind::kConstant:
        // i/rate rather than a running sum, so arrival i is exact and does
        // not collect rounding error over a long run.
        arrival = static_cast<double>(i_) / rate_;
        break;
    }
    // Fixed lengths draw nothing, so the stream is only used for sampling.
    const LengthPair& pair =
        fixed_ ? samples_[0] : samples_[lengths_rng_.UniformInt(samples_.size())];
    if (rate_scale_ != 1.0) arrival /= rate_scale_;
    row = {arrival, pair.input_tokens, pair.output_tokens};
    ++i_;
    return true;
  }
  int64_t rows_read() const override { return i_; }
  std::string Describe() const override { return description_; }

 private:
  Kind kind_;
  double rate_, shape_, scale_;
  int64_t n_;
  std::vector<LengthPair> samples_;
  bool fixed_;
  std::string description_;
  double rate_scale_;
  Rng arrivals_rng_;
  Rng lengths_rng_;
  int64_t i_ = 0;
  double t_ = 0;
};

absl::StatusOr<std::unique_ptr<SortedSource>> OpenSynthetic(
    const servesim::v1::WorkloadSpec& synthetic, const std::string& base_dir,
    uint64_t seed, double rate_scale) {
  using servesim::v1::WorkloadSpec;
  const int64_t n = synthetic.num_requests();
  RETURN_IF_ERROR(
      CheckCount("workload.num_requests", n, kMaxGeneratedRequests));
  SyntheticSource::Kind kind;
  double rate = 0, shape = 0, scale = 0;
  std::string description;
  switch (synthetic.source_case()) {
    case WorkloadSpec::kPoisson: {
      kind = SyntheticSource::Kind::kPoisson;
      rate = synthetic.poisson().rate_rps();
      RETURN_IF_ERROR(
          CheckPositiveRate("workload.poisson.rate_rps", rate));
      description = absl::StrCat("poisson ", Num(rate), " req/s");
      break;
    }
    case WorkloadSpec::kGamma: {
      kind = SyntheticSource::Kind::kGamma;
      rate = synthetic.gamma().rate_rps();
      const double cv = synthetic.gamma().cv();
      RETURN_IF_ERROR(
          CheckPositiveRate("workload.gamma.rate_rps", rate));
      RETURN_IF_ERROR(CheckPositiveRate("workload.gamma.cv", cv));
      // Gamma(k, theta) has mean k*theta and CV 1/sqrt(k): k = 1/cv^2 and
      // theta = cv^2/rate give mean gap 1/rate with the requested CV.
      shape = 1.0 / (cv * cv);
      scale = cv * cv / rate;
      description = absl::StrCat("gamma ", Num(rate), " req/s cv ", Num(cv));
      break;
    }
    case WorkloadSpec::kConstant: {
      kind = SyntheticSource::Kind::kConstant;
      rate = synthetic.constant().rate_rps();
      RETURN_IF_ERROR(
          CheckPositiveRate("workload.constant.rate_rps", rate));
      description = absl::StrCat("constant ", Num(rate), " req/s");
      break;
    }
    default:
      return absl::InvalidArgumentError(
          "workload has no arrival process; expected one of "
          "poisson, gamma, constant");
  }

  // Lengths after arrivals, so a bad rate is reported before a lengths file
  // is read.
  std::vector<LengthPair> samples;
  std::string lengths_text;
  switch (synthetic.lengths().kind_case()) {
    case servesim::v1::LengthSpec::kFixed: {
      const auto& fixed = synthetic.lengths().fixed();
      RETURN_IF_ERROR(
          CheckTokens("workload.lengths.fixed.input_tokens",
                      fixed.input_tokens()));
      RETURN_IF_ERROR(
          CheckTokens("workload.lengths.fixed.output_tokens",
                      fixed.output_tokens()));
      samples.push_back({fixed.input_tokens(), fixed.output_tokens()});
      lengths_text = absl::StrCat("lengths ", fixed.input_tokens(), " in / ",
                                  fixed.output_tokens(), " out tokens");
      break;
    }
    case servesim::v1::LengthSpec::kSampledFrom: {
      if (synthetic.lengths().sampled_from().empty()) {
        return absl::InvalidArgumentError(
            "workload.lengths.sampled_from is empty; expected the "
            "path of a CSV with num_prefill_tokens,num_decode_tokens columns");
      }
      const std::string path =
          ResolvePath(base_dir, synthetic.lengths().sampled_from());
      ASSIGN_OR_RETURN(samples, ReadLengthCsv(path));
      lengths_text = absl::StrCat("lengths from ", path);
      break;
    }
    default:
      return absl::InvalidArgumentError(
          "workload.lengths is not set; expected fixed { "
          "input_tokens output_tokens } or sampled_from: \"<csv path>\"");
  }
  absl::StrAppend(&description, ", ", n, " requests, ", lengths_text);
  const bool fixed =
      synthetic.lengths().kind_case() == servesim::v1::LengthSpec::kFixed;
  return std::unique_ptr<SortedSource>(std::make_unique<SyntheticSource>(
      kind, rate, shape, scale, n, std::move(samples), fixed,
      std::move(description), seed, rate_scale));
}

// AttAcc's static batch: N identical requests at t = 0.
class SaturatedSource : public SortedSource {
 public:
  explicit SaturatedSource(const servesim::v1::SaturatedSource& spec)
      : spec_(spec) {}
  absl::StatusOr<bool> Next(TraceRow& row) override {
    if (i_ >= spec_.num_requests()) return false;
    row = {0.0, spec_.input_tokens(), spec_.output_tokens()};
    ++i_;
    return true;
  }
  int64_t rows_read() const override { return i_; }
  std::string Describe() const override {
    return absl::StrCat("saturated ", spec_.num_requests(),
                        " requests at t=0, ", spec_.input_tokens(), " in / ",
                        spec_.output_tokens(), " out tokens");
  }

 private:
  servesim::v1::SaturatedSource spec_;
  int64_t i_ = 0;
};

// The shaping LoadWorkload always applied (window, max_requests, shift to
// 0, ids), then workload.repeat. Each pass opens a fresh source, so the
// passes are the same sequence (same file rows, same random streams).
class WorkloadStream : public RequestStream {
 public:
  using Opener =
      std::function<absl::StatusOr<std::unique_ptr<SortedSource>>()>;
  struct Shape {
    const servesim::v1::WorkloadSpec* spec = nullptr;  // for the text, in Create
    double rate_scale = 1;
    double window_start = -std::numeric_limits<double>::infinity();
    double window_end = std::numeric_limits<double>::infinity();
    int64_t max_requests = std::numeric_limits<int64_t>::max();
    int64_t repeat = 1;
  };

  static absl::StatusOr<std::unique_ptr<RequestStream>> Create(Shape shape,
                                                               Opener open) {
    auto stream = std::unique_ptr<WorkloadStream>(new WorkloadStream(shape, std::move(open)));
    ASSIGN_OR_RETURN(stream->source_, stream->open_());
    // The shaping suffix, known before any row is read.
    const servesim::v1::WorkloadSpec& spec = *shape.spec;
    if (shape.rate_scale != 1.0) {
      absl::StrAppend(&stream->suffix_, "; rate_scale ", Num(shape.rate_scale));
    }
    if (spec.has_window_start_s() || spec.has_window_end_s()) {
      absl::StrAppend(&stream->suffix_, "; window [",
                      Num(spec.has_window_start_s() ? shape.window_start : 0),
                      ", ", Num(shape.window_end), ") s");
    }
    if (spec.has_max_requests()) {
      absl::StrAppend(&stream->suffix_, "; max_requests ", shape.max_requests);
    }
    stream->has_window_start_ = spec.has_window_start_s();
    stream->shape_.spec = nullptr;  // the caller's; not needed past here
    return std::unique_ptr<RequestStream>(std::move(stream));
  }

  absl::StatusOr<bool> Next(RequestSpec* out) override {
    while (true) {
      if (source_ == nullptr) {
        if (pass_ >= shape_.repeat) return false;
        ASSIGN_OR_RETURN(source_, open_());
      }
      TraceRow row;
      ASSIGN_OR_RETURN(const bool more, source_->Next(row));
      if (!more) {
        RETURN_IF_ERROR(EndPass());
        continue;
      }
      if (pass_total_ == 0) first_seen_ = row.timestamp_s;
      last_seen_ = row.timestamp_s;
      ++pass_total_;
      if (!(row.timestamp_s >= shape_.window_start &&
            row.timestamp_s < shape_.window_end) ||
          pass_kept_ >= shape_.max_requests) {
        continue;
      }
      if (pass_kept_ == 0) shift_ = row.timestamp_s;
      ++pass_kept_;
      *out = RequestSpec{};
      out->id = summary_.num_requests;
      out->arrival_s = row.timestamp_s - shift_;
      if (pass_ > 0) out->arrival_s += static_cast<double>(pass_) * period_s_;
      out->input_tokens = row.input_tokens;
      out->output_tokens = row.output_tokens;
      ++summary_.num_requests;
      summary_.last_arrival_s = out->arrival_s;
      return true;
    }
  }

 private:
  WorkloadStream(Shape shape, Opener open)
      : shape_(shape), open_(std::move(open)) {}

  absl::Status EndPass() {
    if (pass_total_ == 0) RETURN_IF_ERROR(source_->CheckNotEmpty());
    if (pass_kept_ == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "workload.window_start_s/window_end_s [%g, %g) kept none of the %d "
          "requests (they arrive between %g and %g s, after rate_scale %g)",
          has_window_start_ ? shape_.window_start : 0.0, shape_.window_end,
          pass_total_, first_seen_, last_seen_, shape_.rate_scale));
    }
    summary_.rows_read += source_->rows_read();
    summary_.skipped_failed += source_->skipped_failed();
    summary_.outside_window += pass_total_ - pass_kept_;
    if (pass_ == 0) {
      // Pass k is pass 0 shifted by k periods: its span plus one mean gap,
      // so the seam between passes looks like any other gap.
      const double span = summary_.last_arrival_s;
      period_s_ = pass_kept_ > 1
                      ? span + span / static_cast<double>(pass_kept_ - 1)
                      : 0.0;
      summary_.description = absl::StrCat(source_->Describe(), suffix_);
      if (shape_.repeat > 1) {
        absl::StrAppend(&summary_.description, "; repeat ", shape_.repeat,
                        " (period ", Num(period_s_), " s)");
      }
    }
    source_.reset();
    ++pass_;
    pass_total_ = 0;
    pass_kept_ = 0;
    return absl::OkStatus();
  }

  Shape shape_;
  Opener open_;
  std::unique_ptr<SortedSource> source_;
  std::string suffix_;
  bool has_window_start_ = false;
  int64_t pass_ = 0;
  int64_t pass_total_ = 0;  // rows of this pass that reached the window
  int64_t pass_kept_ = 0;
  double first_seen_ = 0, last_seen_ = 0;
  double shift_ = 0;
  double period_s_ = 0;
};

// Replays a materialised workload.
class VectorStream : public RequestStream {
 public:
  explicit VectorStream(const Workload& workload) : workload_(workload) {
    summary_.num_requests = static_cast<int64_t>(workload.requests.size());
    summary_.last_arrival_s =
        workload.requests.empty() ? 0 : workload.requests.back().arrival_s;
    summary_.rows_read = workload.rows_read;
    summary_.skipped_failed = workload.skipped_failed;
    summary_.outside_window = workload.outside_window;
    summary_.description = workload.description;
  }
  absl::StatusOr<bool> Next(RequestSpec* out) override {
    if (next_ >= workload_.requests.size()) return false;
    *out = workload_.requests[next_++];
    return true;
  }

 private:
  const Workload& workload_;
  size_t next_ = 0;
};

}  // namespace

absl::StatusOr<TraceFile> ParseAzureTrace(absl::string_view content, const std::string& name) {
  return ParseAzure(name, content);
}

absl::StatusOr<TraceFile> ParseMooncakeTrace(absl::string_view content,
                                             const std::string& name) {
  return ParseMooncake(name, content);
}

absl::StatusOr<TraceFile> ParseBurstGptTrace(absl::string_view content,
                                             const std::string& name) {
  return ParseBurstGpt(name, content);
}

absl::StatusOr<std::vector<LengthPair>> ParseLengthCsvContent(absl::string_view content,
                                                              const std::string& name) {
  return ParseLengthCsv(name, content);
}

absl::StatusOr<TraceFile> ReadAzureTrace(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<LineReader> lines, FileLines(path));
  ASSIGN_OR_RETURN(auto rows, AzureRows::Open(path, std::move(lines)));
  return DrainRows(*rows);
}

absl::StatusOr<TraceFile> ReadMooncakeTrace(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<LineReader> lines, FileLines(path));
  MooncakeRows rows(path, std::move(lines));
  return DrainMooncake(rows);
}

absl::StatusOr<TraceFile> ReadBurstGptTrace(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<LineReader> lines, FileLines(path));
  ASSIGN_OR_RETURN(auto rows, BurstGptRows::Open(path, std::move(lines)));
  return DrainRows(*rows);
}

absl::StatusOr<std::vector<LengthPair>> ReadLengthCsv(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<LineReader> lines, FileLines(path));
  CsvReader csv(path, std::move(lines));
  return ReadLengths(csv);
}

absl::StatusOr<std::unique_ptr<RequestStream>> OpenWorkload(
    const servesim::v1::WorkloadSpec& spec, const std::string& base_dir,
    const std::string& trace_override, uint64_t seed) {
  // The shaping knobs are checked first, so a bad one is reported before a
  // trace is read.
  WorkloadStream::Shape shape;
  shape.spec = &spec;
  if (spec.has_rate_scale()) {
    shape.rate_scale = spec.rate_scale();
    RETURN_IF_ERROR(CheckPositiveRate("workload.rate_scale", shape.rate_scale));
  }
  // An unset start keeps every arrival, including the negative times of an
  // Azure file whose later rows precede its first; an explicit 0 drops them.
  if (spec.has_window_start_s()) {
    shape.window_start = spec.window_start_s();
    if (!std::isfinite(shape.window_start)) {
      return absl::InvalidArgumentError(
          absl::StrCat("workload.window_start_s = ", Num(shape.window_start),
                       "; expected a finite number of seconds"));
    }
  }
  if (spec.has_window_end_s()) {
    shape.window_end = spec.window_end_s();
    const double start = spec.has_window_start_s() ? shape.window_start : 0.0;
    if (!(shape.window_end > start)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "workload.window_end_s = ", Num(shape.window_end),
          "; expected > workload.window_start_s (", Num(start), ")"));
    }
  }
  if (spec.has_max_requests()) {
    shape.max_requests = spec.max_requests();
    if (shape.max_requests < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "workload.max_requests = ", shape.max_requests, "; expected >= 1"));
    }
  }
  if (spec.has_repeat()) {
    shape.repeat = spec.repeat();
    RETURN_IF_ERROR(CheckCount("workload.repeat", shape.repeat, kMaxRepeat));
  }

  const double rate_scale = shape.rate_scale;
  if (spec.has_trace() || !trace_override.empty()) {
    std::string path;
    servesim::v1::TraceFormat format = servesim::v1::TRACE_FORMAT_UNSPECIFIED;
    if (spec.has_trace()) format = spec.trace().format();
    if (!trace_override.empty()) {
      // A command-line path: relative to the working folder, as the user
      // typed it, not to the scenario file.
      path = trace_override;
    } else {
      if (spec.trace().path().empty()) {
        return absl::InvalidArgumentError(
            "workload.trace.path is empty; expected the path of a trace file");
      }
      path = ResolvePath(base_dir, spec.trace().path());
    }
    return WorkloadStream::Create(shape, [path, format, rate_scale] {
      return OpenTrace(path, format, rate_scale);
    });
  }
  if (spec.has_poisson() || spec.has_gamma() || spec.has_constant()) {
    return WorkloadStream::Create(shape, [spec, base_dir, seed, rate_scale] {
      return OpenSynthetic(spec, base_dir, seed, rate_scale);
    });
  }
  if (spec.has_saturated()) {
    const auto& saturated = spec.saturated();
    RETURN_IF_ERROR(CheckCount("workload.saturated.num_requests",
                               saturated.num_requests(),
                               kMaxGeneratedRequests));
    RETURN_IF_ERROR(CheckTokens("workload.saturated.input_tokens",
                                saturated.input_tokens()));
    RETURN_IF_ERROR(CheckTokens("workload.saturated.output_tokens",
                                saturated.output_tokens()));
    return WorkloadStream::Create(shape, [saturated] {
      return absl::StatusOr<std::unique_ptr<SortedSource>>(
          std::make_unique<SaturatedSource>(saturated));
    });
  }
  return absl::InvalidArgumentError(
      "workload has no source; expected one of trace, poisson, gamma, "
      "constant, saturated");
}

std::unique_ptr<RequestStream> StreamOf(const Workload& workload) {
  return std::make_unique<VectorStream>(workload);
}

absl::StatusOr<Workload> ScanWorkload(const servesim::v1::WorkloadSpec& spec,
                                      const std::string& base_dir,
                                      const std::string& trace_override,
                                      uint64_t seed) {
  ASSIGN_OR_RETURN(std::unique_ptr<RequestStream> stream,
                   OpenWorkload(spec, base_dir, trace_override, seed));
  RequestSpec request;
  while (true) {
    ASSIGN_OR_RETURN(const bool more, stream->Next(&request));
    if (!more) break;
  }
  return stream->summary();
}

absl::StatusOr<Workload> LoadWorkload(const servesim::v1::WorkloadSpec& spec,
                                      const std::string& base_dir,
                                      const std::string& trace_override,
                                      uint64_t seed) {
  ASSIGN_OR_RETURN(std::unique_ptr<RequestStream> stream,
                   OpenWorkload(spec, base_dir, trace_override, seed));
  std::vector<RequestSpec> requests;
  RequestSpec request;
  while (true) {
    ASSIGN_OR_RETURN(const bool more, stream->Next(&request));
    if (!more) break;
    requests.push_back(request);
  }
  Workload workload = stream->summary();
  workload.requests = std::move(requests);
  return workload;
}

}  // namespace servesim::cluster
