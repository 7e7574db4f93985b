// The cluster simulation on SimGrid S4U.
//
// Platform (built in C++ from the scenario): a `clients` host, a `router`
// host and one host per xPU (`r<i>.xpu<j>`, speed = peak FP16 FLOP/s). The
// clients reach the router over the `frontend.in` link; the router reaches
// each replica's first xPU over its own `r<i>.frontend` link (both of the
// cluster.frontend link class); each xPU has an `r<i>.xpu<j>.link` of the
// interconnect class to its replica's switch.
//
// Actors (few and long-lived: SimGrid handles ~100k messages per wall second,
// ~10 KiB per actor):
//  - source (on clients): pulls each request from the workload's
//    RequestStream (workload/workload.h; the trace is read as the run goes),
//    sleeps until its arrival and sends it to the router; its size on the
//    wire is 4 bytes per prompt token.
//  - router: routes each request (scheduler/router.h) and forwards it over
//    the replica's front-end link; at the end tells every engine how many
//    requests it was sent.
//  - one engine per replica (on r<i>.xpu0): takes the requests that have
//    arrived, asks its ReplicaScheduler for a batch, costs it with the
//    IterationPlanner on its Device, and applies it at the step's end.
//    Colocated and decode engines advance lazily: an engine's state stands
//    at a time of its own and is brought forward in plain calls by whoever
//    reads it (the router, before it reads the loads; a prefill engine,
//    before it picks a decode replica) and as its messages land, so its
//    actor waits in SimGrid only for messages (docs/design.md). Engines
//    whose steps make SimGrid calls (collectives or store loads as flows,
//    asynchronous tier loads), watched ones (--metrics, --pace) and
//    prefill engines sleep through their steps in SimGrid instead.
// A disaggregated cluster (cluster.disaggregation; docs/disaggregation.md)
// numbers the prefill pool's replicas first. The router sends arrivals to
// them; a prefill engine hands each prompt's KV to a decode engine as
// SimGrid flows from its host over `r<i>.nic` (the replica's NICs as one
// link), the `rack<k>.uplink`s between racks and the decode replica's
// NIC, and ends with a count to every decode engine. A decode engine's
// mailbox has its own receiver actor (`engine<i>.kv`), which stamps each
// message as it lands, so a transfer ends when the network says, not when
// the engine's step does, and brings a lazy engine forward to that time.
// Prefill engines run every step as a SimGrid sleep.
// Collectives inside a replica are costed by the device model per layer
// (hundreds per iteration) rather than sent as SimGrid messages: at ~100k
// messages per wall second, per-layer messages would make an hour-long
// trace take minutes. The links are in the platform for the transfers that
// happen once per request or iteration.
//
// Where each part lives: cluster/platform.h builds the platform,
// cluster/actors.h holds the source and the router, cluster/engine.h the
// replicas' engines and the parts they compose (power, KV transfer, flows
// on the fabric, hints to remote devices); those headers are internal.
//
// SimGrid allows one Engine per process, so RunSimulation may be called
// once per process.
#ifndef SERVESIM_CLUSTER_SIMULATION_H_
#define SERVESIM_CLUSTER_SIMULATION_H_

#include <atomic>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "metrics/collector.h"
#include "metrics/live_sink.h"
#include "scenario/scenario.h"
#include "workload/workload.h"

namespace servesim::cluster {

struct RunResult {
  std::unique_ptr<metrics::MetricsCollector> metrics;
  double simulated_s = 0;  // SimGrid clock at the end
  // The times the replicas' engines (and decode replicas' receivers)
  // blocked in SimGrid: for a message, a step's end, a flow. The run's
  // event cost, not a result: it depends on how engines advance (lazily or
  // a SimGrid event per step) and not on what they compute.
  int64_t engine_waits = 0;
  // What the engines told remote devices of the batches they expect
  // (devices::Device::Expect): projections made because a batch was not
  // the one projected (a request arrived), renewals of projections about
  // to run out, and renewals made early to go in the same message as
  // another rank's projection. Zero where no device takes hints. Not a
  // result: hints never change one.
  struct Hints {
    int64_t projections = 0, renewals = 0, renewals_alongside = 0;
  };
  Hints hints;
  // workload.max_in_flight: the requests the clients held back because
  // that many were in flight, and how long (their latencies count from
  // when they were sent).
  struct Held {
    int64_t requests = 0;
    double total_s = 0, max_s = 0;
  };
  Held held;
};

// How a run is watched; none of it changes results.
struct RunOptions {
  std::vector<std::string> simgrid_args;  // extra --cfg=... / --log=...
  metrics::LiveSink* live = nullptr;      // borrowed; may be null
  // > 0: at most `pace` simulated seconds per wall second. The driver
  // (never an actor) sleeps between SimGrid time steps to keep the pace.
  double pace = 0;
  // Sample iterations for timeline.json (output.timeline_*): only when the
  // outputs will be written.
  bool record_timeline = false;
  // When the run fails after it started (e.g. no device agent left): the
  // metrics measured until then, for partial outputs. May be null.
  struct RunResult* partial = nullptr;
  // Where requests and iterations go as they become final (requests.csv,
  // iterations.csv); borrowed, may be null. Keep report.html's series.
  metrics::RecordSink* sink = nullptr;
  bool time_series = false;
  // Set (non-zero) from outside, e.g. by a signal handler: the run stops at
  // its next step, as a failed one does (CANCELLED, with `partial` filled).
  // Borrowed; may be null.
  const std::atomic<int>* interrupt = nullptr;
};

// Runs the requests `requests` yields (pulled as the run goes). A stream
// error (a bad trace row) stops the run like a failed iteration does, and
// so does simulated time passing kMaxSimulatedSeconds (common/sim_time.h;
// OUT_OF_RANGE). SimGrid's own Ctrl-C handler (a dump of every actor) is
// not kept: the caller's SIGINT handling stays in force.
absl::StatusOr<RunResult> RunSimulation(const scenario::ResolvedScenario& scenario,
                                        workload::RequestStream& requests,
                                        const RunOptions& options);
// Loads the scenario's platform file (cluster.disaggregation.fabric.
// platform_file) into a SimGrid engine of its own and checks it as a run
// would: it parses, every replica's host is there, and every prefill-to-
// decode route exists with bandwidth on each link. For `servesim validate`
// (SimGrid allows one engine per process: not in one that runs). Returns
// a line saying what it found; empty without a platform file.
absl::StatusOr<std::string> CheckPlatformFile(const scenario::ResolvedScenario& scenario);

// The same over a materialised workload.
absl::StatusOr<RunResult> RunSimulation(const scenario::ResolvedScenario& scenario,
                                        const workload::Workload& workload,
                                        const RunOptions& options);

}  // namespace servesim::cluster

#endif  // SERVESIM_CLUSTER_SIMULATION_H_
