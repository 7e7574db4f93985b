// `servesim search SCENARIO --slo ... (--vary-rate | --vary-replicas)`: the
// largest arrival rate or the fewest replicas meeting an SLO
// (studies/search.h), each probe a child run.
//
// The command checks its flags and the scenario, picks the field to vary,
// runs the search (ProbeSearch runs the probes and stops a search no value
// can win), then writes search.csv and prints the table and the answer.
#include "studies/search.h"

#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "services/commands/commands.h"
#include "services/commands/points.h"
#include "services/commands/run.h"
#include "services/commands/scenario_args.h"
#include "studies/processes.h"
#include "studies/sweep.h"

namespace servesim::services {
namespace {

struct SearchFlags {
  ScenarioArgs scenario_args;
  std::string out;
  std::string slo;
  bool vary_rate = false, vary_replicas = false;
  double attainment = 0.9, tolerance = 0.02;
  int64_t max_replicas = 1024;
  int max_probes = 40;
  int jobs = 0;  // -j; 0: the cores available
  bool force = false;
};

// Stops the search from on_step (a probe of the sequential algorithm), with
// the reason search.csv and the terminal give.
absl::Status StopSearch(const std::string& why) { return absl::FailedPreconditionError(why); }

void AddSearchFlags(FlagParser& flags, SearchFlags* options) {
  SearchFlags& o = *options;
  AddScenarioFlags(flags, &o.scenario_args);
  flags.String("--out", &o.out, "--out needs a folder");
  flags.Switch("--force", [&o] { o.force = true; });
  flags.String("--slo", &o.slo, "--slo needs e.g. ttft_p99=2s,tbt_p99=50ms");
  flags.Switch("--vary-rate", [&o] { o.vary_rate = true; });
  flags.Switch("--vary-replicas", [&o] { o.vary_replicas = true; });
  flags.Value("--attainment", "", [&o](const std::string& v) -> std::string {
    if (!absl::SimpleAtod(v, &o.attainment) || !(o.attainment > 0) || !(o.attainment <= 1)) {
      return absl::StrCat("--attainment ", v, ": expected a fraction in (0, 1]");
    }
    return "";
  });
  flags.Value("--tolerance", "", [&o](const std::string& v) -> std::string {
    if (!absl::SimpleAtod(v, &o.tolerance) || !(o.tolerance > 0) || !(o.tolerance < 1)) {
      return absl::StrCat("--tolerance ", v, ": expected a relative width in (0, 1)");
    }
    return "";
  });
  flags.Value("--max-replicas", "", [&o](const std::string& v) -> std::string {
    if (!absl::SimpleAtoi(v, &o.max_replicas) || o.max_replicas < 1) {
      return absl::StrCat("--max-replicas ", v, ": expected an integer >= 1");
    }
    return "";
  });
  flags.Value("--max-probes", "", [&o](const std::string& v) -> std::string {
    if (!absl::SimpleAtoi(v, &o.max_probes) || o.max_probes < 1 || o.max_probes > 1000) {
      return absl::StrCat("--max-probes ", v, ": expected an integer in [1, 1000]");
    }
    return "";
  });
  AddJobsFlag(flags, &o.jobs);
}

// The --set list every probe runs with: the scenario flags', the SLO's.
std::vector<std::string> ProbeOverrides(const ScenarioArgs& scenario_args,
                                        const std::vector<studies::SloLimit>& slo) {
  std::vector<std::string> base = BaseOverrides(scenario_args);
  // The per-request SLO that slo_attainment counts (sweep.h).
  double ttft = 0, tpot = 0, tbt = 0;
  for (const studies::SloLimit& l : slo) {
    double* slot = l.key == "ttft_s"   ? &ttft
                   : l.key == "tpot_s" ? &tpot
                   : l.key == "tbt_s"  ? &tbt
                                       : nullptr;
    if (slot != nullptr && (*slot == 0 || l.limit_s < *slot)) *slot = l.limit_s;
  }
  if (ttft > 0) base.push_back(absl::StrCat("slo.ttft_s=", studies::FormatValue(ttft)));
  if (tpot > 0 || tbt > 0) {
    base.push_back(absl::StrCat("slo.tpot_s=", studies::FormatValue(tpot > 0 ? tpot : tbt)));
  }
  // Probes need summary.json only: the per-request rows and the report
  // would be a third of a probe's time.
  base.push_back("output.iterations_csv=false");
  base.push_back("output.timeline=false");
  base.push_back("output.requests_csv=false");
  base.push_back("output.report_html=false");
  return base;
}

// The field the search varies and its value in the scenario; the exit
// status instead when the scenario has none to vary.
std::optional<int> ChooseVariedField(const SearchFlags& o, const Scenario& checked,
                                     std::string* field_out, double* start_out) {
  const auto& w = checked.resolved.proto.workload();
  std::string& field = *field_out;
  double& start = *start_out;
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
    start = static_cast<double>(checked.resolved.replicas);
    if (o.max_replicas < checked.resolved.replicas) {
      return UsageError(absl::StrCat("--max-replicas ", o.max_replicas,
                                     " is below the scenario's cluster.replicas ",
                                     checked.resolved.replicas));
    }
  }
  return std::nullopt;
}

// One probe: summary.json's figures and the verdict.
struct Probe {
  std::map<std::string, std::string> figures;
  bool pass = false;
  std::string reason;
};

// The probes of one search: Evaluate and OnStep are the callbacks of
// studies::SearchMaxRate / SearchMinReplicas. Each probe runs as a child
// `servesim run` in out/probes/FIELD-VALUE.
struct ProbeSearch {
  // Fixed for the search.
  std::string scenario, scenario_hash;
  std::vector<std::string> base;  // ProbeOverrides
  std::string field, short_field, out;
  std::vector<studies::SloLimit> slo;
  double attainment = 0;
  bool vary_rate = false;
  int jobs = 0;
  // Whether every probe serves the same requests (see SearchCommand).
  bool fixed_requests = false;
  // Filled as the search goes.
  std::map<double, Probe> probes;
  std::vector<double> probe_order;  // the sequential algorithm's, in order
  int bounded_probes = 0;

