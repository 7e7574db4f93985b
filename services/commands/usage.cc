// The text of `servesim --help`, and of `servesim COMMAND --help` (that
// command's entry and the option sections it takes).
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "services/commands/commands.h"

namespace servesim::services {
namespace {

constexpr char kUsage[] = R"(servesim - discrete-event simulator of LLM serving clusters

Usage:
  servesim run SCENARIO.pbtxt [options]   simulate and print the summary table
  servesim validate SCENARIO.pbtxt [--set path=value ...]
                                          parse and check; print the resolved
                                          scenario and the replica memory plan
  servesim presets [models|xpus|links|nodes|collectives|attacc|topick|spatten|cta|lad]
                                          list presets with their parameters
  servesim study attacc [--out DIR] [--trace FILE | --no-trace]
                        [--rules authors|servesim]
                                          the AttAcc paper's evaluation (§7):
                                          DGX_Base, DGX_Large, DGX+AttAccs x
                                          policies x models x lengths x SLOs,
                                          saturated, then the Azure trace;
                                          batches and pipelining as the
                                          authors' simulator counts them
                                          (default) or as servesim does
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
  servesim replay RUN_DIR --out DIR [--profiles DIR] [--set ...]
                 [--workloads DIR] [--strict]
                                          replay a measured vLLM run (a
                                          folder with setup.json, trace.csv,
                                          optional truth.csv): the usual
                                          outputs plus replay_compare.csv
                                          and two SVGs; or an inference-perf
                                          run (its config and stage reports):
                                          replay_stages.csv (docs/fidelity.md).
                                          --workloads: where else setup.json's
                                          token-id file may be; --strict: any
                                          assumption is an error
  servesim calibrate PROFILE_DIR [--xpu PRESET] [--out FILE]
                                          fit the roofline's efficiencies to
                                          a profile bundle's tp<N> folder;
                                          print the fit error per op class
  servesim help | --help                  this text
  servesim --version                      version, git revision, build type

Options of run (validate takes --set, --seed, --trace and --profiles too):
  --out DIR             write summary.json, run_info.json, requests.csv,
                        iterations.csv, timeline.json and report.html into
                        DIR (overrides output.dir). DIR is locked for the run
                        (a second run into it fails at once) and an earlier
                        run's outputs there are removed first. A folder
                        that holds anything and that servesim did not write
                        (no .servesim.lock) is refused, as is one that holds
                        the scenario, trace or platform file
  --force               take a folder servesim did not write: only
                        servesim's file names there are replaced (listed on
                        stderr first); run, replay, sweep, search, merge and
                        study take it
  --seed N              master seed (overrides the scenario's seed)
  --trace FILE          replay FILE instead of the scenario's workload source
                        (format inferred from its name and header)
  --profiles DIR        measured GPU profiles' root (cluster.profile.root):
                        the xPU's costs come from the bundle
                        DIR/<gpu>/<org>/<model>/<dtype>/tp<N> (docs/profiles.md)
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
                        table and the outputs are written (^C ends it)
  --progress WHEN       auto (default: on a terminal, unless --quiet), always
                        (also into logs: a line every 10 s; the engines then
                        report every step, slower, results identical) or never
  --web-dir DIR         the dashboard's files (default: dashboards/web)
  --metrics-token-file FILE
                        /metrics answers only requests with the token on
                        FILE's first line (Authorization: Bearer TOKEN);
                        open the page as http://HOST:PORT/#token=TOKEN
  --cfg=NAME:VALUE      passed to SimGrid (e.g. --cfg=network/model:CM02)
  --log=SPEC            passed to SimGrid's logging
                        (SERVESIM_SIMGRID_ARGS, space-separated, come first)
  --log-level LEVEL     any command: gRPC's and SimGrid's own log lines, at
                        quiet (default), error, warning, info or debug

Studies (docs/studies.md):
  -j N                  child runs at once, 1 to the cores available (default:
                        the cores available); results do not depend on it
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

Device agents (servesim-agent; docs/agents.md):
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
  --agent-retry-s S     when no agent of a kind answers, keep trying them all,
                        with backoff, for S seconds (default 10) before the run
                        stops: an agent restarted within S is picked up
  --agent-lookahead N   cap on the decode steps an Estimate call asks ahead
                        (a miss asks 8, a prefetch 16; 0..256, default 64;
                        0: none). Fewer round trips, same results

Scenario files are protobuf text (schema: proto/servesim/v1/scenario.proto;
examples: examples/*.pbtxt). Relative trace paths are resolved against the
scenario file's folder. Exit status: 0 success, 1 bad input or failed run,
2 bad command line, 3 a run that served no request (latencies undefined),
130 / 143 a run stopped by SIGINT / SIGTERM (partial outputs written).
)";

// kUsage's parts: the title, each command's entry under "Usage:", the
// option sections (a line without indentation ending in ":"), the footer
// (the paragraph after the last section).
struct UsageParts {
  std::string title;
  std::vector<std::string> entries;
  std::vector<std::string> sections;
  std::string footer;
};

UsageParts SplitUsage() {
  UsageParts p;
  std::vector<std::string> lines = absl::StrSplit(kUsage, '\n');
  size_t i = 0;
  for (; i < lines.size() && lines[i] != "Usage:"; ++i) absl::StrAppend(&p.title, lines[i], "\n");
  for (++i; i < lines.size() && !lines[i].empty(); ++i) {
    if (absl::StartsWith(lines[i], "  servesim ")) p.entries.emplace_back();
    if (!p.entries.empty()) absl::StrAppend(&p.entries.back(), lines[i], "\n");
  }
  for (; i < lines.size(); ++i) {
    if (lines[i].empty()) continue;
    if (absl::EndsWith(lines[i], ":") && lines[i][0] != ' ') {
      p.sections.push_back(lines[i] + "\n");
    } else if (lines[i][0] != ' ' && !absl::EndsWith(lines[i], ":")) {
      for (; i < lines.size(); ++i) absl::StrAppend(&p.footer, lines[i], "\n");
      break;
    } else if (!p.sections.empty()) {
      absl::StrAppend(&p.sections.back(), lines[i], "\n");
    }
  }
  return p;
}

}  // namespace

int PrintUsage(const std::string& command) {
  if (command.empty()) {
    std::cout << kUsage;
    return kExitOk;
  }
  const UsageParts p = SplitUsage();
  std::string entry;
  for (const std::string& e : p.entries) {
    if (absl::StartsWith(e, absl::StrCat("  servesim ", command, " ")) ||
        absl::StartsWith(e, absl::StrCat("  servesim ", command, "\n"))) {
      entry += e;
    }
  }
  if (entry.empty()) return UsageError(absl::StrCat("no help for ", command, ": unknown command"));
  // The option sections each command takes.
  const bool runs = command == "run" || command == "validate" || command == "replay" ||
                    command == "sweep" || command == "search";
  const bool studies =
      command == "sweep" || command == "search" || command == "merge" || command == "study";
  const bool agents = command == "run" || command == "validate";
  std::cout << p.title << "Usage:\n" << entry;
  for (const std::string& s : p.sections) {
    if ((runs && absl::StartsWith(s, "Options of run")) ||
        (studies && absl::StartsWith(s, "Studies")) ||
        (agents && absl::StartsWith(s, "Device agents"))) {
      std::cout << "\n" << s;
    }
  }
  std::cout << "\n" << p.footer;
  return kExitOk;
}

}  // namespace servesim::services

namespace servesim::services {

std::optional<int> ParseFlags(FlagParser& flags, const Args& args) {
  switch (flags.Parse(args)) {
    case FlagParser::Result::kOk:
      return std::nullopt;
    case FlagParser::Result::kHelp:
      return PrintUsage();
    case FlagParser::Result::kError:
      break;
  }
  return kExitUsage;
}

}  // namespace servesim::services
