#include "cluster/simulation.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <simgrid/Exception.hpp>
#include <simgrid/s4u.hpp>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/sim_time.h"
#include "common/status_macros.h"
#include "devices/registry.h"
#include "scheduler/pipeline.h"
#include "scheduler/planner.h"

namespace sg4 = simgrid::s4u;

namespace servesim::cluster {
namespace {

using metrics::IterationRecord;
using metrics::LiveIteration;
using metrics::LiveSink;
using metrics::MetricsCollector;
using metrics::MetricsOptions;
using metrics::TimelineIteration;
using scenario::ResolvedScenario;
using workload::RequestStream;

// A message on a mailbox: a request, or the end-of-stream count.
struct Message {
  scheduler::RequestSpec request;
  bool end = false;        // end of stream: no request
  int64_t total_sent = 0;  // with end of stream
  // A part of a request's KV on its way to a decode replica: -1 not one;
  // 0 one of several; n > 0 the last one sent, of n in all.
  int32_t kv_parts = -1;
  double prefill_end_s = 0;  // with the last KV part
  Message* prev = nullptr;  // MessageList links
  Message* next = nullptr;
  // A KV part: its bytes, when it left and from which replica, and its
  // flow (this message is the notice that it left).
  double bytes = 0;
  double sent_s = 0;
  int32_t from = -1;
  sg4::CommPtr flow;
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

constexpr double kBytesPerPromptToken = 4;  // token ids on the wire
constexpr double kHeaderBytes = 512;

class Engine;

struct Shared {
  MessageList messages;
  const ResolvedScenario* sc = nullptr;
  RequestStream* requests = nullptr;
  MetricsCollector* metrics = nullptr;
  LiveSink* live = nullptr;  // may be null
  bool record_timeline = false;
  bool paced = false;  // RunOptions::pace > 0
  std::vector<scheduler::ReplicaLoad> loads;
  // Cache-aware routing: how many of a request's leading blocks replica
  // `r`'s prefix cache holds (its engine answers).
  std::function<int64_t(int r, const scheduler::RequestSpec&)> cached_blocks;
  std::vector<sg4::Mailbox*> engine_boxes;
  sg4::Mailbox* router_box = nullptr;
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
  // arrival, the ops of its prefill step (Engine::HintArrival); null: no
  // device takes hints.
  std::function<void(const scheduler::RequestSpec&)> hint_arrival;
  // The engines that tell remote devices their projected batches
  // (Engine::Anticipate), in the order they first did, and what they told.
  std::vector<Engine*> anticipating;
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
  // The platform's links with the traffic they carried (summary.json,
  // links.csv): one NIC link per replica (index = replica), then the
  // racks' uplinks, then the pods', then (share_nodes) one NVLink link per
  // replica from `nvlink_base`.
  std::vector<metrics::LinkLoad> links;
  std::vector<int> rack_of, pod_of;  // per replica; -1 without racks or pods
  int racks = 0;
  // With cluster.disaggregation.share_nodes: each replica's (first) node,
  // and where its NVLink link is in `links` (-1: no NVLink routes).
  std::vector<int64_t> node_of;
  int nvlink_base = -1;
  // Whether replicas a and b exchange their flows over their node's NVLink.
  bool SameNode(int a, int b) const {
    return nvlink_base >= 0 && node_of[static_cast<size_t>(a)] == node_of[static_cast<size_t>(b)];
  }
  double link_bin_s = 1.0;
  // A platform file's (fabric.platform_file): each replica's host there,
  // and per prefill replica p and decode replica d the indices in `links`
  // of its route, at [p x decode replicas + d - prefill replicas].
  std::vector<sg4::Host*> file_hosts;
  std::vector<std::vector<int>> file_routes;
  // Where each replica's KV flows leave from and land (its first xPU's
  // host, or its host in the platform file); where each decode replica's
  // receiver runs (a host of its own, which the prefill replicas' notices
  // reach at once).
  std::vector<sg4::Host*> kv_hosts, receiver_hosts;
  // Per link, its first index in the live metrics' list (LiveSink::OnLinks).
  std::vector<int> live_link;
  // Per link, the KV flows on it now (sent, not yet landed).
  std::vector<int> kv_flows_on;
  // SLO-limited batching: per pool, the batch cap by 64-token context
  // bucket (Engine::SloCap). A pool's replicas plan alike, so they share it.
  absl::flat_hash_map<const ResolvedScenario*, std::map<int64_t, int64_t>> slo_caps;
  // Collectives on the fabric (docs/disaggregation.md): per replica whose
  // xPUs span nodes (none with a platform file), the flows that carry a
  // step's bytes out of its nodes' NICs from its host: over its NIC link
  // the hops of the ring over its nodes that stay in a rack, together, and
  // each hop between racks on its own over the uplinks too.
  struct CollectiveHop {
    sg4::Host* to = nullptr;
    double share = 0;                        // of the step's bytes
    std::vector<std::pair<int, int>> links;  // (index in `links`, direction)
  };
  struct Collectives {
    std::vector<CollectiveHop> hops;
    double nic_bw = 0, latency = 0;  // the NIC link's, the in-rack route's
    bool crosses_racks = false;
  };
  std::vector<Collectives> collectives;  // per replica; empty: none
  // Calls f(link index, direction) for each link of the route from
  // replica a to replica b (BuildPlatform's routes: from a prefill replica
  // to a decode replica, and between replicas of a pool with a cluster KV
  // store; with a platform file, prefill to decode only): out of a's NIC
  // link, up and down the uplinks between their racks and pods, into b's.
  template <typename F>
  void ForRoute(int a, int b, F f) const {
    if (!file_routes.empty()) {
      const size_t decode = rack_of.size() - static_cast<size_t>(prefill_replicas);
      for (int l : file_routes[static_cast<size_t>(a) * decode +
                               static_cast<size_t>(b - prefill_replicas)]) {
        f(l, 0);
      }
      return;
    }
    if (SameNode(a, b)) {
      f(nvlink_base + a, 0);
      f(nvlink_base + b, 1);
      return;
    }
    f(a, 0);
    const int ra = rack_of[a], rb = rack_of[b];
    if (ra >= 0 && ra != rb) {
      const int nics = static_cast<int>(rack_of.size());
      f(nics + ra, 0);
      const int pa = pod_of[a], pb = pod_of[b];
      if (pa >= 0 && pa != pb) {
        f(nics + racks + pa, 0);
        f(nics + racks + pb, 1);
      }
      f(nics + rb, 1);
    }
    f(b, 1);
  }
  // The earliest time a request or a KV part not yet received can reach an
  // engine of the pool that gets requests (arrivals) or hand-offs. A
  // prefill engine is busy (may hand off) from the moment it takes a
  // message until it blocks for the next, and says until when (the end of
  // the step it sleeps through, or now).
  double ArrivalFloor() const { return in_flight > 0 ? sg4::Engine::get_clock() : next_arrival_s; }
  double HandoffFloor() const {
    if (kv_in_flight > 0) return sg4::Engine::get_clock();
    return PrefillFloor();
  }
  // HandoffFloor for decode engine d alone, what it may run ahead of: a
  // part on its way to another engine changes nothing d holds or anyone
  // reads of d (the decode router reads d's load, and a part's sender d's
  // prefix cache, only as a prefill engine starts a step, which
  // PrefillFloor bounds).
  double HandoffFloor(int d) const {
    if (kv_in_flight_to[static_cast<size_t>(d)] > 0) return sg4::Engine::get_clock();
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
  int64_t engines_done = 0;                     // engines whose Run ended with all their work
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
    sg4::Actor::kill_all();
  }
};

absl::Status Interruption() { return absl::CancelledError("interrupted"); }

absl::Status PastTimeLimit(double t, const char* what) {
  return absl::OutOfRangeError(absl::StrCat(
      what, " at t = ", t, " s, past the simulated-time limit of ", kMaxSimulatedSeconds,
      " s (beyond it time loses sub-microsecond resolution); shorten the trace or raise the "
      "arrival rate"));
}

double WireBytes(const scheduler::RequestSpec& r) {
  return kHeaderBytes + kBytesPerPromptToken * static_cast<double>(r.input_tokens);
}

void Source(Shared* sh) {
  int64_t sent = 0;
  scheduler::RequestSpec r;
  while (true) {
    absl::StatusOr<bool> more = sh->requests->Next(&r);
    if (!more.ok()) {
      // A bad row further into the trace: stop the run, as a failed
      // iteration does.
      sh->Stop(more.status());
      return;
    }
    if (!*more) break;
    if (r.arrival_s > kMaxSimulatedSeconds) {
      sh->Stop(PastTimeLimit(r.arrival_s, absl::StrCat("request ", r.id, " arrives").c_str()));
      return;
    }
    sh->next_arrival_s = r.arrival_s;
    if (sh->hint_arrival) sh->hint_arrival(r);
    sg4::this_actor::sleep_until(r.arrival_s);
    if (sh->Interrupted()) {
      sh->Stop(Interruption());
      return;
    }
    ++sh->in_flight;
    ++sent;
    sh->metrics->OnArrival(r);
    auto* msg = sh->messages.New(r, false, 0);
    sh->router_box->put_init(msg, static_cast<uint64_t>(WireBytes(r)))->detach();
  }
  sh->next_arrival_s = std::numeric_limits<double>::infinity();
  auto* end = sh->messages.New({}, true, sent);
  sh->router_box->put_init(end, 0)->detach();
}

void RouterActor(Shared* sh) {
  // Arrivals go to the prefill pool when there is one.
  const ResolvedScenario& front = sh->prefill_replicas > 0 ? *sh->sc->prefill_pool : *sh->sc;
  const size_t targets = sh->prefill_replicas > 0 ? static_cast<size_t>(sh->prefill_replicas)
                                                  : sh->engine_boxes.size();
  const absl::Span<const scheduler::ReplicaLoad> loads(sh->loads.data(), targets);
  scheduler::Router router(front.routing);
  std::vector<int64_t> sent(targets, 0);
  int64_t expected = -1, received = 0;
  while (expected < 0 || received < expected) {
    auto* msg = sh->router_box->get<Message>();
    if (msg->end) {
      expected = msg->total_sent;
      sh->messages.Delete(msg);
      continue;
    }
    ++received;
    // The loads and caches it reads are those of this moment.
    if (sh->prefill_replicas == 0 && sh->advance && !sh->advance(sg4::Engine::get_clock())) {
      return;
    }
    if (router.policy() == scheduler::RoutingPolicy::kPrefixAffinity) {
      const int64_t bt = front.batching.kv_block_tokens;
      for (size_t i = 0; i < targets; ++i) {
        sh->loads[i].prompt_blocks = (msg->request.input_tokens + bt - 1) / bt;
        sh->loads[i].prefix_hit_blocks = sh->cached_blocks(static_cast<int>(i), msg->request);
      }
    }
    const int r = router.Route(loads);
    ++sh->loads[r].outstanding;
    ++sent[r];
    sh->engine_boxes[r]->put_init(msg, static_cast<uint64_t>(WireBytes(msg->request)))
        ->detach();
  }
  for (size_t r = 0; r < targets; ++r) {
    sh->engine_boxes[r]->put_init(sh->messages.New({}, true, sent[r]), 0)->detach();
  }
}

scheduler::PlannerConfig ReplicaPlannerConfig(const ResolvedScenario& sc,
                                              const devices::Device* xpu,
                                              const devices::Device* attention) {
  scheduler::PlannerConfig c = sc.planner;
  c.tensor_parallel = sc.tensor_parallel;
  c.xpu = xpu;
  c.attention = attention;
  return c;
}

// The CUDA graph a step of `tokens` tokens runs under: vLLM's default
// capture sizes 1, 2, 4, multiples of 8 up to 256, multiples of 16 above.
int64_t CapturedTokens(int64_t tokens) {
  if (tokens <= 4) return tokens <= 1 ? 1 : tokens <= 2 ? 2 : 4;
  if (tokens <= 256) return (tokens + 7) / 8 * 8;
  return (tokens + 15) / 16 * 16;
}

// The pool of each replica: the scenario itself when colocated.
const ResolvedScenario& PoolOf(const ResolvedScenario& sc, int64_t replica) {
  if (!sc.disaggregated()) return sc;
  return replica < sc.prefill_pool->replicas ? *sc.prefill_pool : *sc.decode_pool;
}

// What an engine's replica does: everything, or one side of a
// disaggregated cluster.
enum class Role { kColocated, kPrefill, kDecode };

class Engine {
 public:
  // `pool`: the resolved scenario of the engine's pool (the whole
  // scenario when colocated); borrowed.
  // `store`: the pool's cluster KV store, or null.
  Engine(Shared* sh, const ResolvedScenario* pool, Role role, int replica,
         std::shared_ptr<devices::Device> device, std::shared_ptr<devices::Device> attention,
         std::shared_ptr<scheduler::BlockLru> store)
      : sh_(sh),
        pool_(pool),
        role_(role),
        replica_(replica),
        device_(std::move(device)),
        attention_(std::move(attention)),
        observer_(sh->metrics->ObserverFor(replica)) {
    const scheduler::PlannerConfig pc =
        ReplicaPlannerConfig(*pool, device_.get(), attention_.get());
    scheduler::BatchingConfig batching = pool->batching;
    batching.kv_store = std::move(store);
    batching.kv_store_home = replica;
    shared_store_ = batching.kv_store != nullptr;
    // The store's loads cross the network where BuildPlatform routes them
    // (not over a platform file's routes).
    store_flows_ = shared_store_ && !batching.kv_tier_async && sh->file_routes.empty() &&
                   !sh->kv_hosts.empty();
    for (int64_t i = 0; i < pool->ranks(); ++i) {
      ranks_.push_back(std::make_unique<Rank>(batching, pool->model, pc));
    }
    // Static power (docs/energy.md): the xPUs' idle power, the host's
    // share, and the attention device's (the scenario's figure, else the
    // device model's).
    xpu_static_w_ = pool->xpu_idle_power_w * static_cast<double>(pool->xpus_per_replica());
    host_w_ = pool->host_power_w;
    if (attention_ != nullptr) {
      const devices::DeviceDescription d = attention_->Describe();
      device_static_w_ =
          pool->attention_static_w >= 0 ? pool->attention_static_w : d.static_power_w;
      device_static_in_ops_ = d.static_in_op_energy;
    }
    // A decode replica hears the end of every prefill replica's stream.
    ends_needed_ = role == Role::kDecode ? sh->prefill_replicas : 1;
    // Colocated and decode replicas whose steps make no SimGrid call (no
    // flows for collectives or store loads, no waits for asynchronous tier
    // loads) and whom no observer watches in time run lazily (RunLazy).
    lazy_ = role != Role::kPrefill && FastForward() && !batching.kv_tier_async &&
            (sh->collectives.empty() || sh->collectives[static_cast<size_t>(replica)].hops.empty());
    if (role == Role::kPrefill) {
      handed_.assign(static_cast<size_t>(sh->sc->replicas - sh->prefill_replicas), 0);
    }
  }

