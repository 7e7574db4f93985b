// Studies over many runs: `servesim sweep` and `merge` (the points), and
// what `search` (studies/search.h) shares with them.
//
// SimGrid allows one engine per process, so every run (a sweep "point", a
// search "probe") is a child `servesim run` process writing into its own
// folder. Each folder holds point.json: the scenario file, an FNV-1a 64 hash
// of its text, and every --set the run gets, in order. A folder whose
// point.json matches and whose summary.json is complete is finished: an
// interrupted sweep or search resumes without redoing it.
//
// sweep.csv (written by sweep and by merge, from the point folders alone, so
// both write the same bytes): one row per point in point order: `point`
// (the folder name), the varied fields, then summary.json figures copied
// verbatim (kSweepFigures).
//
#ifndef SERVESIM_STUDIES_SWEEP_H_
#define SERVESIM_STUDIES_SWEEP_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace servesim::studies {

// The summary.json figures of sweep.csv, as (column, key, distribution
// field or "").
struct SweepFigure {
  const char* column;
  const char* key;
  const char* field;
};
extern const std::vector<SweepFigure> kSweepFigures;

// One varied field and its values, from --vary field=v1,v2,...
struct VaryAxis {
  std::string field;
  std::vector<std::string> values;
};
absl::StatusOr<VaryAxis> ParseVary(const std::string& spec);

struct SweepPoint {
  int64_t index = 0;
  std::string name;  // folder name: <index>_<slug>
  std::vector<std::pair<std::string, std::string>> vary;  // field, value
};
// The cross product; the last --vary changes fastest.
std::vector<SweepPoint> ExpandPoints(const std::vector<VaryAxis>& axes);

// What a point folder's run is: the scenario and every override in order.
struct PointSpec {
  std::string scenario;  // absolute path
  std::string scenario_hash;
  std::vector<std::string> overrides;  // path=value
  int64_t index = -1;                  // -1: a search probe
  std::vector<std::pair<std::string, std::string>> vary;
};
std::string PointJson(const PointSpec& p);
absl::StatusOr<PointSpec> ParsePointJson(const std::string& text, const std::string& where);

uint64_t Fnv1a64(const std::string& text);
absl::StatusOr<std::string> ScenarioHash(const std::string& path);

// `servesim run` arguments (after the binary) for one point.
std::vector<std::string> RunArgs(const PointSpec& p, const std::string& out_dir);
std::string ShellQuote(const std::string& s);

// The top-level and distribution figures of a summary.json, as written
// (numbers verbatim). Errors name the folder and what is missing.
absl::StatusOr<std::map<std::string, std::string>> ReadSummaryFigures(const std::string& point_dir);

// True when `dir` holds point.json equal to `p` and a complete summary.json.
bool PointFinished(const std::string& dir, const PointSpec& p);
// Writes point.json (and removes a stale summary.json) before a run.
absl::Status PreparePoint(const std::string& dir, const PointSpec& p);

// sweep.csv from point folders (each a points/ child of a sweep folder, or
// a point folder itself). Rows in point order.
struct SweepTable {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
};
absl::StatusOr<SweepTable> MergePoints(const std::vector<std::string>& dirs);
std::string TableCsv(const SweepTable& t);
std::string TableText(const SweepTable& t);

std::string FormatValue(double v);  // %.10g

}  // namespace servesim::studies

#endif  // SERVESIM_STUDIES_SWEEP_H_
