#include "cluster/workload.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
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

// Synthetic and saturated sources allocate every request up front; a typo
// such as num_requests: 1000000000000 should be an error, not an abort in
// the allocator. Ten million requests is far beyond what a run simulates.
constexpr int64_t kMaxGeneratedRequests = 10'000'000;

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
// it, with no allocation per line or per field.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    const int err = errno;
    // ENOENT maps to NOT_FOUND, EACCES to PERMISSION_DENIED, and so on.
    return absl::Status(
        absl::ErrnoToStatusCode(err),
        absl::StrCat(path, ": cannot open: ",
                     std::error_code(err, std::generic_category()).message()));
  }
  std::string content;
  struct stat info;
  if (fstat(fileno(file), &info) == 0) {
    // A directory opens fine with fopen on Linux; say what is wrong rather
    // than let a read fail with EISDIR.
    if (S_ISDIR(info.st_mode)) {
      std::fclose(file);
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": is a directory; expected a trace file"));
    }
    // Only a regular file's size is meaningful (a pipe reports 0).
    if (S_ISREG(info.st_mode) && info.st_size > 0) {
      content.reserve(static_cast<size_t>(info.st_size));
    }
  }
  char buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file)) > 0) {
    content.append(buffer, n);
  }
  const bool failed = std::ferror(file) != 0;
  const int err = errno;
  std::fclose(file);
  if (failed) {
    return absl::Status(
        absl::ErrnoToStatusCode(err),
        absl::StrCat(path, ": cannot read: ",
                     std::error_code(err, std::generic_category()).message()));
  }
  return content;
}

// Splits file content into lines, dropping the `\n` or `\r\n` terminator, so
// the readers accept files written on Windows (the Azure traces use CRLF)
// and files with or without a final newline. Counts lines from 1.
class LineReader {
 public:
  explicit LineReader(absl::string_view content) : rest_(content) {
    // A UTF-8 byte order mark would otherwise stick to the first column name.
    if (absl::StartsWith(rest_, "\xEF\xBB\xBF")) rest_.remove_prefix(3);
  }

  // Next line that is not blank (blank lines, e.g. the empty line after a
  // final newline, carry no data); false at the end of the content.
  bool NextNonBlank(absl::string_view& line) {
    while (!rest_.empty()) {
      const size_t newline = rest_.find('\n');
      if (newline == absl::string_view::npos) {
        line = rest_;
        rest_ = {};
      } else {
        line = rest_.substr(0, newline);
        rest_.remove_prefix(newline + 1);
      }
      ++line_number_;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (!absl::StripAsciiWhitespace(line).empty()) return true;
    }
    return false;
  }

  // 1-based number of the line NextNonBlank returned last.
  int64_t line_number() const { return line_number_; }

 private:
  absl::string_view rest_;
  int64_t line_number_ = 0;
};

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

