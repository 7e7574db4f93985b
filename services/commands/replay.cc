// `servesim replay RUN_DIR --out DIR`: simulate a measured vLLM run from its
// setup.json and trace.csv (studies/replay.h), write the usual outputs and
// the scenario it ran (DIR/scenario.pbtxt), and when the run has truth.csv
// compare: DIR/replay_compare.csv, the table on stdout, and two charts
// (DIR/replay_e2e.svg, DIR/replay_queue.svg). A folder holding an
// inference-perf run instead of a trace (its config and stage reports) is
// replayed stage by stage (replay_inference_perf.h).
#include "studies/replay.h"

#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/commands/commands.h"
#include "services/commands/replay_inference_perf.h"
#include "services/commands/run.h"

namespace servesim::services {

int FailStrict(const std::vector<std::string>& assumptions) {
  return Fail(absl::FailedPreconditionError(
      absl::StrCat("--strict: the replay would assume ", assumptions.size(), " thing",
                   assumptions.size() > 1 ? "s" : "",
                   " the run did not record: ", absl::StrJoin(assumptions, "; "))));
}

int ReplayCommand(const Args& args) {
  namespace fs = std::filesystem;
  RunFlags o;
  std::string run_dir;
  FlagParser flags;
  flags.Positional([&run_dir](const std::string& a) -> std::string {
    if (!run_dir.empty()) return absl::StrCat("unexpected argument ", a);
    run_dir = a;
    return "";
  });
  flags.Repeated("--set", &o.scenario.sets, "--set needs path=value");
  flags.String("--profiles", &o.scenario.profiles, "--profiles needs a folder");
  flags.String("--out", &o.out, "--out needs a folder");
  flags.Switch("--force", [&o] { o.force = true; });
  flags.Switch("--quiet", [&o] { o.quiet = true; });
  flags.Switch("--strict", [&o] { o.strict = true; });
  studies::ReplayOptions replay_options;
  flags.String("--workloads", &replay_options.workloads_dir, "--workloads needs a folder");
  if (auto exit = ParseFlags(flags, args)) return *exit;
  if (run_dir.empty()) {
    return UsageError(
        "replay needs a run folder (setup.json with trace.csv, or with an inference-perf "
        "config and its stage reports)");
  }
  if (o.out.empty()) return UsageError("replay needs --out DIR");
  // An inference-perf run: read before anything is written.
  auto inference_perf = studies::FindInferencePerfRun(run_dir);
  if (!inference_perf.ok()) return Fail(inference_perf.status());

  // The folder is locked and cleared of an earlier replay's files before
  // the workload and scenario are written into it; the measured run's
  // files are inputs, so a folder holding them is refused.
  reports::OutputDir::Options options;
  options.also_clear = {"scenario.pbtxt",     "workload.jsonl", "trace.csv",
                        "replay_compare.csv", "replay_e2e.svg", "replay_queue.svg",
                        "replay_stages.csv"};
  for (const char* name : {"setup.json", "trace.csv", "truth.csv", "timeseries.csv", "config.yml",
                           "config.yaml", "profile.yaml", "stage_0_lifecycle_metrics.json"}) {
    options.inputs.push_back((fs::path(run_dir) / name).string());
  }
  if (*inference_perf) {
    for (const auto& r : (*inference_perf)->reports) options.inputs.push_back(r.path);
  }
  auto dir =
      AcquireOutputs(o.out, absl::StrCat("servesim replay ", run_dir), o.force, std::move(options));
  if (!dir.ok()) return Fail(dir.status());
  o.output_dir = dir->get();
  if (*inference_perf) {
    return ReplayInferencePerf(run_dir, std::move(**inference_perf), o, **dir, replay_options);
  }
  // The measurement is checked before anything is written, so that a bad
  // truth.csv fails with the folder as it was.
  if (const std::string truth = (fs::path(run_dir) / "truth.csv").string();
      fs::is_regular_file(truth)) {
    if (absl::Status st = studies::CheckTruth(truth, (fs::path(run_dir) / "trace.csv").string());
        !st.ok()) {
      return Fail(st);
    }
  }
  auto setup = studies::PrepareReplay(run_dir, o.out, o.scenario.sets, replay_options);
  if (!setup.ok()) return Fail(setup.status());
  if (o.strict && !setup->assumptions.empty()) return FailStrict(setup->assumptions);
  if (absl::Status st = (*dir)->Write("scenario.pbtxt", setup->scenario_text); !st.ok()) {
    return Fail(st);
  }
  o.scenario.scenario = (*dir)->Path("scenario.pbtxt");
  o.fallbacks = setup->assumptions;
  if (const int rc = RunWithFlags(o); rc != 0) return rc;
  if (setup->truth_path.empty()) {
    if (!o.quiet) std::cout << "  (no truth.csv in " << run_dir << ": nothing to compare)\n";
    return 0;
  }
  const std::string requests = (fs::path(o.out) / "requests.csv").string();
  auto rows = studies::CompareWithTruth(setup->truth_path,
                                        (fs::path(run_dir) / "trace.csv").string(), requests);
  if (!rows.ok()) return Fail(rows.status());
  if (absl::Status st = (*dir)->Write("replay_compare.csv", studies::CompareCsv(*rows)); !st.ok()) {
    return Fail(st);
  }
  auto e2e = studies::E2eScatterSvg(setup->truth_path, requests);
  if (!e2e.ok()) return Fail(e2e.status());
  if (absl::Status st = (*dir)->Write("replay_e2e.svg", *e2e); !st.ok()) {
    return Fail(st);
  }
  if (!setup->timeseries_path.empty()) {
    auto queue = studies::QueueOverTimeSvg((fs::path(o.out) / "iterations.csv").string(),
                                           setup->timeseries_path);
    if (!queue.ok()) return Fail(queue.status());
    if (absl::Status st = (*dir)->Write("replay_queue.svg", *queue); !st.ok()) {
      return Fail(st);
    }
  }
  if (!o.quiet) {
    std::cout << "\n  measured vs simulated (" << o.out << "/replay_compare.csv)\n"
              << studies::CompareTable(*rows) << std::flush;
  }
  return 0;
}

}  // namespace servesim::services
