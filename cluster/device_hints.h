// Hints to remote devices (devices::Device::Expect, agents/remote_device.h):
// what a replica's coming iterations will ask, so that an agent far away
// can answer before it is asked.
//
// Contract:
//  - Hints never change a cost or a result: a wrong one costs only an
//    agent's work. In-process devices want none (ExpectSteps() is 0) and
//    every call here returns at once.
//  - One DeviceHints per engine, reading the engine's ranks and whether it
//    is stepping (borrowed). A projection made for one rank can renew, in
//    the same message, the projections of other engines' ranks that share
//    its devices (RunState::anticipating lists the engines that hint).
//  - Projections come from scheduler::ReplicaScheduler::Project: the
//    running batch's next steps if no request arrives.
// Internal to cluster/.
#ifndef SERVESIM_CLUSTER_DEVICE_HINTS_H_
#define SERVESIM_CLUSTER_DEVICE_HINTS_H_

#include <cstddef>
#include <cstdint>

#include "cluster/rank.h"
#include "cluster/run_state.h"
#include "scenario/scenario.h"
#include "scheduler/batching.h"
#include "scheduler/request.h"

namespace servesim::cluster {

class DeviceHints {
 public:
  // `pool`, `ranks` and `stepping` are the engine's (borrowed).
  DeviceHints(RunState* sh, const scenario::ResolvedScenario* pool, Ranks* ranks,
              const bool* stepping)
      : sh_(sh), pool_(pool), ranks_(ranks), stepping_(stepping) {}

  // Rank `r` is about to plan its batch: when it is not the one projected
  // (a request arrived, or the projection is about to run out), project the
  // batches after it (requests leave as their output ends) and tell the
  // devices the ops they will be asked.
  void Anticipate(Rank& r);

  // Whether HintArrival may guess a request's prefill step: a colocated
  // replica of one rank and stage whose prompts prefill whole and alone
  // (PREFILL_FIRST with the cache holding none of them), planning for
  // devices that take hints.
  bool HintsArrivals(Role role) const;
  // A request is on its way: tells the devices the ops of the step that
  // prefills it alone, the step PREFILL_FIRST runs when it finds it alone
  // in the queue (most arrivals on a trace's rate). A remote device sends
  // them with its next round trip (the projection of an earlier arrival's
  // batches, usually), and the step, an arrival later, finds their costs
  // in the memo instead of making one more. A wrong guess (other prompts
  // waiting too) costs an agent's work and changes nothing.
  void HintArrival(const scheduler::RequestSpec& spec);

 private:
  // A batch's identity: who runs, with how many new and past tokens (a
  // collision costs only a hint).
  static uint64_t BatchHash(const scheduler::Batch& b);
  // Projects `steps` batches after the rank's current one and tells the
  // devices those after the first `told` (told already).
  static void Reproject(Rank& r, int steps, size_t told);

  RunState* sh_;
  const scenario::ResolvedScenario* pool_;
  Ranks* ranks_;
  const bool* stepping_;
  scheduler::Batch hint_batch_;  // HintArrival's
};

}  // namespace servesim::cluster

#endif  // SERVESIM_CLUSTER_DEVICE_HINTS_H_