  bool lazy() const { return lazy_; }

  void Run() {
    if (lazy_ ? !RunLazy() : !RunStepping()) return;
    Finished();
  }

  // Lazy engines (docs/design.md, "Engines advance lazily"): the engine's
  // state stands at some time of its own, with the step it started then
  // and the messages that landed during it; it is brought forward, in
  // plain calls and not in SimGrid, by whoever needs it as of a later
  // time: the router before it reads a colocated cluster's loads and a
  // prefill engine before it picks a decode replica (Shared::advance),
  // the engine's own actor (a decode replica's receiver) as a message
  // lands, and the end of the stream. Every step ending before that time
  // completes, the messages landed by its end are taken, and the next step
  // starts. Nothing reaches or reads a replica between those moments, so
  // the result is the one a SimGrid sleep per step gives, with SimGrid
  // events only for the transfers. Returns false once the run has stopped.
  bool AdvanceTo(double t) {
    while (StepsBefore(t)) {
      if (!NextStep()) return false;
    }
    return true;
  }
  // Whether the step in progress ends before `t`, and when it ends.
  bool StepsBefore(double t) const { return stepping_ && step_end_ < t; }
  double step_end() const { return step_end_; }
  // Completes the step in progress and starts the next (AdvanceTo's step;
  // Shared::advance takes several engines' steps in the order they end).
  // False once the run has stopped.
  bool NextStep() {
    if (sh_->Interrupted()) {
      sh_->Stop(Interruption());
      return false;
    }
    const double end = step_end_;
    stepping_ = false;
    CompleteAt(end);
    return StartAt(end);
  }

 private:
  // A lazy engine's loop: it waits in SimGrid only for messages (a
  // decode replica's receiver takes them and brings it forward: Land).
  bool RunLazy() {
    sg4::Mailbox* box = sh_->engine_boxes[replica_];
    sh_->metrics->MarkIdle(replica_, sg4::Engine::get_clock());
    while (role_ == Role::kDecode && !all_landed_) {
      ++sh_->engine_waits;
      asleep_ = true;
      wake_->acquire();
      asleep_ = false;
    }
    while (role_ != Role::kDecode && (ends_ < ends_needed_ || received_ < expected_)) {
      Message* msg = Wait(box);
      const double now = sg4::Engine::get_clock();
      if (!AdvanceTo(now)) return false;
      bool requests = false;
      while (true) {
        if (msg->end) {
          Receive(msg, now);
        } else {
          ++received_;
          landed_.push_back({msg, now});
          requests = true;
        }
        if (!box->ready()) break;
        msg = box->get<Message>();
      }
      // An idle engine takes them at once and starts a step; a busy one
      // at the end of its step.
      if (requests && !stepping_ && !StartAt(now)) return false;
    }
    if (!AdvanceTo(std::numeric_limits<double>::infinity())) return false;
    // The clock ends at this replica's last step.
    if (sg4::Engine::get_clock() < last_end_) SleepUntil(last_end_);
    return true;
  }

  // Takes the requests landed by `t` (the end of the step before, or
  // now) and starts the next step at `t`, or marks the replica idle.
  bool StartAt(double t) {
    for (const auto& [msg, landed] : landed_) {
      landed_s_ = landed;  // a KV part's (ReceiveKv)
      Receive(msg, t);
    }
    landed_.clear();
    last_end_ = t;
    if (Idle()) {
      sh_->metrics->MarkIdle(replica_, t);
      return true;
    }
    double duration = 0;
    if (!Step(t, &duration)) return false;
    step_end_ = t + duration;
    stepping_ = true;
    return true;
  }

  // Runs the iteration that starts at `t` (Iteration) into `*duration`;
  // false once that stopped the run (past the simulated-time limit, or a
  // failed iteration).
  bool Step(double t, double* duration) {
    if (t > kMaxSimulatedSeconds) {
      sh_->Stop(
          PastTimeLimit(t, absl::StrCat("replica ", replica_, " starts an iteration").c_str()));
      return false;
    }
    absl::StatusOr<double> d = Iteration(t);
    if (!d.ok()) {
      Stop(d.status());
      return false;
    }
    *duration = *d;
    return true;
  }

  // Engines that step in SimGrid: prefill replicas, and colocated or
  // decode replicas whose steps make SimGrid calls or that an observer
  // watches. They run ahead without an event while nothing can reach them
  // (the next arrival or hand-off).
  bool RunStepping() {
    sg4::Mailbox* box = sh_->engine_boxes[replica_];
    while (true) {
      if (role_ == Role::kDecode) {
        TakeLanded();
      } else {
        while (box->ready()) Receive(box->get<Message>(), Now());
      }
      if (Idle()) {
        if (ends_ >= ends_needed_ && done_ >= expected_) break;
        // Its next iteration starts no earlier than now.
        sh_->metrics->MarkIdle(replica_, Now());
        // Block until work arrives.
        if (role_ == Role::kDecode) {
          while (landed_.empty()) {
            asleep_ = true;
            ++sh_->engine_waits;
            wake_->acquire();
            asleep_ = false;
          }
          TakeLanded();
        } else {
          if (role_ == Role::kPrefill) sh_->prefill_busy_until[replica_] = -1;
          Message* msg = Wait(box);
          Receive(msg, Now());
          // Busy from taking the message (Shared::HandoffFloor), also while
          // a step waits in SimGrid before it ends (a store's loads).
          if (role_ == Role::kPrefill) {
            sh_->prefill_busy_until[replica_] = sg4::Engine::get_clock();
          }
        }
        continue;
      }
      // Iterations run back to back without a SimGrid event while nothing
      // can reach this replica: no request is on its way and the next one
      // leaves the clients after the iteration ends. Their completions are
      // then final (no arrival can precede them) and the router reads no
      // load before the next arrival, so the result is the one a sleep per
      // iteration gives, at a fraction of the cost. The last iteration of
      // a run, the one an arrival may interrupt, sleeps in SimGrid.
      double t = Now();
      while (true) {
        if (sh_->Interrupted()) {
          sh_->Stop(Interruption());
          return false;
        }
        double duration = 0;
        if (!Step(t, &duration)) return false;
        if (wait_until_ >= 0) {
          if (sg4::Engine::get_clock() < t) SleepUntil(t);
          AwaitLoads();
          break;
        }
        const double end = t + duration;
        const double floor =
            role_ == Role::kDecode ? sh_->HandoffFloor(replica_) : sh_->ArrivalFloor();
        if (!FastForward() || !(end < floor)) {
          if (role_ == Role::kPrefill) sh_->prefill_busy_until[replica_] = end;
          SleepUntil(end);
          CompleteAt(end);
          last_end_ = end;
          // Busy until it blocks for work (Run), as it may start a step now.
          if (role_ == Role::kPrefill) sh_->prefill_busy_until[replica_] = sg4::Engine::get_clock();
          break;
        }
        CompleteAt(end);
        t = end;
        last_end_ = end;
        if (Idle()) {
          SleepUntil(t);
          break;
        }
      }
    }
    return true;
  }

  // The end of the run for this replica: its cache's figures, and the end
  // of a prefill replica's hand-offs.
  void Finished() {
    int64_t hit = 0, query = 0;
    bool tiered = false;
    for (const auto& r : ranks_) {
      hit += r->scheduler.prefix_hit_tokens();
      query += r->scheduler.prefix_query_tokens();
      if (const scheduler::PrefixCache* pc = r->scheduler.prefix_cache()) {
        tiered = tiered || pc->num_tiers() > 0;
        for (int k = 0; k < pc->num_tiers(); ++k) {
          sh_->metrics->AddKvTier(pc->tier_config(k), pc->tier_stats(k),
                                  r->scheduler.tier_hit_tokens(k));
        }
      }
    }
    sh_->metrics->AddPrefixCache(hit, query,
                                 role_ == Role::kPrefill  ? 0
                                 : role_ == Role::kDecode ? 1
                                                          : -1,
                                 tiered);
    sh_->metrics->MarkDone(replica_);
    ++sh_->engines_done;
    if (role_ == Role::kPrefill) sh_->prefill_busy_until[replica_] = -1;
    // The end of this prefill replica's hand-offs, to every decode replica.
    for (size_t d = 0; d < handed_.size(); ++d) {
      sh_->engine_boxes[sh_->prefill_replicas + d]
          ->put_init(sh_->messages.New({}, true, handed_[d]), 0)
          ->detach();
    }
  }

 private:
  // A request in the prefill pool: what the decode pool will serve, where,
  // the KV parts sent so far and the last layer's bytes of its last chunk.
  struct Handoff {
    scheduler::RequestSpec spec;
    int decode = -1;
    int32_t parts_sent = 0;
    double tail_bytes = 0;
    int64_t sent_tokens = -1;  // of the prompt, the tokens whose KV moves (TransferTokens)
  };
  struct Arriving {
    int32_t received = 0, expected = 0;
    double prefill_end_s = 0;
    double first_sent_s = std::numeric_limits<double>::infinity();
  };

  // One data-parallel rank (one for every model but MoE ones with
  // cluster.data_parallel > 1): a TP group with its own batch and KV cache.
  struct Rank {
    Rank(const scheduler::BatchingConfig& b, const devices::ModelDims& m,
         const scheduler::PlannerConfig& pc)
        : scheduler(b), planner(m, pc) {}
    scheduler::ReplicaScheduler scheduler;
    scheduler::IterationPlanner planner;
    scheduler::IterationCost cost;
    const scheduler::Batch* batch = nullptr;  // this iteration's; null: none
    // Hints to remote devices (Anticipate): the projected batches' hashes,
    // the next one due, and whether the projection stopped at its horizon
    // (not because everyone finished).
    std::vector<uint64_t> projected;
    size_t projected_next = 0;
    bool projected_full = false;
    bool anticipating = false;  // Anticipate found the devices take hints
    std::vector<scheduler::Batch> projection;
  };

  // A batch's identity for Anticipate: who runs, with how many new and past
  // tokens (a collision costs only a hint).
  static uint64_t BatchHash(const scheduler::Batch& b) {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ b.entries.size();
    auto mix = [&h](uint64_t x) {
      h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
      h *= 0xff51afd7ed558ccdull;
    };
    for (const scheduler::BatchEntry& e : b.entries) {
      mix(static_cast<uint64_t>(e.request_id));
      mix(static_cast<uint64_t>(e.new_tokens) << 1 | (e.prefill ? 1 : 0));
      mix(static_cast<uint64_t>(e.past_tokens));
    }
    return h;
  }

