#include "cluster/simulation.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>
#include <simgrid/s4u.hpp>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
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
  Message* prev = nullptr;  // MessageList links
  Message* next = nullptr;
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
  Message* New(const scheduler::RequestSpec& request, bool end, int64_t total_sent) {
    auto* m = new Message{request, end, total_sent, nullptr, head_};
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

struct Shared {
  MessageList messages;
  const ResolvedScenario* sc = nullptr;
  RequestStream* requests = nullptr;
  MetricsCollector* metrics = nullptr;
  LiveSink* live = nullptr;  // may be null
  bool record_timeline = false;
  bool paced = false;  // RunOptions::pace > 0
  std::vector<scheduler::ReplicaLoad> loads;
  std::vector<sg4::Mailbox*> engine_boxes;
  sg4::Mailbox* router_box = nullptr;
  // What engines may run ahead of (see Engine::Run): the arrival time of the
  // next request the clients send, and the requests sent but not yet
  // received by an engine.
  double next_arrival_s = std::numeric_limits<double>::infinity();
  int64_t in_flight = 0;
  absl::Status error;  // first internal error; stops the run
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
  scheduler::Router router(sh->sc->routing);
  std::vector<int64_t> sent(sh->engine_boxes.size(), 0);
  int64_t expected = -1, received = 0;
  while (expected < 0 || received < expected) {
    auto* msg = sh->router_box->get<Message>();
    if (msg->end) {
      expected = msg->total_sent;
      sh->messages.Delete(msg);
      continue;
    }
    ++received;
    const int r = router.Route(sh->loads);
    ++sh->loads[r].outstanding;
    ++sent[r];
    sh->engine_boxes[r]->put_init(msg, static_cast<uint64_t>(WireBytes(msg->request)))
        ->detach();
  }
  for (size_t r = 0; r < sh->engine_boxes.size(); ++r) {
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

class Engine {
 public:
  Engine(Shared* sh, int replica, std::shared_ptr<devices::Device> device,
         std::shared_ptr<devices::Device> attention)
      : sh_(sh),
        replica_(replica),
        device_(std::move(device)),
        attention_(std::move(attention)),
        observer_(sh->metrics->ObserverFor(replica)) {
    const scheduler::PlannerConfig pc =
        ReplicaPlannerConfig(*sh->sc, device_.get(), attention_.get());
    for (int64_t i = 0; i < sh->sc->ranks(); ++i) {
      ranks_.push_back(std::make_unique<Rank>(sh->sc->batching, sh->sc->model, pc));
    }
  }

  void Run() {
    sg4::Mailbox* box = sh_->engine_boxes[replica_];
    while (true) {
      while (box->ready()) Receive(box->get<Message>());
      if (Idle()) {
        if (expected_ >= 0 && done_ >= expected_) break;
        // Its next iteration starts no earlier than now.
        sh_->metrics->MarkIdle(replica_, sg4::Engine::get_clock());
        Receive(box->get<Message>());  // block until work arrives
        continue;
      }
      // Iterations run back to back without a SimGrid event while nothing
      // can reach this replica: no request is on its way and the next one
      // leaves the clients after the iteration ends. Their completions are
      // then final (no arrival can precede them) and the router reads no
      // load before the next arrival, so the result is the one a sleep per
      // iteration gives, at a fraction of the cost. The last iteration of
      // a run, the one an arrival may interrupt, sleeps in SimGrid.
      double t = sg4::Engine::get_clock();
      while (true) {
        if (sh_->Interrupted()) {
          sh_->Stop(Interruption());
          return;
        }
        if (t > kMaxSimulatedSeconds) {
          sh_->Stop(
              PastTimeLimit(t, absl::StrCat("replica ", replica_, " starts an iteration").c_str()));
          return;
        }
        auto duration = Iteration(t);
        if (!duration.ok()) {
          Stop(duration.status());
          return;
        }
        const double end = t + *duration;
        if (!FastForward() || !(end < sh_->next_arrival_s) || sh_->in_flight > 0) {
          sg4::this_actor::sleep_until(end);
          CompleteAt(sg4::Engine::get_clock());
          break;
        }
        CompleteAt(end);
        t = end;
        if (Idle()) {
          sg4::this_actor::sleep_until(t);
          break;
        }
      }
    }
    int64_t hit = 0, query = 0;
    for (const auto& r : ranks_) {
      hit += r->scheduler.prefix_hit_tokens();
      query += r->scheduler.prefix_query_tokens();
    }
    sh_->metrics->AddPrefixCache(hit, query);
    sh_->metrics->MarkDone(replica_);
  }

 private:
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
  };

  bool Idle() const {
    for (const auto& r : ranks_) {
      if (!r->scheduler.Idle()) return false;
    }
    return true;
  }

  // Without a live sink or pacing, whose observers watch the clock.
  bool FastForward() const { return sh_->live == nullptr && !sh_->paced; }

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
    if (sh_->sc->tbt_slo_s > 0) {
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
    const bool lockstep = sh_->sc->data_parallel > 1;
    const bool pipeline = sh_->sc->pipeline_parallel > 1;
    const int64_t graph_max = sh_->sc->cuda_graph_max_tokens;
    if (lockstep && graph_max > 0 && most_tokens <= graph_max) {
      group_tokens =
          static_cast<int64_t>(ranks_.size()) * std::min(graph_max, CapturedTokens(most_tokens));
    }
    if (lead == nullptr) {
      return absl::InternalError(absl::StrCat(
          "replica ", replica_, ": work queued but nothing schedulable at t=", start));
    }
    IterationRecord it;
    it.replica = replica_;
    it.start_s = start;
    it.bound = lead->batch->bound;
    it.batch_cap = batch_cap_;
    double time_s = 0, xpu_busy_s = 0, device_busy_s = 0;
    double pipe_bytes = 0;  // hidden states between pipeline stages
    cost_ = scheduler::IterationCost{};
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
        ASSIGN_OR_RETURN(r->cost, r->planner.Plan(*r->batch));
        it.batch_size += static_cast<int32_t>(r->batch->entries.size());
        it.prefill_tokens += r->batch->prefill_tokens;
        it.decode_tokens += r->batch->decode_tokens;
        if (pipeline) {
          steps_.push_back(scheduler::StepOf(sh_->sc->pipeline, r->cost,
                                             r->batch->prefill_tokens + r->batch->decode_tokens));
          pipe_bytes += static_cast<double>(sh_->sc->pipeline_parallel - 1) *
                        scheduler::StageTransferBytes(
                            sh_->sc->pipeline, r->batch->prefill_tokens + r->batch->decode_tokens);
        }
      } else {
        ASSIGN_OR_RETURN(r->cost, r->planner.PlanIdleRank(group_tokens));
        idle = &r->cost;
      }
      it.kv_blocks_used += r->scheduler.kv().used();
      it.waiting += r->scheduler.num_waiting();
      time_s = std::max(time_s, r->cost.time_s);
      xpu_busy_s = std::max(xpu_busy_s, r->cost.xpu_busy_s);
      device_busy_s = std::max(device_busy_s, r->cost.device_busy_s);
      if (!lockstep && !pipeline) {
        cost_ = r->cost;
      } else {
        cost_.total += r->cost.total;
        cost_.device_total += r->cost.device_total;
      }
    }
    if (pipeline) {
      // The in-flight batches' steady-state cycle (scheduler/pipeline.h);
      // the busiest stage's xPUs are busy for its share.
      const scheduler::PipelineCycle cycle =
          scheduler::SteadyCycle(steps_, sh_->sc->pipeline_parallel);
      time_s = cycle.time_s;
      xpu_busy_s = cycle.busiest_stage_s;
      cost_.total.link_bytes += pipe_bytes;
      cost_.total.link_energy_pj += pipe_bytes * sh_->sc->pipeline.link_energy_pj_per_byte;
    }
    if (lockstep || pipeline) {
      cost_.time_s = time_s;
      cost_.total.time_s = time_s;
      cost_.xpu_busy_s = xpu_busy_s;
      cost_.device_busy_s = device_busy_s;
    }
    const scheduler::IterationCost* cost = &cost_;
    // The engine's host time per step that does not overlap the xPUs.
    const double duration = cost->time_s + sh_->sc->step_overhead_s;
    it.duration_s = duration;
    it.energy_j = cost->total.energy_pj() * 1e-12;
    it.xpu_busy_s = cost->xpu_busy_s;
    it.device_busy_s = cost->device_busy_s;
    sh_->metrics->AddIteration(it);
    sh_->metrics->AddEnergy(cost->total, cost->device_total);
    RETURN_IF_ERROR(SampleTimeline(*lead, it));
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
      }
      li.xpu_busy_s = cost->xpu_busy_s;
      li.device_busy_s = cost->device_busy_s;
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

  // Forwards to the metrics observer and counts finishes.
  class Counting : public scheduler::RequestObserver {
   public:
    explicit Counting(Engine* e) : e_(e) {}
    void OnToken(const scheduler::RequestState& r, double t, double gap) override {
      e_->observer_->OnToken(r, t, gap);
      if (LiveSink* live = e_->sh_->live) {
        if (gap < 0) {
          live->OnFirstToken(e_->replica_, t - r.spec.arrival_s);
        } else {
          live->OnToken(e_->replica_, gap);
        }
      }
    }
    void OnFinish(const scheduler::RequestState& r, double t) override {
      ++e_->finished_;
      --e_->sh_->loads[e_->replica_].outstanding;
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

  void Receive(Message* msg) {
    if (msg->end) {
      expected_ = msg->total_sent;
    } else {
      --sh_->in_flight;
      const int64_t before = finished_;
      if (sh_->live != nullptr) sh_->live->OnArrival(replica_);
      PickRank().scheduler.Add(msg->request, sg4::Engine::get_clock(), &counting_);
      done_ += finished_ - before;
    }
    sh_->messages.Delete(msg);
    UpdateLoad();
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
  // bucket (rounded up, so the cap is never too generous). Data-parallel
  // ranks share the first rank's cap.
  absl::StatusOr<int64_t> SloCap() {
    const int64_t ctx = ranks_[0]->scheduler.MeanContextTokens();
    const int64_t bucket = (ctx + 63) / 64;
    auto it = slo_caps_.find(bucket);
    if (it == slo_caps_.end()) {
      ASSIGN_OR_RETURN(int64_t cap,
                       scheduler::MaxBatchWithinSlo(ranks_[0]->planner, sh_->sc->tbt_slo_s,
                                                    std::max<int64_t>(1, bucket * 64),
                                                    sh_->sc->batching.max_batch_size));
      it = slo_caps_.emplace(bucket, cap).first;
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
    RETURN_IF_ERROR(rank.planner.Plan(*rank.batch, &t.spans).status());
    sh_->metrics->AddTimeline(std::move(t));
    return absl::OkStatus();
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
  int replica_;
  std::shared_ptr<devices::Device> device_;
  std::shared_ptr<devices::Device> attention_;
  scheduler::RequestObserver* observer_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  Counting counting_{this};
  int64_t iteration_index_ = 0;
  int64_t timeline_samples_ = 0;
  int64_t expected_ = -1;  // requests the router sent; known at the end
  int64_t finished_ = 0;   // finished or rejected
  int64_t done_ = 0;
  int64_t batch_cap_ = 0;
  absl::flat_hash_map<int64_t, int64_t> slo_caps_;
  scheduler::IterationCost cost_;  // the current iteration's
  std::vector<scheduler::PipelineStep> steps_;  // its in-flight batches' stages
};

void BuildPlatform(const ResolvedScenario& sc, sg4::NetZone** zone_out,
                   std::vector<sg4::Host*>* engine_hosts,
                   sg4::Host** clients,
                   sg4::Host** router) {
  const auto& c = sc.proto.cluster();
  auto* zone = sg4::create_full_zone("cluster");
  *clients = zone->create_host("clients", 1e9);
  *router = zone->create_host("router", 1e9);
  auto make_link = [&](const std::string& name, const servesim::v1::LinkSpec& l) {
    return zone->create_link(name, l.bandwidth_bytes_per_s())
        ->set_latency(l.latency_s())
        ->seal();
  };
  auto* in = make_link("frontend.in", c.frontend());
  zone->add_route((*clients)->get_netpoint(), (*router)->get_netpoint(), nullptr, nullptr,
                  {sg4::LinkInRoute(in)}, true);
  for (int64_t r = 0; r < sc.replicas; ++r) {
    std::vector<sg4::Host*> xpus;
    std::vector<sg4::Link*> links;
    for (int64_t j = 0; j < sc.tensor_parallel; ++j) {
      xpus.push_back(zone->create_host(absl::StrCat("r", r, ".xpu", j),
                                       c.xpu().peak_flops_fp16()));
      links.push_back(make_link(absl::StrCat("r", r, ".xpu", j, ".link"), c.interconnect()));
    }
    auto* fe = make_link(absl::StrCat("r", r, ".frontend"), c.frontend());
    zone->add_route((*router)->get_netpoint(), xpus[0]->get_netpoint(), nullptr, nullptr,
                    {sg4::LinkInRoute(fe)}, true);
    for (int64_t j = 1; j < sc.tensor_parallel; ++j) {
      zone->add_route(xpus[0]->get_netpoint(), xpus[j]->get_netpoint(), nullptr, nullptr,
                      {sg4::LinkInRoute(links[0]), sg4::LinkInRoute(links[j])}, true);
    }
    engine_hosts->push_back(xpus[0]);
  }
  zone->seal();
  *zone_out = zone;
}

}  // namespace

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

  RunResult result;
  MetricsOptions metrics_options;
  const auto& output = sc.proto.output();
  if (output.has_exact_percentile_max_samples()) {
    metrics_options.exact_percentile_max_samples = output.exact_percentile_max_samples();
  }
  metrics_options.ttft_slo_s = sc.ttft_slo_s;
  metrics_options.tpot_slo_s = sc.tpot_slo_s;
  metrics_options.kv_capacity_blocks = sc.kv.blocks * sc.ranks();
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
  sh.paced = options.pace > 0;
  sh.interrupt = options.interrupt;
  sh.loads.assign(sc.replicas, scheduler::ReplicaLoad{});
  for (auto& l : sh.loads) l.kv_blocks_capacity = sc.kv.blocks * sc.ranks();

  sg4::NetZone* zone = nullptr;
  std::vector<sg4::Host*> engine_hosts;
  sg4::Host *clients = nullptr, *router = nullptr;
  BuildPlatform(sc, &zone, &engine_hosts, &clients, &router);

  std::vector<std::unique_ptr<Engine>> engines;
  for (int64_t r = 0; r < sc.replicas; ++r) {
    std::shared_ptr<devices::Device> device = sc.xpu_agent;
    if (device == nullptr) {
      ASSIGN_OR_RETURN(device, devices::CreateDevice(sc.xpu_device));
    }
    std::shared_ptr<devices::Device> attention =
        sc.attention_shared != nullptr ? sc.attention_shared : sc.attention_agent;
    if (sc.has_attention_device && attention == nullptr) {
      ASSIGN_OR_RETURN(attention, scenario::CreateAttentionDevice(sc));
    }
    engines.push_back(std::make_unique<Engine>(&sh, static_cast<int>(r), std::move(device),
                                               std::move(attention)));
    sh.engine_boxes.push_back(sg4::Mailbox::by_name(absl::StrCat("engine", r)));
  }
  sh.router_box = sg4::Mailbox::by_name("router");

  // Permanent receivers: hand-offs complete without waiting for the
  // receiver to call get(), so a busy engine finds them queued.
  auto router_actor = sg4::Actor::create("router", router, RouterActor, &sh);
  sh.router_box->set_receiver(router_actor);
  for (int64_t r = 0; r < sc.replicas; ++r) {
    Engine* e = engines[r].get();
    auto actor = sg4::Actor::create(absl::StrCat("engine", r), engine_hosts[r],
                                    [e]() { e->Run(); });
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
  result.metrics->SetArrivalFloor([&sh] {
    return sh.in_flight > 0 ? sg4::Engine::get_clock() : sh.next_arrival_s;
  });
  engine.run();
  result.metrics->SetArrivalFloor(nullptr);
  result.metrics->Finish();
  if (!sh.error.ok()) {
    if (options.partial != nullptr) {
      options.partial->metrics = std::move(result.metrics);
      options.partial->simulated_s = sg4::Engine::get_clock();
    }
    return sh.error;
  }
  result.simulated_s = sg4::Engine::get_clock();
  if (options.live != nullptr) options.live->OnDone(result.simulated_s, wall_s());
  return result;
}

}  // namespace servesim::cluster
