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
//  - kPrefixAffinity: least prefill work ahead of the request, in blocks:
//    kv_blocks_queued + prompt_blocks - prefix_hit_blocks (the request's
//    leading blocks the replica's prefix cache holds, filled by the caller
//    per request). Without hits it is the least queued prefill; a multi-
//    turn conversation's next turn finds its history where it was served.
#ifndef SERVESIM_SCHEDULER_ROUTER_H_
#define SERVESIM_SCHEDULER_ROUTER_H_

#include <cstdint>

#include "absl/types/span.h"

namespace servesim::scheduler {

enum class RoutingPolicy { kRoundRobin, kLeastOutstanding, kLeastKvLoad, kPrefixAffinity };

struct ReplicaLoad {
  int64_t outstanding = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_queued = 0;
  int64_t kv_blocks_capacity = 1;
  // kPrefixAffinity, per request: the prompt's blocks, and how many of its
  // leading ones the replica holds cached.
  int64_t prompt_blocks = 0;
  int64_t prefix_hit_blocks = 0;
};

class Router {
 public:
  explicit Router(RoutingPolicy policy) : policy_(policy) {}
  // Index of the replica for the next request; loads must be non-empty.
  int Route(absl::Span<const ReplicaLoad> loads);
  RoutingPolicy policy() const { return policy_; }

 private:
  RoutingPolicy policy_;
  int64_t next_ = 0;
};

}  // namespace servesim::scheduler

#endif  // SERVESIM_SCHEDULER_ROUTER_H_
