#include "services/commands/scenario_args.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agents/client_options.h"
#include "common/read_text.h"
#include "common/status_macros.h"
#include "devices/registry.h"

namespace servesim::services {

void AddScenarioFlags(FlagParser& flags, ScenarioArgs* args) {
  flags.Positional([args](const std::string& a) -> std::string {
    if (!args->scenario.empty()) return absl::StrCat("unexpected argument ", a);
    args->scenario = a;
    return "";
  });
  flags.Repeated("--set", &args->sets, "--set needs path=value");
  flags.Value("--seed", "--seed needs a non-negative integer",
              [args](const std::string& v) -> std::string {
                if (!absl::SimpleAtoi(v, &args->seed)) return "--seed needs a non-negative integer";
                args->has_seed = true;
                return "";
              });
  flags.String("--trace", &args->trace, "--trace needs a file");
  flags.String("--profiles", &args->profiles, "--profiles needs a folder");
}

void AddAgentFlags(FlagParser& flags, ScenarioArgs* args) {
  flags.Value("--agent", "--agent needs KIND=HOST:PORT[,HOST:PORT...]",
              [args](const std::string& v) -> std::string {
                const size_t k = v.find('=');
                if (k == std::string::npos || k == 0 || k + 1 == v.size()) {
                  return absl::StrCat("--agent ", v, ": expected KIND=HOST:PORT[,HOST:PORT...]");
                }
                const std::string kind = v.substr(0, k);
                const auto kinds = devices::RegisteredDeviceKinds();
                if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) {
                  return absl::StrCat("--agent ", v, ": unknown device kind '", kind,
                                      "'; registered: ", absl::StrJoin(kinds, ", "));
                }
                if (args->agents.count(kind) != 0) {
                  return absl::StrCat("--agent ", kind,
                                      "=... given twice; list every endpoint of a kind in one "
                                      "flag, comma-separated");
                }
                std::vector<std::string> eps =
                    absl::StrSplit(v.substr(k + 1), ',', absl::SkipEmpty());
                for (const std::string& e : eps) {
                  const size_t colon = e.rfind(':');
                  int port = -1;
                  if (colon == std::string::npos || colon == 0 ||
                      !absl::SimpleAtoi(e.substr(colon + 1), &port) || port < 1 || port > 65535) {
                    return absl::StrCat("--agent ", v, ": endpoint '", e,
                                        "'; expected HOST:PORT with PORT in [1, 65535]");
                  }
                }
                args->agents[kind] = std::move(eps);
                return "";
              });
  flags.String("--agent-tls-ca", &args->agent_client.tls_ca_file, "--agent-tls-ca needs a file");
  flags.String("--agent-tls-cert", &args->agent_client.tls_cert_file,
               "--agent-tls-cert needs a file");
  flags.String("--agent-tls-key", &args->agent_client.tls_key_file, "--agent-tls-key needs a file");
  flags.String("--agent-token-file", &args->agent_token_file, "--agent-token-file needs a file");
  flags.Value("--agent-deadline", "--agent-deadline needs seconds in (0, 86400]",
              [args](const std::string& v) -> std::string {
                double& d = args->agent_client.deadline_s;
                if (!absl::SimpleAtod(v, &d) || !(d > 0 && d <= 86400)) {
                  return "--agent-deadline needs seconds in (0, 86400]";
                }
                return "";
              });
  flags.Value("--agent-retry-s", "--agent-retry-s needs seconds in [0, 86400]",
              [args](const std::string& v) -> std::string {
                double& d = args->agent_client.retry_s;
                if (!absl::SimpleAtod(v, &d) || !(d >= 0 && d <= 86400)) {
                  return "--agent-retry-s needs seconds in [0, 86400]";
                }
                return "";
              });
  flags.Value("--agent-lookahead", "--agent-lookahead needs a number of steps, 0..256",
              [args](const std::string& v) -> std::string {
                int& n = args->agent_client.lookahead_max;
                if (!absl::SimpleAtoi(v, &n) || n < 0 || n > 256) {
                  return "--agent-lookahead needs a number of steps, 0..256";
                }
                return "";
              });
}

void AddSimGridFlags(FlagParser& flags, std::vector<std::string>* simgrid_args) {
  for (const char* name : {"--cfg", "--log"}) {
    const std::string flag = name;
    flags.Inline(flag, flag + " takes --cfg=NAME:VALUE form",
                 [flag, simgrid_args](const std::string& v) {
                   simgrid_args->push_back(flag + "=" + v);
                   return std::string();
                 });
  }
}

