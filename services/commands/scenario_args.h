// What the commands that read a scenario share: the flags that change it
// (--set, --seed, --trace), the device agents' flags, and loading it
// through the scenario pipeline (scenario/scenario.h) with those applied.
#ifndef SERVESIM_SERVICES_COMMANDS_SCENARIO_ARGS_H_
#define SERVESIM_SERVICES_COMMANDS_SCENARIO_ARGS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "agents/client_options.h"
#include "scenario/scenario.h"
#include "services/commands/flags.h"
#include "workload/workload.h"

namespace servesim::services {

struct ScenarioArgs {
  std::string scenario;           // the file, as given
  std::vector<std::string> sets;  // --set path=value, in order
  bool has_seed = false;
  uint64_t seed = 0;
  std::string trace;  // --trace FILE (relative to the working folder)
  std::string profiles;  // --profiles DIR: cluster.profile.root (ditto)
  // Device agents (--agent KIND=..., TLS, token, deadline, lookahead).
  std::map<std::string, std::vector<std::string>> agents;
  agents::ClientOptions agent_client;
  std::string agent_token_file;
};

// The scenario file as the one positional argument, and --set, --seed,
// --trace and --profiles.
void AddScenarioFlags(FlagParser& flags, ScenarioArgs* args);
// --agent, --agent-tls-ca/-cert/-key, --agent-token-file, --agent-deadline,
// --agent-lookahead.
void AddAgentFlags(FlagParser& flags, ScenarioArgs* args);

// --cfg=NAME:VALUE and --log=SPEC, passed to SimGrid as given.
void AddSimGridFlags(FlagParser& flags, std::vector<std::string>* simgrid_args);

// The scenario as written (for error locations) and as resolved.
struct Scenario {
  scenario::LoadedScenario loaded;
  scenario::ResolvedScenario resolved;
};

// Loads the file, applies the flags, normalises and resolves.
absl::StatusOr<Scenario> LoadAndResolve(const ScenarioArgs& args);

// Reads the workload once to check every row and count its requests; keeps
// none of them (the run streams them again). Errors name the field's line.
absl::StatusOr<workload::Workload> ScanWorkloadOf(const Scenario& s);
absl::StatusOr<std::unique_ptr<workload::RequestStream>> OpenWorkloadOf(const Scenario& s);

// The token on the first line of `path` (a CR before the newline dropped),
// checked as the agents check theirs; errors name `flag` and the file.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path, const std::string& flag);

// Fields the scenario sets that its own settings ignore, each
// "FILE:LINE: FIELD ...why": workload.lengths or num_requests with a trace
// or the saturated source (not when --trace or --set changed the source:
// the file's lengths were for its own); long_prefill_token_threshold
// without VLLM_V1 batching; cuda_graph_max_tokens on a single rank; the
// timeline's knobs without a timeline; hash_block_tokens with a trace
// format other than Mooncake; collective tables for one-GPU replicas.
// `run` and sweeps refuse them, `validate` warns.
std::vector<std::string> InapplicableFields(const Scenario& s);

// The --set list a study's every run starts from: --set, then --seed,
// --trace and --profiles as the fields they set.
std::vector<std::string> BaseOverrides(const ScenarioArgs& args);

// Loads, overrides, normalises and resolves one point of a study, and
// scans its workload: every error a run of it would stop on. Errors of a
// varied field name "--vary field=value".
absl::StatusOr<Scenario> CheckPoint(const std::string& scenario,
                                    const std::vector<std::string>& base,
                                    const std::vector<std::pair<std::string, std::string>>& vary);

// Bytes as "%.2f GB", as validate and presets print them.
std::string FormatGb(double bytes);

// This program's own path (for child runs).
std::string SelfBinary();

}  // namespace servesim::services

#endif  // SERVESIM_SERVICES_COMMANDS_SCENARIO_ARGS_H_
