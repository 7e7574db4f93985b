// `servesim run SCENARIO`: simulate, print the summary table, write the
// outputs (reports/), optionally serving live metrics while it runs.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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
#include "agents/remote_device.h"
#include "cluster/simulation.h"
#include "devices/registry.h"
#include "metrics/collector.h"
#include "reports/csv_writer.h"
#include "reports/outputs.h"
#include "reports/summary.h"
#include "services/commands/commands.h"
#include "services/commands/run.h"
#include "services/commands/scenario_args.h"
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
    items.push_back(
        absl::StrFormat("    {\"device\": %s, \"endpoints\": [%s], \"estimate_calls\": %d, "
                        "\"estimate_rpcs\": %d, \"memo_hits\": %d, \"memo_misses\": %d, "
                        "\"memo_hit_rate\": %.6f, \"predicted_ops\": %d, \"prefetch_rpcs\": %d, "
                        "\"prefetch_failures\": %d, \"other_rpcs\": %d, "
                        "\"retries\": %d, \"failovers\": %d, "
                        "\"rebinds\": %d, \"session_rebuilds\": %d}",
                        reports::JsonString(d->label()), absl::StrJoin(eps, ", "), s.estimate_calls,
                        s.estimate_rpcs, s.ops_memo_hits, s.ops_memo_misses,
                        s.ops_memo_hits + s.ops_memo_misses > 0
                            ? double(s.ops_memo_hits) / double(s.ops_memo_hits + s.ops_memo_misses)
                            : 0.0,
                        s.predicted_ops, s.prefetch_rpcs, s.prefetch_failures, s.other_rpcs,
                        s.retries, s.failovers, s.rebinds, s.session_rebuilds));
  }
  return absl::StrCat("[\n", absl::StrJoin(items, ",\n"), "\n  ]");
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

}  // namespace