absl::StatusOr<Scenario> LoadAndResolve(const ScenarioArgs& a) {
  ASSIGN_OR_RETURN(scenario::LoadedScenario sc, scenario::LoadScenarioFile(a.scenario));
  for (const std::string& s : a.sets) RETURN_IF_ERROR(scenario::ApplyOverride(&sc, s));
  if (a.has_seed) {
    sc.proto.set_seed(a.seed);
    sc.overridden.insert("seed");
  }
  if (!a.trace.empty()) {
    // --trace paths are relative to the working folder, not the scenario.
    auto* t = sc.proto.mutable_workload()->mutable_trace();
    t->set_path(std::filesystem::absolute(a.trace).string());
    sc.overridden.insert("workload.trace.path");
  }
  if (!a.profiles.empty()) {
    sc.proto.mutable_cluster()->mutable_profile()->set_root(
        std::filesystem::absolute(a.profiles).string());
    sc.overridden.insert("cluster.profile.root");
  }
  sc.agent_endpoints = a.agents;
  sc.agent_client = a.agent_client;
  if (!a.agent_token_file.empty()) {
    ASSIGN_OR_RETURN(sc.agent_client.token,
                     ReadTokenFile(a.agent_token_file, "--agent-token-file"));
  }
  RETURN_IF_ERROR(scenario::Normalize(&sc));
  ASSIGN_OR_RETURN(auto resolved, scenario::Resolve(sc));
  return Scenario{std::move(sc), std::move(resolved)};
}

absl::StatusOr<workload::Workload> ScanWorkloadOf(const Scenario& s) {
  auto wl =
      workload::ScanWorkload(s.resolved.proto.workload(), s.resolved.base_dir, "", s.resolved.seed);
  if (!wl.ok()) return scenario::AnnotateFieldError(s.loaded, wl.status());
  return wl;
}

absl::StatusOr<std::unique_ptr<workload::RequestStream>> OpenWorkloadOf(const Scenario& s) {
  auto stream = workload::OpenWorkload(s.resolved.proto.workload(), s.resolved.base_dir, "",
                                       s.resolved.seed, s.resolved.prefix_block_tokens());
  if (!stream.ok()) return scenario::AnnotateFieldError(s.loaded, stream.status());
  return stream;
}

std::vector<std::string> BaseOverrides(const ScenarioArgs& a) {
  std::vector<std::string> sets = a.sets;
  if (a.has_seed) sets.push_back(absl::StrCat("seed=", a.seed));
  if (!a.trace.empty()) {
    sets.push_back(
        absl::StrCat("workload.trace.path=", std::filesystem::absolute(a.trace).string()));
  }
  if (!a.profiles.empty()) {
    sets.push_back(absl::StrCat("cluster.profile.root=",
                                std::filesystem::absolute(a.profiles).string()));
  }
  return sets;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path, const std::string& flag) {
  auto text = ReadTextFile(path, 64 << 10, "a token file (the token on its first line)");
  if (!text.ok()) {
    return absl::Status(text.status().code(), absl::StrCat(flag, " ", text.status().message()));
  }
  std::string token = text->substr(0, text->find('\n'));
  if (absl::EndsWith(token, "\r")) token.pop_back();
  RETURN_IF_ERROR(agents::CheckToken(token, absl::StrCat(flag, " ", path, " (first line)")));
  return token;
}

namespace {

// Fields outside the workload that the scenario writes and its own
// settings make ignored: each applies under a condition this scenario does
// not meet. A condition changed by --set (say output.timeline=false for a
// quick run) makes the file's own fields for it moot, not wrong: those are
// not listed (a field --set gives is).
std::vector<std::string> InapplicableSettings(const Scenario& s) {
  const scenario::LoadedScenario& ls = s.loaded;
  const scenario::ResolvedScenario& rs = s.resolved;
  std::vector<std::string> out;
  const auto by_flag = [&ls](absl::string_view path) {
    for (const std::string& o : ls.overridden) {
      if (o == path ||
          (absl::StartsWith(o, path) && o.size() > path.size() && o[path.size()] == '.')) {
        return true;
      }
    }
    return false;
  };
  // `field` is listed when written, the scenario does not meet its
  // condition, and either the field came from --set or none of the
  // settings deciding the condition did.
  const auto check = [&](const char* field, bool applies,
                         std::initializer_list<const char*> deciders, const std::string& why) {
    if (applies || !ls.Written(field)) return;
    if (!by_flag(field)) {
      for (const char* d : deciders) {
        if (by_flag(d)) return;
      }
    }
    out.push_back(absl::StrCat(ls.Where(field), ": ", field, " ", why));
  };
  // The colocated scheduler's knobs (a disaggregated cluster's pools have
  // their own scheduler blocks, resolved per pool).
  if (!rs.disaggregated()) {
    // A 0 (the default: no cap, eager) is harmless anywhere.
    const auto& sched = rs.proto.scheduler();
    check("scheduler.long_prefill_token_threshold",
          sched.long_prefill_token_threshold() == 0 ||
              rs.batching.policy == scheduler::BatchingPolicy::kVllmV1,
          {"scheduler.batching"},
          "applies to VLLM_V1 batching only (vLLM's v1 scheduler caps each prompt's chunk with "
          "it); this scenario batches otherwise");
    check("scheduler.cuda_graph_max_tokens",
          sched.cuda_graph_max_tokens() == 0 || rs.data_parallel > 1, {"cluster.data_parallel"},
          "applies to data-parallel MoE ranks only (cluster.data_parallel > 1, whose steps vLLM "
          "pads to a captured size); this replica is one rank");
  }
  // The timeline's knobs without a timeline.
  for (const char* field :
       {"output.timeline_every", "output.timeline_max_iterations", "output.timeline_start_s",
        "output.timeline_end_s", "output.timeline_layers"}) {
    check(field, rs.proto.output().timeline(), {"output.timeline"},
          "shapes the timeline, and output.timeline is false");
  }
  // Mooncake's unit size with another trace format named.
  const auto format = rs.proto.workload().trace().format();
  check("workload.trace.hash_block_tokens",
        format == servesim::v1::TRACE_FORMAT_UNSPECIFIED ||
            format == servesim::v1::TRACE_FORMAT_MOONCAKE,
        {"workload.trace"},
        absl::StrCat("applies to Mooncake traces (their hash_ids) only; this trace is ",
                     servesim::v1::TraceFormat_Name(format)));
  // Collective tables for replicas that run no collective.
  const bool collectives = rs.disaggregated() || rs.tensor_parallel > 1 || rs.data_parallel > 1 ||
                           rs.pipeline_parallel > 1;
  for (const char* field : {"cluster.collectives", "cluster.internode_collectives"}) {
    check(field, collectives,
          {"cluster.tensor_parallel", "cluster.data_parallel", "cluster.pipeline_parallel"},
          "costs collectives, and each replica is one GPU (none run)");
  }
  return out;
}

}  // namespace

