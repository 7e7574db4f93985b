// `servesim sweep SCENARIO --vary field=v1,v2,...`: the cross product of the
// --vary lists, one child run per point (studies/sweep.h).
#include "studies/sweep.h"

#include <filesystem>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/commands/commands.h"
#include "services/commands/points.h"
#include "services/commands/run.h"
#include "services/commands/scenario_args.h"
#include "studies/processes.h"

namespace servesim::services {
namespace {

struct SweepFlags {
  ScenarioArgs scenario_args;
  std::vector<std::string> vary;
  std::string out;
  std::string emit_jobs;
  bool quiet = false;
  bool force = false;
  int jobs = 0;  // -j; 0: the cores available
};

}  // namespace

int SweepCommand(const Args& args) {
  SweepFlags o;
  FlagParser flags;
  AddScenarioFlags(flags, &o.scenario_args);
  flags.Repeated("--vary", &o.vary, "--vary needs field.path=v1,v2,...");
  flags.String("--out", &o.out, "--out needs a folder");
  flags.Value("--emit-jobs", "--emit-jobs needs a file", [&o](const std::string& v) -> std::string {
    if (v.empty()) return "--emit-jobs needs a file";
    o.emit_jobs = v;
    return "";
  });
  flags.Switch("--quiet", [&o] { o.quiet = true; });
  flags.Switch("--force", [&o] { o.force = true; });
  AddJobsFlag(flags, &o.jobs);
  if (auto exit = ParseFlags(flags, args)) return *exit;
  if (o.jobs == 0) o.jobs = studies::AvailableCores();
  if (o.scenario_args.scenario.empty()) return UsageError("sweep needs a scenario file");
  if (o.vary.empty()) return UsageError("sweep needs at least one --vary field.path=v1,v2,...");
  const std::string out = std::filesystem::absolute(o.out.empty() ? "out/sweep" : o.out).string();
  const std::string scenario = std::filesystem::absolute(o.scenario_args.scenario).string();
  auto hash = studies::ScenarioHash(scenario);
  if (!hash.ok()) return Fail(hash.status());
  std::vector<studies::VaryAxis> axes;
  std::set<std::string> fields;
  for (const std::string& v : o.vary) {
    auto axis = studies::ParseVary(v);
    if (!axis.ok()) return UsageError(std::string(axis.status().message()));
    if (!fields.insert(axis->field).second) {
      return UsageError(absl::StrCat("--vary ", axis->field,
                                     " given twice; list all its values "
                                     "in one --vary"));
    }
    axes.push_back(*axis);
  }
  const std::vector<std::string> base = BaseOverrides(o.scenario_args);
  const std::vector<studies::SweepPoint> points = studies::ExpandPoints(axes);
  // Every point is checked before any runs.
  std::vector<studies::PointSpec> specs;
  std::vector<std::string> dirs;
  std::string list;
  for (const studies::SweepPoint& p : points) {
    if (auto checked = CheckPoint(scenario, base, p.vary); !checked.ok()) {
      return Fail(checked.status());
    }
    studies::PointSpec spec;
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
  // The folder is servesim's, held for the sweep's life; its table and
  // point list are rewritten.
  reports::OutputDir::Options options;
  options.run_outputs = false;
  options.also_clear = {"points.txt", "sweep.csv"};
  options.inputs = {scenario, o.scenario_args.trace};
  auto claimed = AcquireOutputs(out, absl::StrCat("servesim sweep ", scenario), o.force, options);
  if (!claimed.ok()) return Fail(claimed.status());
  std::error_code ec;
  std::filesystem::create_directories(out + "/points", ec);
  if (ec) return Fail(absl::UnavailableError(absl::StrCat(out, ": cannot create: ", ec.message())));
  if (absl::Status st = WriteTextFile(out + "/points.txt", list); !st.ok()) return Fail(st);
  if (!o.emit_jobs.empty()) {
    std::string lines;
    for (size_t i = 0; i < specs.size(); ++i) {
      if (absl::Status st = studies::PreparePoint(dirs[i], specs[i]); !st.ok()) return Fail(st);
      std::string cmd = studies::ShellQuote(SelfBinary());
      for (const std::string& a : studies::RunArgs(specs[i], dirs[i])) {
        absl::StrAppend(&cmd, " ", studies::ShellQuote(a));
      }
      absl::StrAppend(&lines, cmd, " > ", studies::ShellQuote(dirs[i] + "/run.log"), " 2>&1\n");
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
  if (!st.ok()) return FailPoints(st);
  auto table = studies::MergePoints({out});
  if (!table.ok()) return Fail(table.status());
  if (absl::Status w = WriteTextFile(out + "/sweep.csv", studies::TableCsv(*table)); !w.ok()) {
    return Fail(w);
  }
  if (!o.quiet) std::cout << studies::TableText(*table);
  std::cout << absl::StrFormat("wrote %s/sweep.csv: %d points (%d run, %d already finished)\n", out,
                               specs.size(), ran, specs.size() - ran);
  return 0;
}

}  // namespace servesim::services
