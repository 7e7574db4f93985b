#include "scheduler/router.h"

namespace servesim::scheduler {

int Router::Route(absl::Span<const ReplicaLoad> loads) {
  const int n = static_cast<int>(loads.size());
  switch (policy_) {
    case RoutingPolicy::kRoundRobin:
      return static_cast<int>(next_++ % n);
    case RoutingPolicy::kLeastOutstanding: {
      int best = 0;
      for (int i = 1; i < n; ++i) {
        if (loads[i].outstanding < loads[best].outstanding) best = i;
      }
      return best;
    }
    case RoutingPolicy::kLeastKvLoad: {
      // Compare fractions exactly: a/b < c/d  <=>  a*d < c*b (b, d > 0).
      int best = 0;
      auto demand = [](const ReplicaLoad& l) {
        return static_cast<__int128>(l.kv_blocks_used + l.kv_blocks_queued);
      };
      for (int i = 1; i < n; ++i) {
        if (demand(loads[i]) * loads[best].kv_blocks_capacity <
            demand(loads[best]) * loads[i].kv_blocks_capacity) {
          best = i;
        }
      }
      return best;
    }
    case RoutingPolicy::kPrefixAffinity: {
      auto ahead = [](const ReplicaLoad& l) {
        return l.kv_blocks_queued + l.prompt_blocks - l.prefix_hit_blocks;
      };
      int best = 0;
      for (int i = 1; i < n; ++i) {
        if (ahead(loads[i]) < ahead(loads[best])) best = i;
      }
      return best;
    }
  }
  return 0;
}

}  // namespace servesim::scheduler