  studies::PointSpec SpecOf(double v) const {
    studies::PointSpec spec;
    spec.scenario = scenario;
    spec.scenario_hash = scenario_hash;
    spec.overrides = base;
    spec.overrides.push_back(absl::StrCat(field, "=", studies::FormatValue(v)));
    spec.vary = {{field, studies::FormatValue(v)}};
    return spec;
  }
  std::string DirOf(double v) const {
    return absl::StrCat(out, "/probes/", short_field, "-", studies::FormatValue(v));
  }

  // Runs probes (the sequential algorithm's and speculative ones) and says
  // which pass; the stops are decided in OnStep, on the sequential
  // algorithm's probes only, so they do not depend on -j.
  absl::StatusOr<std::vector<bool>> Evaluate(const std::vector<double>& values) {
    std::vector<studies::PointSpec> specs;
    std::vector<std::string> dirs;
    for (double v : values) {
      ASSIGN_OR_RETURN(auto ok, CheckPoint(scenario, base, {{field, studies::FormatValue(v)}}));
      (void)ok;
      specs.push_back(SpecOf(v));
      dirs.push_back(DirOf(v));
    }
    int ran = 0;
    RETURN_IF_ERROR(RunPoints(specs, dirs, jobs, &ran));
    std::vector<bool> pass;
    for (size_t i = 0; i < values.size(); ++i) {
      ASSIGN_OR_RETURN(auto figures, studies::ReadSummaryFigures(dirs[i]));
      Probe p;
      ASSIGN_OR_RETURN(p.pass, studies::ProbePasses(figures, slo, attainment, &p.reason));
      p.figures = std::move(figures);
      pass.push_back(p.pass);
      probes[values[i]] = std::move(p);
    }
    return pass;
  }

