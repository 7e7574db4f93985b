// SLO-limited batching (AttAcc §3.2, §7.3): MaxBatchWithinSlo searches the
// decode batch sizes for the largest whose planned iteration meets a
// time-between-tokens target. It only calls IterationPlanner::Plan on
// uniform decode batches (UniformBatch); times in seconds.
#include <algorithm>

#include "common/status_macros.h"
#include "scheduler/planner.h"

namespace servesim::scheduler {

absl::StatusOr<int64_t> MaxBatchWithinSlo(IterationPlanner& planner, double tbt_s,
                                          int64_t context_tokens, int64_t max_batch, int64_t hint) {
  auto meets = [&](int64_t b) -> absl::StatusOr<bool> {
    ASSIGN_OR_RETURN(IterationCost c, planner.Plan(UniformBatch(b, 1, context_tokens)));
    return c.time_s <= tbt_s;
  };
  int64_t lo = 0, hi = max_batch;  // lo meets the SLO (0 trivially), above hi none does
  if (hint >= 1 && hint <= max_batch) {
    // Gallop from the hint (a neighbouring context's cap: usually the
    // answer or next to it) to a bracket, then bisect it.
    ASSIGN_OR_RETURN(bool ok, meets(hint));
    if (ok) {
      lo = hint;
      for (int64_t step = 1; lo < hi; step *= 2) {
        const int64_t b = std::min(hi, lo + step);
        ASSIGN_OR_RETURN(ok, meets(b));
        if (!ok) {
          hi = b - 1;
          break;
        }
        lo = b;
      }
    } else {
      hi = hint - 1;
      for (int64_t step = 1; lo < hi; step *= 2) {
        const int64_t b = std::max<int64_t>(1, hi - step + 1);
        ASSIGN_OR_RETURN(ok, meets(b));
        if (ok) {
          lo = b;
          break;
        }
        hi = b - 1;
      }
    }
  }
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    ASSIGN_OR_RETURN(bool ok, meets(mid));
    if (ok) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

}  // namespace servesim::scheduler
