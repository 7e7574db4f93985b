#include "workload/text_reader.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace servesim::workload {

absl::Status LineError(absl::string_view path, int64_t line,
                       absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ":", line, ": ", what));
}

std::string Quoted(absl::string_view field) {
  constexpr size_t kMaxShown = 60;
  if (field.size() > kMaxShown) {
    return absl::StrCat("\"", absl::CHexEscape(field.substr(0, kMaxShown)),
                        "...\"");
  }
  return absl::StrCat("\"", absl::CHexEscape(field), "\"");
}

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

LineReader::~LineReader() {
  if (file_ != nullptr) std::fclose(file_);
}

absl::StatusOr<bool> LineReader::NextNonBlank(absl::string_view& line) {
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

absl::Status LineReader::Refill() {
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

std::unique_ptr<LineReader> MemoryLines(absl::string_view content) {
  return std::make_unique<LineReader>(content);
}

absl::StatusOr<std::unique_ptr<LineReader>> FileLines(const std::string& path) {
  ASSIGN_OR_RETURN(std::FILE* file, OpenForReading(path));
  return std::make_unique<LineReader>(path, file);
}

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

absl::Status CsvReader::ReadHeader(absl::Span<const absl::string_view> columns) {
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

absl::StatusOr<bool> CsvReader::Next() {
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

absl::Status CsvReader::Split(absl::string_view line) {
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

}  // namespace servesim::workload