int RunCommand(const Args& args) {
  RunFlags o;
  FlagParser flags;
  AddScenarioFlags(flags, &o.scenario);
  AddAgentFlags(flags, &o.scenario);
  flags.String("--out", &o.out, "--out needs a folder");
  flags.Switch("--quiet", [&o] { o.quiet = true; });
  flags.Value("--metrics", "--metrics needs [HOST:]PORT (e.g. 9464 or 127.0.0.1:9464; 0: any free)",
              [&o](const std::string& v) -> std::string {
                if (v.empty()) {
                  return "--metrics needs [HOST:]PORT (e.g. 9464 or 127.0.0.1:9464; 0: any free)";
                }
                o.metrics = v;
                return "";
              });
  flags.String("--web-dir", &o.web_dir, "--web-dir needs a folder");
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
  auto wl = ScanWorkloadOf(*loaded);
  if (!wl.ok()) return Fail(wl.status());
  const scenario::ResolvedScenario* sc = &loaded->resolved;
  std::vector<std::string> fallbacks = sc->fallbacks;
  fallbacks.insert(fallbacks.end(), o.fallbacks.begin(), o.fallbacks.end());
  for (const std::string& f : fallbacks) std::cerr << "servesim: warning: " << f << "\n";
  const devices::GpuProfile::Counts profile_before =
      sc->profile != nullptr ? sc->profile->counts() : devices::GpuProfile::Counts{};
  cluster::RunOptions run_options;
  // SERVESIM_SIMGRID_ARGS: SimGrid options for every run, before the
  // command line's (the sanitizer suite sets --cfg=contexts/factory:thread,
  // as AddressSanitizer cannot follow SimGrid's own context switches).
  if (const char* env = std::getenv("SERVESIM_SIMGRID_ARGS"); env != nullptr) {
    for (absl::string_view a : absl::StrSplit(env, ' ', absl::SkipWhitespace())) {
      run_options.simgrid_args.emplace_back(a);
    }
  }
  run_options.simgrid_args.insert(run_options.simgrid_args.end(), o.simgrid.begin(),
                                  o.simgrid.end());
  run_options.pace = o.pace;
  run_options.record_timeline = !o.out.empty() || !sc->proto.output().dir().empty();
  // Live metrics and the dashboard: started before the run, kept up for
  // --linger seconds after it.
  std::unique_ptr<LiveMetrics> live;
  std::unique_ptr<HttpServer> server;
  if (!o.metrics.empty()) {
    LiveMetricsConfig mc;
    mc.scenario = sc->proto.name().empty() ? o.scenario.scenario : sc->proto.name();
    mc.replicas = static_cast<int>(sc->replicas);
    mc.xpu_kind = "gpu";
    if (sc->has_attention_device) mc.device_kind = sc->attention_kind;
    mc.trace_s = wl->last_arrival_s;
    live = std::make_unique<LiveMetrics>(mc);
    auto started =
        HttpServer::Start(o.metrics, o.web_dir, [m = live.get()] { return m->Render(); });
    if (!started.ok()) return Fail(started.status());
    server = std::move(*started);
    const std::string& host = server->host();
    std::cerr << "metrics: http://"
              << (host.find(':') != std::string::npos ? "[" + host + "]" : host) << ":"
              << server->port() << "/" << std::endl;
  }
  // The progress line: on a terminal, unless --quiet. Sinks are attached
  // only when something listens (the hot path then makes no calls at all).
  const bool show_progress = !o.quiet && ::isatty(::fileno(stderr));
  ProgressBar progress(show_progress ? stderr : nullptr, wl->num_requests, wl->last_arrival_s);
  std::vector<metrics::LiveSink*> sinks;
  if (show_progress) sinks.push_back(&progress);
  if (live != nullptr) sinks.push_back(live.get());
  FanoutSink fanout(sinks);
  run_options.live = sinks.empty() ? nullptr : sinks.size() == 1 ? sinks[0] : &fanout;
  cluster::RunResult partial;
  run_options.partial = &partial;
  const std::string out = !o.out.empty() ? o.out : sc->proto.output().dir();
  // requests.csv and iterations.csv are written as the run goes. A folder
  // that cannot be written is reported after the run, whose summary table
  // is still printed.
  std::unique_ptr<reports::CsvRecordWriter> csv;
  absl::Status csv_status;
  if (!out.empty()) {
    auto opened = reports::CsvRecordWriter::Open(out, *sc);
    if (opened.ok()) {
      csv = std::move(*opened);
      run_options.sink = csv.get();
    } else {
      csv_status = opened.status();
    }
    run_options.time_series = sc->proto.output().report_html();
  }
  auto stream = OpenWorkloadOf(*loaded);
  if (!stream.ok()) return Fail(stream.status());
  auto result = cluster::RunSimulation(*sc, **stream, run_options);
  if (csv != nullptr) csv_status = csv->Close();
  if (server != nullptr && o.linger_s > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(o.linger_s));
  }
  reports::RunInfo info;
  info.agents_json = AgentsJson(*sc);
  info.profile_json = ProfileJson(*sc, profile_before);
  info.fallbacks = fallbacks;
  if (!result.ok()) {
    // A run that started and then failed (e.g. no device agent left):
    // write what it measured, flagged partial, then report the error.
    if (partial.metrics != nullptr && !out.empty()) {
      metrics::Summary summary = metrics::ComputeSummary(*partial.metrics);
      info.simulated_s = partial.simulated_s;
      info.wall_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
      info.partial = true;
      info.error = std::string(result.status().message());
      if (absl::Status st = reports::WriteOutputs(out, *sc, *wl, *partial.metrics, summary, info);
          st.ok()) {
        std::cerr << "servesim: partial results (up to t = " << partial.simulated_s
                  << " s simulated) written to " << out << "/\n";
      }
    }
    return Fail(result.status());
  }
  metrics::Summary summary = metrics::ComputeSummary(*result->metrics);
  if (sc->attention_shared != nullptr) {
    // What the (shared) device measured over the run; wall-clock figures
    // stay out of the deterministic outputs.
    for (const auto& [k, v] : sc->attention_shared->Describe().parameters) {
      if (!absl::StrContains(k, "calibration_s")) summary.device_parameters.push_back({k, v});
    }
  } else if (sc->has_attention_device) {
    // Per-replica devices (AttAcc) hold nothing measured: their parameters
    // are the spec's, described by an in-process instance (the same whether
    // the run used agents or not).
    if (auto d = devices::CreateDevice(sc->attention_device); d.ok()) {
      for (const auto& [k, v] : (*d)->Describe().parameters) {
        summary.device_parameters.push_back({k, v});
      }
    }
  }
  info.simulated_s = result->simulated_s;
  info.wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  // The table first: if writing files fails, the results are still shown.
  if (!o.quiet) std::cout << reports::FormatSummaryTable(*sc, *wl, summary, info) << std::flush;
  if (!out.empty()) {
    if (!csv_status.ok()) return Fail(csv_status);
    if (absl::Status st = reports::WriteOutputs(out, *sc, *wl, *result->metrics, summary, info);
        !st.ok()) {
      return Fail(st);
    }
    if (!o.quiet) std::cout << "  outputs    " << out << "/\n";
  }
  return 0;
}

}  // namespace servesim::services
