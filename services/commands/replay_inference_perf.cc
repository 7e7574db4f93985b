// `servesim replay RUN_DIR` for an inference-perf run (studies/inference_perf.h):
// the requests its config sends, each stage placed after the simulated
// drain of the one before, compared stage by stage with its reports.
//
// A stage starts when the last request of the one before has finished,
// which only the simulation knows. The stages before a stage decide its
// requests' fate alone (the engine is idle between stages, and a run
// shifted in time is the same run shifted), so: provisional runs (child
// processes: SimGrid allows one engine per process) with each stage placed
// generously late, until every stage drained before the next began; then
// the run itself, in process, with each stage at its drain + interval + 1 s.
#include "services/commands/replay_inference_perf.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "services/commands/commands.h"
#include "studies/processes.h"
#include "studies/replay.h"

namespace servesim::services {
namespace {

namespace fs = std::filesystem;

// The scenario's seed as --set gives it; 1 (the scenario default) else.
uint64_t SeedOf(const std::vector<std::string>& sets) {
  uint64_t seed = 1;
  for (const std::string& s : sets) {
    absl::string_view v(s);
    if (absl::ConsumePrefix(&v, "seed=")) (void)absl::SimpleAtoi(v, &seed);
  }
  return seed;
}

// Each stage's last send, from its start.
std::vector<double> LastOffsets(const std::vector<studies::PlannedRequest>& plan, size_t stages) {
  std::vector<double> last(stages, 0.0);
  for (const auto& r : plan) {
    last[static_cast<size_t>(r.stage)] = std::max(last[static_cast<size_t>(r.stage)], r.offset_s);
  }
  return last;
}

// The first provisional starts: each stage its sends and as long again
// to drain after the one before.
std::vector<double> FirstStarts(const studies::InferencePerfConfig& config,
                                const std::vector<studies::PlannedRequest>& plan) {
  const size_t stages = config.stages.size();
  const std::vector<double> last = LastOffsets(plan, stages);
  std::vector<double> starts(stages, 0.0);
  for (size_t k = 1; k < stages; ++k) {
    starts[k] =
        starts[k - 1] + config.interval_s + 1.0 + last[k - 1] + config.stages[k - 1].duration_s;
  }
  return starts;
}

// One provisional run (a child process: SimGrid allows one engine per
// process) of the scenario with the stages at `starts`: each stage's drain.
absl::StatusOr<std::vector<double>> ProvisionalDrains(
    const RunFlags& o, const reports::OutputDir& dir,
    const std::vector<studies::PlannedRequest>& plan, const std::vector<double>& starts) {
  RETURN_IF_ERROR(dir.Write("trace.csv", studies::StagedTraceCsv(plan, starts)));
  const std::string pass_dir = dir.Path(".inference_perf_pass");
  const std::string log = dir.Path(".inference_perf_pass.log");
  std::error_code ec;
  fs::remove_all(pass_dir, ec);
  std::vector<std::string> args = {"run",
                                   o.scenario.scenario,
                                   "--out",
                                   pass_dir,
                                   "--quiet",
                                   "--set",
                                   "output.timeline=false",
                                   "--set",
                                   "output.report_html=false",
                                   "--set",
                                   "output.iterations_csv=false"};
  for (const std::string& s : o.scenario.sets) args.insert(args.end(), {"--set", s});
  if (!o.scenario.profiles.empty()) args.insert(args.end(), {"--profiles", o.scenario.profiles});
  const std::vector<int> status = studies::RunForked(
      [](const std::vector<std::string>& a) { return RunCommand(Args(a.begin() + 1, a.end())); },
      {args}, {log}, 1, [](size_t, int) {});
  if (studies::StoppedBySignal() != 0) {
    fs::remove_all(pass_dir, ec);
    return absl::CancelledError(
        absl::StrCat("interrupted during a provisional run; ", o.out, " holds no results"));
  }
  if (status[0] != 0 && status[0] != kExitNothingServed) {
    return absl::InternalError(absl::StrCat(
        "the provisional run that places the stages failed (exit ", status[0], "; ", log, ")"));
  }
  auto drains = studies::StageDrains(plan, static_cast<int>(starts.size()),
                                     (fs::path(pass_dir) / "requests.csv").string());
  fs::remove_all(pass_dir, ec);
  fs::remove(log, ec);
  return drains;
}

// Where each stage starts: provisional runs with each stage placed well
// after the one before, until every stage drained before the next began;
// then each stage starts its predecessor's length (start to drain) + the
// client's pause after it. A stage that started on an idle engine takes
// the same time whenever it starts; one that had not drained when the next
// began is measured again, placed twice as late as it took.
absl::StatusOr<std::vector<double>> PlaceStages(const RunFlags& o, const reports::OutputDir& dir,
                                                const studies::InferencePerfConfig& config,
                                                const std::vector<studies::PlannedRequest>& plan,
                                                int* passes) {
  const size_t stages = config.stages.size();
  const std::vector<double> last = LastOffsets(plan, stages);
  const double gap = config.interval_s + 1.0;
  // Twice the stage's length, and at the least its sends and as long
  // again to drain.
  const auto generous = [&](size_t k, double length) {
    return gap + 2 * std::max(length, last[k] + config.stages[k].duration_s);
  };
  std::vector<double> starts = FirstStarts(config, plan);
  if (stages == 1) return starts;
  for (*passes = 1;; ++*passes) {
    ASSIGN_OR_RETURN(const std::vector<double> drains, ProvisionalDrains(o, dir, plan, starts));
    // The first stage that had not drained when the next began: its
    // length counts the next stage's load too.
    size_t overlap = stages;
    for (size_t k = 0; k + 1 < stages; ++k) {
      if (drains[k] > starts[k + 1]) {
        overlap = k;
        break;
      }
    }
    std::vector<double> next(stages, 0.0);
    for (size_t k = 1; k < stages; ++k) {
      const double length = drains[k - 1] - starts[k - 1];
      next[k] = next[k - 1] + (k <= overlap ? length + gap : generous(k - 1, length));
    }
    starts = std::move(next);
    if (overlap == stages) return starts;
    if (*passes > static_cast<int>(stages)) {
      return absl::InternalError("the stages could not be placed after their drains");
    }
  }
}

}  // namespace

int ReplayInferencePerf(const std::string& run_dir, studies::InferencePerfRun run, RunFlags o,
                        const reports::OutputDir& dir, studies::ReplayOptions options) {
  const studies::InferencePerfConfig& config = run.config;
  const size_t stages = config.stages.size();
  auto plan = studies::PlanRequests(config, SeedOf(o.scenario.sets));
  if (!plan.ok()) return Fail(plan.status());
  const double gap = config.interval_s + 1.0;

  // The trace as first placed, which the scenario reads; rewritten as the
  // stages find their places.
  if (absl::Status st =
          dir.Write("trace.csv", studies::StagedTraceCsv(*plan, FirstStarts(config, *plan)));
      !st.ok()) {
    return Fail(st);
  }
  studies::BuiltWorkload built;
  built.trace_path = dir.Path("trace.csv");
  built.note =
      absl::StrCat(plan->size(), " requests in ", stages, " stages from the inference-perf config ",
                   run.config_source, " (", config.load_type, " load, ", config.data_type,
                   " data; lengths and send times drawn from the scenario seed)");
  built.max_in_flight = config.max_in_flight;
  options.built = &built;
  auto setup = studies::PrepareReplay(run_dir, o.out, o.scenario.sets, options);
  if (!setup.ok()) return Fail(setup.status());
  for (const std::string& n : config.notes) {
    setup->assumptions.push_back(absl::StrCat("inference-perf: ", n));
  }
  if (o.strict && !setup->assumptions.empty()) return FailStrict(setup->assumptions);
  if (absl::Status st = dir.Write("scenario.pbtxt", setup->scenario_text); !st.ok()) {
    return Fail(st);
  }
  o.scenario.scenario = dir.Path("scenario.pbtxt");
  o.fallbacks = setup->assumptions;

  int passes = 0;
  auto starts = PlaceStages(o, dir, config, *plan, &passes);
  if (!starts.ok()) {
    if (absl::IsCancelled(starts.status())) {
      std::cerr << "servesim: " << starts.status().message() << "\n";
      return 128 + studies::StoppedBySignal();
    }
    return Fail(starts.status());
  }
  if (absl::Status st = dir.Write("trace.csv", studies::StagedTraceCsv(*plan, *starts)); !st.ok()) {
    return Fail(st);
  }
  if (!o.quiet && passes > 0) {
    std::cout << "  inference-perf: " << stages << " stages placed after their drains (" << passes
              << " provisional run" << (passes > 1 ? "s" : "") << ")\n";
  }
  if (const int rc = RunWithFlags(o); rc != 0) return rc;

  const std::string requests = dir.Path("requests.csv");
  std::vector<double> drains;
  auto simulated = studies::SimulatedStages(*plan, static_cast<int>(stages), requests,
                                            dir.Path("iterations.csv"), &drains);
  if (!simulated.ok()) return Fail(simulated.status());
  // Each stage started its pause after the one before drained (to within
  // the rounding of the trace's microseconds).
  const std::vector<double> exact = studies::StageStarts(config, drains);
  for (size_t k = 1; k < stages; ++k) {
    if (std::fabs(exact[k] - (*starts)[k]) > 1e-5) {
      std::cerr << absl::StrFormat(
          "servesim: warning: stage %d started %.6f s after stage %d drained (the client "
          "pauses %.3g s)\n",
          k, (*starts)[k] - drains[k - 1], k - 1, gap);
    }
  }
  if (run.reports.empty()) {
    if (!o.quiet) std::cout << "  (no stage reports in " << run_dir << ": nothing to compare)\n";
    return 0;
  }
  if (absl::Status st =
          dir.Write("replay_stages.csv", studies::StagesCsv(config, run.reports, *simulated));
      !st.ok()) {
    return Fail(st);
  }
  if (!o.quiet) {
    std::cout << "\n  measured vs simulated, per stage (" << o.out << "/replay_stages.csv)\n"
              << studies::StagesTable(config, run.reports, *simulated) << std::flush;
  }
  return 0;
}

}  // namespace servesim::services