  // Remote devices answer far away: when a rank's batch is not the one
  // projected (a request arrived, or the projection is about to run out),
  // project the batches after it (requests leave as their output ends) and
  // tell the devices the ops they will be asked (devices::Device::Expect).
  // Changes no cost; in-process devices want no hints and skip all this.
  void Anticipate(Rank& r) {
    const int steps = r.planner.ExpectSteps();
    if (steps <= 0) return;
    if (!r.anticipating) {
      r.anticipating = true;
      if (std::find(sh_->anticipating.begin(), sh_->anticipating.end(), this) ==
          sh_->anticipating.end()) {
        sh_->anticipating.push_back(this);
      }
    }
    const bool hit = r.projected_next < r.projected.size() &&
                     r.projected[r.projected_next] == BatchHash(*r.batch);
    if (hit) ++r.projected_next;
    // A projection runs `steps` ahead and is renewed a quarter before its
    // end. (On the AttAcc Azure hour 16, 24 and 32 steps cost the same, and
    // sizing projections to how long earlier ones held cost more round
    // trips than it saved.)
    const size_t margin = static_cast<size_t>(std::max(1, steps / 4));
    const size_t told = hit ? r.projected.size() - r.projected_next : 0;
    if (hit && (!r.projected_full || told >= margin)) return;
    ++(hit ? sh_->hints.renewals : sh_->hints.projections);
    Reproject(r, steps, told);
    // What this tells goes to the devices in one message, which can carry
    // the renewals that the other ranks sharing them would soon send in
    // messages of their own: those within twice the margin of their
    // projection's end are renewed now (a rank of an engine that is not
    // stepping has nothing to renew).
    for (Engine* e : sh_->anticipating) {
      if (e->pool_ != pool_ || !e->stepping_) continue;
      for (const auto& o : e->ranks_) {
        if (o.get() == &r || !o->anticipating || !o->projected_full || o->batch == nullptr) {
          continue;
        }
        const size_t left = o->projected.size() - std::min(o->projected_next, o->projected.size());
        if (left > 0 && left < 2 * margin) {
          e->Reproject(*o, steps, left);
          ++sh_->hints.renewals_alongside;
        }
      }
    }
  }
  // Projects `steps` batches after the rank's current one and tells the
  // devices those after the first `told` (told already).
  void Reproject(Rank& r, int steps, size_t told) {
    r.scheduler.Project(steps, &r.projection);
    r.planner.Expect(
        absl::MakeConstSpan(r.projection).subspan(std::min(told, r.projection.size())));
    r.projected.clear();
    for (const scheduler::Batch& b : r.projection) r.projected.push_back(BatchHash(b));
    r.projected_next = 0;
    r.projected_full = static_cast<int>(r.projection.size()) == steps;
  }

  // A stepping engine's time: the clock, or the end of the step it slept
  // through if later. SimGrid ends a sleep within its timing precision
  // (surf/precision, 1e-9 s) of the date asked when another event falls
  // that close, so the end is taken as computed, as a lazy engine takes it.
  double Now() const { return std::max(sg4::Engine::get_clock(), last_end_); }

  // SimGrid's blocking calls, counted (Shared::engine_waits).
  void SleepUntil(double t) {
    ++sh_->engine_waits;
    sg4::this_actor::sleep_until(t);
  }
  Message* Wait(sg4::Mailbox* box) {
    ++sh_->engine_waits;
    return box->get<Message>();
  }

  // Nothing was schedulable (Iteration): blocks until a request's
  // asynchronous tier loads end (wait_until_) or a message comes, which
  // Run then takes.
  void AwaitLoads() {
    const double wait = wait_until_ - sg4::Engine::get_clock();
    wait_until_ = -1;
    if (!(wait > 0)) return;
    if (role_ == Role::kDecode) {
      if (landed_.empty()) {
        asleep_ = true;
        ++sh_->engine_waits;
        wake_->acquire_timeout(wait);
        asleep_ = false;
      }
      return;
    }
    // A prefill replica may start a step (and so hand off) from now on.
    if (role_ == Role::kPrefill) sh_->prefill_busy_until[replica_] = sg4::Engine::get_clock();
    try {
      ++sh_->engine_waits;
      Message* msg = sh_->engine_boxes[replica_]->get<Message>(wait);
      Receive(msg, sg4::Engine::get_clock());
    } catch (const simgrid::TimeoutException&) {
      // The loads are done.
    }
  }

  bool Idle() const {
    for (const auto& r : ranks_) {
      if (!r->scheduler.Idle()) return false;
    }
    return true;
  }

  // Without a live sink or pacing, whose observers watch the clock.
  // Prefill replicas hand KV off as their steps start and end, in SimGrid
  // time.
  // Nor with a cluster KV store, which the replicas must use in time
  // order.
  bool FastForward() const {
    return sh_->live == nullptr && !sh_->paced && role_ != Role::kPrefill && !shared_store_;
  }

  void CompleteAt(double t) {
    const int64_t finished_before = finished_;
    for (auto& r : ranks_) {
      if (r->batch != nullptr) r->scheduler.Complete(t, &counting_);
      r->batch = nullptr;
    }
    done_ += finished_ - finished_before;
    UpdateLoad();
  }

  // Schedules, costs and records one iteration starting at `start`;
  // returns its duration. Data-parallel ranks (MoE models) step in
  // lockstep: every rank with work schedules a batch, the MoE layers see
  // the group's tokens, a rank without work runs them for the others
  // (PlanIdleRank), and the iteration lasts as long as the slowest rank.
  // Pipeline stages keep one batch per stage in flight, one per rank
  // (vLLM's virtual engines): the step is their steady-state cycle through
  // the stages (scheduler/pipeline.h).
  absl::StatusOr<double> Iteration(double start) {
    if (pool_->tbt_slo_s > 0) {
      ASSIGN_OR_RETURN(int64_t cap, SloCap());
      for (auto& r : ranks_) r->scheduler.SetBatchCap(std::max<int64_t>(1, cap));
    }
    int64_t group_tokens = 0, most_tokens = 0;
    Rank* lead = nullptr;  // the first rank with a batch
    for (auto& r : ranks_) {
      r->batch = nullptr;
      if (r->scheduler.Idle()) continue;
      const scheduler::Batch& b = r->scheduler.Schedule(start);
      if (b.empty()) continue;
      r->batch = &b;
      group_tokens += b.prefill_tokens + b.decode_tokens;
      most_tokens = std::max(most_tokens, b.prefill_tokens + b.decode_tokens);
      if (lead == nullptr) lead = r.get();
    }
    // Under CUDA graphs every data-parallel rank runs the largest rank's
    // captured size.
    const bool lockstep = pool_->data_parallel > 1;
    const bool pipeline = pool_->pipeline_parallel > 1;
    const int64_t graph_max = pool_->cuda_graph_max_tokens;
    if (lockstep && graph_max > 0 && most_tokens <= graph_max) {
      group_tokens =
          static_cast<int64_t>(ranks_.size()) * std::min(graph_max, CapturedTokens(most_tokens));
    }
    if (lead == nullptr) {
      // Nothing runs until a request's asynchronous tier loads end (or a
      // request arrives): Run waits for either.
      double ready = std::numeric_limits<double>::infinity();
      for (const auto& r : ranks_) ready = std::min(ready, r->scheduler.NextLoadReady());
      if (ready < std::numeric_limits<double>::infinity()) {
        wait_until_ = ready;
        return 0.0;
      }
      return absl::InternalError(absl::StrCat(
          "replica ", replica_, ": work queued but nothing schedulable at t=", start));
    }
    // A cluster store's loads from other replicas' nodes, as flows from
    // the step's start; the clock is then their end.
    const double load_extra = store_flows_ ? StoreFlows(start) : 0;
    IterationRecord it;
    it.replica = replica_;
    it.start_s = start;
    it.bound = lead->batch->bound;
    it.batch_cap = batch_cap_;
    double time_s = 0, xpu_busy_s = 0, device_busy_s = 0;
    double busy_sum_s = 0, collective_sum_s = 0;  // over ranks: the collectives' share
    double tier_s = 0;      // waiting for KV tiers (the slowest rank's)
    double pipe_bytes = 0;  // hidden states between pipeline stages
    // The step's cost: the one rank's own (costed in place), or the ranks'
    // or stages' summed into cost_.
    const bool grouped = lockstep || pipeline;
    if (grouped) cost_ = scheduler::IterationCost{};
    scheduler::IterationCost& step_cost = grouped ? cost_ : lead->cost;
    // Idle ranks' planners are alike (same model, layout and device), so
    // one answers for all of them.
    const scheduler::IterationCost* idle = nullptr;
    steps_.clear();
    for (auto& r : ranks_) {
      if (r->batch == nullptr && pipeline) {
        r->cost = scheduler::IterationCost{};  // an empty slot of the pipeline
      } else if (r->batch == nullptr && idle != nullptr) {
        r->cost = *idle;
      } else if (r->batch != nullptr) {
        if (lockstep) r->planner.SetGroupTokens(group_tokens);
        if (!lockstep && !pipeline) Anticipate(*r);
        RETURN_IF_ERROR(r->planner.Plan(*r->batch, &r->cost));
        tier_s = std::max(tier_s,
                          scheduler::KvTierWaitS(*r->batch, r->cost.time_s, pool_->model.num_layers,
                                                 pool_->kv_tier_layerwise, load_extra));
        it.batch_size += static_cast<int32_t>(r->batch->entries.size());
        it.prefill_tokens += r->batch->prefill_tokens;
        it.decode_tokens += r->batch->decode_tokens;
        if (pipeline) {
          steps_.push_back(scheduler::StepOf(pool_->pipeline, r->cost,
                                             r->batch->prefill_tokens + r->batch->decode_tokens));
          pipe_bytes += static_cast<double>(pool_->pipeline_parallel - 1) *
                        scheduler::StageTransferBytes(
                            pool_->pipeline, r->batch->prefill_tokens + r->batch->decode_tokens);
        }
      } else {
        ASSIGN_OR_RETURN(r->cost, r->planner.PlanIdleRank(group_tokens));
        idle = &r->cost;
      }
      it.kv_blocks_used += r->scheduler.kv().used();
      it.waiting += r->scheduler.num_waiting();
      time_s = std::max(time_s, r->cost.time_s);
      xpu_busy_s = std::max(xpu_busy_s, r->cost.xpu_busy_s);
      busy_sum_s += r->cost.xpu_busy_s;
      collective_sum_s += r->cost.xpu_collective_s;
      device_busy_s = std::max(device_busy_s, r->cost.device_busy_s);
      if (grouped) {
        cost_.total += r->cost.total;
        cost_.device_total += r->cost.device_total;
      }
    }
    if (pipeline) {
      // The in-flight batches' steady-state cycle (scheduler/pipeline.h);
      // the busiest stage's xPUs are busy for its share.
      const scheduler::PipelineCycle cycle =
          scheduler::SteadyCycle(steps_, pool_->pipeline_parallel);
      time_s = cycle.time_s;
      xpu_busy_s = cycle.busiest_stage_s;
      cost_.total.link_bytes += pipe_bytes;
      cost_.total.link_energy_pj += pipe_bytes * pool_->pipeline.link_energy_pj_per_byte;
      // Across nodes they leave through the NICs (Collectives).
      if (pool_->pipeline.across_nodes) cost_.total.internode_bytes += pipe_bytes;
    }
    if (lockstep || pipeline) {
      cost_.time_s = time_s;
      cost_.total.time_s = time_s;
      cost_.xpu_busy_s = xpu_busy_s;
      cost_.device_busy_s = device_busy_s;
      // The busiest rank's or stage's busy time, with the ranks' share of
      // collectives in it.
      cost_.xpu_collective_s = busy_sum_s > 0 ? xpu_busy_s * collective_sum_s / busy_sum_s : 0;
    }
    if (pool_->xpu_power_cap_w > 0) ApplyPowerCap(&step_cost);
    const scheduler::IterationCost* cost = &step_cost;
    // The engine's host time per step that does not overlap the xPUs, and
    // the wait for KV tiers.
    double duration = cost->time_s + pool_->step_overhead_s + tier_s;
    // A prefill replica's layer-wise KV leaves as the step starts; before
    // its collectives' flow, which it shares the NIC link with.
    const bool stream = role_ == Role::kPrefill && sh_->sc->kv_layerwise;
    bool streamed = false;
    if (cost->total.internode_bytes > 0 && !sh_->collectives.empty() &&
        !sh_->collectives[replica_].hops.empty()) {
      if (stream) {
        StreamLayers(start);
        streamed = true;
      }
      duration += Collectives(start, duration, cost->total.internode_bytes);
    }
    device_busy_total_s_ += cost->device_busy_s;
    it.duration_s = duration;
    // The xPUs' active power over their busy time but collectives
    // (cluster.xpu.active_power_w), and the board's power limit.
    double active_j = pool_->xpu_active_power_w * static_cast<double>(pool_->xpus_per_replica()) *
                      std::max(0.0, cost->xpu_busy_s - cost->xpu_collective_s);
    if (pool_->xpu_tdp_w > 0) LimitToTdp(&step_cost, &active_j);
    it.energy_j = cost->total.energy_pj() * 1e-12 + active_j;
    it.xpu_busy_s = cost->xpu_busy_s;
    it.device_busy_s = cost->device_busy_s;
    it.static_w = xpu_static_w_ + device_static_w_ + host_w_;
    sh_->metrics->AddIteration(it);
    sh_->metrics->AddEnergy(cost->total, cost->device_total, active_j);
    RETURN_IF_ERROR(SampleTimeline(*lead, it));
    if (stream && !streamed) StreamLayers(start);
    if (sh_->live != nullptr) {
      LiveIteration li;
      li.replica = replica_;
      li.start_s = start;
      li.duration_s = duration;
      li.batch_size = it.batch_size;
      li.queue_length = it.waiting;
      li.kv_blocks_used = it.kv_blocks_used;
      for (const auto& r : ranks_) {
        li.kv_blocks_total += r->scheduler.kv().capacity();
        li.preemptions_total += r->scheduler.total_preemptions();
        li.prefix_hit_tokens_total += r->scheduler.prefix_hit_tokens();
        li.prefix_query_tokens_total += r->scheduler.prefix_query_tokens();
        if (const scheduler::PrefixCache* pc = r->scheduler.prefix_cache()) {
          li.num_kv_tiers = pc->num_tiers();
          for (int k = 0; k < pc->num_tiers(); ++k) {
            li.kv_tier_names[k] = pc->tier_config(k).name;
            li.kv_tier_hit_tokens_total[k] += r->scheduler.tier_hit_tokens(k);
          }
        }
      }
      li.xpu_busy_s = cost->xpu_busy_s;
      li.device_busy_s = cost->device_busy_s;
      li.xpu_static_w = xpu_static_w_;
      li.xpu_active_j = active_j;
      li.device_static_w = device_static_w_;
      li.host_w = host_w_;
      li.device = cost->device_total;
      li.xpu = cost->total;
      for (double devices::Cost::*f :
           {&devices::Cost::flops, &devices::Cost::dram_bytes, &devices::Cost::link_bytes,
            &devices::Cost::compute_energy_pj, &devices::Cost::dram_energy_pj,
            &devices::Cost::link_energy_pj, &devices::Cost::bg_bus_bytes,
            &devices::Cost::tsv_bytes, &devices::Cost::external_bytes}) {
        li.xpu.*f -= li.device.*f;
      }
      sh_->live->OnIteration(li);
    }
    return duration;
  }

