// RunSimulation: sets up SimGrid, the platform, the engines and the
// actors, runs them, and collects what they measured. The parts live in
// their own files: cluster/platform.h (hosts, links, routes),
// cluster/actors.h (clients and router), cluster/engine.h (a replica's
// engine and the parts it composes), cluster/run_state.h (what they share).
#include "cluster/simulation.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <simgrid/s4u.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cluster/actors.h"
#include "cluster/engine.h"
#include "cluster/platform.h"
#include "cluster/run_state.h"
#include "common/status_macros.h"
#include "devices/registry.h"

namespace sg4 = simgrid::s4u;

namespace servesim::cluster {
namespace {

using metrics::MetricsCollector;
using metrics::MetricsOptions;
using scenario::ResolvedScenario;
using workload::RequestStream;

// KV flows take latency + bytes / bandwidth, links shared max-min fair
// (CM02), with no TCP window bound and no reverse-path traffic: RDMA over
// InfiniBand or RoCE, not SimGrid's TCP-calibrated default. Flags the
// command line set stay.
void UseRdmaNetworkModel(const RunOptions& options) {
  for (const char* cfg : {"network/model:CM02", "network/TCP-gamma:0", "network/crosstraffic:0"}) {
    const std::string key = std::string(cfg).substr(0, std::string(cfg).find(':'));
    bool given = false;
    for (const std::string& a : options.simgrid_args) given |= a.find(key) != std::string::npos;
    if (!given) sg4::Engine::set_config(cfg);
  }
}

MetricsOptions MetricsOptionsFor(const ResolvedScenario& sc, const RunOptions& options) {
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
  return metrics_options;
}

void InitRunState(const ResolvedScenario& sc, RequestStream& requests, const RunOptions& options,
                  MetricsCollector* metrics, RunState* sh) {
  sh->sc = &sc;
  sh->requests = &requests;
  sh->metrics = metrics;
  sh->live = options.live;
  sh->record_timeline = options.record_timeline;
  sh->fabric.link_bin_s = sc.proto.output().link_bin_s();
  sh->paced = options.pace > 0;
  sh->interrupt = options.interrupt;
  sh->loads.assign(sc.replicas, scheduler::ReplicaLoad{});
  for (int64_t r = 0; r < sc.replicas; ++r) {
    const ResolvedScenario& pool = PoolOf(sc, r);
    sh->loads[r].kv_blocks_capacity = pool.kv.blocks * pool.ranks();
  }
  if (sc.disaggregated()) {
    sh->prefill_replicas = sc.prefill_pool->replicas;
    sh->fabric.prefill_replicas = sh->prefill_replicas;
    sh->prefill_busy_until.assign(static_cast<size_t>(sh->prefill_replicas), -1.0);
    sh->kv_in_flight_to.assign(static_cast<size_t>(sc.replicas), 0);
    sh->decode_router = std::make_unique<scheduler::Router>(sc.decode_pool->routing);
  }
}

// The live metrics' list of links: each split-duplex link as two.
void AnnounceLinks(RunState* sh) {
  if (sh->live == nullptr || sh->fabric.links.empty()) return;
  std::vector<std::pair<std::string, double>> live_links;
  for (const metrics::LinkLoad& l : sh->fabric.links) {
    sh->fabric.live_link.push_back(static_cast<int>(live_links.size()));
    if (l.split_duplex) {
      live_links.emplace_back(l.name + ".up", l.bandwidth_bytes_per_s);
      live_links.emplace_back(l.name + ".down", l.bandwidth_bytes_per_s);
    } else {
      live_links.emplace_back(l.name, l.bandwidth_bytes_per_s);
    }
  }
  sh->live->OnLinks(live_links);
}

// One engine per replica, with its devices (in process, or the pool's
// agents) and its pool's cluster KV store; one mailbox each.
absl::Status CreateEngines(const ResolvedScenario& sc, RunState* sh,
                           std::vector<std::unique_ptr<Engine>>* engines) {
  std::map<const ResolvedScenario*, std::shared_ptr<scheduler::BlockLru>> stores;
  for (int64_t r = 0; r < sc.replicas; ++r) {
    const ResolvedScenario& pool = PoolOf(sc, r);
    const Role role = !sc.disaggregated()        ? Role::kColocated
                      : r < sh->prefill_replicas ? Role::kPrefill
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
    engines->push_back(std::make_unique<Engine>(sh, &pool, role, static_cast<int>(r),
                                                std::move(device), std::move(attention), store));
    sh->engine_boxes.push_back(sg4::Mailbox::by_name(absl::StrCat("engine", r)));
  }
  return absl::OkStatus();
}

// The lazy engines' steps that end before t, in the order they end (ties
// in engine order): engines are independent between arrivals and the
// collector orders what they record, so the result is the one engine
// after engine gives. But a step that tells remote devices what the next
// ones will ask (a prefill changing the batch: DeviceHints::Anticipate) is
// followed by the other engines' steps that end before it does, which run
// while the agent answers, instead of by its own next step, which would
// wait for the answer.
std::function<bool(double)> AdvanceInEndOrder(std::vector<Engine*> lazy) {
  return [lazy, due = std::vector<std::pair<double, size_t>>()](double t) mutable {
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

// The actors: the router, one engine per replica (and a receiver per
// decode replica), the clients. Permanent receivers: hand-offs complete
// without waiting for the receiver to call get(), so a busy engine finds
// them queued.
void StartActors(const ResolvedScenario& sc, RunState* sh,
                 const std::vector<std::unique_ptr<Engine>>& engines, const PlatformHosts& hosts) {
  auto router_actor = sg4::Actor::create("router", hosts.router, RouterActor, sh);
  sh->router_box->set_receiver(router_actor);
  for (int64_t r = 0; r < sc.replicas; ++r) {
    Engine* e = engines[r].get();
    auto actor =
        sg4::Actor::create(absl::StrCat("engine", r), hosts.engines[r], [e]() { e->Run(); });
    if (r >= sh->prefill_replicas && sh->prefill_replicas > 0) {
      // A decode replica's messages land at its receiver (Engine::Land).
      actor = sg4::Actor::create(absl::StrCat("engine", r, ".kv"), sh->fabric.receiver_hosts[r],
                                 [e]() { e->Receiver(); });
    }
    sh->engine_boxes[r]->set_receiver(actor);
  }
  sg4::Actor::create("source", hosts.clients, Source, sh);
}

// Watching the run: the driver, not an actor, reads the wall clock here,
// between SimGrid time steps; nothing it does feeds back into the run.
void WatchTheClock(const RunOptions& options,
                   const std::chrono::steady_clock::time_point& wall_start,
                   const std::function<double()>& wall_s) {
  if (!(options.pace > 0) && options.live == nullptr) return;
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

}  // namespace

absl::StatusOr<RunResult> RunSimulation(const ResolvedScenario& sc,
                                        const workload::Workload& workload,
                                        const RunOptions& options) {
  std::unique_ptr<RequestStream> stream = workload::StreamOf(workload);
  return RunSimulation(sc, *stream, options);
}

absl::StatusOr<RunResult> RunSimulation(const ResolvedScenario& sc, RequestStream& requests,
                                        const RunOptions& options) {
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
    return absl::InvalidArgumentError(absl::StrCat("unrecognised SimGrid argument: ", argv[1]));
  }
  if (sc.disaggregated() || HasClusterStore(sc)) UseRdmaNetworkModel(options);

  RunResult result;
  result.metrics = std::make_unique<MetricsCollector>(MetricsOptionsFor(sc, options));
  RunState sh;
  InitRunState(sc, requests, options, result.metrics.get(), &sh);
  if (const int64_t cap = sc.proto.workload().max_in_flight(); cap > 0) {
    sh.max_in_flight = cap;
    sh.client_mutex = sg4::Mutex::create();
    sh.client_cv = sg4::ConditionVariable::create();
  }

  std::vector<std::unique_ptr<Engine>> engines;
  sh.cached_blocks = [&engines](int r, const scheduler::RequestSpec& spec) {
    return engines[static_cast<size_t>(r)]->CachedPrefixBlocks(spec);
  };
  std::optional<FilePlatform> file;
  if (!sc.platform_file.empty()) {
    ASSIGN_OR_RETURN(file, LoadPlatformFile(sc, engine));
  }
  const PlatformHosts hosts = BuildPlatform(sc, file ? &*file : nullptr, &sh.fabric);
  AnnounceLinks(&sh);
  RETURN_IF_ERROR(CreateEngines(sc, &sh, &engines));
  sh.router_box = sg4::Mailbox::by_name("router");
  std::vector<Engine*> lazy;
  for (const auto& e : engines) {
    if (e->lazy()) lazy.push_back(e.get());
  }
  if (!lazy.empty()) sh.advance = AdvanceInEndOrder(std::move(lazy));
  // The replicas share their pool's remote devices, so one engine's hints
  // serve them all.
  if (!engines.empty() && engines[0]->HintsArrivals()) {
    Engine* first = engines[0].get();
    sh.hint_arrival = [first](const scheduler::RequestSpec& r) { first->HintArrival(r); };
  }
  StartActors(sc, &sh, engines, hosts);

  const auto wall_start = std::chrono::steady_clock::now();
  const std::function<double()> wall_s = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  };
  WatchTheClock(options, wall_start, wall_s);
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
  result.metrics->SetLinkLoads(std::move(sh.fabric.links), sh.fabric.link_bin_s);
  result.metrics->Finish();
  if (!sh.error.ok()) {
    if (options.partial != nullptr) {
      options.partial->metrics = std::move(result.metrics);
      options.partial->simulated_s = sg4::Engine::get_clock();
      options.partial->engine_waits = sh.engine_waits;
      options.partial->hints = sh.hints;
      options.partial->held = sh.held;
    }
    return sh.error;
  }
  result.simulated_s = sg4::Engine::get_clock();
  result.engine_waits = sh.engine_waits;
  result.hints = sh.hints;
  result.held = sh.held;
  if (options.live != nullptr) options.live->OnDone(result.simulated_s, wall_s());
  return result;
}

}  // namespace servesim::cluster