std::vector<std::string> InapplicableFields(const Scenario& s) {
  std::vector<std::string> out = InapplicableSettings(s);
  const scenario::LoadedScenario& ls = s.loaded;
  const auto& w = ls.proto.workload();
  for (const std::string& o : ls.overridden) {
    if (absl::StartsWith(o, "workload.") && o != "workload.lengths" &&
        !absl::StartsWith(o, "workload.lengths.") && o != "workload.num_requests" &&
        !absl::StartsWith(o, "workload.window_") && o != "workload.max_requests" &&
        o != "workload.rate_scale" && o != "workload.repeat" && o != "workload.max_in_flight") {
      return out;  // the source came from the command line
    }
  }
  std::string source, instead_n, instead_len;
  if (w.has_trace()) {
    source = "reads a trace";
    instead_n = "workload.max_requests caps a trace";
    instead_len = "the trace gives each request's lengths";
  } else if (w.has_saturated()) {
    source = "is the saturated source";
    instead_n = "set workload.saturated.num_requests";
    instead_len = "set workload.saturated.input_tokens and output_tokens";
  } else {
    return out;
  }
  if (w.has_lengths()) {
    out.push_back(absl::StrCat(ls.Where("workload.lengths"),
                               ": workload.lengths applies to synthetic arrivals only (poisson, "
                               "gamma, constant); this workload ",
                               source, ": ", instead_len));
  }
  if (w.has_num_requests()) {
    out.push_back(absl::StrCat(ls.Where("workload.num_requests"),
                               ": workload.num_requests applies to synthetic arrivals only "
                               "(poisson, gamma, constant); this workload ",
                               source, ": ", instead_n));
  }
  return out;
}

absl::StatusOr<Scenario> CheckPoint(const std::string& scenario_path,
                                    const std::vector<std::string>& base,
                                    const std::vector<std::pair<std::string, std::string>>& vary) {
  ASSIGN_OR_RETURN(scenario::LoadedScenario ls, scenario::LoadScenarioFile(scenario_path));
  for (const std::string& s : base) RETURN_IF_ERROR(scenario::ApplyOverride(&ls, s));
  for (const auto& [field, value] : vary) {
    const absl::Status st = scenario::ApplyOverride(&ls, absl::StrCat(field, "=", value));
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
    return absl::Status(st.code(),
                        absl::StrCat("--vary ", absl::StrJoin(v, " "), ": ", st.message()));
  };
  if (absl::Status st = scenario::Normalize(&ls); !st.ok()) return annotate(st);
  auto resolved = scenario::Resolve(ls);
  if (!resolved.ok()) return annotate(resolved.status());
  Scenario out{std::move(ls), std::move(*resolved)};
  if (const std::vector<std::string> ignored = InapplicableFields(out); !ignored.empty()) {
    return annotate(absl::InvalidArgumentError(absl::StrJoin(ignored, "; ")));
  }
  auto wl = ScanWorkloadOf(out);
  if (!wl.ok()) return annotate(wl.status());
  return out;
}

std::string FormatGb(double bytes) { return absl::StrFormat("%.2f GB", bytes / 1e9); }

std::string SelfBinary() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

}  // namespace servesim::services