  // Each probe of the sequential algorithm, in order: requests rejected as
  // too long for the context or for the whole KV cache count as misses at
  // any rate and any replica count, so they bound the attainment every
  // probe can reach. (Early rejections for the TTFT SLO depend on the load:
  // not them.)
  absl::Status OnStep(const studies::SearchStep& step) {
    probe_order.push_back(step.value);
    std::map<std::string, std::string>& figures = probes.at(step.value).figures;
    double requests = 0, rejected = 0, late = 0;
    if (figures.count("requests_rejected_late") > 0 &&
        !absl::SimpleAtod(figures["requests_rejected_late"], &late)) {
      late = 0;
    }
    if (absl::SimpleAtod(figures["requests"], &requests) && requests > 0 &&
        absl::SimpleAtod(figures["requests_rejected"], &rejected) &&
        (rejected -= late, (requests - rejected) / requests < attainment) &&
        ++bounded_probes >= (fixed_requests ? 1 : 2)) {
      return StopSearch(absl::StrFormat(
          "the SLO cannot be met: %s of %s requests are rejected (too long for the context or "
          "the KV cache) at %s %s, so slo_attainment <= %.4g < --attainment %g",
          absl::StrFormat("%.0f", rejected), figures["requests"],
          fixed_requests ? "every" : "this and an earlier", vary_rate ? "rate" : "replica count",
          (requests - rejected) / requests, attainment));
    }
    return absl::OkStatus();
  }
};

// The table: the sequential algorithm's probes, then the answer; or,
// when the search stopped, its probes up to the stop and why it stopped.
studies::SweepTable SearchTable(const ProbeSearch& search,
                                const absl::StatusOr<studies::SearchResult>& result) {
  std::vector<std::string> header = {"step", "phase", search.field, "pass"};
  for (const studies::SloLimit& l : search.slo) header.push_back(absl::StrCat(l.name, "_s"));
  for (const char* k : {"slo_attainment", "goodput_requests_per_s", "throughput_tokens_per_s",
                        "requests", "completed"}) {
    header.push_back(k);
  }
  header.push_back("reason");
  studies::SweepTable table;
  table.header = header;
  auto row = [&](const std::string& step, const std::string& phase, double v) {
    const Probe& p = search.probes.at(v);
    std::vector<std::string> r = {step, phase, studies::FormatValue(v), p.pass ? "pass" : "fail"};
    for (const studies::SloLimit& l : search.slo)
      r.push_back(p.figures.at(absl::StrCat(l.key, ".", l.field)));
    for (const char* k : {"slo_attainment", "goodput_requests_per_s", "throughput_tokens_per_s",
                          "requests", "requests_completed"}) {
      r.push_back(p.figures.at(k));
    }
    r.push_back(p.reason);
    table.rows.push_back(r);
  };
  if (result.ok()) {
    for (size_t i = 0; i < result->path.size(); ++i) {
      row(absl::StrCat(i + 1), result->path[i].phase, result->path[i].value);
    }
    row("", "answer", result->answer);
  } else {
    for (size_t i = 0; i < search.probe_order.size(); ++i) {
      row(absl::StrCat(i + 1), "probe", search.probe_order[i]);
    }
    std::vector<std::string> stop(header.size());
    stop[1] = "stopped";
    stop.back() = std::string(result.status().message());
    table.rows.push_back(stop);
  }
  return table;
}

// The answer, its bracket and its figures, on stdout.
void PrintAnswer(const SearchFlags& o, const ProbeSearch& search,
                 const studies::SearchResult& result, double start) {
  const std::string& field = search.field;
  const std::string& out = search.out;
  const Probe& best = search.probes.at(result.answer);
  if (o.vary_rate) {
    std::cout << absl::StrFormat(
        "answer: max %s = %s (%.4g x the scenario's %s) meets the SLO; the next probe up, %s, "
        "does not (relative width %.3g <= tolerance %g)\n",
        field, studies::FormatValue(result.answer), result.answer / start,
        studies::FormatValue(start), studies::FormatValue(result.hi),
        (result.hi - result.lo) / result.lo, o.tolerance);
  } else {
    std::cout << absl::StrFormat(
        "answer: min %s = %s meets the SLO%s\n", field, studies::FormatValue(result.answer),
        result.lo > 0 ? absl::StrCat("; ", studies::FormatValue(result.lo), " does not")
                      : std::string(" (the least possible)"));
  }
  std::cout << absl::StrFormat(
      "  at it: goodput %s requests/s, throughput %s tokens/s, slo_attainment %s\n"
      "  wrote %s/search.csv (probes in %s/probes/)\n",
      best.figures.at("goodput_requests_per_s"), best.figures.at("throughput_tokens_per_s"),
      best.figures.at("slo_attainment"), out, out);
}

}  // namespace