  // Collectives on the fabric (docs/disaggregation.md): a step of a
  // replica whose xPUs span nodes sends `bytes` out of its nodes' NICs,
  // which its cost times as if the NICs were its own: at least the time
  // they take over the NIC link alone, route latency + bytes / bandwidth.
  // When another flow may share a link of theirs during the step (a KV
  // flow in flight on the NIC link now, or, on a decode replica, one that
  // may leave a prefill replica before the step ends; on a replica across
  // racks, always), the bytes go as flows from the step's start (the ring's
  // hops within racks together over the NIC link, each hop between racks
  // over the uplinks too), sharing every link with what else crosses it,
  // and the step lasts as much longer as they take beyond that time alone;
  // returns the extra time. Otherwise no flow runs: it would take exactly
  // that time. The bytes count on the links either way.
  double Collectives(double start, double duration, double bytes) {
    const Shared::Collectives& c = sh_->collectives[static_cast<size_t>(replica_)];
    const double alone = c.latency + bytes / c.nic_bw;
    const bool shared = c.crosses_racks || sh_->kv_flows_on[replica_] > 0 ||
                        (role_ == Role::kDecode && !(start + duration < sh_->HandoffFloor()));
    double end = start + alone, extra = 0;
    if (shared) {
      if (sg4::Engine::get_clock() < start) SleepUntil(start);
      flows_.clear();
      for (const Shared::CollectiveHop& hop : c.hops) {
        flows_.push_back(sg4::Comm::sendto_async(
            sh_->kv_hosts[replica_], hop.to, static_cast<uint64_t>(std::ceil(bytes * hop.share))));
      }
      sg4::Comm::wait_all(flows_);
      end = sg4::Engine::get_clock();
      // Below SimGrid's timing precision (1 ns), or bytes rounded up to
      // whole ones, the flows were alone.
      extra = end - start - alone;
      if (extra < 1e-9) extra = 0;
    }
    for (const Shared::CollectiveHop& hop : c.hops) {
      for (const auto& [l, dir] : hop.links) {
        metrics::LinkLoad& link = sh_->links[l];
        link.bytes += bytes * hop.share;
        link.AddFlow(dir, bytes * hop.share, start, end, sh_->link_bin_s);
        if (sh_->live != nullptr)
          sh_->live->OnLinkBytes(sh_->live_link[l] + dir, bytes * hop.share);
      }
    }
    sh_->metrics->AddCollectives(bytes, shared, extra);
    return extra;
  }

  // A cluster store's loads over the network (docs/kv_tiers.md, "Cluster
  // store"): the blocks a step loads from another replica's node leave
  // that node as one flow per home, from the step's start, over the route
  // between the replicas (out of the home's NIC link, through the fabric,
  // into this replica's), sharing every link with what else crosses it:
  // other loads, and in a disaggregated pool KV hand-offs and collectives.
  // Their time alone, the smallest route latency plus all their bytes over
  // this replica's NIC link, is already in the step's load time (the tier
  // link's); returns how much longer the flows took. Blocks at home take no
  // flow.
  double StoreFlows(double start) {
    const double bytes_per_block = pool_->batching.kv_tiers.back().bytes_per_block;
    flows_.clear();
    store_flows_of_step_.clear();
    double total = 0, latency = std::numeric_limits<double>::infinity();
    for (const auto& r : ranks_) {
      if (r->batch == nullptr) continue;
      for (const auto& [home, blocks] : r->batch->kv_store_from) {
        if (home == replica_) continue;
        StoreFlow f;
        f.home = home;
        f.bytes = static_cast<double>(blocks) * bytes_per_block;
        sh_->ForRoute(home, replica_, [&](int l, int dir) {
          f.links.emplace_back(l, dir);
          ++sh_->kv_flows_on[l];
        });
        std::vector<sg4::Link*> route;
        double route_latency = 0;
        sh_->kv_hosts[home]->route_to(sh_->kv_hosts[replica_], route, &route_latency);
        latency = std::min(latency, route_latency);
        total += f.bytes;
        store_flows_of_step_.push_back(std::move(f));
      }
    }
    if (store_flows_of_step_.empty()) return 0;
    if (sg4::Engine::get_clock() < start) SleepUntil(start);
    for (const StoreFlow& f : store_flows_of_step_) {
      flows_.push_back(sg4::Comm::sendto_async(sh_->kv_hosts[f.home], sh_->kv_hosts[replica_],
                                               static_cast<uint64_t>(std::ceil(f.bytes))));
    }
    sg4::Comm::wait_all(flows_);
    const double end = sg4::Engine::get_clock();
    const double alone = latency + total / sh_->links[replica_].bandwidth_bytes_per_s;
    // Below SimGrid's timing precision (1 ns), or bytes rounded up to
    // whole ones, the flows were alone.
    double extra = end - start - alone;
    if (extra < 1e-9) extra = 0;
    for (const StoreFlow& f : store_flows_of_step_) {
      for (const auto& [l, dir] : f.links) {
        --sh_->kv_flows_on[l];
        metrics::LinkLoad& link = sh_->links[l];
        link.bytes += f.bytes;
        link.AddFlow(dir, f.bytes, start, end, sh_->link_bin_s);
        if (sh_->live != nullptr) sh_->live->OnLinkBytes(sh_->live_link[l] + dir, f.bytes);
      }
    }
    sh_->metrics->AddStoreFlows(total, extra);
    return extra;
  }

  // The xPU power cap (cluster.power.xpu_cap_w, docs/energy.md). Over
  // their busy time the xPUs draw their idle and active power plus their
  // ops' energy / busy time on average; above the cap the clocks drop until
  // the average equals it: the busy time stretches to E / (n x (cap - idle
  // - active)), the ops' energy unchanged, and the iteration by as much.
  void ApplyPowerCap(scheduler::IterationCost* c) {
    const double n = static_cast<double>(pool_->xpus_per_replica());
    const double e_j = (c->total.energy_pj() - c->device_total.energy_pj()) * 1e-12;
    if (!(c->xpu_busy_s > 0) || !(e_j > 0)) return;
    // Active power is not drawn during collectives, which the clocks do
    // not lengthen: idle + active (t - c) / t + E / (n t) = cap.
    const double need_s =
        (e_j / n - pool_->xpu_active_power_w * c->xpu_collective_s) /
        (pool_->xpu_power_cap_w - pool_->xpu_idle_power_w - pool_->xpu_active_power_w);
    if (!(need_s > c->xpu_busy_s)) return;
    const double stretch = need_s - c->xpu_busy_s;
    c->xpu_busy_s = need_s;
    c->time_s += stretch;
    c->total.time_s += stretch;
    ++capped_iterations_;
  }

  // The board's power limit (cluster.xpu.tdp_w, docs/energy.md): over
  // their busy time the xPUs draw at most their TDP. The kernels' times
  // were measured at that limit (GEMMs run power-limited), so the time
  // stays and the energy above it is not drawn: it comes off the ops'
  // compute energy (the clocks and voltage drop), then off the active
  // power.
  void LimitToTdp(scheduler::IterationCost* c, double* active_j) {
    const double n = static_cast<double>(pool_->xpus_per_replica());
    const double limit_j = (pool_->xpu_tdp_w - pool_->xpu_idle_power_w) * n * c->xpu_busy_s;
    const double xpu_j = (c->total.energy_pj() - c->device_total.energy_pj()) * 1e-12 + *active_j;
    if (!(xpu_j > limit_j)) return;
    double excess_pj = (xpu_j - limit_j) * 1e12;
    const double xpu_compute_pj = c->total.compute_energy_pj - c->device_total.compute_energy_pj;
    const double cut_pj = std::min(excess_pj, std::max(0.0, xpu_compute_pj));
    c->total.compute_energy_pj -= cut_pj;
    excess_pj -= cut_pj;
    *active_j = std::max(0.0, *active_j - excess_pj * 1e-12);
    ++tdp_limited_iterations_;
  }

 public:
  // Charges the replica's static power over the run's `span_s` (the
  // attention device's only while idle when its ops already charge it).
  void ChargeStatic(double span_s) const {
    const double device_s =
        device_static_in_ops_ ? std::max(0.0, span_s - device_busy_total_s_) : span_s;
    sh_->metrics->AddStaticEnergy(xpu_static_w_ * span_s, device_static_w_ * device_s,
                                  host_w_ * span_s, capped_iterations_, tdp_limited_iterations_);
  }

 private:
  // Forwards to the metrics observer and counts finishes.
  class Counting : public scheduler::RequestObserver {
   public:
    explicit Counting(Engine* e) : e_(e) {}
    void OnFirstToken(const scheduler::RequestState& r, double t) override {
      // A prefill replica's token is not the user's: the decode replica
      // computes the first one again (vLLM's KV connectors).
      if (e_->role_ == Role::kPrefill) return;
      e_->observer_->OnFirstToken(r, t);
      if (LiveSink* live = e_->sh_->live) live->OnFirstToken(e_->replica_, t - r.spec.arrival_s);
    }
    void OnGaps(double t, double gap, int64_t count) override {
      if (e_->role_ == Role::kPrefill) return;
      e_->observer_->OnGaps(t, gap, count);
      if (LiveSink* live = e_->sh_->live) {
        for (int64_t k = 0; k < count; ++k) live->OnToken(e_->replica_, gap);
      }
    }
    void OnFinish(const scheduler::RequestState& r, double t) override {
      ++e_->finished_;
      --e_->sh_->loads[e_->replica_].outstanding;
      if (e_->role_ == Role::kPrefill) {
        e_->HandOff(r.spec.id, t);
        return;
      }
      e_->observer_->OnFinish(r, t);
      if (LiveSink* live = e_->sh_->live) live->OnFinish(e_->replica_, t - r.spec.arrival_s);
    }
    void OnReject(const scheduler::RequestSpec& r, scheduler::RejectReason why,
                  double t) override {
      ++e_->finished_;
      --e_->sh_->loads[e_->replica_].outstanding;
      e_->observer_->OnReject(r, why, t);
      if (LiveSink* live = e_->sh_->live) live->OnReject(e_->replica_, why);
    }

   private:
    Engine* e_;
  };

  // Takes a message at `now` (a lazy engine's time may be behind the
  // clock).
  void Receive(Message* msg, double now) {
    const int64_t before = finished_;
    // A prefill replica may hand off from now on: busy before the message
    // stops counting as in flight.
    if (role_ == Role::kPrefill) sh_->prefill_busy_until[replica_] = now;
    if (msg->end) {
      expected_ += msg->total_sent;
      ++ends_;
    } else if (msg->kv_parts >= 0) {
      --sh_->kv_in_flight;
      --sh_->kv_in_flight_to[static_cast<size_t>(replica_)];
      ReceiveKv(*msg, now);
    } else {
      --sh_->in_flight;
      if (sh_->live != nullptr) sh_->live->OnArrival(replica_);
      if (role_ == Role::kPrefill) {
        Prefill(msg->request, now);
      } else {
        Rank& rank = PickRank();
        if (!RejectedLate(rank, msg->request, now)) {
          rank.scheduler.Add(msg->request, now, &counting_);
        }
      }
    }
    done_ += finished_ - before;
    sh_->messages.Delete(msg);
    UpdateLoad();
  }

