// One replica's engine: the loop that takes requests, asks the replica's
// schedulers for a batch, costs it with the planners on the replica's
// devices, and applies it at the step's end, as vLLM's EngineCore steps its
// scheduler and executor.
//
// Contract:
//  - One Engine per replica, run by its own SimGrid actor (Run) and, on a
//    decode replica of a disaggregated cluster, a receiver actor that lands
//    its KV parts as their flows end (Receiver). Simulated time only.
//  - Colocated and decode engines whose steps make no SimGrid call and that
//    no observer watches in time advance lazily (docs/design.md, "Engines
//    advance lazily"): their state stands at a time of their own and is
//    brought forward in plain calls (AdvanceTo, NextStep) by whoever reads
//    it. The others sleep through their steps in SimGrid. Both give the
//    same result, byte for byte.
//  - The engine composes the parts that do one job each:
//      cluster/rank.h          a data-parallel rank's scheduler and planner
//      cluster/power.h         power cap, board limit, static power
//      cluster/fabric_flows.h  collectives and store loads as flows
//      cluster/kv_transfer.h   KV hand-off (prefill side) and landing (decode)
//      cluster/device_hints.h  what remote devices will be asked
//    Its own files: engine.cc (the step loop and the receiver),
//    iteration.cc (one step: schedule, cost, record) and intake.cc (taking
//    messages: arrivals, early rejection, the data-parallel rank a request
//    joins).
//  - A failed step (a device agent lost) or a step past the simulated-time
//    limit stops the whole run (RunState::Stop).
// Internal to cluster/.
#ifndef SERVESIM_CLUSTER_ENGINE_H_
#define SERVESIM_CLUSTER_ENGINE_H_

#include <cstdint>
#include <memory>
#include <simgrid/s4u.hpp>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cluster/device_hints.h"
#include "cluster/fabric_flows.h"
#include "cluster/kv_transfer.h"
#include "cluster/power.h"
#include "cluster/rank.h"
#include "cluster/run_state.h"
#include "devices/device.h"
#include "metrics/collector.h"
#include "scenario/scenario.h"
#include "scheduler/batching.h"
#include "scheduler/kv_store.h"
#include "scheduler/pipeline.h"
#include "scheduler/request.h"

namespace servesim::cluster {

class Engine {
 public:
  // `pool`: the resolved scenario of the engine's pool (the whole
  // scenario when colocated); borrowed.
  // `store`: the pool's cluster KV store, or null.
  Engine(RunState* sh, const scenario::ResolvedScenario* pool, Role role, int replica,
         std::shared_ptr<devices::Device> device, std::shared_ptr<devices::Device> attention,
         std::shared_ptr<scheduler::BlockLru> store);
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  bool lazy() const { return lazy_; }

  // The engine actor's body: steps until every request sent here is done.
  void Run();

  // Lazy engines: brings the engine's state forward to `t`. Every step
  // ending before `t` completes, the messages landed by its end are taken,
  // and the next step starts. Nothing reaches or reads a replica between
  // those moments, so the result is the one a SimGrid sleep per step gives.
  // Returns false once the run has stopped.
  bool AdvanceTo(double t);
  // Whether the step in progress ends before `t`, and when it ends.
  bool StepsBefore(double t) const { return stepping_ && step_end_ < t; }
  double step_end() const { return step_end_; }
  // Completes the step in progress and starts the next (AdvanceTo's step;
  // RunState::advance takes several engines' steps in the order they end).
  // False once the run has stopped.
  bool NextStep();

  // Decode replicas: the receiver actor's body. It takes every message as
  // it lands, so that a KV part's time is its transfer's end, not the end
  // of the step the engine was in.
  void Receiver();

  // Hints of arrivals to remote devices (DeviceHints).
  bool HintsArrivals() { return hints_.HintsArrivals(role_); }
  void HintArrival(const scheduler::RequestSpec& spec) { hints_.HintArrival(spec); }

