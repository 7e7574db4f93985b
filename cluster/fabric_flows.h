// The flows a replica's step sends over the fabric: collectives of a
// replica whose xPUs span nodes, and a cluster KV store's loads from other
// replicas' nodes (docs/disaggregation.md, "Collectives on the fabric";
// docs/kv_tiers.md, "Cluster store").
//
// Contract:
//  - Called by the engine's actor as a step is costed, in simulated time;
//    a call may block that actor in SimGrid until its flows end (counted in
//    RunState::engine_waits).
//  - Each returns how much longer the step lasts than its cost already
//    says (the bytes' time alone is in the cost): 0 when no other flow
//    shared a link, or when none could and no flow was sent.
//  - The bytes count on every link of their routes either way
//    (Fabric::links), and in the metrics (AddCollectives, AddStoreFlows).
// Internal to cluster/.
#ifndef SERVESIM_CLUSTER_FABRIC_FLOWS_H_
#define SERVESIM_CLUSTER_FABRIC_FLOWS_H_

#include <simgrid/s4u.hpp>
#include <utility>
#include <vector>

#include "cluster/rank.h"
#include "cluster/run_state.h"
#include "scenario/scenario.h"

namespace servesim::cluster {

class FabricFlows {
 public:
  FabricFlows(RunState* sh, const scenario::ResolvedScenario* pool, int replica, Role role)
      : sh_(sh), pool_(pool), replica_(replica), role_(role) {}

  // A step of `duration` from `start` sends `bytes` of collectives out of
  // its nodes' NICs, which its cost times as if the NICs were its own: at
  // least the time they take over the NIC link alone, route latency +
  // bytes / bandwidth. When another flow may share a link of theirs during
  // the step (a KV flow in flight on the NIC link now, or, on a decode
  // replica, one that may leave a prefill replica before the step ends; on
  // a replica across racks, always), the bytes go as flows from the step's
  // start (the ring's hops within racks together over the NIC link, each
  // hop between racks over the uplinks too), sharing every link with what
  // else crosses it, and the step lasts as much longer as they take beyond
  // that time alone; returns the extra time. Otherwise no flow runs: it
  // would take exactly that time.
  double Collectives(double start, double duration, double bytes);

  // The blocks the ranks' batches load from another replica's node leave
  // that node as one flow per home, from the step's start, over the route
  // between the replicas (out of the home's NIC link, through the fabric,
  // into this replica's), sharing every link with what else crosses it:
  // other loads, and in a disaggregated pool KV hand-offs and collectives.
  // Their time alone, the smallest route latency plus all their bytes over
  // this replica's NIC link, is already in the step's load time (the tier
  // link's); returns how much longer the flows took. Blocks at home take
  // no flow.
  double StoreFlows(const Ranks& ranks, double start);

 private:
  void SleepUntil(double t);

  // A step's store loads: per flow, its bytes and its route's links.
  struct StoreFlow {
    int home = 0;
    double bytes = 0;
    std::vector<std::pair<int, int>> links;  // (index in Fabric::links, direction)
  };

  RunState* sh_;
  const scenario::ResolvedScenario* pool_;
  int replica_;
  Role role_;
  std::vector<simgrid::s4u::CommPtr> flows_;
  std::vector<StoreFlow> store_flows_of_step_;
};

}  // namespace servesim::cluster

#endif  // SERVESIM_CLUSTER_FABRIC_FLOWS_H_