  // SLO-aware early rejection (scheduler.admission REJECT_LATE;
  // docs/disaggregation.md, "Early rejection"): refuses `spec`, reported as
  // kLate, when the time it has waited plus the prefill of every prompt
  // token queued on `rank` before it and of its own uncached tokens, in
  // steps of the token budget with nothing else in them, exceeds the TTFT
  // SLO. That is a lower bound on its TTFT (to within a step's attention
  // among the prompts that share it): only sure misses are refused.
  bool RejectedLate(Rank& rank, const scheduler::RequestSpec& spec, double now) {
    if (!pool_->reject_late) return false;
    const int64_t tokens = rank.scheduler.PrefillTokensAhead(spec);
    const int64_t budget = std::max<int64_t>(1, pool_->batching.max_tokens_per_iteration);
    double t = now - spec.arrival_s;
    auto chunk = [&](int64_t n) -> double {
      auto it = chunk_s_.find(n);
      if (it != chunk_s_.end()) return it->second;
      // The step alone: a data-parallel group's MoE layers see its tokens
      // only (the setting is restored).
      const int64_t group = rank.planner.group_tokens();
      if (pool_->data_parallel > 1) rank.planner.SetGroupTokens(n);
      absl::StatusOr<scheduler::IterationCost> c =
          rank.planner.Plan(scheduler::UniformBatch(1, n, 0));
      rank.planner.SetGroupTokens(group);
      const double s = (c.ok() ? c->time_s : 0.0) + pool_->step_overhead_s;
      chunk_s_.emplace(n, s);
      return s;
    };
    t += static_cast<double>(tokens / budget) * chunk(budget);
    if (tokens % budget > 0) t += chunk(tokens % budget);
    if (!(t > pool_->ttft_slo_s)) return false;
    counting_.OnReject(spec, scheduler::RejectReason::kLate, now);
    return true;
  }

  // ---- disaggregation (docs/disaggregation.md) ----

  // A request reaches the prefill pool: it prefills there and yields one
  // token, then hands off. One whose whole answer could never fit the
  // model's context is refused here, before the prefill is spent on it.
  void Prefill(const scheduler::RequestSpec& spec, double now) {
    if (spec.input_tokens + spec.output_tokens > pool_->batching.max_context_tokens) {
      counting_.OnReject(spec, scheduler::RejectReason::kTooLong, now);
      return;
    }
    scheduler::RequestSpec p = spec;
    p.output_tokens = 1;
    Rank& rank = PickRank();
    if (RejectedLate(rank, spec, now)) return;
    if (rank.scheduler.Add(p, now, &counting_) == scheduler::RejectReason::kNone) {
      specs_.emplace(spec.id, Handoff{spec, -1, 0});
    }
  }

  // The decode replica request `id` goes to, chosen by the decode pool's
  // router on its first KV part.
  int DecodeReplica(Handoff& h) {
    if (h.decode < 0) {
      // The loads of this moment (lazy decode engines brought to it; if
      // that stopped the run, this actor ends too).
      if (sh_->advance && !sh_->advance(sg4::Engine::get_clock())) sg4::this_actor::exit();
      const int64_t p = sh_->prefill_replicas;
      const absl::Span<const scheduler::ReplicaLoad> loads(
          sh_->loads.data() + p, static_cast<size_t>(sh_->sc->replicas - p));
      h.decode = static_cast<int>(p + sh_->decode_router->Route(loads));
      ++sh_->loads[h.decode].outstanding;
    }
    return h.decode;
  }

  // The prompt tokens whose KV moves to request `h`'s decode replica,
  // decided with its first part: those the decode replica does not hold
  // in its prefix cache then (as vLLM's P/D connectors pull only the
  // tokens the decode instance has not computed locally:
  // get_num_new_matched_tokens), at least the last one.
  int64_t TransferTokens(Handoff& h) {
    if (h.sent_tokens < 0) {
      const int d = DecodeReplica(h);
      const int64_t block = PoolOf(*sh_->sc, d).batching.kv_block_tokens;
      const int64_t cached = sh_->cached_blocks(d, h.spec) * block;
      h.sent_tokens = h.spec.input_tokens - std::min(cached, h.spec.input_tokens - 1);
    }
    return h.sent_tokens;
  }

  // Sends `bytes` of request `h`'s KV to its decode replica as a SimGrid
  // flow from this replica's host, at `now` (this engine's time: its step's
  // start or end); `parts` as Message::kv_parts.
  void SendKv(Handoff& h, double bytes, int32_t parts, double now) {
    const int d = DecodeReplica(h);
    ++h.parts_sent;
    ++sh_->kv_in_flight;
    ++sh_->kv_in_flight_to[static_cast<size_t>(d)];
    sh_->ForRoute(replica_, d, [&](int l, int) {
      sh_->links[l].bytes += bytes;
      ++sh_->kv_flows_on[l];
    });
    // Out of one NIC and into another (or over the node's NVLink).
    const auto& to = PoolOf(*sh_->sc, d).proto.cluster();
    sh_->metrics->AddTransferEnergy(
        bytes * 1e-12 *
        (sh_->SameNode(replica_, d) ? pool_->proto.cluster().interconnect().energy_pj_per_byte() +
                                          to.interconnect().energy_pj_per_byte()
                                    : pool_->proto.cluster().internode().energy_pj_per_byte() +
                                          to.internode().energy_pj_per_byte()));
    auto* msg = sh_->messages.New(h.spec, false, 0, parts);
    msg->prefill_end_s = now;
    msg->bytes = bytes;
    msg->sent_s = msg->prefill_end_s;
    msg->from = replica_;
    // The bytes flow between the replicas' hosts; the decode replica's
    // receiver learns of the flow at once and lands the part as the flow
    // ends, flows ending in any order (Receiver).
    msg->flow = sg4::Comm::sendto_async(sh_->kv_hosts[replica_], sh_->kv_hosts[d],
                                        static_cast<uint64_t>(std::ceil(bytes)));
    sh_->engine_boxes[d]->put_init(msg, 0)->detach();
  }

  double KvBytes(int64_t tokens) const {
    return static_cast<double>(tokens) * sh_->sc->kv_bytes_per_token;
  }

  // Layer-wise transfer: as a step that ends a prompt starts, the KV of
  // every layer but the last leaves (the layers compute one after another
  // while it streams); the last layer's follows when the step ends. KV the
  // prompt's earlier chunks or the prefix cache hold leaves then too.
  void StreamLayers(const scheduler::Batch& batch, double start) {
    const double layers = static_cast<double>(pool_->model.num_layers);
    for (const scheduler::BatchEntry& e : batch.entries) {
      if (!e.prefill || !e.emits_token) continue;
      auto it = specs_.find(e.request_id);
      if (it == specs_.end()) continue;
      Handoff& h = it->second;
      const int64_t sent = TransferTokens(h);
      h.tail_bytes = KvBytes(std::min(e.new_tokens, sent)) / layers;
      SendKv(h, KvBytes(sent) - h.tail_bytes, 0, start);
    }
  }  // Every rank's batch's layer-wise KV (StreamLayers above).
  void StreamLayers(double start) {
    for (const auto& r : ranks_) {
      if (r->batch != nullptr) StreamLayers(*r->batch, start);
    }
  }

  // Request `id`'s prefill ended at `t`: the rest of its KV leaves.
  void HandOff(int64_t id, double t) {
    auto it = specs_.find(id);
    Handoff& h = it->second;
    const double sent = KvBytes(TransferTokens(h));
    const double bytes = sh_->sc->kv_layerwise && h.parts_sent > 0 ? h.tail_bytes : sent;
    sh_->metrics->OnHandoff(id, replica_, t, sent);
    SendKv(h, bytes, h.parts_sent + 1, t);
    ++handed_[static_cast<size_t>(h.decode - sh_->prefill_replicas)];
    specs_.erase(it);
  }

 public:
  // Whether HintArrival may guess a request's prefill step: a colocated
  // replica of one rank and stage whose prompts prefill whole and alone
  // (PREFILL_FIRST with the cache holding none of them), planning for
  // devices that take hints.
  bool HintsArrivals() {
    return role_ == Role::kColocated && ranks_.size() == 1 && pool_->pipeline_parallel <= 1 &&
           pool_->batching.policy == scheduler::BatchingPolicy::kPrefillFirst &&
           !pool_->batching.prefix_caching && ranks_[0]->planner.ExpectSteps() > 0;
  }
  // A request is on its way: tells the devices the ops of the step that
  // prefills it alone, the step PREFILL_FIRST runs when it finds it alone
  // in the queue (most arrivals on a trace's rate). A remote device sends
  // them with its next round trip (the projection of an earlier arrival's
  // batches, usually), and the step, an arrival later, finds their costs
  // in the memo instead of making one more. A wrong guess (other prompts
  // waiting too) costs an agent's work and changes nothing.
  void HintArrival(const scheduler::RequestSpec& spec) {
    if (spec.input_tokens < 1 ||
        spec.input_tokens + spec.output_tokens > pool_->batching.max_context_tokens) {
      return;
    }
    scheduler::Batch& b = hint_batch_;
    b.Clear();
    b.entries.push_back(scheduler::BatchEntry{0, spec.input_tokens, 0, true, true, {}, spec.id,
                                              spec.input_tokens + spec.output_tokens});
    b.prefill_tokens = spec.input_tokens;
    b.emitting = 1;
    ranks_[0]->planner.ExpectLater(b);
  }

  // The most of `spec`'s leading blocks one of this replica's ranks holds
  // cached.
  int64_t CachedPrefixBlocks(const scheduler::RequestSpec& spec) const {
    int64_t most = 0;
    for (const auto& r : ranks_) most = std::max(most, r->scheduler.CachedPrefixBlocks(spec));
    return most;
  }

  // Decode replicas: a receiver actor takes every message as it lands, so
  // that a KV part's time is its transfer's end, not the end of the step
  // the engine was in; the engine takes them between steps (a lazy one is
  // brought forward to the landing first). Returns false once the run has
  // stopped.
  bool Land(Message* msg) {
    if (msg->end) {
      ++landed_ends_;
      landed_expected_ += msg->total_sent;
    } else if (msg->kv_parts > 0) {
      ++landed_finals_;
    }
    const double now = sg4::Engine::get_clock();
    if (msg->from >= 0) {
      // Its bytes over its life on every link of its route (links.csv).
      sh_->ForRoute(msg->from, replica_, [&](int l, int dir) {
        --sh_->kv_flows_on[l];
        sh_->links[l].AddFlow(dir, msg->bytes, msg->sent_s, now, sh_->link_bin_s);
        if (sh_->live != nullptr) sh_->live->OnLinkBytes(sh_->live_link[l] + dir, msg->bytes);
      });
    }
    if (!lazy_) {
      landed_.push_back({msg, now});
      if (asleep_) wake_->release();
      return true;
    }
    // Lazily: the steps that end before it first; an idle replica takes it
    // at once.
    if (!AdvanceTo(now)) return false;
    landed_.push_back({msg, now});
    return stepping_ || StartAt(now);
  }
  // The receiver's loop: until every prefill replica's stream has ended
  // and each request it announced has landed, every part of it. It waits
  // on the next message and on every KV flow announced and not yet ended
  // at once, so that a short flow lands when it ends even behind a long
  // one sent earlier (a request's last layer can land before the layers
  // streamed during a short prefill step).
  void Receiver() {
    sg4::Mailbox* box = sh_->engine_boxes[replica_];
    Message* next = nullptr;
    std::vector<sg4::CommPtr> waits = {box->get_async<Message>(&next)};
    std::vector<Message*> flying;  // waits[i + 1]'s message
    while (landed_ends_ < ends_needed_ || landed_finals_ < landed_expected_ || !flying.empty()) {
      ++sh_->engine_waits;
      const auto i = static_cast<size_t>(sg4::Comm::wait_any(waits));
      if (i == 0) {
        Message* m = next;
        waits[0] = box->get_async<Message>(&next);
        if (m->flow != nullptr) {
          waits.push_back(m->flow);
          flying.push_back(m);
        } else if (!Land(m)) {
          return;
        }
        continue;
      }
      Message* m = flying[i - 1];
      waits.erase(waits.begin() + static_cast<std::ptrdiff_t>(i));
      flying.erase(flying.begin() + static_cast<std::ptrdiff_t>(i - 1));
      m->flow = nullptr;
      if (!Land(m)) return;
    }
    // A lazy engine's actor waits for this to finish the run (RunLazy).
    all_landed_ = true;
    if (asleep_) wake_->release();
  }

 private:
  void TakeLanded() {
    for (const auto& [msg, t] : landed_) {
      landed_s_ = t;
      Receive(msg, Now());
    }
    landed_.clear();
  }

  // A KV part reaches this decode replica; with the last one the request
  // joins a rank's queue, its prompt's KV in place.
  void ReceiveKv(const Message& msg, double now) {
    const int64_t id = msg.request.id;
    Arriving& a = arriving_[id];
    ++a.received;
    a.first_sent_s = std::min(a.first_sent_s, msg.sent_s);
    if (msg.kv_parts > 0) {
      a.expected = msg.kv_parts;
      a.prefill_end_s = msg.prefill_end_s;
    }
    if (a.expected == 0 || a.received < a.expected) return;
    const double prefill_end_s = a.prefill_end_s;
    SampleTransfer(msg, a.first_sent_s);
    arriving_.erase(id);
    sh_->metrics->OnKvReady(id, landed_s_);
    if (sh_->live != nullptr) {
      sh_->live->OnKvTransfer(replica_, KvBytes(msg.request.input_tokens),
                              landed_s_ - prefill_end_s);
    }
    scheduler::RequestSpec spec = msg.request;
    spec.kv_ready_tokens = spec.input_tokens;
    if (sh_->live != nullptr) sh_->live->OnArrival(replica_);
    PickRank().scheduler.Add(spec, now, &counting_);
  }

