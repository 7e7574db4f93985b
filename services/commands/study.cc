// `servesim study attacc`: the AttAcc paper's evaluation (studies/attacc_study.h).
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "services/commands/commands.h"
#include "services/commands/run.h"
#include "services/commands/scenario_args.h"
#include "studies/attacc_study.h"

namespace servesim::services {

int StudyCommand(const Args& args) {
  std::string study, out_flag, trace_flag;
  bool no_trace = false, force = false;
  FlagParser flags;
  flags.Positional([&study](const std::string& a) -> std::string {
    if (!study.empty()) return "unexpected argument " + a;
    study = a;
    return "";
  });
  flags.String("--out", &out_flag, "--out needs a folder");
  flags.String("--trace", &trace_flag, "--trace needs a file");
  flags.Switch("--no-trace", [&no_trace] { no_trace = true; });
  flags.Switch("--force", [&force] { force = true; });
  std::string rules = "authors";
  flags.String("--rules", &rules, "--rules needs authors or servesim");
  if (auto exit = ParseFlags(flags, args)) return *exit;
  if (study != "attacc") return UsageError("study takes one study name: attacc");
  if (rules != "authors" && rules != "servesim") {
    return UsageError("--rules takes authors (the AttAcc simulator's batch count and pipelining "
                      "rule, the default) or servesim (its own)");
  }
  // The folder is checked and held before the study's minutes of work.
  const std::string out = out_flag.empty() ? "out/attacc_study" : out_flag;
  reports::OutputDir::Options claim;
  claim.run_outputs = false;
  claim.also_clear = {"attacc_study.csv", "attacc_trace.csv"};
  claim.inputs = {trace_flag};
  auto claimed = AcquireOutputs(out, "servesim study attacc", force, claim);
  if (!claimed.ok()) return Fail(claimed.status());
  studies::StudyOptions options;
  options.authors_rules = rules == "authors";
  auto points = studies::RunAttAccStudy(options);
  if (!points.ok()) return Fail(points.status());
  std::cout << "AttAcc study, saturated (decode stages; speedups over DGX_Base / DGX_Large "
               "at the same model, lengths and SLO; e2e xB: whole requests, prefill included, "
               "over DGX_Base)\n"
            << studies::StudyTable(*points) << std::flush;
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  {
    std::ofstream f(out + "/attacc_study.csv");
    f << studies::StudyCsv(*points);
    if (!f) return Fail(absl::UnavailableError(out + "/attacc_study.csv: cannot write"));
  }
  std::cout << "  wrote " << out << "/attacc_study.csv\n";
  if (no_trace) return 0;
  const std::string trace =
      trace_flag.empty() ? "examples/traces/AzureLLMInferenceTrace_conv.csv" : trace_flag;
  if (!std::filesystem::exists(trace)) {
    return Fail(absl::NotFoundError(
        absl::StrCat(trace,
                     ": trace not found (run from the repository root, pass --trace FILE, or "
                     "--no-trace)")));
  }
  std::filesystem::create_directories(out + "/trace_runs", ec);
  std::cout << "\nAttAcc study, Azure conversation trace (" << trace << ")\n" << std::flush;
  auto rows = studies::RunAttAccTraceStudy(
      options, std::filesystem::read_symlink("/proc/self/exe").string(),
      std::filesystem::absolute(trace).string(), out + "/trace_runs");
  if (!rows.ok()) return Fail(rows.status());
  std::cout << studies::TraceStudyTable(*rows);
  {
    std::ofstream f(out + "/attacc_trace.csv");
    f << studies::TraceStudyCsv(*rows);
  }
  std::cout << "  wrote " << out << "/attacc_trace.csv\n";
  return 0;
}

}  // namespace servesim::services
