// What the actors of one run share: the messages on their way, the
// replicas' loads, the bounds engines may run ahead of, the network, and
// the run's first error.
//
// Contract:
//  - One RunState per RunSimulation call, made before the actors and
//    outliving them. Actors run one at a time (SimGrid's sequential
//    contexts), so nothing here is locked.
//  - Messages are allocated from `messages` and freed by whoever takes
//    them (MessageList::Delete); a run stopped early frees the rest.
//  - `Stop` ends the whole run: the first status is kept, every actor is
//    killed, and RunSimulation returns it with what was measured so far.
//  - Simulated time only: nothing here reads the wall clock.
// Internal to cluster/.
#ifndef SERVESIM_CLUSTER_RUN_STATE_H_
#define SERVESIM_CLUSTER_RUN_STATE_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <simgrid/s4u.hpp>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "cluster/fabric.h"
#include "cluster/simulation.h"
#include "metrics/collector.h"
#include "metrics/live_sink.h"
#include "scenario/scenario.h"
#include "scheduler/request.h"
#include "scheduler/router.h"
#include "workload/workload.h"

namespace servesim::cluster {

// A message on a mailbox: a request, or the end-of-stream count.
struct Message {
  scheduler::RequestSpec request;
  bool end = false;        // end of stream: no request
  int64_t total_sent = 0;  // with end of stream
  // A part of a request's KV on its way to a decode replica: -1 not one;
  // 0 one of several; n > 0 the last one sent, of n in all.
  int32_t kv_parts = -1;
  double prefill_end_s = 0;  // with the last KV part
  Message* prev = nullptr;   // MessageList links
  Message* next = nullptr;
  // A KV part: its bytes, when it left and from which replica, and its
  // flow (this message is the notice that it left).
  double bytes = 0;
  double sent_s = 0;
  int32_t from = -1;
  simgrid::s4u::CommPtr flow;
};

// The messages sent and not yet received. A run stopped early (an
// interrupt, a failed iteration) kills the actors with messages still in
// flight; the list frees them when the run ends. O(1) per message.
class MessageList {
 public:
  MessageList() = default;
  MessageList(const MessageList&) = delete;
  MessageList& operator=(const MessageList&) = delete;
  ~MessageList() {
    while (head_ != nullptr) Delete(head_);
  }
  Message* New(const scheduler::RequestSpec& request, bool end, int64_t total_sent,
               int32_t kv_parts = -1) {
    auto* m = new Message;
    m->request = request;
    m->end = end;
    m->total_sent = total_sent;
    m->kv_parts = kv_parts;
    m->next = head_;
    if (head_ != nullptr) head_->prev = m;
    head_ = m;
    return m;
  }
  void Delete(Message* m) {
    (m->prev != nullptr ? m->prev->next : head_) = m->next;
    if (m->next != nullptr) m->next->prev = m->prev;
    delete m;
  }