  // The rank an arriving request joins: vLLM's data-parallel load balancer
  // picks the engine with the least 4 x waiting + running, the first on a
  // tie (docs/moe.md).
  Rank& PickRank() {
    Rank* best = ranks_[0].get();
    int64_t best_score = -1;
    for (auto& r : ranks_) {
      const int64_t score = 4 * r->scheduler.num_waiting() + r->scheduler.num_running();
      if (best_score < 0 || score < best_score) {
        best_score = score;
        best = r.get();
      }
    }
    return *best;
  }

  // The SLO batch cap for the current mean context, memoised per 64-token
  // bucket (rounded up, so the cap is never too generous) and shared by the
  // pool's replicas. A new bucket's search starts from the nearest known
  // bucket's cap. Data-parallel ranks share the first rank's cap.
  absl::StatusOr<int64_t> SloCap() {
    const int64_t ctx = ranks_[0]->scheduler.MeanContextTokens();
    const int64_t bucket = (ctx + 63) / 64;
    std::map<int64_t, int64_t>& caps = sh_->slo_caps[pool_];
    auto it = caps.lower_bound(bucket);
    if (it == caps.end() || it->first != bucket) {
      int64_t hint = 0;
      if (it != caps.end()) hint = it->second;
      if (it != caps.begin() &&
          (it == caps.end() || bucket - std::prev(it)->first < it->first - bucket)) {
        hint = std::prev(it)->second;
      }
      ASSIGN_OR_RETURN(int64_t cap,
                       scheduler::MaxBatchWithinSlo(ranks_[0]->planner, pool_->tbt_slo_s,
                                                    std::max<int64_t>(1, bucket * 64),
                                                    pool_->batching.max_batch_size, hint));
      it = caps.emplace_hint(it, bucket, cap);
    }
    batch_cap_ = it->second;
    return it->second;
  }

  // Every Nth iteration within the window (output.timeline_*): costed
  // again with its spans recorded (the planner is pure: same cost). With
  // data-parallel ranks, the first busy rank's schedule.
  absl::Status SampleTimeline(Rank& rank, const IterationRecord& it) {
    const auto& o = sh_->sc->proto.output();
    const int64_t index = iteration_index_++;
    if (!o.timeline() || !sh_->record_timeline || index % o.timeline_every() != 0 ||
        timeline_samples_ >= o.timeline_max_iterations() || it.start_s < o.timeline_start_s() ||
        it.start_s >= o.timeline_end_s()) {
      return absl::OkStatus();
    }
    ++timeline_samples_;
    TimelineIteration t;
    t.replica = replica_;
    t.index = index;
    t.start_s = it.start_s;
    t.duration_s = it.duration_s;
    t.batch_size = it.batch_size;
    t.prefill_tokens = it.prefill_tokens;
    t.decode_tokens = it.decode_tokens;
    t.power_w = it.duration_s > 0 ? it.static_w + it.energy_j / it.duration_s : it.static_w;
    // Layers past those drawn span by span are kept folded (one span per
    // track): the timeline draws them so, and a sample keeps 2-3% of its
    // spans instead of every layer's.
    RETURN_IF_ERROR(
        rank.planner
            .Plan(*rank.batch, &t.spans, std::max(o.timeline_layers(), metrics::kScheduleLayers))
            .status());
    sh_->metrics->AddTimeline(std::move(t));
    return absl::OkStatus();
  }

  // The KV transfers whose first part left within the timeline's window,
  // the first output.timeline_max_iterations of each decode replica.
  void SampleTransfer(const Message& last, double start_s) {
    const auto& o = sh_->sc->proto.output();
    if (!o.timeline() || !sh_->record_timeline ||
        transfer_samples_ >= o.timeline_max_iterations() || start_s < o.timeline_start_s() ||
        start_s >= o.timeline_end_s()) {
      return;
    }
    ++transfer_samples_;
    sh_->metrics->AddTimelineTransfer({last.request.id, last.from, replica_, start_s, landed_s_,
                                       KvBytes(last.request.input_tokens)});
  }

  // A failed iteration (e.g. no device agent left) ends the whole run.
  void Stop(absl::Status status) { sh_->Stop(std::move(status)); }

  void UpdateLoad() {
    auto& l = sh_->loads[replica_];
    l.kv_blocks_used = 0;
    l.kv_blocks_queued = 0;
    for (const auto& r : ranks_) {
      l.kv_blocks_used += r->scheduler.kv().used();
      l.kv_blocks_queued += r->scheduler.queued_block_demand();
    }
  }

  Shared* sh_;
  const ResolvedScenario* pool_;
  Role role_;
  int replica_;
  absl::flat_hash_map<int64_t, Handoff> specs_;      // prefill replicas
  std::vector<int64_t> handed_;                      // per decode replica
  absl::flat_hash_map<int64_t, Arriving> arriving_;  // decode replicas
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
  std::vector<sg4::CommPtr> flows_;  // a step's collectives (Collectives)
  // Set by Iteration when nothing could run before this time (a request's
  // asynchronous tier loads); -1: not waiting.
  double wait_until_ = -1;
  int64_t landed_ends_ = 0, landed_expected_ = 0, landed_finals_ = 0;
  sg4::SemaphorePtr wake_ = sg4::Semaphore::create(0);
  bool asleep_ = false;
  std::shared_ptr<devices::Device> device_;
  std::shared_ptr<devices::Device> attention_;
  scheduler::RequestObserver* observer_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  Counting counting_{this};
  int64_t iteration_index_ = 0;
  int64_t timeline_samples_ = 0;
  int64_t transfer_samples_ = 0;
  // Power: static figures (W), the attention device's busy time so far,
  // and the iterations the xPU cap slowed.
  double xpu_static_w_ = 0, host_w_ = 0, device_static_w_ = 0;
  bool device_static_in_ops_ = false;
  scheduler::Batch hint_batch_;  // HintArrival's
  bool shared_store_ = false;    // a cluster KV store: no fast-forward
  bool store_flows_ = false;   // its loads as flows (StoreFlows)
  // A step's store loads: per flow, its bytes and its route's links.
  struct StoreFlow {
    int home = 0;
    double bytes = 0;
    std::vector<std::pair<int, int>> links;  // (index in Shared::links, direction)
  };
  std::vector<StoreFlow> store_flows_of_step_;
  double device_busy_total_s_ = 0;
  int64_t capped_iterations_ = 0;
  int64_t tdp_limited_iterations_ = 0;  // at the board's power limit (LimitToTdp)
  int64_t expected_ = 0;                // requests sent here, summed from the end messages
  int64_t ends_ = 0, ends_needed_ = 1;  // end messages received, expected
  int64_t finished_ = 0;   // finished or rejected
  int64_t done_ = 0;
  int64_t batch_cap_ = 0;
  absl::flat_hash_map<int64_t, double> chunk_s_;  // a lone prefill step's time, by tokens
  scheduler::IterationCost cost_;  // the current step's, of grouped ranks or stages
  std::vector<scheduler::PipelineStep> steps_;  // its in-flight batches' stages
};

// The user's platform (fabric.platform_file), loaded into the engine:
// each replica's host, and the links of the routes from prefill replicas'
// hosts to decode replicas' (Shared::file_routes).
struct FilePlatform {
  std::vector<sg4::Host*> hosts;
  std::vector<sg4::Link*> links;  // in the order the routes first cross them
  std::vector<std::vector<int>> routes;
};

// Names servesim's own hosts and links take beside a platform file's.
constexpr const char* kOwnPrefix = "servesim.";

absl::StatusOr<FilePlatform> LoadPlatformFile(const ResolvedScenario& sc,
                                              const sg4::Engine& engine) {
  const std::string field = "cluster.disaggregation.fabric.platform_file";
  const std::string& file = sc.platform_file;
  try {
    engine.load_platform(file);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", e.what()));
  }
  std::vector<std::string> names;
  for (const sg4::Host* h : engine.get_all_hosts()) names.push_back(h->get_name());
  std::sort(names.begin(), names.end());
  auto own = [&](const std::string& name) -> absl::Status {
    if (absl::StartsWith(name, kOwnPrefix)) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", file, " names a host or link \"",
                                                     name, "\": names starting \"", kOwnPrefix,
                                                     "\" are servesim's own; rename it"));
    }
    return absl::OkStatus();
  };
  for (const std::string& n : names) RETURN_IF_ERROR(own(n));
  for (const sg4::Link* l : engine.get_all_links()) RETURN_IF_ERROR(own(l->get_name()));
  FilePlatform out;
  const bool named = sc.proto.cluster().disaggregation().fabric().replica_hosts_size() > 0;
  for (int64_t r = 0; r < sc.replicas; ++r) {
    const std::string& name = sc.replica_hosts[r];
    sg4::Host* h = engine.host_by_name_or_null(name);
    if (h == nullptr) {
      if (names.size() > 12) {
        names.resize(12);
        names.push_back("...");
      }
      return absl::InvalidArgumentError(absl::StrCat(
          named ? absl::StrCat("cluster.disaggregation.fabric.replica_hosts[", r, "] = \"", name,
                               "\"")
                : absl::StrCat(field, ": replica ", r, "'s host \"", name,
                               "\" (the default; cluster.disaggregation.fabric.replica_hosts "
                               "names others)"),
          ": no such host in ", file, " (its hosts: ", absl::StrJoin(names, ", "), ")"));
    }
    out.hosts.push_back(h);
  }
  absl::flat_hash_map<const sg4::Link*, int> index;
  const int64_t prefill = sc.prefill_pool->replicas;
  for (int64_t p = 0; p < prefill; ++p) {
    for (int64_t d = prefill; d < sc.replicas; ++d) {
      std::vector<sg4::Link*> links;
      double latency = 0;
      const std::string where = absl::StrCat(
          "the route from host \"", sc.replica_hosts[p], "\" (prefill replica ", p, ") to host \"",
          sc.replica_hosts[d], "\" (decode replica ", d, ") in ", file);
      try {
        out.hosts[p]->route_to(out.hosts[d], links, &latency);
      } catch (const std::exception& e) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": ", where, ": ", e.what()));
      }
      if (links.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": ", where, " is missing: the KV transfer needs one"));
      }
      std::vector<int>& route = out.routes.emplace_back();
      for (sg4::Link* l : links) {
        if (!(l->get_bandwidth() > 0)) {
          return absl::InvalidArgumentError(absl::StrCat(
              field, ": link \"", l->get_name(), "\" on ", where, " has bandwidth ",
              l->get_bandwidth(), ": a KV transfer over it could never complete; expected > 0"));
        }
        auto [it, added] = index.emplace(l, static_cast<int>(out.links.size()));
        if (added) out.links.push_back(l);
        route.push_back(it->second);
      }
    }
  }
  return out;
}

// Whether the pool's last KV tier is a cluster store.
bool HasClusterStore(const ResolvedScenario& pool) {
  return !pool.batching.kv_tiers.empty() && pool.batching.kv_tiers.back().cluster_store;
}

