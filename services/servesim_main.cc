// servesim: the command-line front end. Parsing flags, calling into
// cluster/, printing; no model logic lives here.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
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
#include "cluster/report.h"
#include "cluster/scenario.h"
#include "cluster/simulation.h"
#include "cluster/study.h"
#include "devices/attacc/attacc_device.h"
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
  servesim presets [models|xpus|links|attacc|topick|spatten]
                                          list presets with their parameters
  servesim study attacc [--out DIR] [--trace FILE | --no-trace]
                                          the AttAcc paper's evaluation (§7):
                                          DGX_Base, DGX_Large, DGX+AttAccs x
                                          policies x models x lengths x SLOs,
                                          saturated, then the Azure trace
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

Device agents (servesim-agent; README "Device agents"):
  --agent KIND=HOST:PORT[,HOST:PORT...]
                        run every device of KIND (gpu, attacc, topick,
                        spatten) on these agents instead of in process
                        (repeatable, one per kind; replaces the scenario's
                        cluster.xpu_endpoints / attention_endpoints). Results
                        are byte-identical; call counts go to run_info.json
  --agent-tls-ca FILE   TLS to the agents: their certificates chain to FILE
  --agent-tls-cert FILE with --agent-tls-key: a client certificate (PEM)
  --agent-tls-key FILE
  --agent-token-file FILE
                        send 'authorization: Bearer <first line of FILE>'
  --agent-deadline S    per-call deadline, seconds (default 30)

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
      if (!get(&v) || !absl::SimpleAtod(v, &o->linger_s) || !(o->linger_s >= 0) ||
          !std::isfinite(o->linger_s)) {
        return UsageError("--linger needs wall seconds, >= 0");
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
          !(o->agent_client.deadline_s > 0) || !std::isfinite(o->agent_client.deadline_s)) {
        return UsageError("--agent-deadline needs seconds, > 0");
      }
    } else if (flag == "--quiet") {
      o->quiet = true;
    } else if (flag == "--no-trace") {
      o->no_trace = true;
    } else if (absl::StartsWith(a, "-")) {
      return UsageError(absl::StrCat("unknown option ", a));
    } else if (o->command == "presets" && o->presets_kind.empty()) {
      o->presets_kind = a;
    } else if (o->command == "study" && o->study.empty()) {
      o->study = a;
    } else if (o->scenario.empty() && o->command != "presets" && o->command != "study") {
      o->scenario = a;
    } else {
      return UsageError(absl::StrCat("unexpected argument ", a));
    }
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

absl::StatusOr<servesim::cluster::Workload> LoadWorkloadOf(const Scenario& s) {
  auto wl = servesim::cluster::LoadWorkload(s.resolved.proto.workload(), s.resolved.base_dir,
                                            "", s.resolved.seed);
  if (!wl.ok()) return servesim::cluster::AnnotateFieldError(s.loaded, wl.status());
  return wl;
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
      wl->requests.size());
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
        "\"memo_hit_rate\": %.6f, \"other_rpcs\": %d, \"retries\": %d, \"failovers\": %d, "
        "\"rebinds\": %d, \"session_rebuilds\": %d}",
        servesim::cluster::JsonString(d->label()), absl::StrJoin(eps, ", "), s.estimate_calls,
        s.estimate_rpcs, s.ops_memo_hits, s.ops_memo_misses,
        s.ops_memo_hits + s.ops_memo_misses > 0
            ? double(s.ops_memo_hits) / double(s.ops_memo_hits + s.ops_memo_misses)
            : 0.0,
        s.other_rpcs, s.retries, s.failovers, s.rebinds, s.session_rebuilds));
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
  run_options.simgrid_args = o.simgrid;
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
    mc.trace_s = wl->requests.empty() ? 0 : wl->requests.back().arrival_s;
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
      show_progress ? stderr : nullptr, static_cast<int64_t>(wl->requests.size()),
      wl->requests.empty() ? 0 : wl->requests.back().arrival_s);
  std::vector<servesim::cluster::LiveSink*> sinks;
  if (show_progress) sinks.push_back(&progress);
  if (live != nullptr) sinks.push_back(live.get());
  servesim::services::FanoutSink fanout(sinks);
  run_options.live = sinks.empty() ? nullptr : sinks.size() == 1 ? sinks[0] : &fanout;
  servesim::cluster::RunResult partial;
  run_options.partial = &partial;
  auto result = servesim::cluster::RunSimulation(*sc, *wl, run_options);
  if (server != nullptr && o.linger_s > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(o.linger_s));
  }
  servesim::cluster::RunInfo info;
  info.agents_json = AgentsJson(*sc);
  const std::string out = !o.out.empty() ? o.out : sc->proto.output().dir();
  if (!result.ok()) {
    // A run that started and then failed (e.g. no device agent left):
    // write what it measured, flagged partial, then report the error.
    if (partial.metrics != nullptr && !out.empty()) {
      servesim::cluster::Summary summary = servesim::cluster::ComputeSummary(
          *partial.metrics, sc->ttft_slo_s, sc->tpot_slo_s, sc->kv.blocks);
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
  servesim::cluster::Summary summary = servesim::cluster::ComputeSummary(
      *result->metrics, sc->ttft_slo_s, sc->tpot_slo_s, sc->kv.blocks);
  if (sc->attention_shared != nullptr) {
    // What the (shared) device measured over the run; wall-clock figures
    // stay out of the deterministic outputs.
    for (const auto& [k, v] : sc->attention_shared->Describe().parameters) {
      if (!absl::StrContains(k, "calibration_s")) summary.device_parameters.push_back({k, v});
    }
  }
  info.simulated_s = result->simulated_s;
  info.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  // The table first: if writing files fails, the results are still shown.
  if (!o.quiet) std::cout << FormatSummaryTable(*sc, *wl, summary, info) << std::flush;
  if (!out.empty()) {
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
      k != "topick" && k != "spatten") {
    return UsageError("presets takes models, xpus, links, attacc, topick or spatten");
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
  return UsageError(absl::StrCat("unknown command ", o.command));
}
