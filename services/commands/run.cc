// `servesim run SCENARIO`: simulate, print the summary table, write the
// outputs (reports/), optionally serving live metrics while it runs.
//
// RunWithFlags sets the run up (SimGrid's arguments, live metrics, the
// progress line, the output folder, the stop signals, the CSV writer),
// runs it, then either writes a stopped run's partial outputs
// (FinishStoppedRun) or prints the table and writes the outputs.
#include "services/commands/run.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agents/logging.h"
#include "agents/remote_device.h"
#include "cluster/simulation.h"
#include "common/status_macros.h"
#include "devices/collectives.h"
#include "devices/registry.h"
#include "metrics/collector.h"
#include "reports/csv_writer.h"
#include "reports/outputs.h"
#include "reports/summary.h"
#include "services/commands/commands.h"
#include "services/commands/scenario_args.h"
#include "services/commands/stop_signals.h"
#include "services/http_server.h"
#include "services/live_metrics.h"
#include "services/progress.h"

namespace servesim::services {
namespace {

// Call counts of the run's device agents, for run_info.json.
std::string AgentsJson(const scenario::ResolvedScenario& sc) {
  if (sc.remote_devices.empty()) return "";
  std::vector<std::string> items;
  for (const agents::RemoteDevice* d : sc.remote_devices) {
    const agents::RemoteStats s = d->Stats();
    std::vector<std::string> eps;
    for (const std::string& e : s.endpoints) eps.push_back(reports::JsonString(e));
    items.push_back(absl::StrFormat(
        "    {\"device\": %s, \"endpoints\": [%s], \"estimate_calls\": %d, "
        "\"estimate_rpcs\": %d, \"memo_hits\": %d, \"memo_misses\": %d, "
        "\"memo_hit_rate\": %.6f, \"predicted_ops\": %d, \"prefetch_rpcs\": %d, "
        "\"prefetch_failures\": %d, \"other_rpcs\": %d, "
        "\"retries\": %d, \"failovers\": %d, "
        "\"rebinds\": %d, \"session_rebuilds\": %d, \"measure_rpcs\": %d, "
        "\"measured_steps\": [%s], \"ahead_rpcs\": %d, \"ahead_failures\": %d, "
        "\"expected_ops\": %d, \"expected_hits\": %d, "
        "\"expect_waits\": %d, \"prepare_rpcs\": %d, \"prepared_ops\": %d}",
        reports::JsonString(d->label()), absl::StrJoin(eps, ", "), s.estimate_calls,
        s.estimate_rpcs, s.ops_memo_hits, s.ops_memo_misses,
        s.ops_memo_hits + s.ops_memo_misses > 0
            ? double(s.ops_memo_hits) / double(s.ops_memo_hits + s.ops_memo_misses)
            : 0.0,
        s.predicted_ops, s.prefetch_rpcs, s.prefetch_failures, s.other_rpcs, s.retries, s.failovers,
        s.rebinds, s.session_rebuilds, s.measure_rpcs, absl::StrJoin(s.measured_steps, ", "),
        s.ahead_rpcs, s.ahead_failures, s.expected_ops, s.expected_hits, s.expect_waits,
        s.prepare_rpcs, s.prepared_ops));
  }
  return absl::StrCat("[\n", absl::StrJoin(items, ",\n"), "\n  ]");
}

// What the engines told remote devices, for run_info.json.
void SetHints(const cluster::RunResult::Hints& h, reports::RunInfo* info) {
  info->hint_projections = h.projections;
  info->hint_renewals = h.renewals;
  info->hint_renewals_alongside = h.renewals_alongside;
}

// The requests the clients held back under workload.max_in_flight, for
// run_info.json.
std::string ClientJson(const scenario::ResolvedScenario& sc, const cluster::RunResult::Held& h) {
  const int64_t cap = sc.proto.workload().max_in_flight();
  if (cap == 0) return "";
  return absl::StrCat(
      "{\"max_in_flight\": ", cap, ", \"held_requests\": ", h.requests, ", \"held_mean_s\": ",
      reports::FormatFigure(h.requests > 0 ? h.total_s / static_cast<double>(h.requests) : 0),
      ", \"held_max_s\": ", reports::FormatFigure(h.max_s), "}");
}

// The measured collectives' answers during this run, for run_info.json
// (in process; an agent's are counted in its own).
std::string CollectivesJson(const scenario::ResolvedScenario& sc,
                            const devices::CollectiveCounts& before) {
  if (!sc.xpu_device.has_gpu()) return "";
  const auto& c = sc.xpu_device.gpu().collectives();
  if (c.curves().empty() && sc.xpu_device.gpu().internode_collectives().curves().empty()) return "";
  const devices::CollectiveCounts now = devices::CollectiveTable::ProcessCounts();
  return absl::StrFormat(
      "{\"preset\": %s, \"peer_to_peer\": %s, \"custom_all_reduce\": %s, \"measured\": %d, "
      "\"below_smallest\": %d, \"above_largest\": %d, \"other_gpu_count\": %d}",
      reports::JsonString(c.preset()), c.peer_to_peer() ? "true" : "false",
      c.custom_all_reduce() ? "true" : "false", now.measured - before.measured,
      now.below_smallest - before.below_smallest, now.above_largest - before.above_largest,
      now.other_gpu_count - before.other_gpu_count);
}

// Where each class of the xPU's ops takes its time from, for run_info.json
// ("op_costs"): the profile bundle (ops it has no layer for fall back to
// the roofline, counted in "profile"'s missing_layer), the roofline with
// caps `servesim calibrate` fitted to measured kernels (the xPU preset's
// roofline entries), or the roofline with the datasheet-level default
// caps; collectives from measured tables or the ring model.
std::string OpCostsJson(const scenario::ResolvedScenario& sc) {
  if (!sc.xpu_device.has_gpu()) return "";
  const auto& gpu = sc.xpu_device.gpu();
  const auto& x = gpu.xpu();
  const auto roofline = [&x](absl::string_view cls) {
    for (const auto& c : x.roofline()) {
      if (c.op_class() == cls) {
        return absl::StrFormat(
            "roofline, caps fitted to measured kernels (compute %.3g, memory %.3g, %.3g us per "
            "kernel)",
            c.compute_utilization(), c.memory_utilization(), c.kernel_overhead_s() * 1e6);
      }
    }
    return absl::StrFormat("roofline, default caps (compute %.3g, memory %.3g, %.3g us per kernel)",
                           x.compute_utilization(), x.memory_utilization(),
                           x.kernel_overhead_s() * 1e6);
  };
  const bool profiled = sc.profile != nullptr;
  std::vector<std::string> items;
  for (const char* cls : {"gemm", "attention", "norm", "activation", "embedding"}) {
    items.push_back(absl::StrCat(reports::JsonString(cls), ": ",
                                 reports::JsonString(profiled ? "profile" : roofline(cls))));
  }
  if (sc.model.moe()) {
    items.push_back(absl::StrCat(
        "\"moe\": ",
        reports::JsonString(profiled && sc.profile->has_moe()
                                ? "profile (moe.csv)"
                                : "roofline of the grouped GEMMs, " + roofline("gemm"))));
  }
  if (sc.xpus_per_replica() > 1) {
    const auto& c = gpu.collectives();
    items.push_back(absl::StrCat(
        "\"collectives\": ",
        reports::JsonString(
            c.curves().empty()
                ? absl::StrCat("ring model over ", gpu.interconnect().preset().empty()
                                                       ? std::string("the scenario's link")
                                                       : gpu.interconnect().preset())
                : absl::StrCat("measured tables (", c.preset(), ")"))));
  }
  return absl::StrCat("{", absl::StrJoin(items, ", "), "}");
}

// The profile bundle's lookups during this run, for run_info.json (an
// agent's lookups are counted in its own process).
std::string ProfileJson(const scenario::ResolvedScenario& sc,
                        const devices::GpuProfile::Counts& before) {
  if (sc.profile == nullptr) return "";
  const devices::GpuProfile::Counts now = sc.profile->counts();
  const int64_t lookups = now.lookups - before.lookups;
  const int64_t beyond = now.beyond_grid - before.beyond_grid;
  return absl::StrFormat(
      "{\"dir\": %s, \"fingerprint\": %s, \"lookups\": %d, \"beyond_grid\": %d, "
      "\"beyond_grid_fraction\": %.6f, \"missing_layer\": %d, \"counted_in\": %s}",
      reports::JsonString(sc.profile->dir()), reports::JsonString(sc.profile->fingerprint()),
      lookups, beyond, lookups > 0 ? double(beyond) / double(lookups) : 0.0,
      now.missing_layer - before.missing_layer,
      reports::JsonString(sc.xpu_endpoints.empty() ? "this process" : "the xPU agents"));
}

// Below this many completed requests a warning says how little the
// percentiles rest on: with fewer than 10 samples, p90 and p99 both lie
// between the two largest.
constexpr int64_t kFewRequests = 10;

// The SimGrid arguments: the log level, SERVESIM_SIMGRID_ARGS, then the
// command line's --cfg and --log.
std::vector<std::string> SimGridArgs(const RunFlags& o) {
  std::vector<std::string> simgrid_args;
  // SERVESIM_SIMGRID_ARGS: SimGrid options for every run, before the
  // command line's (the sanitizer suite sets --cfg=contexts/factory:thread,
  // as AddressSanitizer cannot follow SimGrid's own context switches).
  if (const char* env = std::getenv("SERVESIM_SIMGRID_ARGS"); env != nullptr) {
    for (absl::string_view a : absl::StrSplit(env, ' ', absl::SkipWhitespace())) {
      simgrid_args.emplace_back(a);
    }
  }
  simgrid_args.insert(simgrid_args.begin(), agents::SimGridLogArg(agents::ThirdPartyLogLevel()));
  simgrid_args.insert(simgrid_args.end(), o.simgrid.begin(), o.simgrid.end());
  return simgrid_args;
}

double WallSecondsSince(std::chrono::steady_clock::time_point wall_start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
}

// Live metrics and the dashboard, for --metrics: started before the run
// (kept up for --linger seconds after the outputs by the caller).
absl::Status StartLiveMetrics(const RunFlags& o, const scenario::ResolvedScenario& sc,
                              const workload::Workload& wl, std::unique_ptr<LiveMetrics>* live,
                              std::unique_ptr<HttpServer>* server_out) {
  LiveMetricsConfig mc;
  mc.scenario = sc.proto.name().empty() ? o.scenario.scenario : sc.proto.name();
  mc.replicas = static_cast<int>(sc.replicas);
  mc.xpu_kind = "gpu";
  if (sc.has_attention_device) mc.device_kind = sc.attention_kind;
  mc.trace_s = wl.last_arrival_s;
  std::error_code ec;
  if (!o.web_dir.empty() && !std::filesystem::is_directory(o.web_dir, ec)) {
    return absl::NotFoundError(absl::StrCat(
        "--web-dir ", o.web_dir,
        ": no such folder (the dashboard's files, dashboards/web in the source tree)"));
  }
  std::string token;
  if (!o.metrics_token_file.empty()) {
    ASSIGN_OR_RETURN(token, ReadTokenFile(o.metrics_token_file, "--metrics-token-file"));
  }
  *live = std::make_unique<LiveMetrics>(mc);
  auto started = HttpServer::Start(
      o.metrics, o.web_dir, [m = live->get()] { return m->Render(); }, token);
  if (!started.ok()) return started.status();
  std::unique_ptr<HttpServer>& server = *server_out;
  server = std::move(*started);
  const std::string& host = server->host();
  std::cerr << "metrics: http://" << (host.find(':') != std::string::npos ? "[" + host + "]" : host)
            << ":" << server->port() << "/"
            << (token.empty() ? "" : " (open it as .../#token=TOKEN)") << std::endl;
  if (!server->loopback() && token.empty()) {
    std::cerr << "servesim: warning: --metrics " << o.metrics
              << " listens beyond this machine: anyone who can reach it sees the run's live "
                 "metrics (no authentication); give 127.0.0.1:PORT to keep it local, or "
                 "--metrics-token-file FILE to require a token\n";
  }
  return absl::OkStatus();
}

// A run that started and then stopped (interrupted, or e.g. no device
// agent left): writes what it measured, flagged partial, then says why.
// Returns the exit status.
int FinishStoppedRun(const Scenario& loaded, const workload::Workload& wl,
                     const reports::OutputDir* dir, const absl::Status& run_status, int stopped_by,
                     const cluster::RunResult& partial, const absl::Status& csv_status,
                     std::chrono::steady_clock::time_point wall_start, bool show_progress,
                     reports::RunInfo* info_out) {
  reports::RunInfo& info = *info_out;
  const bool interrupted = stopped_by != 0 && absl::IsCancelled(run_status);
  info.partial = true;
  info.error = interrupted ? absl::StrCat("interrupted by ", SignalName(stopped_by))
                           : std::string(run_status.message());
  std::string written;
  if (partial.metrics != nullptr && dir != nullptr) {
    metrics::Summary summary = metrics::ComputeSummary(*partial.metrics);
    info.simulated_s = partial.simulated_s;
    info.engine_waits = partial.engine_waits;
    SetHints(partial.hints, &info);
    info.client_json = ClientJson(loaded.resolved, partial.held);
    info.wall_s = WallSecondsSince(wall_start);
    if (absl::Status st =
            reports::WriteOutputs(*dir, loaded.resolved, wl, *partial.metrics, summary, info);
        st.ok() && csv_status.ok()) {
      written = absl::StrCat("; partial results written to ", dir->dir(), "/");
    } else {
      written =
          absl::StrCat("; partial results not written: ", (st.ok() ? csv_status : st).message());
    }
  }
  if (show_progress) std::cerr << "\n";
  if (interrupted) {
    std::cerr << "servesim: " << info.error << " at t = " << partial.simulated_s << " s simulated"
              << written << "\n";
    return 128 + stopped_by;
  }
  if (!written.empty()) {
    std::cerr << "servesim: stopped at t = " << partial.simulated_s << " s simulated" << written
              << "\n";
  }
  // A platform file refused as the run loads it names its field's line.
  return Fail(scenario::AnnotateFieldError(loaded.loaded, run_status));
}

// The attention device's parameters in the summary: what the (shared)
// device measured, or the spec's.
void AddDeviceParameters(const scenario::ResolvedScenario& sc, metrics::Summary* summary) {
  if (sc.attention_shared != nullptr) {
    // What the (shared) device measured over the run; wall-clock figures
    // stay out of the deterministic outputs.
    for (const auto& [k, v] : sc.attention_shared->Describe().parameters) {
      if (!absl::StrContains(k, "calibration_s")) summary->device_parameters.push_back({k, v});
    }
  } else if (sc.has_attention_device) {
    // Per-replica devices (AttAcc) hold nothing measured: their parameters
    // are the spec's, described by an in-process instance (the same whether
    // the run used agents or not).
    if (auto d = devices::CreateDevice(sc.attention_device); d.ok()) {
      for (const auto& [k, v] : (*d)->Describe().parameters) {
        summary->device_parameters.push_back({k, v});
      }
    }
  }
}

// The exit status of a finished run, with a warning when it served
// nothing or too few requests for its percentiles to mean much.
int ServedExitStatus(const metrics::Summary& summary) {
  // A run that served nothing is not a result: its latencies are undefined
  // ("-" in the table, null in summary.json).
  if (summary.completed == 0) {
    std::cerr << "servesim: warning: no request was served (" << summary.requests << " arrived, "
              << summary.rejected << " rejected): the latencies are undefined; exit status 3\n";
    return kExitNothingServed;
  }
  if (summary.completed < kFewRequests) {
    std::cerr << "servesim: warning: only " << summary.completed
              << " request(s) completed: p90 and p99 both lie between the two largest "
                 "samples\n";
  }
  return 0;
}

// The files a run reads: its scenario, trace and platform files.
std::vector<std::string> InputsOf(const Scenario& s) {
  const scenario::ResolvedScenario& sc = s.resolved;
  // Relative paths are the scenario folder's, as the workload and the
  // platform read them.
  auto resolve = [&sc](const std::string& path) {
    const std::filesystem::path p(path);
    return p.is_relative() && !sc.base_dir.empty()
               ? (std::filesystem::path(sc.base_dir) / p).string()
               : path;
  };
  std::vector<std::string> inputs = {s.loaded.path};
  if (sc.proto.workload().has_trace())
    inputs.push_back(resolve(sc.proto.workload().trace().path()));
  const std::string& platform = sc.proto.cluster().disaggregation().fabric().platform_file();
  if (!platform.empty()) inputs.push_back(resolve(platform));
  return inputs;
}

}  // namespace

absl::StatusOr<std::unique_ptr<reports::OutputDir>> AcquireOutputs(
    const std::string& out, const std::string& holder, bool force,
    reports::OutputDir::Options options) {
  options.force = force;
  auto dir = reports::OutputDir::Acquire(out, holder, options);
  if (dir.ok() && !(*dir)->forced().empty()) {
    std::cerr << "servesim: --force: " << out << " was not written by servesim; replacing only "
              << absl::StrJoin((*dir)->forced(), ", ") << " there\n";
  } else if (dir.ok() && force) {
    std::cerr << "servesim: --force: " << out << " holds none of servesim's file names\n";
  }
  return dir;
}

int RunCommand(const Args& args) {
  RunFlags o;
  FlagParser flags;
  AddScenarioFlags(flags, &o.scenario);
  AddAgentFlags(flags, &o.scenario);
  flags.String("--out", &o.out, "--out needs a folder");
  flags.Switch("--force", [&o] { o.force = true; });
  flags.Switch("--quiet", [&o] { o.quiet = true; });
  flags.Value("--progress", "--progress needs auto, always or never",
              [&o](const std::string& v) -> std::string {
                if (v != "auto" && v != "always" && v != "never") {
                  return absl::StrCat("--progress ", v, ": expected auto, always or never");
                }
                o.progress = v;
                return "";
              });
  flags.Value("--metrics", "--metrics needs [HOST:]PORT (e.g. 9464 or 127.0.0.1:9464; 0: any free)",
              [&o](const std::string& v) -> std::string {
                if (v.empty()) {
                  return "--metrics needs [HOST:]PORT (e.g. 9464 or 127.0.0.1:9464; 0: any free)";
                }
                o.metrics = v;
                return "";
              });
  flags.String("--web-dir", &o.web_dir, "--web-dir needs a folder");
  flags.String("--metrics-token-file", &o.metrics_token_file, "--metrics-token-file needs a file");
  flags.Value("--pace", "--pace needs simulated seconds per wall second, > 0",
              [&o](const std::string& v) -> std::string {
                if (!absl::SimpleAtod(v, &o.pace) || !(o.pace > 0) || !std::isfinite(o.pace)) {
                  return "--pace needs simulated seconds per wall second, > 0";
                }
                return "";
              });
  flags.Value(
      "--linger", "--linger needs wall seconds in [0, 86400]",
      [&o](const std::string& v) -> std::string {
        if (!absl::SimpleAtod(v, &o.linger_s) || !(o.linger_s >= 0 && o.linger_s <= 86400)) {
          return "--linger needs wall seconds in [0, 86400]";
        }
        return "";
      });
  AddSimGridFlags(flags, &o.simgrid);
  if (auto exit = ParseFlags(flags, args)) return *exit;
  if (o.scenario.scenario.empty()) return UsageError("run needs a scenario file");
  return RunWithFlags(o);
}

int RunWithFlags(const RunFlags& o) {
  const auto wall_start = std::chrono::steady_clock::now();
  auto loaded = LoadAndResolve(o.scenario);
  if (!loaded.ok()) return Fail(loaded.status());
  // A field the workload would ignore is refused: the run would not be
  // the one the file describes.
  if (const std::vector<std::string> ignored = InapplicableFields(*loaded); !ignored.empty()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        absl::StrJoin(ignored, "; "), " (remove the field; `servesim validate` lists them)")));
  }
  auto wl = ScanWorkloadOf(*loaded);
  if (!wl.ok()) return Fail(wl.status());
  const scenario::ResolvedScenario* sc = &loaded->resolved;
  std::vector<std::string> fallbacks = sc->fallbacks;
  fallbacks.insert(fallbacks.end(), o.fallbacks.begin(), o.fallbacks.end());
  if (o.strict && !fallbacks.empty()) {
    return Fail(absl::FailedPreconditionError(
        absl::StrCat("--strict: the run would fall back ", fallbacks.size(), " time",
                     fallbacks.size() > 1 ? "s" : "", ": ", absl::StrJoin(fallbacks, "; "))));
  }
  for (const std::string& f : fallbacks) std::cerr << "servesim: warning: " << f << "\n";
  const devices::CollectiveCounts collectives_before = devices::CollectiveTable::ProcessCounts();
  const devices::GpuProfile::Counts profile_before =
      sc->profile != nullptr ? sc->profile->counts() : devices::GpuProfile::Counts{};
  cluster::RunOptions run_options;
  run_options.simgrid_args = SimGridArgs(o);
  run_options.pace = o.pace;
  run_options.record_timeline = !o.out.empty() || !sc->proto.output().dir().empty();
  // Live metrics and the dashboard: started before the run, kept up for
  // --linger seconds after it.
  std::unique_ptr<LiveMetrics> live;
  std::unique_ptr<HttpServer> server;
  if (!o.metrics.empty()) {
    if (absl::Status st = StartLiveMetrics(o, *sc, *wl, &live, &server); !st.ok()) return Fail(st);
  }
  // The progress line: on a terminal, unless --quiet. Sinks are attached
  // only when something listens (the hot path then makes no calls at all).
  // Progress: a bar on a terminal unless --quiet; with --progress always,
  // also elsewhere, as a line every 10 wall seconds. Not by default off a
  // terminal: a listening sink makes the engines report every step, which
  // costs the speed of engines that would run ahead (results identical).
  const bool terminal = ::isatty(::fileno(stderr));
  const bool progress_on = o.progress == "always" || (o.progress == "auto" && !o.quiet && terminal);
  const bool show_progress = progress_on && terminal;  // the bar, redrawn in place
  constexpr double kProgressEveryS = 10;
  ProgressBar progress(progress_on ? stderr : nullptr, wl->num_requests, wl->last_arrival_s,
                       terminal ? 0.0 : kProgressEveryS);
  std::vector<metrics::LiveSink*> sinks;
  if (progress_on) sinks.push_back(&progress);
  if (live != nullptr) sinks.push_back(live.get());
  FanoutSink fanout(sinks);
  run_options.live = sinks.empty() ? nullptr : sinks.size() == 1 ? sinks[0] : &fanout;
  cluster::RunResult partial;
  run_options.partial = &partial;
  const std::string out = !o.out.empty() ? o.out : sc->proto.output().dir();
  // The output folder is checked, locked and cleared of an earlier run's
  // files before the simulation starts (reports/output_dir.h).
  std::unique_ptr<reports::OutputDir> owned_dir;
  const reports::OutputDir* dir = o.output_dir;
  if (dir == nullptr && !out.empty()) {
    reports::OutputDir::Options options;
    options.inputs = InputsOf(*loaded);
    auto acquired = AcquireOutputs(out, absl::StrCat("servesim run ", o.scenario.scenario), o.force,
                                   std::move(options));
    if (!acquired.ok()) return Fail(acquired.status());
    owned_dir = std::move(*acquired);
    dir = owned_dir.get();
  }
  // From here on SIGINT / SIGTERM stop the run cleanly (the simulation sees
  // the flag at its first step if it came earlier).
  StopSignals stop_signals;
  stop_signals.Watch(dir);
  run_options.interrupt = &g_stop_signal;
  // requests.csv and iterations.csv are written as the run goes.
  std::unique_ptr<reports::CsvRecordWriter> csv;
  if (dir != nullptr) {
    auto opened = reports::CsvRecordWriter::Open(*dir, *sc);
    if (!opened.ok()) return Fail(opened.status());
    csv = std::move(*opened);
    run_options.sink = csv.get();
    run_options.time_series = sc->proto.output().report_html();
  }
  auto stream = OpenWorkloadOf(*loaded);
  if (!stream.ok()) return Fail(stream.status());
  auto result = cluster::RunSimulation(*sc, **stream, run_options);
  const int stopped_by = g_stop_signal.load();
  absl::Status csv_status = csv != nullptr ? csv->Close() : absl::OkStatus();
  reports::RunInfo info;
  info.agents_json = AgentsJson(*sc);
  info.profile_json = ProfileJson(*sc, profile_before);
  info.collectives_json = CollectivesJson(*sc, collectives_before);
  info.op_costs_json = OpCostsJson(*sc);
  info.fallbacks = fallbacks;
  if (!result.ok()) {
    return FinishStoppedRun(*loaded, *wl, dir, result.status(), stopped_by, partial, csv_status,
                            wall_start, show_progress, &info);
  }
  metrics::Summary summary = metrics::ComputeSummary(*result->metrics);
  AddDeviceParameters(*sc, &summary);
  info.simulated_s = result->simulated_s;
  info.engine_waits = result->engine_waits;
  SetHints(result->hints, &info);
  info.client_json = ClientJson(*sc, result->held);
  info.wall_s = WallSecondsSince(wall_start);
  // The table first: if writing files fails, the results are still shown.
  if (!o.quiet) std::cout << reports::FormatSummaryTable(*sc, *wl, summary, info) << std::flush;
  if (dir != nullptr) {
    if (!csv_status.ok()) return Fail(csv_status);
    if (absl::Status st = reports::WriteOutputs(*dir, *sc, *wl, *result->metrics, summary, info);
        !st.ok()) {
      return Fail(st);
    }
    if (!o.quiet) std::cout << "  outputs    " << dir->dir() << "/\n";
  }
  const int rc = ServedExitStatus(summary);
  // --linger: the table and the files are out (and the speed printed was
  // the simulation's); the dashboard stays up, until SIGINT or SIGTERM.
  if (server != nullptr && o.linger_s > 0 && g_stop_signal.load() == 0) {
    std::cerr << "servesim: the dashboard stays up " << o.linger_s << " s (--linger; ^C ends it)"
              << std::endl;
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(o.linger_s));
    while (g_stop_signal.load() == 0 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  return rc;
}

}  // namespace servesim::services