void BuildPlatform(const ResolvedScenario& sc, Shared* sh, const FilePlatform* file,
                   std::vector<sg4::Host*>* engine_hosts, sg4::Host** clients, sg4::Host** router) {
  // Beside a platform file, servesim's hosts and links sit in a zone of
  // their own under the file's root, their names prefixed.
  const std::string own = file != nullptr ? kOwnPrefix : "";
  auto* zone = sg4::create_full_zone(own + "cluster");
  if (file != nullptr) zone->set_parent(sg4::Engine::get_instance()->get_netzone_root());
  *clients = zone->create_host(own + "clients", 1e9);
  *router = zone->create_host(own + "router", 1e9);
  auto make_link = [&](const std::string& name, const servesim::v1::LinkSpec& l) {
    return zone->create_link(own + name, l.bandwidth_bytes_per_s())
        ->set_latency(l.latency_s())
        ->seal();
  };
  const auto& front = PoolOf(sc, 0).proto.cluster();
  auto* in = make_link("frontend.in", front.frontend());
  zone->add_route((*clients)->get_netpoint(), (*router)->get_netpoint(), nullptr, nullptr,
                  {sg4::LinkInRoute(in)}, true);
  for (int64_t r = 0; r < sc.replicas; ++r) {
    const ResolvedScenario& pool = PoolOf(sc, r);
    const auto& c = pool.proto.cluster();
    std::vector<sg4::Host*> xpus;
    std::vector<sg4::Link*> links;
    for (int64_t j = 0; j < pool.tensor_parallel; ++j) {
      xpus.push_back(
          zone->create_host(absl::StrCat(own, "r", r, ".xpu", j), c.xpu().peak_flops_fp16()));
      links.push_back(make_link(absl::StrCat("r", r, ".xpu", j, ".link"), c.interconnect()));
    }
    auto* fe = make_link(absl::StrCat("r", r, ".frontend"), c.frontend());
    zone->add_route((*router)->get_netpoint(), xpus[0]->get_netpoint(), nullptr, nullptr,
                    {sg4::LinkInRoute(fe)}, true);
    for (int64_t j = 1; j < pool.tensor_parallel; ++j) {
      zone->add_route(xpus[0]->get_netpoint(), xpus[j]->get_netpoint(), nullptr, nullptr,
                      {sg4::LinkInRoute(links[0]), sg4::LinkInRoute(links[j])}, true);
    }
    engine_hosts->push_back(xpus[0]);
  }
  if (sc.disaggregated()) {
    // Each decode replica's receiver sits on a host of its own; the
    // prefill replicas' notices of KV flows (and of their streams' end)
    // reach it over a link that takes no time.
    auto* notices = zone->create_link(own + "kv.notices", 1e30)->set_latency(0)->seal();
    sh->receiver_hosts.assign(static_cast<size_t>(sc.replicas), nullptr);
    for (int64_t d = sc.prefill_pool->replicas; d < sc.replicas; ++d) {
      sh->receiver_hosts[d] = zone->create_host(absl::StrCat(own, "r", d, ".kv"), 1e9);
      for (int64_t p = 0; p < sc.prefill_pool->replicas; ++p) {
        zone->add_route((*engine_hosts)[p]->get_netpoint(), sh->receiver_hosts[d]->get_netpoint(),
                        nullptr, nullptr, {sg4::LinkInRoute(notices)}, false);
      }
    }
    sh->kv_hosts = file != nullptr ? file->hosts : *engine_hosts;
  }
  if (file != nullptr) {
    // KV flows over the file's routes.
    for (const sg4::Link* l : file->links) {
      metrics::LinkLoad load;
      load.name = l->get_name();
      load.bandwidth_bytes_per_s = l->get_bandwidth();
      sh->links.push_back(std::move(load));
    }
    sh->file_hosts = file->hosts;
    sh->file_routes = file->routes;
    sh->rack_of.assign(static_cast<size_t>(sc.replicas), -1);
    sh->pod_of.assign(static_cast<size_t>(sc.replicas), -1);
  } else if (sc.disaggregated()) {
    // Each replica's NICs as one link of their summed bandwidth; nodes in
    // racks, each pool from a fresh node; racks joined through a spine over
    // split-duplex uplinks (docs/disaggregation.md, "Platform").
    const auto& fabric = sc.proto.cluster().disaggregation().fabric();
    std::vector<sg4::Link*> nics;
    std::vector<int64_t> node_of(static_cast<size_t>(sc.replicas));
    std::vector<int64_t> nodes_of(static_cast<size_t>(sc.replicas), 1);
    std::vector<double> node_nic_bw;  // per node: its NICs' bandwidth
    int64_t used = 0, per_node = 0;   // xPUs used on the current node, its size
    for (int64_t r = 0; r < sc.replicas; ++r) {
      const ResolvedScenario& pool = PoolOf(sc, r);
      const auto& c = pool.proto.cluster();
      const int64_t xpus = pool.tensor_parallel * pool.ranks();
      const int64_t size = c.xpus_per_node() > 0 ? c.xpus_per_node() : xpus;
      const bool share = sc.proto.cluster().disaggregation().share_nodes();
      const bool pool_start = r == 0 || (r == sc.prefill_pool->replicas && !share);
      if (pool_start || used + std::min(xpus, size) > per_node) {
        node_nic_bw.push_back(static_cast<double>(size) * c.internode().bandwidth_bytes_per_s());
        used = 0;
        per_node = size;
      }
      node_of[r] = static_cast<int64_t>(node_nic_bw.size()) - 1;
      // A replica larger than a node takes whole nodes.
      const int64_t extra = (xpus + size - 1) / size - 1;
      nodes_of[r] = extra + 1;
      for (int64_t k = 0; k < extra; ++k) node_nic_bw.push_back(node_nic_bw.back());
      used = xpus > size ? size : used + xpus;
      const double bw = static_cast<double>(xpus) * c.internode().bandwidth_bytes_per_s();
      nics.push_back(zone->create_split_duplex_link(absl::StrCat("r", r, ".nic"), bw)
                         ->set_latency(c.internode().latency_s())
                         ->seal());
      metrics::LinkLoad load;
      load.name = absl::StrCat("r", r, ".nic");
      load.bandwidth_bytes_per_s = bw;
      load.split_duplex = true;
      sh->links.push_back(std::move(load));
    }
    // One uplink per group of `per` members (racks of nodes, pods of
    // racks), the members' bandwidths `member_bw`: each carries its group's
    // most member bandwidth x `per` / `oversubscription` each way, with
    // half of `latency` (docs/disaggregation.md, "Platform").
    auto make_uplinks = [&](const char* kind, const std::vector<double>& member_bw, int64_t per,
                            double oversubscription, double latency) {
      std::vector<sg4::Link*> ups;
      std::vector<double> bws;
      const int64_t members = static_cast<int64_t>(member_bw.size());
      for (int64_t k = 0; k * per < members; ++k) {
        double most = 0;
        for (int64_t n = k * per; n < std::min((k + 1) * per, members); ++n) {
          most = std::max(most, member_bw[n]);
        }
        const double bw = static_cast<double>(per) * most / oversubscription;
        const std::string name = absl::StrCat(kind, k, ".uplink");
        auto* up = zone->create_split_duplex_link(name, bw);
        up->set_latency(latency / 2)->seal();
        ups.push_back(up);
        bws.push_back(bw);
        metrics::LinkLoad load;
        load.name = name;
        load.bandwidth_bytes_per_s = bw;
        load.split_duplex = true;
        sh->links.push_back(std::move(load));
      }
      return std::make_pair(ups, bws);
    };
    const int64_t per_rack = fabric.nodes_per_rack();
    std::vector<sg4::Link*> uplinks, pod_uplinks;
    if (per_rack > 0) {
      auto [ups, bws] = make_uplinks("rack", node_nic_bw, per_rack, fabric.oversubscription(),
                                     fabric.spine_latency_s());
      uplinks = std::move(ups);
      sh->racks = static_cast<int>(uplinks.size());
      if (fabric.racks_per_pod() > 0) {
        pod_uplinks = make_uplinks("pod", bws, fabric.racks_per_pod(),
                                   fabric.pod_oversubscription(), fabric.core_latency_s())
                          .first;
      }
    }
    for (int64_t r = 0; r < sc.replicas; ++r) {
      const int rack = per_rack > 0 ? static_cast<int>(node_of[r] / per_rack) : -1;
      sh->rack_of.push_back(rack);
      sh->pod_of.push_back(pod_uplinks.empty() ? -1 : rack / fabric.racks_per_pod());
    }
    // Replicas sharing nodes reach each other over NVLink: each replica's
    // xPUs' links to the node's switch, summed per direction.
    std::vector<sg4::Link*> nvlinks;
    if (sc.proto.cluster().disaggregation().share_nodes()) {
      sh->node_of = node_of;
      sh->nvlink_base = static_cast<int>(sh->links.size());
      for (int64_t r = 0; r < sc.replicas; ++r) {
        const ResolvedScenario& pool = PoolOf(sc, r);
        const auto& link = pool.proto.cluster().interconnect();
        const double bw =
            static_cast<double>(pool.tensor_parallel * pool.ranks()) * link.bandwidth_bytes_per_s();
        const std::string name = absl::StrCat("r", r, ".nvlink");
        nvlinks.push_back(
            zone->create_split_duplex_link(name, bw)->set_latency(link.latency_s())->seal());
        metrics::LinkLoad load;
        load.name = name;
        load.bandwidth_bytes_per_s = bw;
        load.split_duplex = true;
        sh->links.push_back(std::move(load));
      }
    }
    // sh->links' index -> the SimGrid link.
    const int nics_n = static_cast<int>(sc.replicas);
    const int pods_end = nics_n + sh->racks + static_cast<int>(pod_uplinks.size());
    auto link_of = [&](int l, int dir) {
      sg4::Link* link = l < nics_n               ? nics[l]
                        : l < nics_n + sh->racks ? uplinks[l - nics_n]
                        : l < pods_end           ? pod_uplinks[l - nics_n - sh->racks]
                                                 : nvlinks[l - pods_end];
      return sg4::LinkInRoute(
          link, dir == 0 ? sg4::LinkInRoute::Direction::UP : sg4::LinkInRoute::Direction::DOWN);
    };
    // Collectives of replicas across nodes (Engine::Collectives): a ring
    // over the replica's nodes. Its flows leave the replica's host out of
    // its NIC link and come back into it (the ring's next node is the
    // replica's too): the route latency of a KV flow between two replicas
    // of a rack, as CM02 shares a link in inverse proportion to its flows'
    // route latencies, as TCP does.
    sh->collectives.assign(static_cast<size_t>(sc.replicas), {});
    for (int64_t r = 0; r < sc.replicas; ++r) {
      const int64_t n = nodes_of[r];
      if (n < 2) continue;
      const auto& net = PoolOf(sc, r).proto.cluster().internode();
      Shared::Collectives& c = sh->collectives[r];
      c.nic_bw = sh->links[r].bandwidth_bytes_per_s;
      c.latency = 2 * net.latency_s();
      auto add_hop = [&](const std::string& name, double share,
                         std::vector<std::pair<int, int>> links) {
        Shared::CollectiveHop hop;
        hop.to = zone->create_host(own + name, 1e9);
        hop.share = share;
        hop.links = std::move(links);
        hop.links.emplace_back(static_cast<int>(r), 1);  // into the next node's NIC
        std::vector<sg4::LinkInRoute> route;
        for (const auto& [l, dir] : hop.links) route.push_back(link_of(l, dir));
        zone->add_route((*engine_hosts)[r]->get_netpoint(), hop.to->get_netpoint(), nullptr,
                        nullptr, route, false);
        c.hops.push_back(std::move(hop));
      };
      // Node k sends 1/n of the bytes to node k + 1 (mod n).
      int64_t in_rack = 0;
      for (int64_t k = 0; k < n; ++k) {
        const int64_t a = node_of[r] + k, b = node_of[r] + (k + 1) % n;
        const int ra = per_rack > 0 ? static_cast<int>(a / per_rack) : -1;
        const int rb = per_rack > 0 ? static_cast<int>(b / per_rack) : -1;
        if (ra == rb) {
          ++in_rack;
          continue;
        }
        std::vector<std::pair<int, int>> links = {{static_cast<int>(r), 0}, {nics_n + ra, 0}};
        if (!pod_uplinks.empty()) {
          const int pa = ra / fabric.racks_per_pod(), pb = rb / fabric.racks_per_pod();
          if (pa != pb) {
            links.emplace_back(nics_n + sh->racks + pa, 0);
            links.emplace_back(nics_n + sh->racks + pb, 1);
          }
        }
        links.emplace_back(nics_n + rb, 1);
        add_hop(absl::StrCat("r", r, ".ring", k), 1.0 / static_cast<double>(n), std::move(links));
        c.crosses_racks = true;
      }
      if (in_rack > 0) {
        add_hop(absl::StrCat("r", r, ".ring"),
                static_cast<double>(in_rack) / static_cast<double>(n), {{static_cast<int>(r), 0}});
      }
    }
    auto add_route = [&](int64_t a, int64_t b) {
      std::vector<sg4::LinkInRoute> route;
      sh->ForRoute(static_cast<int>(a), static_cast<int>(b),
                   [&](int l, int dir) { route.push_back(link_of(l, dir)); });
      zone->add_route((*engine_hosts)[a]->get_netpoint(), (*engine_hosts)[b]->get_netpoint(),
                      nullptr, nullptr, route, false);
    };
    const int64_t prefill = sc.prefill_pool->replicas;
    for (int64_t p = 0; p < prefill; ++p) {
      for (int64_t d = prefill; d < sc.replicas; ++d) add_route(p, d);
    }
    // A pool's cluster KV store: loads between the pool's replicas
    // (Engine::StoreFlows).
    for (const auto& [begin, end] :
         {std::pair<int64_t, int64_t>{0, prefill}, {prefill, sc.replicas}}) {
      if (!HasClusterStore(PoolOf(sc, begin))) continue;
      for (int64_t a = begin; a < end; ++a) {
        for (int64_t b = begin; b < end; ++b) {
          if (a != b) add_route(a, b);
        }
      }
    }
  } else if (HasClusterStore(sc)) {
    // A colocated cluster's store (Engine::StoreFlows): each replica's NICs
    // to the store as one full-duplex link of the tier link's bandwidth per
    // xPU each way (its latency is in the load's time already); a block
    // goes out of its home's link and into the loading replica's.
    const scheduler::KvTierConfig& t = sc.batching.kv_tiers.back();
    const double bw = t.bytes_per_block / t.seconds_per_block;
    std::vector<sg4::Link*> nics;
    for (int64_t r = 0; r < sc.replicas; ++r) {
      const std::string name = absl::StrCat("r", r, ".nic");
      nics.push_back(zone->create_split_duplex_link(name, bw)->set_latency(0)->seal());
      metrics::LinkLoad load;
      load.name = name;
      load.bandwidth_bytes_per_s = bw;
      load.split_duplex = true;
      sh->links.push_back(std::move(load));
    }
    for (int64_t a = 0; a < sc.replicas; ++a) {
      for (int64_t b = 0; b < sc.replicas; ++b) {
        if (a == b) continue;
        zone->add_route((*engine_hosts)[a]->get_netpoint(), (*engine_hosts)[b]->get_netpoint(),
                        nullptr, nullptr,
                        {sg4::LinkInRoute(nics[a], sg4::LinkInRoute::Direction::UP),
                         sg4::LinkInRoute(nics[b], sg4::LinkInRoute::Direction::DOWN)},
                        false);
      }
    }
    sh->kv_hosts = *engine_hosts;
    sh->rack_of.assign(static_cast<size_t>(sc.replicas), -1);  // one switch (ForRoute)
    sh->pod_of.assign(static_cast<size_t>(sc.replicas), -1);
  }
  sh->kv_flows_on.assign(sh->links.size(), 0);
  zone->seal();
}

}  // namespace

