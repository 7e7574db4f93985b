// servesim: the command-line front end. Parsing flags, calling into
// cluster/, printing; no model logic lives here.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/match.h"
#include "agents/remote_device.h"
#include "cluster/metrics.h"
#include "cluster/plot.h"
#include "cluster/report.h"
#include "cluster/scenario.h"
#include "cluster/simulation.h"
#include "cluster/study.h"
#include "cluster/sweep.h"
#include "devices/attacc/attacc_device.h"
#include "devices/cta/cta_device.h"
#include "devices/lad/lad_device.h"
#include "devices/spatten/spatten_device.h"
#include "devices/topick/topick_device.h"
#include "cluster/workload.h"
#include "common/status_macros.h"
#include "devices/presets.h"
#include "devices/registry.h"
#include "google/protobuf/text_format.h"
#include "services/http_server.h"
#include "services/live_metrics.h"
#include "services/progress.h"

namespace {

using servesim::cluster::LoadedScenario;

constexpr char kUsage[] = R"(servesim - discrete-event simulator of LLM serving clusters

Usage:
  servesim run SCENARIO.pbtxt [options]   simulate and print the summary table
  servesim validate SCENARIO.pbtxt [--set path=value ...]
                                          parse and check; print the resolved
                                          scenario and the replica memory plan
  servesim presets [models|xpus|links|attacc|topick|spatten|cta|lad]
                                          list presets with their parameters
  servesim study attacc [--out DIR] [--trace FILE | --no-trace]
                                          the AttAcc paper's evaluation (§7):
                                          DGX_Base, DGX_Large, DGX+AttAccs x
                                          policies x models x lengths x SLOs,
                                          saturated, then the Azure trace
  servesim sweep SCENARIO --vary field=v1,v2,... [--vary ...] [--set ...]
                 [-j N] [--out DIR] [--emit-jobs FILE]
                                          run the cross product of the --vary
                                          lists, one child run per point into
                                          DIR/points/ (default out/sweep);
                                          finished points are not rerun; one
                                          row per point in DIR/sweep.csv
  servesim merge DIR... [--out DIR]       sweep.csv from finished points (after
                                          running --emit-jobs lines elsewhere)
  servesim search SCENARIO --slo ttft_p99=2s,tbt_p99=50ms
                 (--vary-rate | --vary-replicas) [--attainment 0.9]
                 [--tolerance 0.02] [--max-replicas 1024] [-j N] [--out DIR]
                                          largest arrival rate (trace:
                                          workload.rate_scale; synthetic:
                                          its rate_rps) or fewest replicas
                                          meeting the SLO; DIR/search.csv
                                          (default out/search)
  servesim plot TABLE.csv --x COL --y COL [--group COL[,COL...]]
                 [--where COL=VALUE ...] [--title T] [--out FILE.svg]
                                          a line chart (SVG) of a table
                                          servesim wrote (sweep.csv,
                                          search.csv, ...): one line per
                                          group; default FILE: TABLE.svg
  servesim help | --help                  this text

Options of run (validate takes --set, --seed and --trace too):
  --out DIR             write summary.json, run_info.json, requests.csv,
                        iterations.csv, timeline.json and report.html into
                        DIR (overrides output.dir)
  --seed N              master seed (overrides the scenario's seed)
  --trace FILE          replay FILE instead of the scenario's workload source
                        (format inferred from its name and header)
  --set path=value      set any scalar field of the scenario by its path,
                        e.g. --set cluster.replicas=2
                             --set scheduler.batching=CHUNKED_PREFILL
                        (repeatable; applied in order, before defaults)
  --quiet               do not print the summary table
  --metrics [HOST:]PORT serve live Prometheus metrics at /metrics and the
                        dashboard at / (port 0: any free; the address is
                        printed on stderr). Loopback unless a HOST is given
  --pace X              run at most X simulated seconds per wall second
                        (default: as fast as possible); never changes results
  --linger S            with --metrics: keep serving S wall seconds after the
                        run ends
  --web-dir DIR         the dashboard's files (default: dashboards/web)
  --cfg=NAME:VALUE      passed to SimGrid (e.g. --cfg=network/model:CM02)
  --log=SPEC            passed to SimGrid's logging
                        (SERVESIM_SIMGRID_ARGS, space-separated, come first)

Studies (README "Studies: sweeps and searches"):
  -j N                  child runs at once, 1 to the cores available (default 1);
                        results do not depend on it
  --vary field=v1,...   a field to vary (any --set path) and its values
  --emit-jobs FILE      sweep: write one `servesim run` command line per point
                        into FILE instead of running them (Slurm arrays, GNU
                        parallel); then `servesim merge DIR`
  --slo LIST            search: METRIC_STAT=LIMIT,... with METRIC ttft, tbt,
                        tpot or e2e, STAT mean, p50, p90, p99 or max, LIMIT in
                        s, ms or us. A probe passes when every statistic is
                        within its limit and slo_attainment (per request: TTFT
                        <= the ttft limit, TPOT <= the tpot limit, else the
                        tbt limit) >= --attainment
  --attainment F        search: required slo_attainment, in (0, 1] (default 0.9)
  --tolerance F         --vary-rate: stop when (hi - lo) / lo <= F, in (0, 1)
                        (default 0.02)

Device agents (servesim-agent; README "Device agents"):
  --agent KIND=HOST:PORT[,HOST:PORT...]
                        run every device of KIND (gpu, attacc, topick,
                        spatten, cta, lad) on these agents instead of in process
                        (repeatable, one per kind; replaces the scenario's
                        cluster.xpu_endpoints / attention_endpoints). Results
                        are byte-identical; call counts go to run_info.json
  --agent-tls-ca FILE   TLS to the agents: their certificates chain to FILE
  --agent-tls-cert FILE with --agent-tls-key: a client certificate (PEM)
  --agent-tls-key FILE
  --agent-token-file FILE
                        send 'authorization: Bearer <first line of FILE>'
  --agent-deadline S    per-call deadline, seconds (default 30)
  --agent-lookahead N   cap on the decode steps an Estimate call asks ahead
                        (a miss asks 8, a prefetch 16; 0..256, default 64;
                        0: none). Fewer round trips, same results

Scenario files are protobuf text (schema: proto/servesim/v1/scenario.proto;
examples: examples/*.pbtxt). Relative trace paths are resolved against the
scenario file's folder. Exit status: 0 success, 1 bad input or failed run,
2 bad command line.
)";

struct Options {
  std::string command;
  std::string scenario;
  std::string out;
  std::string trace;
  std::string presets_kind;
  std::vector<std::string> sets;
  std::vector<std::string> simgrid;
  bool has_seed = false;
  uint64_t seed = 0;
  bool quiet = false;
  bool no_trace = false;
  std::string study;
  std::string metrics;  // --metrics HOST:PORT
  std::string web_dir = SERVESIM_WEB_DIR;
  double pace = 0;
  double linger_s = 0;
  std::map<std::string, std::vector<std::string>> agents;  // --agent
  servesim::agents::ClientOptions agent_client;
  std::string agent_token_file;
  // Studies.
  std::vector<std::string> vary;
  std::vector<std::string> merge_dirs;
  std::string emit_jobs;
  std::string slo;
  bool vary_rate = false, vary_replicas = false;
  double attainment = 0.9, tolerance = 0.02;
  int64_t max_replicas = 1024;
  int jobs = 1;
  // plot.
  servesim::cluster::PlotSpec plot;
};

int UsageError(const std::string& msg) {
  std::cerr << "servesim: " << msg << "\nRun 'servesim --help' for usage.\n";
  return 2;
}

int Fail(const absl::Status& status) {
  std::cerr << "servesim: error: " << status.message() << "\n";
  return 1;
}

// Returns 0 on success, else the exit code.
int ParseArgs(int argc, char** argv, Options* o) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) return UsageError("no command given");
  size_t i = 0;
  o->command = args[i++];
  if (o->command == "--help" || o->command == "-h" || o->command == "help") {
    o->command = "help";
    return 0;
  }
  auto value = [&](const std::string& flag, std::string* out) -> bool {
    if (i >= args.size()) return false;
    *out = args[i++];
    (void)flag;
    return true;
  };
  while (i < args.size()) {
    std::string a = args[i++];
    std::string v;
    // Accept --flag=value as well as --flag value.
    const size_t eq = a.find('=');
    const bool inline_value = absl::StartsWith(a, "--") && eq != std::string::npos;
    std::string flag = inline_value ? a.substr(0, eq) : a;
    auto get = [&](std::string* out) -> bool {
      if (inline_value) {
        *out = a.substr(eq + 1);
        return true;
      }
      return value(flag, out);
    };
    if (flag == "--help" || flag == "-h") {
      o->command = "help";
      return 0;
    } else if (flag == "--cfg" || flag == "--log") {
      if (!inline_value) return UsageError(flag + " takes --cfg=NAME:VALUE form");
      o->simgrid.push_back(a);
    } else if (flag == "--out") {
      if (!get(&o->out)) return UsageError("--out needs a folder");
    } else if (flag == "--trace") {
      if (!get(&o->trace)) return UsageError("--trace needs a file");
    } else if (flag == "--set") {
      if (!get(&v)) return UsageError("--set needs path=value");
      o->sets.push_back(v);
    } else if (flag == "--seed") {
      if (!get(&v) || !absl::SimpleAtoi(v, &o->seed)) {
        return UsageError("--seed needs a non-negative integer");
      }
      o->has_seed = true;
    } else if (flag == "--metrics") {
      if (!get(&o->metrics) || o->metrics.empty()) {
        return UsageError("--metrics needs [HOST:]PORT (e.g. 9464 or 127.0.0.1:9464; 0: any free)");
      }
    } else if (flag == "--web-dir") {
      if (!get(&o->web_dir)) return UsageError("--web-dir needs a folder");
    } else if (flag == "--pace") {
      if (!get(&v) || !absl::SimpleAtod(v, &o->pace) || !(o->pace > 0) ||
          !std::isfinite(o->pace)) {
        return UsageError("--pace needs simulated seconds per wall second, > 0");
      }
    } else if (flag == "--linger") {
      if (!get(&v) || !absl::SimpleAtod(v, &o->linger_s) ||
          !(o->linger_s >= 0 && o->linger_s <= 86400)) {
        return UsageError("--linger needs wall seconds in [0, 86400]");
      }
    } else if (flag == "--agent") {
      if (!get(&v)) return UsageError("--agent needs KIND=HOST:PORT[,HOST:PORT...]");
      const size_t k = v.find('=');
      if (k == std::string::npos || k == 0 || k + 1 == v.size()) {
        return UsageError(absl::StrCat("--agent ", v, ": expected KIND=HOST:PORT[,HOST:PORT...]"));
      }
      const std::string kind = v.substr(0, k);
      const auto kinds = servesim::devices::RegisteredDeviceKinds();
      if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) {
        return UsageError(absl::StrCat("--agent ", v, ": unknown device kind '", kind,
                                       "'; registered: ", absl::StrJoin(kinds, ", ")));
      }
      if (o->agents.count(kind) != 0) {
        return UsageError(absl::StrCat("--agent ", kind, "=... given twice; list every endpoint "
                                       "of a kind in one flag, comma-separated"));
      }
      std::vector<std::string> eps = absl::StrSplit(v.substr(k + 1), ',', absl::SkipEmpty());
      for (const std::string& e : eps) {
        const size_t colon = e.rfind(':');
        int port = -1;
        if (colon == std::string::npos || colon == 0 ||
            !absl::SimpleAtoi(e.substr(colon + 1), &port) || port < 1 || port > 65535) {
          return UsageError(absl::StrCat("--agent ", v, ": endpoint '", e,
                                         "'; expected HOST:PORT with PORT in [1, 65535]"));
        }
      }
      o->agents[kind] = std::move(eps);
    } else if (flag == "--agent-tls-ca") {
      if (!get(&o->agent_client.tls_ca_file)) return UsageError("--agent-tls-ca needs a file");
    } else if (flag == "--agent-tls-cert") {
      if (!get(&o->agent_client.tls_cert_file)) return UsageError("--agent-tls-cert needs a file");
    } else if (flag == "--agent-tls-key") {
      if (!get(&o->agent_client.tls_key_file)) return UsageError("--agent-tls-key needs a file");
    } else if (flag == "--agent-token-file") {
      if (!get(&o->agent_token_file)) return UsageError("--agent-token-file needs a file");
    } else if (flag == "--agent-deadline") {
      if (!get(&v) || !absl::SimpleAtod(v, &o->agent_client.deadline_s) ||
          !(o->agent_client.deadline_s > 0 && o->agent_client.deadline_s <= 86400)) {
        return UsageError("--agent-deadline needs seconds in (0, 86400]");
      }
    } else if (flag == "--agent-lookahead") {
      if (!get(&v) || !absl::SimpleAtoi(v, &o->agent_client.lookahead_max) ||
          o->agent_client.lookahead_max < 0 || o->agent_client.lookahead_max > 256) {
        return UsageError("--agent-lookahead needs a number of steps, 0..256");
      }
    } else if (flag == "--x") {
      if (!get(&o->plot.x)) return UsageError("--x needs a column name");
    } else if (flag == "--y") {
      if (!get(&o->plot.y)) return UsageError("--y needs a column name");
    } else if (flag == "--group") {
      if (!get(&v)) return UsageError("--group needs column names");
      o->plot.group = absl::StrSplit(v, ',', absl::SkipEmpty());
    } else if (flag == "--where") {
      if (!get(&v) || v.find('=') == std::string::npos) {
        return UsageError("--where needs COLUMN=VALUE");
      }
      o->plot.where.emplace_back(v.substr(0, v.find('=')), v.substr(v.find('=') + 1));
    } else if (flag == "--title") {
      if (!get(&o->plot.title)) return UsageError("--title needs a text");
    } else if (flag == "--vary") {
      if (!get(&v)) return UsageError("--vary needs field.path=v1,v2,...");
      o->vary.push_back(v);
    } else if (flag == "-j" || flag == "--jobs" || (absl::StartsWith(a, "-j") && a.size() > 2 &&
                                                     !absl::StartsWith(a, "--"))) {
      const int cores = servesim::cluster::AvailableCores();
      if (flag != "-j" && flag != "--jobs") {
        v = a.substr(2);
      } else if (!get(&v)) {
        v.clear();
      }
      if (!absl::SimpleAtoi(v, &o->jobs) || o->jobs < 1 || o->jobs > cores) {
        return UsageError(absl::StrCat("-j ", v, ": expected 1 to ", cores,
                                       " (the cores available to this process)"));
      }
    } else if (flag == "--emit-jobs") {
      if (!get(&o->emit_jobs) || o->emit_jobs.empty()) return UsageError("--emit-jobs needs a file");
    } else if (flag == "--slo") {
      if (!get(&o->slo)) return UsageError("--slo needs e.g. ttft_p99=2s,tbt_p99=50ms");
    } else if (flag == "--vary-rate") {
      o->vary_rate = true;
    } else if (flag == "--vary-replicas") {
      o->vary_replicas = true;
    } else if (flag == "--attainment") {
      if (!get(&v) || !absl::SimpleAtod(v, &o->attainment) || !(o->attainment > 0) ||
          !(o->attainment <= 1)) {
        return UsageError(absl::StrCat("--attainment ", v, ": expected a fraction in (0, 1]"));
      }
    } else if (flag == "--tolerance") {
      if (!get(&v) || !absl::SimpleAtod(v, &o->tolerance) || !(o->tolerance > 0) ||
          !(o->tolerance < 1)) {
        return UsageError(absl::StrCat("--tolerance ", v, ": expected a relative width in (0, 1)"));
      }
    } else if (flag == "--max-replicas") {
      if (!get(&v) || !absl::SimpleAtoi(v, &o->max_replicas) || o->max_replicas < 1) {
        return UsageError(absl::StrCat("--max-replicas ", v, ": expected an integer >= 1"));
      }
    } else if (flag == "--quiet") {
      o->quiet = true;
    } else if (flag == "--no-trace") {
      o->no_trace = true;
    } else if (absl::StartsWith(a, "-")) {
      return UsageError(absl::StrCat("unknown option ", a));
    } else if (o->command == "presets" && o->presets_kind.empty()) {
      o->presets_kind = a;
    } else if (o->command == "merge") {
      o->merge_dirs.push_back(a);
    } else if (o->command == "study" && o->study.empty()) {
      o->study = a;
    } else if (o->scenario.empty() && o->command != "presets" && o->command != "study") {
      o->scenario = a;
    } else {
      return UsageError(absl::StrCat("unexpected argument ", a));
    }
  }
  if (o->command == "sweep" || o->command == "search") {
    if (o->scenario.empty()) return UsageError(o->command + " needs a scenario file");
  }
  if (o->command == "sweep" && o->vary.empty()) {
    return UsageError("sweep needs at least one --vary field.path=v1,v2,...");
  }
  if (o->command == "search") {
    if (o->slo.empty()) return UsageError("search needs --slo, e.g. ttft_p99=2s,tbt_p99=50ms");
    if (o->vary_rate == o->vary_replicas) {
      return UsageError("search needs exactly one of --vary-rate and --vary-replicas");
    }
  }
  if (o->command == "plot" && (o->scenario.empty() || o->plot.x.empty() || o->plot.y.empty())) {
    return UsageError("plot needs a CSV table, --x COLUMN and --y COLUMN");
  }
  if (o->command == "merge" && o->merge_dirs.empty()) {
    return UsageError("merge needs one or more sweep folders (or point folders)");
  }
  if ((o->command == "run" || o->command == "validate") && o->scenario.empty()) {
    return UsageError(o->command + " needs a scenario file");
  }
  if (o->command == "study" && o->study != "attacc") {
    return UsageError("study takes one study name: attacc");
  }
  return 0;
}

// The scenario as written (for error locations) and as resolved.
struct Scenario {
  LoadedScenario loaded;
  servesim::cluster::ResolvedScenario resolved;
};

absl::StatusOr<Scenario> LoadAndResolve(const Options& o) {
  ASSIGN_OR_RETURN(LoadedScenario sc, servesim::cluster::LoadScenarioFile(o.scenario));
  for (const std::string& s : o.sets) RETURN_IF_ERROR(servesim::cluster::ApplyOverride(&sc, s));
  if (o.has_seed) {
    sc.proto.set_seed(o.seed);
    sc.overridden.insert("seed");
  }
  if (!o.trace.empty()) {
    // --trace paths are relative to the working folder, not the scenario.
    auto* t = sc.proto.mutable_workload()->mutable_trace();
    t->set_path(std::filesystem::absolute(o.trace).string());
    sc.overridden.insert("workload.trace.path");
  }
  sc.agent_endpoints = o.agents;
  sc.agent_client = o.agent_client;
  if (!o.agent_token_file.empty()) {
    std::ifstream in(o.agent_token_file);
    std::stringstream text;
    text << in.rdbuf();
    std::string token = text.str().substr(0, text.str().find('\n'));
    if (!in || token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--agent-token-file ", o.agent_token_file, ": cannot read a token from its first line"));
    }
    sc.agent_client.token = token;
  }
  RETURN_IF_ERROR(servesim::cluster::Normalize(&sc));
  ASSIGN_OR_RETURN(auto resolved, servesim::cluster::Resolve(sc));
  return Scenario{std::move(sc), std::move(resolved)};
}

// Reads the workload once to check every row and count its requests; keeps
// none of them (the run streams them again).
absl::StatusOr<servesim::cluster::Workload> LoadWorkloadOf(const Scenario& s) {
  auto wl = servesim::cluster::ScanWorkload(s.resolved.proto.workload(), s.resolved.base_dir,
                                            "", s.resolved.seed);
  if (!wl.ok()) return servesim::cluster::AnnotateFieldError(s.loaded, wl.status());
  return wl;
}

absl::StatusOr<std::unique_ptr<servesim::cluster::RequestStream>> OpenWorkloadOf(
    const Scenario& s) {
  auto stream = servesim::cluster::OpenWorkload(s.resolved.proto.workload(),
                                                s.resolved.base_dir, "", s.resolved.seed);
  if (!stream.ok()) return servesim::cluster::AnnotateFieldError(s.loaded, stream.status());
  return stream;
}

std::string Gb(double b) { return absl::StrFormat("%.2f GB", b / 1e9); }

int Validate(const Options& o) {
  auto loaded = LoadAndResolve(o);
  if (!loaded.ok()) return Fail(loaded.status());
  auto wl = LoadWorkloadOf(*loaded);
  if (!wl.ok()) return Fail(wl.status());
  const servesim::cluster::ResolvedScenario* sc = &loaded->resolved;
  std::string text;
  google::protobuf::TextFormat::PrintToString(sc->proto, &text);
  std::cout << "# resolved scenario (every default and preset value filled in)\n"
            << text << "\n";
  if (sc->has_attention_device) {
    std::cout << absl::StrFormat(
        "# attention device: %s, %s in all (FF partitions %s); KV lives there\n",
        sc->attention_label, Gb(sc->device_memory_bytes), Gb(sc->device_ff_weight_bytes));
  }
  std::cout << absl::StrFormat(
      "# memory plan per xPU: weights %s, activations %s, KV %s\n"
      "# KV capacity per replica: %d blocks x %d tokens = %d tokens\n"
      "# workload: %s, %d requests\n",
      Gb(sc->weight_bytes_per_xpu), Gb(sc->activation_bytes_per_xpu),
      Gb(sc->kv.usable_bytes_per_xpu), sc->kv.blocks,
      sc->batching.kv_block_tokens, sc->kv.tokens, wl->description,
      wl->num_requests);
  std::cout << "OK\n";
  return 0;
}

// Call counts of the run's device agents, for run_info.json.
std::string AgentsJson(const servesim::cluster::ResolvedScenario& sc) {
  if (sc.remote_devices.empty()) return "";
  std::vector<std::string> items;
  for (const servesim::agents::RemoteDevice* d : sc.remote_devices) {
    const servesim::agents::RemoteStats s = d->Stats();
    std::vector<std::string> eps;
    for (const std::string& e : s.endpoints) eps.push_back(servesim::cluster::JsonString(e));
    items.push_back(absl::StrFormat(
        "    {\"device\": %s, \"endpoints\": [%s], \"estimate_calls\": %d, "
        "\"estimate_rpcs\": %d, \"memo_hits\": %d, \"memo_misses\": %d, "
        "\"memo_hit_rate\": %.6f, \"predicted_ops\": %d, \"prefetch_rpcs\": %d, "
        "\"prefetch_failures\": %d, \"other_rpcs\": %d, "
        "\"retries\": %d, \"failovers\": %d, "
        "\"rebinds\": %d, \"session_rebuilds\": %d}",
        servesim::cluster::JsonString(d->label()), absl::StrJoin(eps, ", "), s.estimate_calls,
        s.estimate_rpcs, s.ops_memo_hits, s.ops_memo_misses,
        s.ops_memo_hits + s.ops_memo_misses > 0
            ? double(s.ops_memo_hits) / double(s.ops_memo_hits + s.ops_memo_misses)
            : 0.0,
        s.predicted_ops, s.prefetch_rpcs, s.prefetch_failures, s.other_rpcs, s.retries,
        s.failovers, s.rebinds, s.session_rebuilds));
  }
  return absl::StrCat("[\n", absl::StrJoin(items, ",\n"), "\n  ]");
}

int Run(const Options& o) {
  const auto wall_start = std::chrono::steady_clock::now();
  auto loaded = LoadAndResolve(o);
  if (!loaded.ok()) return Fail(loaded.status());
  auto wl = LoadWorkloadOf(*loaded);
  if (!wl.ok()) return Fail(wl.status());
  const servesim::cluster::ResolvedScenario* sc = &loaded->resolved;
  servesim::cluster::RunOptions run_options;
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
  std::unique_ptr<servesim::services::LiveMetrics> live;
  std::unique_ptr<servesim::services::HttpServer> server;
  if (!o.metrics.empty()) {
    servesim::services::LiveMetricsConfig mc;
    mc.scenario = sc->proto.name().empty() ? o.scenario : sc->proto.name();
    mc.replicas = static_cast<int>(sc->replicas);
    mc.xpu_kind = "gpu";
    if (sc->has_attention_device) mc.device_kind = sc->attention_kind;
    mc.trace_s = wl->last_arrival_s;
    live = std::make_unique<servesim::services::LiveMetrics>(mc);
    auto started = servesim::services::HttpServer::Start(
        o.metrics, o.web_dir, [m = live.get()] { return m->Render(); });
    if (!started.ok()) return Fail(started.status());
    server = std::move(*started);
    const std::string& host = server->host();
    std::cerr << "metrics: http://" << (host.find(':') != std::string::npos ? "[" + host + "]" : host)
              << ":" << server->port() << "/" << std::endl;
  }
  // The progress line: on a terminal, unless --quiet. Sinks are attached
  // only when something listens (the hot path then makes no calls at all).
  const bool show_progress = !o.quiet && ::isatty(::fileno(stderr));
  servesim::services::ProgressBar progress(
      show_progress ? stderr : nullptr, wl->num_requests, wl->last_arrival_s);
  std::vector<servesim::cluster::LiveSink*> sinks;
  if (show_progress) sinks.push_back(&progress);
  if (live != nullptr) sinks.push_back(live.get());
  servesim::services::FanoutSink fanout(sinks);
  run_options.live = sinks.empty() ? nullptr : sinks.size() == 1 ? sinks[0] : &fanout;
  servesim::cluster::RunResult partial;
  run_options.partial = &partial;
  const std::string out = !o.out.empty() ? o.out : sc->proto.output().dir();
  // requests.csv and iterations.csv are written as the run goes. A folder
  // that cannot be written is reported after the run, whose summary table
  // is still printed.
  std::unique_ptr<servesim::cluster::CsvRecordWriter> csv;
  absl::Status csv_status;
  if (!out.empty()) {
    auto opened = servesim::cluster::CsvRecordWriter::Open(out, *sc);
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
  auto result = servesim::cluster::RunSimulation(*sc, **stream, run_options);
  if (csv != nullptr) csv_status = csv->Close();
  if (server != nullptr && o.linger_s > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(o.linger_s));
  }
  servesim::cluster::RunInfo info;
  info.agents_json = AgentsJson(*sc);
  if (!result.ok()) {
    // A run that started and then failed (e.g. no device agent left):
    // write what it measured, flagged partial, then report the error.
    if (partial.metrics != nullptr && !out.empty()) {
      servesim::cluster::Summary summary = servesim::cluster::ComputeSummary(*partial.metrics);
      info.simulated_s = partial.simulated_s;
      info.wall_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
      info.partial = true;
      info.error = std::string(result.status().message());
      if (absl::Status st = WriteOutputs(out, *sc, *wl, *partial.metrics, summary, info);
          st.ok()) {
        std::cerr << "servesim: partial results (up to t = " << partial.simulated_s
                  << " s simulated) written to " << out << "/\n";
      }
    }
    return Fail(result.status());
  }
  servesim::cluster::Summary summary = servesim::cluster::ComputeSummary(*result->metrics);
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
    if (auto d = servesim::devices::CreateDevice(sc->attention_device); d.ok()) {
      for (const auto& [k, v] : (*d)->Describe().parameters) {
        summary.device_parameters.push_back({k, v});
      }
    }
  }
  info.simulated_s = result->simulated_s;
  info.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  // The table first: if writing files fails, the results are still shown.
  if (!o.quiet) std::cout << FormatSummaryTable(*sc, *wl, summary, info) << std::flush;
  if (!out.empty()) {
    if (!csv_status.ok()) return Fail(csv_status);
    if (absl::Status st = WriteOutputs(out, *sc, *wl, *result->metrics, summary, info);
        !st.ok()) {
      return Fail(st);
    }
    if (!o.quiet) std::cout << "  outputs    " << out << "/\n";
  }
  return 0;
}

void PrintMessage(const google::protobuf::Message& m) {
  std::string text;
  google::protobuf::TextFormat::Printer printer;
  printer.SetSingleLineMode(true);
  printer.PrintToString(m, &text);
  std::cout << "    " << text << "\n";
}

int Presets(const Options& o) {
  const std::string& k = o.presets_kind;
  if (!k.empty() && k != "models" && k != "xpus" && k != "links" && k != "attacc" &&
      k != "topick" && k != "spatten" && k != "cta" && k != "lad") {
    return UsageError("presets takes models, xpus, links, attacc, topick, spatten, cta or lad");
  }
  if (k.empty() || k == "models") {
    std::cout << "models (model.preset):\n";
    for (const auto& name : servesim::devices::ModelPresetNames()) {
      auto m = servesim::devices::ModelPreset(name);
      std::cout << "  " << name << "\n";
      PrintMessage(*m);
      const auto dims = servesim::devices::ModelDimsFromSpec(*m);
      std::cout << absl::StrFormat("    = %.2fB parameters, %s fp16 weights, %d KB KV per token\n",
                                   dims.TotalParams() / 1e9, Gb(dims.WeightBytes()),
                                   dims.KvBytesPerToken() / 1024);
    }
  }
  if (k.empty() || k == "xpus") {
    std::cout << "xpus (cluster.xpu.preset):\n";
    for (const auto& name : servesim::devices::XpuPresetNames()) {
      std::cout << "  " << name << "\n";
      PrintMessage(*servesim::devices::XpuPreset(name));
    }
  }
  if (k.empty() || k == "links") {
    std::cout << "links (cluster.interconnect.preset, cluster.frontend.preset):\n";
    for (const auto& name : servesim::devices::LinkPresetNames()) {
      std::cout << "  " << name << "\n";
      PrintMessage(*servesim::devices::LinkPreset(name));
    }
  }
  if (k.empty() || k == "attacc") {
    std::cout << "attacc (cluster.attacc.preset):\n";
    for (const auto& name : servesim::devices::AttAccPresetNames()) {
      std::cout << "  " << name << "\n";
      PrintMessage(*servesim::devices::AttAccPreset(name));
    }
  }
  if (k.empty() || k == "topick") {
    std::cout << "topick (cluster.attention_pool.topick.topick.preset):\n";
    for (const auto& name : servesim::devices::TopickPresetNames()) {
      std::cout << "  " << name << "\n";
      PrintMessage(*servesim::devices::TopickPreset(name));
    }
  }
  if (k.empty() || k == "spatten") {
    std::cout << "spatten (cluster.attention_pool.spatten.spatten.preset):\n";
    for (const auto& name : servesim::devices::SpattenPresetNames()) {
      std::cout << "  " << name << "\n";
      PrintMessage(*servesim::devices::SpattenPreset(name));
    }
  }
  if (k.empty() || k == "cta") {
    std::cout << "cta (cluster.attention_pool.cta.cta.preset):\n";
    for (const auto& name : servesim::devices::CtaPresetNames()) {
      std::cout << "  " << name << "\n";
      PrintMessage(*servesim::devices::CtaPreset(name));
    }
  }
  if (k.empty() || k == "lad") {
    std::cout << "lad (cluster.attention_pool.lad.lad.preset):\n";
    for (const auto& name : servesim::devices::LadPresetNames()) {
      std::cout << "  " << name << "\n";
      PrintMessage(*servesim::devices::LadPreset(name));
    }
  }
  if (k.empty()) {
    std::cout << "device kinds: " << absl::StrJoin(servesim::devices::RegisteredDeviceKinds(), ", ")
              << "\n";
  }
  return 0;
}

int Study(const Options& o) {
  servesim::cluster::StudyOptions options;
  auto points = servesim::cluster::RunAttAccStudy(options);
  if (!points.ok()) return Fail(points.status());
  std::cout << "AttAcc study, saturated (decode stages; speedups over DGX_Base / DGX_Large "
               "at the same model, lengths and SLO; e2e xB: whole requests, prefill included, "
               "over DGX_Base)\n"
            << servesim::cluster::StudyTable(*points) << std::flush;
  const std::string out = o.out.empty() ? "out/attacc_study" : o.out;
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  {
    std::ofstream f(out + "/attacc_study.csv");
    f << servesim::cluster::StudyCsv(*points);
    if (!f) return Fail(absl::UnavailableError(out + "/attacc_study.csv: cannot write"));
  }
  std::cout << "  wrote " << out << "/attacc_study.csv\n";
  if (o.no_trace) return 0;
  const std::string trace =
      o.trace.empty() ? "examples/traces/AzureLLMInferenceTrace_conv.csv" : o.trace;
  if (!std::filesystem::exists(trace)) {
    return Fail(absl::NotFoundError(absl::StrCat(
        trace, ": trace not found (run from the repository root, pass --trace FILE, or "
               "--no-trace)")));
  }
  std::filesystem::create_directories(out + "/trace_runs", ec);
  std::cout << "\nAttAcc study, Azure conversation trace (" << trace << ")\n" << std::flush;
  auto rows = servesim::cluster::RunAttAccTraceStudy(
      options, std::filesystem::read_symlink("/proc/self/exe").string(),
      std::filesystem::absolute(trace).string(), out + "/trace_runs");
  if (!rows.ok()) return Fail(rows.status());
  std::cout << servesim::cluster::TraceStudyTable(*rows);
  {
    std::ofstream f(out + "/attacc_trace.csv");
    f << servesim::cluster::TraceStudyCsv(*rows);
  }
  std::cout << "  wrote " << out << "/attacc_trace.csv\n";
  return 0;
}

// ------------------------------------------------------------ studies ----

namespace sc = servesim::cluster;

std::string SelfBinary() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

// The --set list every point starts from: --set, then --seed and --trace as
// the fields they set.
std::vector<std::string> BaseOverrides(const Options& o) {
  std::vector<std::string> sets = o.sets;
  if (o.has_seed) sets.push_back(absl::StrCat("seed=", o.seed));
  if (!o.trace.empty()) {
    sets.push_back(
        absl::StrCat("workload.trace.path=", std::filesystem::absolute(o.trace).string()));
  }
  return sets;
}

// Loads, overrides, normalises and resolves one point, and loads its
// workload: every error a run of it would stop on. Errors of a varied
// field name "--vary field=value".
absl::StatusOr<Scenario> CheckPoint(const std::string& scenario,
                                    const std::vector<std::string>& base,
                                    const std::vector<std::pair<std::string, std::string>>& vary) {
  ASSIGN_OR_RETURN(LoadedScenario ls, sc::LoadScenarioFile(scenario));
  for (const std::string& s : base) RETURN_IF_ERROR(sc::ApplyOverride(&ls, s));
  for (const auto& [field, value] : vary) {
    const absl::Status st = sc::ApplyOverride(&ls, absl::StrCat(field, "=", value));
    if (!st.ok()) {
      std::string msg(st.message());
      const std::string prefix = absl::StrCat("--set ", field, ": ");
      if (absl::StartsWith(msg, prefix)) msg = msg.substr(prefix.size());
      return absl::InvalidArgumentError(absl::StrCat("--vary ", field, "=", value, ": ", msg));
    }
  }
  auto annotate = [&](const absl::Status& st) {
    if (vary.empty()) return st;
    std::vector<std::string> v;
    for (const auto& [f, x] : vary) v.push_back(absl::StrCat(f, "=", x));
    return absl::Status(st.code(), absl::StrCat("--vary ", absl::StrJoin(v, " "), ": ",
                                                st.message()));
  };
  if (absl::Status st = sc::Normalize(&ls); !st.ok()) return annotate(st);
  auto resolved = sc::Resolve(ls);
  if (!resolved.ok()) return annotate(resolved.status());
  Scenario out{std::move(ls), std::move(*resolved)};
  auto wl = LoadWorkloadOf(out);
  if (!wl.ok()) return annotate(wl.status());
  return out;
}

std::string LastLine(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  return last;
}

// Runs the points not already finished in their folders; errors list every
// failed point with its log.
absl::Status RunPoints(const std::vector<sc::PointSpec>& specs,
                       const std::vector<std::string>& dirs, int jobs, int* ran) {
  std::vector<std::vector<std::string>> args;
  std::vector<std::string> logs, names;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (sc::PointFinished(dirs[i], specs[i])) continue;
    RETURN_IF_ERROR(sc::PreparePoint(dirs[i], specs[i]));
    args.push_back(sc::RunArgs(specs[i], dirs[i]));
    logs.push_back(dirs[i] + "/run.log");
    names.push_back(dirs[i]);
  }
  *ran = static_cast<int>(args.size());
  if (args.empty()) return absl::OkStatus();
  size_t finished = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int> status =
      sc::RunProcesses(SelfBinary(), args, logs, jobs, [&](size_t i, int st) {
        ++finished;
        std::cerr << absl::StrFormat(
            "[%d/%d] %s %s (%.1f s)\n", finished, args.size(), names[i],
            st == 0 ? "done" : absl::StrCat("FAILED, exit ", st),
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      });
  std::vector<std::string> failed;
  for (size_t i = 0; i < status.size(); ++i) {
    if (status[i] != 0) {
      failed.push_back(absl::StrCat(names[i], " (exit ", status[i], "; ", logs[i], ": ",
                                    LastLine(logs[i]), ")"));
    }
  }
  if (!failed.empty()) {
    return absl::InternalError(absl::StrCat(failed.size(), " of ", args.size(),
                                            " runs failed: ", absl::StrJoin(failed, "; ")));
  }
  return absl::OkStatus();
}

absl::Status WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  if (!f) return absl::UnavailableError(absl::StrCat(path, ": cannot write"));
  return absl::OkStatus();
}

int Sweep(const Options& o) {
  const std::string out = std::filesystem::absolute(o.out.empty() ? "out/sweep" : o.out).string();
  const std::string scenario = std::filesystem::absolute(o.scenario).string();
  auto hash = sc::ScenarioHash(scenario);
  if (!hash.ok()) return Fail(hash.status());
  std::vector<sc::VaryAxis> axes;
  std::set<std::string> fields;
  for (const std::string& v : o.vary) {
    auto axis = sc::ParseVary(v);
    if (!axis.ok()) return UsageError(std::string(axis.status().message()));
    if (!fields.insert(axis->field).second) {
      return UsageError(absl::StrCat("--vary ", axis->field, " given twice; list all its values "
                                     "in one --vary"));
    }
    axes.push_back(*axis);
  }
  const std::vector<std::string> base = BaseOverrides(o);
  const std::vector<sc::SweepPoint> points = sc::ExpandPoints(axes);
  // Every point is checked before any runs.
  std::vector<sc::PointSpec> specs;
  std::vector<std::string> dirs;
  std::string list;
  for (const sc::SweepPoint& p : points) {
    if (auto checked = CheckPoint(scenario, base, p.vary); !checked.ok()) {
      return Fail(checked.status());
    }
    sc::PointSpec spec;
    spec.scenario = scenario;
    spec.scenario_hash = *hash;
    spec.overrides = base;
    for (const auto& [f, v] : p.vary) spec.overrides.push_back(absl::StrCat(f, "=", v));
    spec.index = p.index;
    spec.vary = p.vary;
    specs.push_back(std::move(spec));
    dirs.push_back(absl::StrCat(out, "/points/", p.name));
    absl::StrAppend(&list, p.name, "\n");
  }
  std::error_code ec;
  std::filesystem::create_directories(out + "/points", ec);
  if (ec) return Fail(absl::UnavailableError(absl::StrCat(out, ": cannot create: ", ec.message())));
  if (absl::Status st = WriteTextFile(out + "/points.txt", list); !st.ok()) return Fail(st);
  if (!o.emit_jobs.empty()) {
    std::string lines;
    for (size_t i = 0; i < specs.size(); ++i) {
      if (absl::Status st = sc::PreparePoint(dirs[i], specs[i]); !st.ok()) return Fail(st);
      std::string cmd = sc::ShellQuote(SelfBinary());
      for (const std::string& a : sc::RunArgs(specs[i], dirs[i])) {
        absl::StrAppend(&cmd, " ", sc::ShellQuote(a));
      }
      absl::StrAppend(&lines, cmd, " > ", sc::ShellQuote(dirs[i] + "/run.log"), " 2>&1\n");
    }
    if (absl::Status st = WriteTextFile(o.emit_jobs, lines); !st.ok()) return Fail(st);
    std::cout << "wrote " << specs.size() << " command lines to " << o.emit_jobs
              << "\nrun them (e.g. `parallel < " << o.emit_jobs
              << "`, or line $SLURM_ARRAY_TASK_ID of it per array task), then:\n  servesim merge "
              << out << "\n";
    return 0;
  }
  int ran = 0;
  const absl::Status st = RunPoints(specs, dirs, o.jobs, &ran);
  if (!st.ok()) return Fail(st);
  auto table = sc::MergePoints({out});
  if (!table.ok()) return Fail(table.status());
  if (absl::Status w = WriteTextFile(out + "/sweep.csv", sc::TableCsv(*table)); !w.ok()) {
    return Fail(w);
  }
  if (!o.quiet) std::cout << sc::TableText(*table);
  std::cout << absl::StrFormat("wrote %s/sweep.csv: %d points (%d run, %d already finished)\n",
                               out, specs.size(), ran, specs.size() - ran);
  return 0;
}

int Merge(const Options& o) {
  std::vector<std::string> dirs;
  for (const std::string& d : o.merge_dirs) dirs.push_back(std::filesystem::absolute(d).string());
  auto table = sc::MergePoints(dirs);
  if (!table.ok()) return Fail(table.status());
  const std::string out = o.out.empty() ? o.merge_dirs[0] : o.out;
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (absl::Status w = WriteTextFile(out + "/sweep.csv", sc::TableCsv(*table)); !w.ok()) {
    return Fail(w);
  }
  if (!o.quiet) std::cout << sc::TableText(*table);
  std::cout << absl::StrFormat("wrote %s/sweep.csv: %d points\n", out, table->rows.size());
  return 0;
}

int Plot(const Options& o) {
  std::ifstream in(o.scenario, std::ios::binary);
  if (!in) return Fail(absl::NotFoundError(absl::StrCat(o.scenario, ": cannot read")));
  std::stringstream text;
  text << in.rdbuf();
  auto svg = servesim::cluster::PlotCsv(text.str(), o.scenario, o.plot);
  if (!svg.ok()) return Fail(svg.status());
  std::string out = o.out;
  if (out.empty()) {
    out = absl::EndsWith(o.scenario, ".csv") ? o.scenario.substr(0, o.scenario.size() - 4)
                                            : o.scenario;
    out += ".svg";
  }
  std::ofstream f(out, std::ios::binary);
  f << *svg;
  if (!f.good()) return Fail(absl::InternalError(absl::StrCat(out, ": cannot write")));
  std::cerr << "wrote " << out << "\n";
  return 0;
}

int Search(const Options& o) {
  auto slo = sc::ParseSlo(o.slo);
  if (!slo.ok()) return UsageError(std::string(slo.status().message()));
  const std::string out = std::filesystem::absolute(o.out.empty() ? "out/search" : o.out).string();
  const std::string scenario = std::filesystem::absolute(o.scenario).string();
  auto hash = sc::ScenarioHash(scenario);
  if (!hash.ok()) return Fail(hash.status());
  std::vector<std::string> base = BaseOverrides(o);
  // The per-request SLO that slo_attainment counts (sweep.h).
  double ttft = 0, tpot = 0, tbt = 0;
  for (const sc::SloLimit& l : *slo) {
    double* slot = l.key == "ttft_s" ? &ttft : l.key == "tpot_s" ? &tpot : l.key == "tbt_s" ? &tbt : nullptr;
    if (slot != nullptr && (*slot == 0 || l.limit_s < *slot)) *slot = l.limit_s;
  }
  if (ttft > 0) base.push_back(absl::StrCat("slo.ttft_s=", sc::FormatValue(ttft)));
  if (tpot > 0 || tbt > 0) {
    base.push_back(absl::StrCat("slo.tpot_s=", sc::FormatValue(tpot > 0 ? tpot : tbt)));
  }
  // Probes need summary.json only.
  base.push_back("output.iterations_csv=false");
  base.push_back("output.timeline=false");
  auto checked = CheckPoint(scenario, base, {});
  if (!checked.ok()) return Fail(checked.status());
  const auto& w = checked->resolved.proto.workload();
  std::string field;
  double start = 0;
  if (o.vary_rate) {
    if (w.has_trace()) {
      field = "workload.rate_scale";
      start = w.has_rate_scale() ? w.rate_scale() : 1.0;
    } else if (w.has_poisson()) {
      field = "workload.poisson.rate_rps", start = w.poisson().rate_rps();
    } else if (w.has_gamma()) {
      field = "workload.gamma.rate_rps", start = w.gamma().rate_rps();
    } else if (w.has_constant()) {
      field = "workload.constant.rate_rps", start = w.constant().rate_rps();
    } else {
      return Fail(absl::InvalidArgumentError(
          "--vary-rate: the scenario's workload has no arrival rate (saturated: every request "
          "at t=0); expected a trace, poisson, gamma or constant workload"));
    }
  } else {
    field = "cluster.replicas";
    start = static_cast<double>(checked->resolved.replicas);
    if (o.max_replicas < checked->resolved.replicas) {
      return UsageError(absl::StrCat("--max-replicas ", o.max_replicas,
                                     " is below the scenario's cluster.replicas ",
                                     checked->resolved.replicas));
    }
  }
  const std::string short_field = field.substr(field.rfind('.') + 1);
  struct Probe {
    std::map<std::string, std::string> figures;
    bool pass = false;
    std::string reason;
  };
  std::map<double, Probe> probes;
  auto spec_of = [&](double v) {
    sc::PointSpec spec;
    spec.scenario = scenario;
    spec.scenario_hash = *hash;
    spec.overrides = base;
    spec.overrides.push_back(absl::StrCat(field, "=", sc::FormatValue(v)));
    spec.vary = {{field, sc::FormatValue(v)}};
    return spec;
  };
  auto dir_of = [&](double v) {
    return absl::StrCat(out, "/probes/", short_field, "-", sc::FormatValue(v));
  };
  sc::Evaluate evaluate =
      [&](const std::vector<double>& values) -> absl::StatusOr<std::vector<bool>> {
    std::vector<sc::PointSpec> specs;
    std::vector<std::string> dirs;
    for (double v : values) {
      ASSIGN_OR_RETURN(auto ok, CheckPoint(scenario, base, {{field, sc::FormatValue(v)}}));
      (void)ok;
      specs.push_back(spec_of(v));
      dirs.push_back(dir_of(v));
    }
    int ran = 0;
    RETURN_IF_ERROR(RunPoints(specs, dirs, o.jobs, &ran));
    std::vector<bool> pass;
    for (size_t i = 0; i < values.size(); ++i) {
      ASSIGN_OR_RETURN(auto figures, sc::ReadSummaryFigures(dirs[i]));
      Probe p;
      ASSIGN_OR_RETURN(p.pass, sc::ProbePasses(figures, *slo, o.attainment, &p.reason));
      p.figures = std::move(figures);
      pass.push_back(p.pass);
      probes[values[i]] = std::move(p);
    }
    return pass;
  };
  std::cout << absl::StrFormat("search: %s %s from %s (%s), SLO %s, attainment >= %g\n",
                               o.vary_rate ? "max" : "min", field, sc::FormatValue(start),
                               o.scenario, o.slo, o.attainment)
            << std::flush;
  auto result = o.vary_rate
                    ? sc::SearchMaxRate(start, o.tolerance, o.jobs, evaluate)
                    : sc::SearchMinReplicas(static_cast<int64_t>(start), o.max_replicas, o.jobs,
                                            evaluate);
  if (!result.ok()) return Fail(result.status());
  // The table: the sequential algorithm's probes, then the answer.
  std::vector<std::string> header = {"step", "phase", field, "pass"};
  for (const sc::SloLimit& l : *slo) header.push_back(absl::StrCat(l.name, "_s"));
  for (const char* k : {"slo_attainment", "goodput_requests_per_s", "throughput_tokens_per_s",
                        "requests", "completed"}) {
    header.push_back(k);
  }
  header.push_back("reason");
  sc::SweepTable table;
  table.header = header;
  auto row = [&](const std::string& step, const std::string& phase, double v) {
    const Probe& p = probes.at(v);
    std::vector<std::string> r = {step, phase, sc::FormatValue(v), p.pass ? "pass" : "fail"};
    for (const sc::SloLimit& l : *slo) r.push_back(p.figures.at(absl::StrCat(l.key, ".", l.field)));
    for (const char* k : {"slo_attainment", "goodput_requests_per_s", "throughput_tokens_per_s",
                          "requests", "requests_completed"}) {
      r.push_back(p.figures.at(k));
    }
    r.push_back(p.reason);
    table.rows.push_back(r);
  };
  for (size_t i = 0; i < result->path.size(); ++i) {
    row(absl::StrCat(i + 1), result->path[i].phase, result->path[i].value);
  }
  row("", "answer", result->answer);
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (absl::Status st = WriteTextFile(out + "/search.csv", sc::TableCsv(table)); !st.ok()) {
    return Fail(st);
  }
  std::cout << sc::TableText(table);
  const Probe& best = probes.at(result->answer);
  if (o.vary_rate) {
    std::cout << absl::StrFormat(
        "answer: max %s = %s (%.4g x the scenario's %s) meets the SLO; the next probe up, %s, "
        "does not (relative width %.3g <= tolerance %g)\n",
        field, sc::FormatValue(result->answer), result->answer / start, sc::FormatValue(start),
        sc::FormatValue(result->hi), (result->hi - result->lo) / result->lo, o.tolerance);
  } else {
    std::cout << absl::StrFormat("answer: min %s = %s meets the SLO%s\n", field,
                                 sc::FormatValue(result->answer),
                                 result->lo > 0
                                     ? absl::StrCat("; ", sc::FormatValue(result->lo), " does not")
                                     : std::string(" (the least possible)"));
  }
  std::cout << absl::StrFormat(
      "  at it: goodput %s requests/s, throughput %s tokens/s, slo_attainment %s\n"
      "  wrote %s/search.csv (probes in %s/probes/)\n",
      best.figures.at("goodput_requests_per_s"), best.figures.at("throughput_tokens_per_s"),
      best.figures.at("slo_attainment"), out, out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (int rc = ParseArgs(argc, argv, &o); rc != 0) return rc;
  if (o.command == "help") {
    std::cout << kUsage;
    return 0;
  }
  if (o.command == "run") return Run(o);
  if (o.command == "validate") return Validate(o);
  if (o.command == "presets") return Presets(o);
  if (o.command == "study") return Study(o);
  if (o.command == "sweep") return Sweep(o);
  if (o.command == "merge") return Merge(o);
  if (o.command == "search") return Search(o);
  if (o.command == "plot") return Plot(o);
  return UsageError(absl::StrCat("unknown command ", o.command));
}