 private:
  Message* head_ = nullptr;
};

// What an engine's replica does: everything, or one side of a
// disaggregated cluster.
enum class Role { kColocated, kPrefill, kDecode };

// The pool of each replica: the scenario itself when colocated.
inline const scenario::ResolvedScenario& PoolOf(const scenario::ResolvedScenario& sc,
                                                int64_t replica) {
  if (!sc.disaggregated()) return sc;
  return replica < sc.prefill_pool->replicas ? *sc.prefill_pool : *sc.decode_pool;
}

// The status a run stopped by RunOptions::interrupt returns.
absl::Status Interruption();
// The status of something happening at `t` past kMaxSimulatedSeconds.
absl::Status PastTimeLimit(double t, const char* what);

class DeviceHints;

struct RunState {
  MessageList messages;
  const scenario::ResolvedScenario* sc = nullptr;
  workload::RequestStream* requests = nullptr;
  metrics::MetricsCollector* metrics = nullptr;
  metrics::LiveSink* live = nullptr;  // may be null
  bool record_timeline = false;
  bool paced = false;  // RunOptions::pace > 0
  std::vector<scheduler::ReplicaLoad> loads;
  // Cache-aware routing: how many of a request's leading blocks replica
  // `r`'s prefix cache holds (its engine answers).
  std::function<int64_t(int r, const scheduler::RequestSpec&)> cached_blocks;
  std::vector<simgrid::s4u::Mailbox*> engine_boxes;
  simgrid::s4u::Mailbox* router_box = nullptr;
  // What engines may run ahead of (see Engine::Run): the arrival time of the
  // next request the clients send, and the requests sent but not yet
  // received by an engine.
  double next_arrival_s = std::numeric_limits<double>::infinity();
  int64_t in_flight = 0;
  // The engines that advance lazily (Engine::lazy): brings each one's
  // state to time t (Engine::AdvanceTo), as the router does before it
  // reads a colocated cluster's loads, and a prefill engine before it picks
  // a decode replica; false once the run has stopped. Null: none.
  std::function<bool(double t)> advance;
  // Tells remote devices, as a request leaves the clients' queue for its
  // arrival, the ops of its prefill step (DeviceHints::HintArrival); null:
  // no device takes hints.
  std::function<void(const scheduler::RequestSpec&)> hint_arrival;
  // The engines' hints to remote devices that tell their projected batches
  // (DeviceHints::Anticipate), in the order they first did, and what they
  // told.
  std::vector<DeviceHints*> anticipating;
  RunResult::Hints hints;
  // Disaggregation: the first `prefill_replicas` engines are the prefill
  // pool's, the rest the decode pool's (0: colocated). KV parts sent and
  // not yet received, in all and per engine they go to; per prefill
  // engine, the end of the step it sleeps through (-1 while it waits for
  // work): it hands nothing off before.
  int64_t prefill_replicas = 0;
  int64_t kv_in_flight = 0;
  std::vector<int64_t> kv_in_flight_to;
  std::vector<double> prefill_busy_until;
  std::unique_ptr<scheduler::Router> decode_router;
  // The platform's links and routes (cluster/fabric.h).
  Fabric fabric;
  // SLO-limited batching: per pool, the batch cap by 64-token context
  // bucket (Engine::SloCap). A pool's replicas plan alike, so they share it.
  absl::flat_hash_map<const scenario::ResolvedScenario*, std::map<int64_t, int64_t>> slo_caps;

  // The earliest time a request or a KV part not yet received can reach an
  // engine of the pool that gets requests (arrivals) or hand-offs. A
  // prefill engine is busy (may hand off) from the moment it takes a
  // message until it blocks for the next, and says until when (the end of
  // the step it sleeps through, or now).
  double ArrivalFloor() const {
    return in_flight > 0 ? simgrid::s4u::Engine::get_clock() : next_arrival_s;
  }
  double HandoffFloor() const {
    if (kv_in_flight > 0) return simgrid::s4u::Engine::get_clock();
    return PrefillFloor();
  }
  // HandoffFloor for decode engine d alone, what it may run ahead of: a
  // part on its way to another engine changes nothing d holds or anyone
  // reads of d (the decode router reads d's load, and a part's sender d's
  // prefix cache, only as a prefill engine starts a step, which
  // PrefillFloor bounds).
  double HandoffFloor(int d) const {
    if (kv_in_flight_to[static_cast<size_t>(d)] > 0) return simgrid::s4u::Engine::get_clock();
    return PrefillFloor();
  }
  // The earliest a prefill engine may start a step: a request reaching it,
  // or the end of the step one sleeps through.
  double PrefillFloor() const {
    double t = ArrivalFloor();
    for (double busy : prefill_busy_until) {
      if (busy >= 0) t = std::min(t, busy);
    }
    return t;
  }
  // workload.max_in_flight (0: none): the requests sent and not yet
  // finished or refused, and what the source waits on while that many
  // are out (ClientDone wakes it). Engines then step in SimGrid time, so
  // that each finish happens at the clock's time.
  int64_t max_in_flight = 0;
  int64_t client_in_flight = 0;
  simgrid::s4u::MutexPtr client_mutex;
  simgrid::s4u::ConditionVariablePtr client_cv;
  RunResult::Held held;
  void ClientDone() {
    if (max_in_flight == 0) return;
    --client_in_flight;
    client_cv->notify_one();
  }
  int64_t engines_done = 0;  // engines whose Run ended with all their work
  // The times an engine or a decode replica's receiver blocked in SimGrid
  // (a sleep, a wait for a message or a flow; RunResult::engine_waits).
  int64_t engine_waits = 0;
  absl::Status error;                           // first internal error; stops the run
  const std::atomic<int>* interrupt = nullptr;  // RunOptions::interrupt

  bool Interrupted() const {
    return interrupt != nullptr && interrupt->load(std::memory_order_relaxed) != 0;
  }
  // Ends the whole run now: the other actors are killed, and the driver
  // returns `status` with what was measured so far.
  void Stop(absl::Status status) {
    if (error.ok()) error = std::move(status);
    simgrid::s4u::Actor::kill_all();
  }
};

}  // namespace servesim::cluster

#endif  // SERVESIM_CLUSTER_RUN_STATE_H_
