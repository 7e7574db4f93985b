// The files a replay reads and writes: whole files (gzip too), a written
// file, fields of a JSON object, and the small CSV tables of a measured run (trace.csv, truth.csv,
// timeseries.csv) and of a simulated one (requests.csv, iterations.csv).
//
// Contract: errors name the file, and for a table the line and the column,
// as `servesim replay` prints them. No quoting in the CSV tables (none of
// these files needs it). Library-internal: only studies/replay_*.cc
// include this header.
#ifndef SERVESIM_STUDIES_REPLAY_FILES_H_
#define SERVESIM_STUDIES_REPLAY_FILES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/struct.pb.h"

namespace servesim::studies::replay_internal {

// The file's bytes; NOT_FOUND when it cannot be opened.
absl::StatusOr<std::string> ReadFile(const std::string& path);
// The same, gunzipped when the name ends in ".gz" (DATA_LOSS when it is
// not a readable gzip file).
absl::StatusOr<std::string> ReadMaybeGzip(const std::string& path);
// Replaces the file with `text`; UNAVAILABLE when it cannot.
absl::Status WriteFile(const std::string& path, const std::string& text);

// The value at a dotted path ("engine_knobs.max_num_seqs") of a JSON
// object read as a Struct; null when a part is missing or not an object.
const google::protobuf::Value* JsonField(const google::protobuf::Struct& s, absl::string_view path);

// A small CSV table with a header (no quoting), its rows and line numbers.
struct Table {
  std::string path;
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  std::vector<int64_t> lines;

  // The column's index; an error lists the header.
  absl::StatusOr<size_t> Column(absl::string_view name) const;
  bool Has(absl::string_view name) const;
  // Row r's value in column c as a finite number.
  absl::StatusOr<double> Number(size_t r, size_t c) const;
};

// Reads a table: blank lines skipped, every row as wide as the header.
absl::StatusOr<Table> ReadTable(const std::string& path);

}  // namespace servesim::studies::replay_internal

#endif  // SERVESIM_STUDIES_REPLAY_FILES_H_