// Parses a token count that must be >= `min`, naming `column` on error.
absl::StatusOr<int64_t> ParseCount(absl::string_view path, int64_t line,
                                   absl::string_view column,
                                   absl::string_view field, int64_t min) {
  int64_t value = 0;
  if (!ParseInt64(field, value) || value < min) {
    return LineError(path, line,
                     absl::StrCat(column, " is ", Quoted(field),
                                  "; expected an integer >= ", min));
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
  CsvReader(absl::string_view path, absl::string_view content)
      : path_(path), lines_(content) {}

  // Reads the header line and locates `columns`; on error names them all.
  absl::Status ReadHeader(absl::Span<const absl::string_view> columns) {
    const std::string expected =
        absl::StrCat("expected columns ", absl::StrJoin(columns, ","));
    absl::string_view line;
    if (!lines_.NextNonBlank(line)) {
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
            path_, lines_.line_number(),
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
    if (!lines_.NextNonBlank(line)) {
      if (data_rows_ == 0) {
        return LineError(path_, lines_.line_number() + 1,
                         "no data rows after the header (expected at least "
                         "one row)");
      }
      return false;
    }
    RETURN_IF_ERROR(Split(line));
    if (fields_.size() != num_fields_) {
      return LineError(
          path_, lines_.line_number(),
          absl::StrCat("row has ", fields_.size(), " fields; expected ",
                       num_fields_, " (one per header column: ", header_, ")"));
    }
    ++data_rows_;
    return true;
  }

  // The i-th wanted column of the current row.
  absl::string_view field(size_t i) const { return fields_[index_[i]]; }
  int64_t line_number() const { return lines_.line_number(); }
  const std::string& path() const { return path_; }

 private:
  absl::Status Split(absl::string_view line) {
    if (line.find('"') != absl::string_view::npos) {
      return LineError(path_, lines_.line_number(),
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
  LineReader lines_;
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

absl::StatusOr<TraceFile> ParseAzure(const std::string& path,
                                     absl::string_view content) {
  CsvReader csv(path, content);
  RETURN_IF_ERROR(csv.ReadHeader(kAzureColumns));
  TraceFile trace;
  int64_t first_seconds = 0;
  int64_t first_nanos = 0;
  while (true) {
    ASSIGN_OR_RETURN(const bool more, csv.Next());
    if (!more) break;
    const int64_t line = csv.line_number();
    int64_t seconds = 0;
    int64_t nanos = 0;
    if (!ParseAzureTimestamp(csv.field(0), seconds, nanos)) {
      return LineError(
          path, line,
          absl::StrCat("TIMESTAMP is ", Quoted(csv.field(0)),
                       "; expected YYYY-MM-DD HH:MM:SS with an optional "
                       ".fraction of 1 to 9 digits"));
    }
    if (trace.rows.empty()) {
      first_seconds = seconds;
      first_nanos = nanos;
    }
    TraceRow row;
    // Negative when a row is earlier than the first; LoadWorkload sorts
    // and shifts, so such files still load.
    row.timestamp_s = static_cast<double>(seconds - first_seconds) +
                      static_cast<double>(nanos - first_nanos) * 1e-9;
    ASSIGN_OR_RETURN(row.input_tokens,
                     ParseCount(path, line, "ContextTokens", csv.field(1), 1));
    ASSIGN_OR_RETURN(
        row.output_tokens,
        ParseCount(path, line, "GeneratedTokens", csv.field(2), 1));
    trace.rows.push_back(row);
  }
  return trace;
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

absl::StatusOr<TraceFile> ParseMooncake(const std::string& path,
                                        absl::string_view content) {
  struct Parsed {
    int64_t timestamp_ms;
    int64_t input_tokens;
    int64_t output_tokens;
  };
  std::vector<Parsed> parsed;
  LineReader lines(content);
  absl::string_view line;
  while (lines.NextNonBlank(line)) {
    const int64_t line_number = lines.line_number();
    JsonCursor cursor(line);
    auto malformed = [&](absl::string_view what) {
      return LineError(
          path, line_number,
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
            return LineError(path, line_number,
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
            path, line_number,
            absl::StrCat("no \"", kKeys[i], "\" key (", kMooncakeFormat, ")"));
      }
    }
    Parsed row;
    if (!ParseInt64(values[0], row.timestamp_ms) || row.timestamp_ms < 0) {
      return LineError(path, line_number,
                       absl::StrCat("timestamp is ", Quoted(values[0]),
                                    "; expected an integer number of "
                                    "milliseconds >= 0"));
    }
    ASSIGN_OR_RETURN(
        row.input_tokens,
        ParseCount(path, line_number, "input_length", values[1], 1));
    ASSIGN_OR_RETURN(
        row.output_tokens,
        ParseCount(path, line_number, "output_length", values[2], 1));
    parsed.push_back(row);
  }
  if (parsed.empty()) {
    return LineError(path, lines.line_number() + 1,
                     absl::StrCat("no data rows (", kMooncakeFormat, ")"));
  }

  // Spread each millisecond bucket: the k-th of n requests sharing a
  // timestamp (in file order, wherever they sit in the file) arrives at
  // timestamp + k/n ms, so equal timestamps do not become one burst.
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
    const double n = static_cast<double>(end - begin);
    for (size_t k = begin; k < end; ++k) {
      const Parsed& p = parsed[order[k]];
      TraceRow& row = trace.rows[order[k]];
      row.timestamp_s =
          (static_cast<double>(ms) + static_cast<double>(k - begin) / n) /
          1000.0;
      row.input_tokens = p.input_tokens;
      row.output_tokens = p.output_tokens;
    }
    begin = end;
  }
  return trace;
}

// ----------------------------------------------------------- BurstGPT ----

constexpr absl::string_view kBurstGptColumns[] = {"Timestamp", "Request tokens",
                                                  "Response tokens"};

absl::StatusOr<TraceFile> ParseBurstGpt(const std::string& path,
                                        absl::string_view content) {
  CsvReader csv(path, content);
  RETURN_IF_ERROR(csv.ReadHeader(kBurstGptColumns));
  TraceFile trace;
  while (true) {
    ASSIGN_OR_RETURN(const bool more, csv.Next());
    if (!more) break;
    const int64_t line = csv.line_number();
    TraceRow row;
    if (!ParseDouble(csv.field(0), row.timestamp_s) || row.timestamp_s < 0) {
      return LineError(path, line,
                       absl::StrCat("Timestamp is ", Quoted(csv.field(0)),
                                    "; expected a number of seconds >= 0"));
    }
    // 0 is legal in both token columns here: it marks a failed request.
    ASSIGN_OR_RETURN(row.input_tokens,
                     ParseCount(path, line, "Request tokens", csv.field(1), 0));
    ASSIGN_OR_RETURN(
        row.output_tokens,
        ParseCount(path, line, "Response tokens", csv.field(2), 0));
    if (row.output_tokens == 0) {
      ++trace.skipped_failed;
      continue;
    }
    if (row.input_tokens == 0) {
      return LineError(
          path, line,
          absl::StrCat("Request tokens is \"0\" but Response tokens is ",
                       row.output_tokens,
                       "; expected Request tokens >= 1 for a request that "
                       "produced a response (0 response tokens marks a "
                       "failed request)"));
    }
    trace.rows.push_back(row);
  }
  return trace;
}

// ------------------------------------------------------- length CSV ----

constexpr absl::string_view kLengthColumns[] = {"num_prefill_tokens",
                                                "num_decode_tokens"};

absl::StatusOr<std::vector<LengthPair>> ParseLengthCsv(
    const std::string& path, absl::string_view content) {
  CsvReader csv(path, content);
  RETURN_IF_ERROR(csv.ReadHeader(kLengthColumns));
  std::vector<LengthPair> pairs;
  while (true) {
    ASSIGN_OR_RETURN(const bool more, csv.Next());
    if (!more) break;
    const int64_t line = csv.line_number();
    LengthPair pair;
    ASSIGN_OR_RETURN(
        pair.input_tokens,
        ParseCount(path, line, kLengthColumns[0], csv.field(0), 1));
    ASSIGN_OR_RETURN(
        pair.output_tokens,
        ParseCount(path, line, kLengthColumns[1], csv.field(1), 1));
    pairs.push_back(pair);
  }
  return pairs;
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
absl::StatusOr<servesim::v1::TraceFormat> InferFormat(
    const std::string& path, absl::string_view content) {
  const std::string lower = absl::AsciiStrToLower(path);
  if (absl::EndsWith(lower, ".jsonl") || absl::EndsWith(lower, ".json")) {
    return servesim::v1::TRACE_FORMAT_MOONCAKE;
  }
  LineReader lines(content);
  absl::string_view header;
  if (!lines.NextNonBlank(header)) {
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

struct LoadedTrace {
  TraceFile file;
  std::string format_name;
};

absl::StatusOr<LoadedTrace> LoadTrace(const std::string& path,
                                      servesim::v1::TraceFormat format) {
  ASSIGN_OR_RETURN(const std::string content, ReadWholeFile(path));
  if (format == servesim::v1::TRACE_FORMAT_UNSPECIFIED) {
    ASSIGN_OR_RETURN(format, InferFormat(path, content));
  }
  LoadedTrace loaded;
  switch (format) {
    case servesim::v1::TRACE_FORMAT_AZURE: {
      ASSIGN_OR_RETURN(loaded.file, ParseAzure(path, content));
      loaded.format_name = "azure";
      break;
    }
    case servesim::v1::TRACE_FORMAT_MOONCAKE: {
      ASSIGN_OR_RETURN(loaded.file, ParseMooncake(path, content));
      loaded.format_name = "mooncake";
      break;
    }
    case servesim::v1::TRACE_FORMAT_BURSTGPT: {
      ASSIGN_OR_RETURN(loaded.file, ParseBurstGpt(path, content));
      loaded.format_name = "burstgpt";
      break;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "workload.trace.format = ", static_cast<int>(format),
          "; expected TRACE_FORMAT_UNSPECIFIED, TRACE_FORMAT_AZURE, "
          "TRACE_FORMAT_MOONCAKE or TRACE_FORMAT_BURSTGPT"));
  }
  return loaded;
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
  if (value < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " = ", value, "; expected >= 1"));
  }
  return absl::OkStatus();
}

// Synthetic source: arrivals and lengths come from separate streams, so
// changing the length distribution leaves the arrival times unchanged.
absl::Status GenerateSynthetic(const servesim::v1::WorkloadSpec& synthetic,
                               const std::string& base_dir, uint64_t seed,
                               std::vector<RequestSpec>& requests,
                               std::string& description) {
  using servesim::v1::WorkloadSpec;
  const int64_t n = synthetic.num_requests();
  RETURN_IF_ERROR(
      CheckCount("workload.num_requests", n, kMaxGeneratedRequests));

  Rng arrivals_rng(seed, "workload.arrivals");
  std::vector<double> arrivals(static_cast<size_t>(n));
  switch (synthetic.source_case()) {
    case WorkloadSpec::kPoisson: {
      const double rate = synthetic.poisson().rate_rps();
      RETURN_IF_ERROR(
          CheckPositiveRate("workload.poisson.rate_rps", rate));
      double t = 0;
      for (double& arrival : arrivals) {
        t += arrivals_rng.Exponential(1.0 / rate);
        arrival = t;
      }
      description = absl::StrCat("poisson ", Num(rate), " req/s");
      break;
    }
    case WorkloadSpec::kGamma: {
      const double rate = synthetic.gamma().rate_rps();
      const double cv = synthetic.gamma().cv();
      RETURN_IF_ERROR(
          CheckPositiveRate("workload.gamma.rate_rps", rate));
      RETURN_IF_ERROR(CheckPositiveRate("workload.gamma.cv", cv));
      // Gamma(k, theta) has mean k*theta and CV 1/sqrt(k): k = 1/cv^2 and
      // theta = cv^2/rate give mean gap 1/rate with the requested CV.
      const double shape = 1.0 / (cv * cv);
      const double scale = cv * cv / rate;
      double t = 0;
      for (double& arrival : arrivals) {
        t += arrivals_rng.Gamma(shape, scale);
        arrival = t;
      }
      description = absl::StrCat("gamma ", Num(rate), " req/s cv ", Num(cv));
      break;
    }
    case WorkloadSpec::kConstant: {
      const double rate = synthetic.constant().rate_rps();
      RETURN_IF_ERROR(
          CheckPositiveRate("workload.constant.rate_rps", rate));
      // i/rate rather than a running sum, so arrival i is exact and does not
      // collect rounding error over a long run.
      for (size_t i = 0; i < arrivals.size(); ++i) {
        arrivals[i] = static_cast<double>(i) / rate;
      }
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

  // Fixed lengths draw nothing, so the stream is only used for sampling.
  const bool fixed =
      synthetic.lengths().kind_case() == servesim::v1::LengthSpec::kFixed;
  Rng lengths_rng(seed, "workload.lengths");
  requests.resize(arrivals.size());
  for (size_t i = 0; i < arrivals.size(); ++i) {
    const LengthPair& pair =
        fixed ? samples[0] : samples[lengths_rng.UniformInt(samples.size())];
    requests[i].arrival_s = arrivals[i];
    requests[i].input_tokens = pair.input_tokens;
    requests[i].output_tokens = pair.output_tokens;
  }
  absl::StrAppend(&description, ", ", n, " requests, ", lengths_text);
  return absl::OkStatus();
}

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
  ASSIGN_OR_RETURN(const std::string content, ReadWholeFile(path));
  return ParseAzure(path, content);
}

absl::StatusOr<TraceFile> ReadMooncakeTrace(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string content, ReadWholeFile(path));
  return ParseMooncake(path, content);
}

absl::StatusOr<TraceFile> ReadBurstGptTrace(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string content, ReadWholeFile(path));
  return ParseBurstGpt(path, content);
}

absl::StatusOr<std::vector<LengthPair>> ReadLengthCsv(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string content, ReadWholeFile(path));
  return ParseLengthCsv(path, content);
}

absl::StatusOr<Workload> LoadWorkload(const servesim::v1::WorkloadSpec& spec,
                                      const std::string& base_dir,
                                      const std::string& trace_override,
                                      uint64_t seed) {
  // The shaping knobs are checked first, so a bad one is reported before a
  // trace is read.
  double rate_scale = 1.0;
  if (spec.has_rate_scale()) {
    rate_scale = spec.rate_scale();
    RETURN_IF_ERROR(CheckPositiveRate("workload.rate_scale", rate_scale));
  }
  // An unset start keeps every arrival, including the negative times of an
  // Azure file whose later rows precede its first; an explicit 0 drops them.
  double window_start = -std::numeric_limits<double>::infinity();
  double window_end = std::numeric_limits<double>::infinity();
  if (spec.has_window_start_s()) {
    window_start = spec.window_start_s();
    if (!std::isfinite(window_start)) {
      return absl::InvalidArgumentError(
          absl::StrCat("workload.window_start_s = ", Num(window_start),
                       "; expected a finite number of seconds"));
    }
  }
  if (spec.has_window_end_s()) {
    window_end = spec.window_end_s();
    const double start = spec.has_window_start_s() ? window_start : 0.0;
    if (!(window_end > start)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "workload.window_end_s = ", Num(window_end),
          "; expected > workload.window_start_s (", Num(start), ")"));
    }
  }
  int64_t max_requests = std::numeric_limits<int64_t>::max();
  if (spec.has_max_requests()) {
    max_requests = spec.max_requests();
    if (max_requests < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "workload.max_requests = ", max_requests, "; expected >= 1"));
    }
  }

  Workload workload;
  std::vector<RequestSpec>& requests = workload.requests;
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
    ASSIGN_OR_RETURN(LoadedTrace loaded, LoadTrace(path, format));
    const TraceFile& file = loaded.file;
    workload.rows_read =
        static_cast<int64_t>(file.rows.size()) + file.skipped_failed;
    workload.skipped_failed = file.skipped_failed;
    if (file.rows.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": all ", file.skipped_failed,
          " rows are failed requests (0 response tokens); expected at least "
          "one request to simulate"));
    }
    requests.resize(file.rows.size());
    for (size_t i = 0; i < file.rows.size(); ++i) {
      requests[i].arrival_s = file.rows[i].timestamp_s;
      requests[i].input_tokens = file.rows[i].input_tokens;
      requests[i].output_tokens = file.rows[i].output_tokens;
    }
    workload.description = absl::StrCat(loaded.format_name, " trace ", path,
                                        " (", workload.rows_read, " rows");
    if (file.skipped_failed > 0) {
      absl::StrAppend(&workload.description, ", ", file.skipped_failed,
                      " failed skipped");
    }
    absl::StrAppend(&workload.description, ")");
  } else if (spec.has_poisson() || spec.has_gamma() || spec.has_constant()) {
    RETURN_IF_ERROR(GenerateSynthetic(spec, base_dir, seed,
                                      requests, workload.description));
    workload.rows_read = static_cast<int64_t>(requests.size());
  } else if (spec.has_saturated()) {
    const auto& saturated = spec.saturated();
    RETURN_IF_ERROR(CheckCount("workload.saturated.num_requests",
                               saturated.num_requests(),
                               kMaxGeneratedRequests));
    RETURN_IF_ERROR(CheckTokens("workload.saturated.input_tokens",
                                saturated.input_tokens()));
    RETURN_IF_ERROR(CheckTokens("workload.saturated.output_tokens",
                                saturated.output_tokens()));
    requests.resize(static_cast<size_t>(saturated.num_requests()));
    for (RequestSpec& request : requests) {
      request.arrival_s = 0;
      request.input_tokens = saturated.input_tokens();
      request.output_tokens = saturated.output_tokens();
    }
    workload.rows_read = saturated.num_requests();
    workload.description =
        absl::StrCat("saturated ", saturated.num_requests(),
                     " requests at t=0, ", saturated.input_tokens(), " in / ",
                     saturated.output_tokens(), " out tokens");
  } else {
    return absl::InvalidArgumentError(
        "workload has no source; expected one of trace, poisson, gamma, "
        "constant, saturated");
  }

  if (rate_scale != 1.0) {
    for (RequestSpec& request : requests) request.arrival_s /= rate_scale;
    absl::StrAppend(&workload.description, "; rate_scale ", Num(rate_scale));
  }
  // Sort before the window and the limit, so max_requests keeps the first
  // arrivals even when the file is not in time order. Stable: equal times
  // keep file order.
  std::stable_sort(requests.begin(), requests.end(),
                   [](const RequestSpec& a, const RequestSpec& b) {
                     return a.arrival_s < b.arrival_s;
                   });
  const size_t total = requests.size();
  const double first_seen = requests.front().arrival_s;
  const double last_seen = requests.back().arrival_s;
  std::erase_if(requests, [&](const RequestSpec& r) {
    return !(r.arrival_s >= window_start && r.arrival_s < window_end);
  });
  if (spec.has_window_start_s() || spec.has_window_end_s()) {
    absl::StrAppend(&workload.description, "; window [",
                    Num(spec.has_window_start_s() ? window_start : 0), ", ",
                    Num(window_end), ") s");
  }
  if (requests.size() > static_cast<uint64_t>(max_requests)) {
    requests.resize(static_cast<size_t>(max_requests));
  }
  if (spec.has_max_requests()) {
    absl::StrAppend(&workload.description, "; max_requests ", max_requests);
  }
  workload.outside_window = static_cast<int64_t>(total - requests.size());
  if (requests.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "workload.window_start_s/window_end_s [%g, %g) kept none of the %d "
        "requests (they arrive between %g and %g s, after rate_scale %g)",
        spec.has_window_start_s() ? window_start : 0.0, window_end,
        static_cast<int64_t>(total), first_seen, last_seen, rate_scale));
  }

  const double shift = requests.front().arrival_s;
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].id = static_cast<int64_t>(i);
    requests[i].arrival_s -= shift;
  }
  return workload;
}

}  // namespace servesim::cluster
