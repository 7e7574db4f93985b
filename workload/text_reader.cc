#include "workload/text_reader.h"

#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

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
#include "absl/strings/strip.h"
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
    if (err == ELOOP) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": a loop of symbolic links; expected a trace file"));
    }
    return absl::Status(
        absl::ErrnoToStatusCode(err),
        absl::StrCat(path, ": cannot open: ",
                     std::error_code(err, std::generic_category()).message()));
  }
  struct stat info;
  // A directory opens fine with fopen on Linux; say what is wrong rather
  // than let a read fail with EISDIR. A device (/dev/zero) would be read
  // without end: refused by name too. Pipes stream like files.
  if (fstat(fileno(file), &info) == 0 && (S_ISDIR(info.st_mode) || S_ISCHR(info.st_mode) ||
                                          S_ISBLK(info.st_mode) || S_ISSOCK(info.st_mode))) {
    std::fclose(file);
    const char* kind = S_ISDIR(info.st_mode)   ? "a directory"
                       : S_ISCHR(info.st_mode) ? "a character device"
                       : S_ISBLK(info.st_mode) ? "a block device"
                                               : "a socket";
    return absl::InvalidArgumentError(absl::StrCat(path, ": is ", kind, "; expected a trace file"));
  }
  return file;
}

LineReader::LineReader(std::string path, std::FILE* file, bool gzip)
    : path_(std::move(path)), file_(file) {
  // gzdopen takes a descriptor of its own, so that file_ still owns the
  // one it opened.
  if (gzip) gz_ = gzdopen(dup(fileno(file_)), "rb");
}

LineReader::~LineReader() {
  if (gz_ != nullptr) gzclose(static_cast<gzFile>(gz_));
  if (file_ != nullptr) std::fclose(file_);
}

absl::StatusOr<size_t> LineReader::ReadChunk(char* out, size_t n) {
  if (gz_ == nullptr) {
    const size_t got = std::fread(out, 1, n, file_);
    if (got < n && std::ferror(file_) != 0) {
      const int err = errno;
      return absl::Status(absl::ErrnoToStatusCode(err),
                          absl::StrCat(path_, ": cannot read: ",
                                       std::error_code(err, std::generic_category()).message()));
    }
    return got;
  }
  const int got = gzread(static_cast<gzFile>(gz_), out, static_cast<unsigned>(n));
  if (got < 0) {
    int code = 0;
    const char* what = gzerror(static_cast<gzFile>(gz_), &code);
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": cannot decompress (gzip): ", what == nullptr ? "?" : what));
  }
  return static_cast<size_t>(got);
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
  ASSIGN_OR_RETURN(const size_t n, ReadChunk(buffer_.data() + keep, kChunkBytes));
  buffer_.resize(keep + n);
  data_ = buffer_;
  if (n < kChunkBytes) eof_ = true;
  return absl::OkStatus();
}

std::unique_ptr<LineReader> MemoryLines(absl::string_view content) {
  return std::make_unique<LineReader>(content);
}

absl::StatusOr<std::unique_ptr<LineReader>> FileLines(const std::string& path) {
  ASSIGN_OR_RETURN(std::FILE* file, OpenForReading(path));
  return std::make_unique<LineReader>(path, file, absl::EndsWith(path, ".gz"));
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

absl::Status CsvReader::ReadHeader(absl::Span<const absl::string_view> columns,
                                   absl::Span<const absl::string_view> optional) {
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
  for (absl::string_view column : optional) {
    const auto it = std::find(fields_.begin(), fields_.end(), column);
    index_.push_back(it == fields_.end() ? kMissing : static_cast<size_t>(it - fields_.begin()));
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

absl::Status ReadJsonObject(absl::string_view path, int64_t line_number, absl::string_view line,
                            absl::Span<const absl::string_view> keys, absl::string_view format,
                            std::vector<absl::string_view>* values) {
  values->assign(keys.size(), absl::string_view());
  JsonCursor cursor(line);
  auto malformed = [&](absl::string_view what) {
    return LineError(path, line_number,
                     absl::StrCat("malformed JSON at column ", cursor.column(), ": ", what, " (",
                                  format, ")"));
  };
  if (!cursor.Consume('{')) return malformed("expected '{'");
  if (!cursor.Consume('}')) {
    do {
      absl::string_view key;
      absl::string_view raw;
      if (!cursor.String(key)) return malformed("expected a quoted key");
      if (!cursor.Consume(':')) return malformed("expected ':' after a key");
      if (!cursor.Value(raw)) return malformed("expected a value");
      for (size_t i = 0; i < keys.size(); ++i) {
        if (key != keys[i]) continue;
        if (!(*values)[i].empty()) {
          return LineError(path, line_number,
                           absl::StrCat("duplicate key \"", key, "\" (", format, ")"));
        }
        (*values)[i] = raw;
      }
    } while (cursor.Consume(','));
    if (!cursor.Consume('}')) return malformed("expected ',' or '}'");
  }
  cursor.SkipSpace();
  if (!cursor.AtEnd()) return malformed("unexpected text after the object");
  return absl::OkStatus();
}

bool ParseIdArray(absl::string_view raw, std::vector<uint64_t>* out) {
  out->clear();
  raw = absl::StripAsciiWhitespace(raw);
  if (!absl::ConsumePrefix(&raw, "[") || !absl::ConsumeSuffix(&raw, "]")) return false;
  raw = absl::StripAsciiWhitespace(raw);
  if (raw.empty()) return true;
  size_t pos = 0;
  while (pos <= raw.size()) {
    size_t comma = raw.find(',', pos);
    if (comma == absl::string_view::npos) comma = raw.size();
    int64_t v = 0;
    if (!ParseInt64(raw.substr(pos, comma - pos), v) || v < 0) return false;
    out->push_back(static_cast<uint64_t>(v));
    pos = comma + 1;
  }
  return true;
}

}  // namespace servesim::workload