int SearchCommand(const Args& args) {
  SearchFlags o;
  FlagParser flags;
  AddSearchFlags(flags, &o);
  if (auto exit = ParseFlags(flags, args)) return *exit;
  if (o.jobs == 0) o.jobs = studies::AvailableCores();
  if (o.scenario_args.scenario.empty()) return UsageError("search needs a scenario file");
  if (o.slo.empty()) return UsageError("search needs --slo, e.g. ttft_p99=2s,tbt_p99=50ms");
  if (o.vary_rate == o.vary_replicas) {
    return UsageError("search needs exactly one of --vary-rate and --vary-replicas");
  }
  auto slo = studies::ParseSlo(o.slo);
  if (!slo.ok()) return UsageError(std::string(slo.status().message()));
  const std::string out = std::filesystem::absolute(o.out.empty() ? "out/search" : o.out).string();
  const std::string scenario = std::filesystem::absolute(o.scenario_args.scenario).string();
  auto hash = studies::ScenarioHash(scenario);
  if (!hash.ok()) return Fail(hash.status());
  const std::vector<std::string> base = ProbeOverrides(o.scenario_args, *slo);
  auto checked = CheckPoint(scenario, base, {});
  if (!checked.ok()) return Fail(checked.status());
  const auto& w = checked->resolved.proto.workload();
  std::string field;
  double start = 0;
  if (auto exit = ChooseVariedField(o, *checked, &field, &start)) return *exit;
  // The folder is servesim's, held for the search's life.
  reports::OutputDir::Options options;
  options.run_outputs = false;
  options.also_clear = {"search.csv"};
  options.inputs = {scenario, o.scenario_args.trace};
  auto claimed = AcquireOutputs(out, absl::StrCat("servesim search ", scenario), o.force, options);
  if (!claimed.ok()) return Fail(claimed.status());
  ProbeSearch search;
  search.scenario = scenario;
  search.scenario_hash = *hash;
  search.base = base;
  search.field = field;
  search.short_field = field.substr(field.rfind('.') + 1);
  search.out = out;
  search.slo = *slo;
  search.attainment = o.attainment;
  search.vary_rate = o.vary_rate;
  search.jobs = o.jobs;
  // Rejected requests (too long for the context or the whole KV cache)
  // bound every probe's attainment. The bound is the same at every value
  // when the varied value cannot change which requests arrive: replicas,
  // or a rate over a workload with no time window. A windowed trace keeps
  // more or fewer of its rows as its rate scales, so there two probes must
  // show the bound before the search gives up.
  search.fixed_requests =
      !o.vary_rate || !w.has_trace() || (!w.has_window_start_s() && !w.has_window_end_s());
  studies::Evaluate evaluate = [&search](const std::vector<double>& values) {
    return search.Evaluate(values);
  };
  studies::OnStep on_step = [&search](const studies::SearchStep& step) {
    return search.OnStep(step);
  };
  std::cout << absl::StrFormat("search: %s %s from %s (%s), SLO %s, attainment >= %g\n",
                               o.vary_rate ? "max" : "min", field, studies::FormatValue(start),
                               o.scenario_args.scenario, o.slo, o.attainment)
            << std::flush;
  auto result =
      o.vary_rate
          ? studies::SearchMaxRate(start, o.tolerance, o.jobs, evaluate, on_step, o.max_probes)
          : studies::SearchMinReplicas(static_cast<int64_t>(start), o.max_replicas, o.jobs,
                                       evaluate, on_step, o.max_probes);
  const studies::SweepTable table = SearchTable(search, result);
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (absl::Status st = WriteTextFile(out + "/search.csv", studies::TableCsv(table)); !st.ok()) {
    return Fail(st);
  }
  std::cout << studies::TableText(table);
  if (!result.ok()) {
    std::cout << "  wrote " << out << "/search.csv (probes in " << out << "/probes/)\n";
    return FailPoints(result.status());
  }
  PrintAnswer(o, search, *result, start);
  return 0;
}

}  // namespace servesim::services
