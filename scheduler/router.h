// Routing of arriving requests across replicas.
//
// Contract: a pure function of the replicas' loads and the router's cursor;
// ties go to the lowest replica index, so routing is deterministic.
//  - kRoundRobin: replicas in turn.
//  - kLeastOutstanding: fewest requests routed to it and not yet finished
//    or rejected (counted from the router's side, so in-flight hand-offs
//    count).
//  - kLeastKvLoad: lowest (KV blocks held + blocks its queued prompts need)
//    / capacity.
#ifndef SERVESIM_SCHEDULER_ROUTER_H_
#define SERVESIM_SCHEDULER_ROUTER_H_

#include <cstdint>

#include "absl/types/span.h"

namespace servesim::scheduler {

enum class RoutingPolicy { kRoundRobin, kLeastOutstanding, kLeastKvLoad };

struct ReplicaLoad {
  int64_t outstanding = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_queued = 0;
  int64_t kv_blocks_capacity = 1;
};

class Router {
 public:
  explicit Router(RoutingPolicy policy) : policy_(policy) {}
  // Index of the replica for the next request; loads must be non-empty.
  int Route(absl::Span<const ReplicaLoad> loads);

 private:
  RoutingPolicy policy_;
  int64_t next_ = 0;
};

}  // namespace servesim::scheduler

#endif  // SERVESIM_SCHEDULER_ROUTER_H_
