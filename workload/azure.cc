// The Azure LLM inference trace 2023 (trace_formats.h).
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "workload/row_reader.h"
#include "workload/text_reader.h"
#include "workload/trace_formats.h"

namespace servesim::workload {
namespace {

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

}  // namespace

absl::StatusOr<std::unique_ptr<RowReader>> OpenAzureRows(const std::string& path,
                                                         std::unique_ptr<LineReader> lines) {
  return AzureRows::Open(path, std::move(lines));
}

absl::StatusOr<TraceFile> ParseAzureTrace(absl::string_view content, const std::string& name) {
  ASSIGN_OR_RETURN(auto rows, AzureRows::Open(name, MemoryLines(content)));
  return DrainRows(*rows);
}

absl::StatusOr<TraceFile> ReadAzureTrace(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<LineReader> lines, FileLines(path));
  ASSIGN_OR_RETURN(auto rows, AzureRows::Open(path, std::move(lines)));
  return DrainRows(*rows);
}

}  // namespace servesim::workload
