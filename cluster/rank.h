// One data-parallel rank of a replica: a TP group with its own batch, KV
// cache, scheduler and planner (one per replica but for MoE models with
// cluster.data_parallel > 1, whose ranks step in lockstep: docs/moe.md).
// Internal to cluster/.
#ifndef SERVESIM_CLUSTER_RANK_H_
#define SERVESIM_CLUSTER_RANK_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "devices/model.h"
#include "scheduler/batching.h"
#include "scheduler/planner.h"

namespace servesim::cluster {

struct Rank {
  Rank(const scheduler::BatchingConfig& b, const devices::ModelDims& m,
       const scheduler::PlannerConfig& pc)
      : scheduler(b), planner(m, pc) {}
  scheduler::ReplicaScheduler scheduler;
  scheduler::IterationPlanner planner;
  scheduler::IterationCost cost;
  const scheduler::Batch* batch = nullptr;  // this iteration's; null: none
  // Hints to remote devices (DeviceHints::Anticipate): the projected
  // batches' hashes, the next one due, and whether the projection stopped
  // at its horizon (not because everyone finished).
  std::vector<uint64_t> projected;
  size_t projected_next = 0;
  bool projected_full = false;
  bool anticipating = false;  // Anticipate found the devices take hints
  std::vector<scheduler::Batch> projection;
};

using Ranks = std::vector<std::unique_ptr<Rank>>;

}  // namespace servesim::cluster

#endif  // SERVESIM_CLUSTER_RANK_H_
