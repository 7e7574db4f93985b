// The engine's step loop: lazy and stepping modes, the end of a replica's
// run, and a decode replica's receiver (cluster/engine.h).
#include "cluster/engine.h"

#include <algorithm>
#include <limits>
#include <simgrid/Exception.hpp>

#include "absl/strings/str_cat.h"
#include "common/sim_time.h"
#include "scheduler/planner.h"

namespace servesim::cluster {

namespace sg4 = simgrid::s4u;

namespace {

scheduler::PlannerConfig ReplicaPlannerConfig(const scenario::ResolvedScenario& sc,
                                              const devices::Device* xpu,
                                              const devices::Device* attention) {
  scheduler::PlannerConfig c = sc.planner;
  c.tensor_parallel = sc.tensor_parallel;
  c.xpu = xpu;
  c.attention = attention;
  return c;
}

}  // namespace

Engine::Engine(RunState* sh, const scenario::ResolvedScenario* pool, Role role, int replica,
               std::shared_ptr<devices::Device> device, std::shared_ptr<devices::Device> attention,
               std::shared_ptr<scheduler::BlockLru> store)
    : sh_(sh),
      pool_(pool),
      role_(role),
      replica_(replica),
      device_(std::move(device)),
      attention_(std::move(attention)),
      observer_(sh->metrics->ObserverFor(replica)),
      power_(pool, attention_.get()),
      flows_(sh, pool, replica, role),
      hints_(sh, pool, &ranks_, &stepping_) {
  const scheduler::PlannerConfig pc = ReplicaPlannerConfig(*pool, device_.get(), attention_.get());
  scheduler::BatchingConfig batching = pool->batching;
  batching.kv_store = std::move(store);
  batching.kv_store_home = replica;
  shared_store_ = batching.kv_store != nullptr;
  // The store's loads cross the network where BuildPlatform routes them
  // (not over a platform file's routes).
  store_flows_ = shared_store_ && !batching.kv_tier_async && sh->fabric.file_routes.empty() &&
                 !sh->fabric.kv_hosts.empty();
  for (int64_t i = 0; i < pool->ranks(); ++i) {
    ranks_.push_back(std::make_unique<Rank>(batching, pool->model, pc));
  }
  // A decode replica hears the end of every prefill replica's stream.
  ends_needed_ = role == Role::kDecode ? sh->prefill_replicas : 1;
  // Colocated and decode replicas whose steps make no SimGrid call (no
  // flows for collectives or store loads, no waits for asynchronous tier
  // loads) and whom no observer watches in time run lazily (RunLazy).
  lazy_ = role != Role::kPrefill && FastForward() && !batching.kv_tier_async &&
          !sh->fabric.HasCollectives(replica);
  if (role == Role::kPrefill) kv_out_ = std::make_unique<KvSender>(sh, pool, replica);
  if (role == Role::kDecode) kv_in_ = std::make_unique<KvReceiver>(sh, replica);
}

void Engine::Run() {
  if (lazy_ ? !RunLazy() : !RunStepping()) return;
  Finished();
}

bool Engine::AdvanceTo(double t) {
  while (StepsBefore(t)) {
    if (!NextStep()) return false;
  }
  return true;
}

bool Engine::NextStep() {
  if (sh_->Interrupted()) {
    sh_->Stop(Interruption());
    return false;
  }
  const double end = step_end_;
  stepping_ = false;
  CompleteAt(end);
  return StartAt(end);
}

bool Engine::RunLazy() {
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

bool Engine::StartAt(double t) {
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

bool Engine::Step(double t, double* duration) {
  if (t > kMaxSimulatedSeconds) {
    sh_->Stop(PastTimeLimit(t, absl::StrCat("replica ", replica_, " starts an iteration").c_str()));
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

bool Engine::RunStepping() {
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
        // Busy from taking the message (RunState::HandoffFloor), also while
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

void Engine::Finished() {
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
  if (kv_out_ != nullptr) kv_out_->EndStreams();
}

double Engine::Now() const { return std::max(sg4::Engine::get_clock(), last_end_); }

void Engine::SleepUntil(double t) {
  ++sh_->engine_waits;
  sg4::this_actor::sleep_until(t);
}

Message* Engine::Wait(sg4::Mailbox* box) {
  ++sh_->engine_waits;
  return box->get<Message>();
}

void Engine::AwaitLoads() {
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

bool Engine::Idle() const {
  for (const auto& r : ranks_) {
    if (!r->scheduler.Idle()) return false;
  }
  return true;
}

bool Engine::FastForward() const {
  return sh_->live == nullptr && !sh_->paced && role_ != Role::kPrefill && !shared_store_ &&
         sh_->max_in_flight == 0;
}

void Engine::CompleteAt(double t) {
  const int64_t finished_before = finished_;
  for (auto& r : ranks_) {
    if (r->batch != nullptr) r->scheduler.Complete(t, &counting_);
    r->batch = nullptr;
  }
  done_ += finished_ - finished_before;
  UpdateLoad();
}

bool Engine::Land(Message* msg) {
  if (msg->end) {
    ++landed_ends_;
    landed_expected_ += msg->total_sent;
  } else if (msg->kv_parts > 0) {
    ++landed_finals_;
  }
  const double now = sg4::Engine::get_clock();
  if (msg->from >= 0) {
    // Its bytes over its life on every link of its route (links.csv).
    Fabric& fabric = sh_->fabric;
    fabric.ForRoute(msg->from, replica_, [&](int l, int dir) {
      --fabric.kv_flows_on[l];
      fabric.links[l].AddFlow(dir, msg->bytes, msg->sent_s, now, fabric.link_bin_s);
      if (sh_->live != nullptr) sh_->live->OnLinkBytes(fabric.live_link[l] + dir, msg->bytes);
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

// Until every prefill replica's stream has ended and each request it
// announced has landed, every part of it. It waits on the next message and
// on every KV flow announced and not yet ended at once, so that a short
// flow lands when it ends even behind a long one sent earlier (a request's
// last layer can land before the layers streamed during a short prefill
// step).
void Engine::Receiver() {
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

void Engine::TakeLanded() {
  for (const auto& [msg, t] : landed_) {
    landed_s_ = t;
    Receive(msg, Now());
  }
  landed_.clear();
}

}  // namespace servesim::cluster