absl::StatusOr<std::string> CheckPlatformFile(const ResolvedScenario& sc) {
  if (sc.platform_file.empty()) return std::string();
  std::string name = "servesim";
  char* argv[] = {name.data(), nullptr};
  int argc = 1;
  struct sigaction caller_sigint;
  ::sigaction(SIGINT, nullptr, &caller_sigint);
  sg4::Engine engine(&argc, argv);
  ::sigaction(SIGINT, &caller_sigint, nullptr);
  ASSIGN_OR_RETURN(FilePlatform file, LoadPlatformFile(sc, engine));
  const sg4::Link* slowest = file.links.front();
  for (const sg4::Link* l : file.links) {
    if (l->get_bandwidth() < slowest->get_bandwidth()) slowest = l;
  }
  return absl::StrCat("# platform file ", sc.platform_file, ": ", engine.get_host_count(),
                      " hosts; the KV routes cross ", file.links.size(), " links, the slowest \"",
                      slowest->get_name(), "\" at ", slowest->get_bandwidth() / 1e9, " GB/s\n");
}

absl::StatusOr<RunResult> RunSimulation(const ResolvedScenario& sc,
                                        const workload::Workload& workload,
                                        const RunOptions& options) {
  std::unique_ptr<RequestStream> stream = workload::StreamOf(workload);
  return RunSimulation(sc, *stream, options);
}

absl::StatusOr<RunResult> RunSimulation(const ResolvedScenario& sc,
                                        RequestStream& requests, const RunOptions& options) {
  std::vector<std::string> args = {"servesim"};
  args.insert(args.end(), options.simgrid_args.begin(), options.simgrid_args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  int argc = static_cast<int>(argv.size());
  // SimGrid's engine installs a SIGINT handler that dumps every actor; the
  // caller's handling (servesim's clean stop, or the default) is restored.
  struct sigaction caller_sigint;
  ::sigaction(SIGINT, nullptr, &caller_sigint);
  sg4::Engine engine(&argc, argv.data());
  ::sigaction(SIGINT, &caller_sigint, nullptr);
  if (argc > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("unrecognised SimGrid argument: ", argv[1]));
  }
  if (sc.disaggregated() || HasClusterStore(sc)) {
    // KV flows take latency + bytes / bandwidth, links shared max-min fair
    // (CM02), with no TCP window bound and no reverse-path traffic: RDMA
    // over InfiniBand or RoCE, not SimGrid's TCP-calibrated default. Flags
    // the command line set stay.
    for (const char* cfg :
         {"network/model:CM02", "network/TCP-gamma:0", "network/crosstraffic:0"}) {
      const std::string key = std::string(cfg).substr(0, std::string(cfg).find(':'));
      bool given = false;
      for (const std::string& a : options.simgrid_args) given |= a.find(key) != std::string::npos;
      if (!given) sg4::Engine::set_config(cfg);
    }
  }

  RunResult result;
  MetricsOptions metrics_options;
  const auto& output = sc.proto.output();
  if (output.has_exact_percentile_max_samples()) {
    metrics_options.exact_percentile_max_samples = output.exact_percentile_max_samples();
  }
  metrics_options.ttft_slo_s = sc.ttft_slo_s;
  metrics_options.tpot_slo_s = sc.tpot_slo_s;
  metrics_options.kv_capacity_blocks = 0;
  for (int64_t r = 0; r < sc.replicas; ++r) {
    const ResolvedScenario& pool = PoolOf(sc, r);
    metrics_options.kv_capacity_blocks += pool.kv.blocks * pool.ranks();
  }
  metrics_options.kv_capacity_blocks /= sc.replicas;  // per replica
  metrics_options.replicas = static_cast<int>(sc.replicas);
  metrics_options.time_series = options.time_series;
  metrics_options.sink = options.sink;
  result.metrics = std::make_unique<MetricsCollector>(metrics_options);
  Shared sh;
  sh.sc = &sc;
  sh.requests = &requests;
  sh.metrics = result.metrics.get();
  sh.live = options.live;
  sh.record_timeline = options.record_timeline;
  sh.link_bin_s = sc.proto.output().link_bin_s();
  sh.paced = options.pace > 0;
  sh.interrupt = options.interrupt;
  sh.loads.assign(sc.replicas, scheduler::ReplicaLoad{});
  for (int64_t r = 0; r < sc.replicas; ++r) {
    const ResolvedScenario& pool = PoolOf(sc, r);
    sh.loads[r].kv_blocks_capacity = pool.kv.blocks * pool.ranks();
  }
  if (sc.disaggregated()) {
    sh.prefill_replicas = sc.prefill_pool->replicas;
    sh.prefill_busy_until.assign(static_cast<size_t>(sh.prefill_replicas), -1.0);
    sh.kv_in_flight_to.assign(static_cast<size_t>(sc.replicas), 0);
    sh.decode_router = std::make_unique<scheduler::Router>(sc.decode_pool->routing);
  }

  std::vector<sg4::Host*> engine_hosts;
  sg4::Host *clients = nullptr, *router = nullptr;
  std::vector<std::unique_ptr<Engine>> engines;
  sh.cached_blocks = [&engines](int r, const scheduler::RequestSpec& spec) {
    return engines[static_cast<size_t>(r)]->CachedPrefixBlocks(spec);
  };
  std::optional<FilePlatform> file;
  if (!sc.platform_file.empty()) {
    ASSIGN_OR_RETURN(file, LoadPlatformFile(sc, engine));
  }
  BuildPlatform(sc, &sh, file ? &*file : nullptr, &engine_hosts, &clients, &router);
  if (sh.live != nullptr && !sh.links.empty()) {
    std::vector<std::pair<std::string, double>> live_links;
    for (const metrics::LinkLoad& l : sh.links) {
      sh.live_link.push_back(static_cast<int>(live_links.size()));
      if (l.split_duplex) {
        live_links.emplace_back(l.name + ".up", l.bandwidth_bytes_per_s);
        live_links.emplace_back(l.name + ".down", l.bandwidth_bytes_per_s);
      } else {
        live_links.emplace_back(l.name, l.bandwidth_bytes_per_s);
      }
    }
    sh.live->OnLinks(live_links);
  }

  std::map<const ResolvedScenario*, std::shared_ptr<scheduler::BlockLru>> stores;
  for (int64_t r = 0; r < sc.replicas; ++r) {
    const ResolvedScenario& pool = PoolOf(sc, r);
    const Role role = !sc.disaggregated()       ? Role::kColocated
                      : r < sh.prefill_replicas ? Role::kPrefill
                                                : Role::kDecode;
    std::shared_ptr<devices::Device> device = pool.xpu_agent;
    if (device == nullptr) {
      ASSIGN_OR_RETURN(device, devices::CreateDevice(pool.xpu_device));
    }
    std::shared_ptr<devices::Device> attention =
        pool.attention_shared != nullptr ? pool.attention_shared : pool.attention_agent;
    if (pool.has_attention_device && attention == nullptr) {
      ASSIGN_OR_RETURN(attention, scenario::CreateAttentionDevice(pool));
    }
    // A cluster KV store (the pool's last tier): one per pool and run,
    // every scheduler of the pool's replicas sharing it.
    std::shared_ptr<scheduler::BlockLru>& store = stores[&pool];
    if (store == nullptr && HasClusterStore(pool)) {
      store = std::make_shared<scheduler::BlockLru>(pool.batching.kv_tiers.back().capacity_blocks *
                                                    pool.replicas * pool.ranks());
    }
    engines.push_back(std::make_unique<Engine>(&sh, &pool, role, static_cast<int>(r),
                                               std::move(device), std::move(attention), store));
    sh.engine_boxes.push_back(sg4::Mailbox::by_name(absl::StrCat("engine", r)));
  }
  sh.router_box = sg4::Mailbox::by_name("router");
  std::vector<Engine*> lazy;
  for (const auto& e : engines) {
    if (e->lazy()) lazy.push_back(e.get());
  }
  if (!lazy.empty()) {
    // The engines' steps that end before t, in the order they end (ties in
    // engine order): engines are independent between arrivals and the
    // collector orders what they record, so the result is the one engine
    // after engine gives. But a step that tells remote devices what the
    // next ones will ask (a prefill changing the batch: Anticipate) is
    // followed by the other engines' steps that end before it does, which
    // run while the agent answers, instead of by its own next step, which
    // would wait for the answer.
    sh.advance = [lazy, due = std::vector<std::pair<double, size_t>>()](double t) mutable {
      due.clear();
      for (size_t i = 0; i < lazy.size(); ++i) {
        if (lazy[i]->StepsBefore(t)) due.emplace_back(lazy[i]->step_end(), i);
      }
      std::make_heap(due.begin(), due.end(), std::greater<>());
      while (!due.empty()) {
        std::pop_heap(due.begin(), due.end(), std::greater<>());
        const size_t i = due.back().second;
        due.pop_back();
        Engine* e = lazy[i];
        if (!e->NextStep()) return false;
        if (e->StepsBefore(t)) {
          due.emplace_back(e->step_end(), i);
          std::push_heap(due.begin(), due.end(), std::greater<>());
        }
      }
      return true;
    };
  }
  // The replicas share their pool's remote devices, so one engine's hints
  // serve them all.
  if (!engines.empty() && engines[0]->HintsArrivals()) {
    Engine* first = engines[0].get();
    sh.hint_arrival = [first](const scheduler::RequestSpec& r) { first->HintArrival(r); };
  }

  // Permanent receivers: hand-offs complete without waiting for the
  // receiver to call get(), so a busy engine finds them queued.
  auto router_actor = sg4::Actor::create("router", router, RouterActor, &sh);
  sh.router_box->set_receiver(router_actor);
  for (int64_t r = 0; r < sc.replicas; ++r) {
    Engine* e = engines[r].get();
    auto actor = sg4::Actor::create(absl::StrCat("engine", r), engine_hosts[r],
                                    [e]() { e->Run(); });
    if (r >= sh.prefill_replicas && sh.prefill_replicas > 0) {
      // A decode replica's messages land at its receiver (Engine::Land).
      actor = sg4::Actor::create(absl::StrCat("engine", r, ".kv"), sh.receiver_hosts[r],
                                 [e]() { e->Receiver(); });
    }
    sh.engine_boxes[r]->set_receiver(actor);
  }
  sg4::Actor::create("source", clients, Source, &sh);

  // Watching the run: the driver, not an actor, reads the wall clock here,
  // between SimGrid time steps; nothing it does feeds back into the run.
  const auto wall_start = std::chrono::steady_clock::now();
  auto wall_s = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  };
  if (options.pace > 0 || options.live != nullptr) {
    sg4::Engine::on_time_advance_cb([&options, &wall_s, wall_start](double) {
      const double now = sg4::Engine::get_clock();
      if (options.pace > 0) {
        // At most 10^9 wall seconds ahead: past ~292 years the nanosecond
        // count would leave int64 (a slow pace on a long trace). In steps of
        // at most 0.1 s, so that an interrupt is seen while waiting.
        const auto until =
            wall_start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                             std::chrono::duration<double>(std::min(now / options.pace, 1e9)));
        while (std::chrono::steady_clock::now() < until &&
               !(options.interrupt != nullptr && options.interrupt->load() != 0)) {
          std::this_thread::sleep_until(
              std::min(until, std::chrono::steady_clock::now() + std::chrono::milliseconds(100)));
        }
      }
      if (options.live != nullptr) options.live->OnClock(now, wall_s());
    });
  }
  // Idle replicas hold back no iteration that starts before the next
  // request can reach them (MetricsCollector's merge).
  result.metrics->SetArrivalFloor(
      [&sh] { return sh.prefill_replicas > 0 ? sh.HandoffFloor() : sh.ArrivalFloor(); });
  engine.run();
  // Replicas left waiting when SimGrid ran out of events: a deadlock,
  // which is servesim's bug; the run stops with what finished, not as a
  // success.
  if (sh.engines_done < sc.replicas && sh.error.ok()) {
    sh.error = absl::InternalError(absl::StrCat(
        "the simulation stopped at t=", sg4::Engine::get_clock(), " s with ",
        sc.replicas - sh.engines_done,
        " replica(s) waiting for events that never come (a deadlock in servesim; please report "
        "the scenario); the outputs hold what finished"));
  }
  result.metrics->SetArrivalFloor(nullptr);
  for (const auto& e : engines) e->ChargeStatic(result.metrics->last_event_s());
  result.metrics->SetLinkLoads(std::move(sh.links), sh.link_bin_s);
  result.metrics->Finish();
  if (!sh.error.ok()) {
    if (options.partial != nullptr) {
      options.partial->metrics = std::move(result.metrics);
      options.partial->simulated_s = sg4::Engine::get_clock();
      options.partial->engine_waits = sh.engine_waits;
      options.partial->hints = sh.hints;
    }
    return sh.error;
  }
  result.simulated_s = sg4::Engine::get_clock();
  result.engine_waits = sh.engine_waits;
  result.hints = sh.hints;
  if (options.live != nullptr) options.live->OnDone(result.simulated_s, wall_s());
  return result;
}

}  // namespace servesim::cluster