  // The most of `spec`'s leading blocks one of this replica's ranks holds
  // cached.
  int64_t CachedPrefixBlocks(const scheduler::RequestSpec& spec) const;

  // Charges the replica's static power over the run's `span_s`.
  void ChargeStatic(double span_s) const { power_.ChargeStatic(span_s, sh_->metrics); }

 private:
  // Forwards the schedulers' events to the metrics observer and counts
  // finishes (intake.cc).
  class Counting : public scheduler::RequestObserver {
   public:
    explicit Counting(Engine* e) : e_(e) {}
    void OnFirstToken(const scheduler::RequestState& r, double t) override;
    void OnGaps(double t, double gap, int64_t count) override;
    void OnFinish(const scheduler::RequestState& r, double t) override;
    void OnReject(const scheduler::RequestSpec& r, scheduler::RejectReason why, double t) override;

   private:
    Engine* e_;
  };

  // ---- the step loop (engine.cc) ----
  // A lazy engine's loop: it waits in SimGrid only for messages (a decode
  // replica's receiver takes them and brings it forward: Land).
  bool RunLazy();
  // Engines that step in SimGrid: prefill replicas, and colocated or
  // decode replicas whose steps make SimGrid calls or that an observer
  // watches. They run ahead without an event while nothing can reach them
  // (the next arrival or hand-off).
  bool RunStepping();
  // Takes the requests landed by `t` (the end of the step before, or
  // now) and starts the next step at `t`, or marks the replica idle.
  bool StartAt(double t);
  // Runs the iteration that starts at `t` (Iteration) into `*duration`;
  // false once that stopped the run (past the simulated-time limit, or a
  // failed iteration).
  bool Step(double t, double* duration);
  void CompleteAt(double t);
  // The end of the run for this replica: its cache's figures, and the end
  // of a prefill replica's hand-offs.
  void Finished();
  // Nothing was schedulable (Iteration): blocks until a request's
  // asynchronous tier loads end (wait_until_) or a message comes, which
  // Run then takes.
  void AwaitLoads();
  bool Idle() const;
  // Without a live sink or pacing, whose observers watch the clock.
  // Prefill replicas hand KV off as their steps start and end, in SimGrid
  // time. Nor with a cluster KV store, which the replicas must use in time
  // order.
  bool FastForward() const;
  // A stepping engine's time: the clock, or the end of the step it slept
  // through if later. SimGrid ends a sleep within its timing precision
  // (surf/precision, 1e-9 s) of the date asked when another event falls
  // that close, so the end is taken as computed, as a lazy engine takes it.
  double Now() const;
  // SimGrid's blocking calls, counted (RunState::engine_waits).
  void SleepUntil(double t);
  Message* Wait(simgrid::s4u::Mailbox* box);
  // Decode replicas: lands a message the receiver took (a lazy engine is
  // brought forward to the landing first); false once the run has stopped.
  bool Land(Message* msg);
  void TakeLanded();

  // ---- one step (iteration.cc) ----
  // Schedules, costs and records one iteration starting at `start`;
  // returns its duration.
  absl::StatusOr<double> Iteration(double start);
  // Asks every rank with work for its batch; the group's and the largest
  // rank's tokens. Returns the first rank with a batch, or null.
  Rank* ScheduleRanks(double start, int64_t* group_tokens, int64_t* most_tokens);
  // Costs every rank's batch (an idle rank of a lockstep group runs the
  // MoE layers for the others; an empty pipeline slot costs nothing) and
  // fills the record's batch figures and `*tier_s`, the wait for KV tiers
  // (the slowest rank's). Returns the step's cost: the one rank's own, or
  // the ranks' or stages' combined in cost_.
  absl::StatusOr<scheduler::IterationCost*> CostRanks(Rank* lead, int64_t group_tokens,
                                                      double load_extra,
                                                      metrics::IterationRecord* it, double* tier_s);
  // The SLO batch cap for the current mean context (SloCap) or nothing.
  absl::StatusOr<int64_t> SloCap();
  // Every Nth iteration within the window (output.timeline_*): costed
  // again with its spans recorded (the planner is pure: same cost).
  absl::Status SampleTimeline(Rank& rank, const metrics::IterationRecord& it);
  // The step as the live metrics see it.
  void ReportLive(double start, double duration, const metrics::IterationRecord& it,
                  const scheduler::IterationCost& cost, double active_j);

