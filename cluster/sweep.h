// Studies over many runs: `servesim sweep`, `merge` and `search`.
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
// Search (README "Studies: sweeps and searches"): a probe PASSES when every
// named statistic of summary.json is within its limit (e.g. ttft_p99 is
// summary.json's ttft_s.p99, the 99th percentile over completed requests;
// tbt_p99 is over every token gap of every request, pooled) AND the run's
// slo_attainment >= the target. slo_attainment is the per-request figure
// (README "Metrics"; rejected requests count as misses) computed with
// slo.ttft_s = the ttft limit and slo.tpot_s = the tpot limit (else the tbt
// limit) when --slo names them, otherwise the scenario's slo values. The
// search assumes passing is monotone in the varied value; it brackets by
// doubling (halving) from the scenario's value, then bisects: the rate to a
// relative width (hi - lo) / lo <= tolerance, replicas to hi - lo == 1.
// Parallel probes (-j) are speculative: the next levels of the sequential
// decision tree; the answer and the probes reported do not depend on -j.
#ifndef SERVESIM_CLUSTER_SWEEP_H_
#define SERVESIM_CLUSTER_SWEEP_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace servesim::cluster {

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

// Runs `binary` with each argument list, at most `parallel` at once, each
// writing stdout+stderr to its log file. Returns per-job exit statuses
// (0 = success; -1: could not start). `on_done(job, status)` is called as
// each ends (in completion order).
std::vector<int> RunProcesses(const std::string& binary,
                              const std::vector<std::vector<std::string>>& args,
                              const std::vector<std::string>& logs, int parallel,
                              const std::function<void(size_t, int)>& on_done);

// Cores this process may use (sched affinity).
int AvailableCores();

// sweep.csv from point folders (each a points/ child of a sweep folder, or
// a point folder itself). Rows in point order.
struct SweepTable {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
};
absl::StatusOr<SweepTable> MergePoints(const std::vector<std::string>& dirs);
std::string TableCsv(const SweepTable& t);
std::string TableText(const SweepTable& t);

// ---- search ----

struct SloLimit {
  std::string name;    // as given: ttft_p99
  std::string key;     // summary.json key: ttft_s
  std::string field;   // p99
  double limit_s = 0;
};
// "ttft_p99=2s,tbt_p99=50ms": metrics ttft, tbt, tpot, e2e; statistics
// mean, p50, p90, p99, max; values in s, ms or us (bare numbers: seconds).
absl::StatusOr<std::vector<SloLimit>> ParseSlo(const std::string& spec);

// Decides whether the run in `point_dir` passes; fills `reason` with the
// first limit missed ("" when it passes).
absl::StatusOr<bool> ProbePasses(const std::map<std::string, std::string>& figures,
                                 const std::vector<SloLimit>& slo, double attainment,
                                 std::string* reason);

struct SearchStep {
  std::string phase;  // bracket | bisect
  double value = 0;
  bool pass = false;
};
struct SearchResult {
  std::vector<SearchStep> path;  // the sequential algorithm's probes in order
  double answer = 0;             // max rate / min replicas that passed
  double lo = 0, hi = 0;         // final bracket (fail side for replicas: lo)
};
// `evaluate` runs the values (in parallel, up to `parallel`) and says which
// pass. Rate: largest passing value, bracketing from `start` by doubling or
// halving, bisecting to (hi - lo) / lo <= tolerance. Values are rounded to
// 10 significant digits.
using Evaluate = std::function<absl::StatusOr<std::vector<bool>>(const std::vector<double>&)>;
absl::StatusOr<SearchResult> SearchMaxRate(double start, double tolerance, int parallel,
                                           const Evaluate& evaluate);
// Replicas: smallest passing integer >= 1, up to `max_replicas`.
absl::StatusOr<SearchResult> SearchMinReplicas(int64_t start, int64_t max_replicas,
                                               int parallel, const Evaluate& evaluate);

std::string FormatValue(double v);  // %.10g

}  // namespace servesim::cluster

#endif  // SERVESIM_CLUSTER_SWEEP_H_
