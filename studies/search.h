// `servesim search`: the largest arrival rate or the fewest replicas that
// meet an SLO.
//
// Search (docs/studies.md): a probe PASSES when every
// named statistic of summary.json is within its limit (e.g. ttft_p99 is
// summary.json's ttft_s.p99, the 99th percentile over completed requests;
// tbt_p99 is over every token gap of every request, pooled) AND the run's
// slo_attainment >= the target. slo_attainment is the per-request figure
// (README "Metrics definitions"; rejected requests count as misses) computed with
// slo.ttft_s = the ttft limit and slo.tpot_s = the tpot limit (else the tbt
// limit) when --slo names them, otherwise the scenario's slo values. The
// search assumes passing is monotone in the varied value; it brackets by
// doubling (halving) from the scenario's value, then bisects: the rate to a
// relative width (hi - lo) / lo <= tolerance, replicas to hi - lo == 1.
// Parallel probes (-j) are speculative: the next levels of the sequential
// decision tree; the answer and the probes reported do not depend on -j.
#ifndef SERVESIM_STUDIES_SEARCH_H_
#define SERVESIM_STUDIES_SEARCH_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace servesim::studies {

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
// With parallel > 1 the extra values are speculative (what the sequential
// algorithm would ask next under either outcome), so the path and the answer
// do not depend on `parallel`. `on_step`, if given, sees each probe of the
// sequential algorithm once, in its order, when the algorithm takes its
// result; a status it returns stops the search with that status. With
// `max_probes` > 0 the search stops when the sequential algorithm would
// need more probes than that. Neither depends on `parallel` either: what a
// stopped search reports is what a sequential one would.
using Evaluate = std::function<absl::StatusOr<std::vector<bool>>(const std::vector<double>&)>;
using OnStep = std::function<absl::Status(const SearchStep&)>;
absl::StatusOr<SearchResult> SearchMaxRate(double start, double tolerance, int parallel,
                                           const Evaluate& evaluate, const OnStep& on_step = {},
                                           int max_probes = 0);
// Replicas: smallest passing integer >= 1, up to `max_replicas`.
absl::StatusOr<SearchResult> SearchMinReplicas(int64_t start, int64_t max_replicas, int parallel,
                                               const Evaluate& evaluate, const OnStep& on_step = {},
                                               int max_probes = 0);

}  // namespace servesim::studies

#endif  // SERVESIM_STUDIES_SEARCH_H_