  // ---- taking messages (intake.cc) ----
  // Takes a message at `now` (a lazy engine's time may be behind the
  // clock).
  void Receive(Message* msg, double now);
  // SLO-aware early rejection (scheduler.admission REJECT_LATE).
  bool RejectedLate(Rank& rank, const scheduler::RequestSpec& spec, double now);
  // A request reaches the prefill pool.
  void Prefill(const scheduler::RequestSpec& spec, double now);
  // A decode replica's KV part lands (KvReceiver); with the last one the
  // request joins a rank's queue.
  void ReceiveKv(const Message& msg, double now);
  // The rank an arriving request joins.
  Rank& PickRank();
  void UpdateLoad();

  // A failed iteration (e.g. no device agent left) ends the whole run.
  void Stop(absl::Status status) { sh_->Stop(std::move(status)); }

  RunState* sh_;
  const scenario::ResolvedScenario* pool_;
  Role role_;
  int replica_;
  std::shared_ptr<devices::Device> device_;
  std::shared_ptr<devices::Device> attention_;
  scheduler::RequestObserver* observer_;
  Ranks ranks_;
  Counting counting_{this};
  PowerModel power_;
  FabricFlows flows_;
  DeviceHints hints_;
  std::unique_ptr<KvSender> kv_out_;   // prefill replicas
  std::unique_ptr<KvReceiver> kv_in_;  // decode replicas
  // Decode and lazy replicas: messages landed and not yet taken, with
  // their times; what the receiver counted; the engine's wake-up while it
  // waits idle.
  std::vector<std::pair<Message*, double>> landed_;
  // Lazy replicas (RunLazy): whether a step is under way, its end, the
  // time the replica's state stands at (a stepping one's: the end of its
  // last step, Now), and the requests landed so far.
  bool lazy_ = false;
  bool all_landed_ = false;  // a decode replica's receiver is done
  bool stepping_ = false;
  double step_end_ = 0;
  double last_end_ = 0;
  int64_t received_ = 0;
  double landed_s_ = 0;  // the time of the message Receive() takes
  // Set by Iteration when nothing could run before this time (a request's
  // asynchronous tier loads); -1: not waiting.
  double wait_until_ = -1;
  int64_t landed_ends_ = 0, landed_expected_ = 0, landed_finals_ = 0;
  simgrid::s4u::SemaphorePtr wake_ = simgrid::s4u::Semaphore::create(0);
  bool asleep_ = false;
  int64_t iteration_index_ = 0;
  int64_t timeline_samples_ = 0;
  bool shared_store_ = false;           // a cluster KV store: no fast-forward
  bool store_flows_ = false;            // its loads as flows (FabricFlows::StoreFlows)
  int64_t expected_ = 0;                // requests sent here, summed from the end messages
  int64_t ends_ = 0, ends_needed_ = 1;  // end messages received, expected
  int64_t finished_ = 0;                // finished or rejected
  int64_t done_ = 0;
  int64_t batch_cap_ = 0;
  absl::flat_hash_map<int64_t, double> chunk_s_;  // a lone prefill step's time, by tokens
  scheduler::IterationCost cost_;                 // the current step's, of grouped ranks or stages
  std::vector<scheduler::PipelineStep> steps_;    // its in-flight batches' stages
};

}  // namespace servesim::cluster

#endif  // SERVESIM_CLUSTER_ENGINE_H_
