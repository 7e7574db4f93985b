// The replay's file access (studies/replay_files.h): whole-file reads,
// gzip included, writes, and the CSV Table.
#include "studies/replay_files.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace servesim::studies::replay_internal {

const google::protobuf::Value* JsonField(const google::protobuf::Struct& s,
                                         absl::string_view path) {
  using google::protobuf::Value;
  const google::protobuf::Struct* cur = &s;
  const Value* v = nullptr;
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    if (cur == nullptr) return nullptr;
    auto it = cur->fields().find(std::string(part));
    if (it == cur->fields().end()) return nullptr;
    v = &it->second;
    cur = v->kind_case() == Value::kStructValue ? &v->struct_value() : nullptr;
  }
  return v;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

absl::StatusOr<std::string> ReadMaybeGzip(const std::string& path) {
  if (!absl::EndsWith(path, ".gz")) return ReadFile(path);
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::string out;
  char buf[1 << 16];
  int n = 0;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  const bool failed = n < 0;
  gzclose(f);
  if (failed) return absl::DataLossError(absl::StrCat(path, ": not a readable gzip file"));
  return out;
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat(path, ": cannot write"));
  return absl::OkStatus();
}

// ------------------------------------------------------------ csv table ----

absl::StatusOr<size_t> Table::Column(absl::string_view name) const {
  const auto it = std::find(header.begin(), header.end(), name);
  if (it == header.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": no column ", name, "; columns: ", absl::StrJoin(header, ",")));
  }
  return static_cast<size_t>(it - header.begin());
}

bool Table::Has(absl::string_view name) const {
  return std::find(header.begin(), header.end(), name) != header.end();
}

absl::StatusOr<double> Table::Number(size_t r, size_t c) const {
  double v = 0;
  if (!absl::SimpleAtod(rows[r][c], &v) || !std::isfinite(v)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ":", lines[r], ": column ", header[c],
                                                   " is \"", rows[r][c], "\"; expected a number"));
  }
  return v;
}

absl::StatusOr<Table> ReadTable(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  Table t;
  t.path = path;
  int64_t line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripSuffix(line, "\r");
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    std::vector<std::string> f = absl::StrSplit(line, ',');
    if (t.header.empty()) {
      t.header = std::move(f);
      continue;
    }
    if (f.size() != t.header.size()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": ", f.size(),
                                                     " fields; the header has ", t.header.size()));
    }
    t.rows.push_back(std::move(f));
    t.lines.push_back(line_no);
  }
  if (t.header.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": empty"));
  return t;
}

}  // namespace servesim::studies::replay_internal
