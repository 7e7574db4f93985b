// Planning an inference-perf run's requests and comparing the simulated
// stages with its reports (inference_perf.h); reading its config and
// reports: inference_perf_config.cc.
#include "studies/inference_perf.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/rng.h"
#include "common/status_macros.h"
#include "metrics/quantiles.h"
#include "studies/replay_files.h"

namespace servesim::studies {
namespace {

using replay_internal::ReadTable;
using replay_internal::Table;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ------------------------------------------------------------- drawing ----

int64_t Draw(const LengthDistribution& d, Rng& rng) {
  if (d.type == "fixed") return static_cast<int64_t>(d.mean);
  const double lo = static_cast<double>(d.min), hi = static_cast<double>(d.max);
  double x = 0;
  if (d.type == "uniform") {
    x = lo + (hi - lo) * rng.Uniform();
  } else if (d.type == "lognormal") {
    // inference-perf: the underlying normal set so that the lognormal has
    // the mean and deviation asked, shifted to start at min.
    double shifted = d.mean - lo;
    if (shifted <= 0) shifted = 1;
    const double sigma2 = std::log(1 + (d.std_dev / shifted) * (d.std_dev / shifted));
    const double mu = std::log(shifted) - sigma2 / 2;
    x = std::exp(mu + std::sqrt(sigma2) * rng.Normal()) + lo;
  } else {
    x = d.mean + d.std_dev * rng.Normal();
  }
  x = std::clamp(x, lo, hi);
  // numpy's round: half to even (the default rounding mode).
  return std::clamp(static_cast<int64_t>(std::nearbyint(x)), d.min, d.max);
}

// The send times of `n` requests over `duration`: exponential gaps scaled
// to sum to it (ConstantLoadTimer).
void SpreadOver(int64_t n, double rate, double duration, double start, Rng& rng,
                std::vector<double>* out) {
  std::vector<double> gaps(static_cast<size_t>(n));
  double sum = 0;
  for (double& g : gaps) {
    g = rng.Exponential(1.0 / rate);
    sum += g;
  }
  double t = start;
  for (double g : gaps) {
    t += sum > 0 ? g * duration / sum : duration / static_cast<double>(n);
    out->push_back(t);
  }
}

// A Poisson count of mean `rate`: the events of a rate-`rate` process in
// one unit of time.
int64_t PoissonCount(double rate, Rng& rng) {
  int64_t n = 0;
  double t = rng.Exponential(1.0 / rate);
  while (t < 1.0) {
    ++n;
    t += rng.Exponential(1.0 / rate);
  }
  return n;
}

std::vector<double> StageOffsets(const std::string& load_type, const InferencePerfStage& s,
                                 Rng& rng) {
  const int64_t n = s.requests();
  std::vector<double> out;
  out.reserve(static_cast<size_t>(n));
  if (load_type == "constant") {
    SpreadOver(n, s.rate, s.duration_s, 0, rng, &out);
    return out;
  }
  // PoissonLoadTimer: a Poisson count for each second, spread over it as
  // the constant timer does; a second with none passes empty.
  double second = 0;
  while (static_cast<int64_t>(out.size()) < n) {
    const int64_t c = PoissonCount(s.rate, rng);
    if (c > 0) SpreadOver(c, static_cast<double>(c), 1.0, second, rng, &out);
    second += 1;
  }
  out.resize(static_cast<size_t>(n));
  return out;
}

}  // namespace

absl::StatusOr<std::vector<PlannedRequest>> PlanRequests(const InferencePerfConfig& config,
                                                         uint64_t seed) {
  Rng lengths(seed, "inference_perf.lengths");
  // The prompts (input length, output length, group, prefix length).
  struct Prompt {
    int64_t input, output, group, prefix, id;
  };
  std::vector<Prompt> prompts;
  std::vector<int64_t> inputs, outputs;
  if (config.data_type == "shared_prefix") {
    std::vector<int64_t> system(static_cast<size_t>(config.groups));
    for (int64_t& s : system) s = Draw(config.system_prompt, lengths);
    for (int64_t g = 0; g < config.groups; ++g) {
      std::vector<int64_t> q(static_cast<size_t>(config.prompts_per_group));
      std::vector<int64_t> o(q.size());
      for (int64_t& v : q) v = Draw(config.question, lengths);
      for (int64_t& v : o) v = Draw(config.output, lengths);
      for (size_t p = 0; p < q.size(); ++p) {
        prompts.push_back({system[static_cast<size_t>(g)] + q[p], o[p], g,
                           system[static_cast<size_t>(g)], static_cast<int64_t>(prompts.size())});
      }
    }
    // Shuffled once (Fisher-Yates), as the client does.
    Rng order(seed, "inference_perf.order");
    for (size_t i = prompts.size(); i > 1; --i) {
      std::swap(prompts[i - 1], prompts[order.UniformInt(i)]);
    }
  } else {
    inputs.resize(static_cast<size_t>(config.input_count));
    outputs.resize(static_cast<size_t>(config.output_count));
    for (int64_t& v : inputs) v = Draw(config.input, lengths);
    for (int64_t& v : outputs) v = Draw(config.output, lengths);
  }
  std::vector<PlannedRequest> plan;
  for (size_t k = 0; k < config.stages.size(); ++k) {
    Rng arrivals(seed, absl::StrCat("inference_perf.arrivals.", k));
    const std::vector<double> offsets = StageOffsets(config.load_type, config.stages[k], arrivals);
    // Each stage takes the data from its start (get_data() per stage).
    for (size_t j = 0; j < offsets.size(); ++j) {
      PlannedRequest r;
      r.stage = static_cast<int>(k);
      r.offset_s = offsets[j];
      if (!prompts.empty()) {
        const Prompt& p = prompts[j % prompts.size()];
        r.input_tokens = p.input;
        r.output_tokens = p.output;
        r.prompt = p.id;
        if (p.prefix > 0) {
          r.prefix_group = p.group;
          r.prefix_tokens = p.prefix;
        }
      } else {
        r.input_tokens = inputs[j % inputs.size()];
        r.output_tokens = outputs[j % outputs.size()];
      }
      if (r.input_tokens < 1 || r.output_tokens < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            config.path, ": a request of ", r.input_tokens, " prompt and ", r.output_tokens,
            " output tokens was drawn; the lengths' min must be >= 1 (prompt: system prompt + "
            "question)"));
      }
      plan.push_back(r);
    }
  }
  if (plan.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(config.path, ": the stages send no request (rate x duration < 1)"));
  }
  return plan;
}

std::string StagedTraceCsv(const std::vector<PlannedRequest>& plan,
                           const std::vector<double>& stage_start_s) {
  std::string csv = "arrival_s,input_tokens,output_tokens,prefix_group,prefix_tokens,prompt_id\n";
  for (const PlannedRequest& r : plan) {
    absl::StrAppendFormat(&csv, "%.6f,%d,%d,",
                          stage_start_s[static_cast<size_t>(r.stage)] + r.offset_s, r.input_tokens,
                          r.output_tokens);
    if (r.prefix_group >= 0) {
      absl::StrAppend(&csv, "g", r.prefix_group, ",", r.prefix_tokens, ",");
    } else {
      absl::StrAppend(&csv, ",,");
    }
    if (r.prompt >= 0) absl::StrAppend(&csv, "p", r.prompt);
    csv += "\n";
  }
  return csv;
}

std::vector<double> StageStarts(const InferencePerfConfig& config,
                                const std::vector<double>& drain_s) {
  std::vector<double> starts(config.stages.size(), 0.0);
  for (size_t k = 1; k < starts.size(); ++k) {
    // The client waits for the stage's last request, sleeps load.interval,
    // then starts the next stage's clock one second ahead (run_stage).
    starts[k] = drain_s[k - 1] + config.interval_s + 1.0;
  }
  return starts;
}

namespace {

struct SimRequests {
  Table table;
  size_t id, arrival, finish, in, out, ttft, tpot, e2e, status;
};

absl::StatusOr<SimRequests> ReadRequests(const std::string& path, size_t planned) {
  SimRequests r;
  ASSIGN_OR_RETURN(r.table, ReadTable(path));
  ASSIGN_OR_RETURN(r.id, r.table.Column("id"));
  ASSIGN_OR_RETURN(r.arrival, r.table.Column("arrival_s"));
  ASSIGN_OR_RETURN(r.finish, r.table.Column("finish_s"));
  ASSIGN_OR_RETURN(r.in, r.table.Column("input_tokens"));
  ASSIGN_OR_RETURN(r.out, r.table.Column("output_tokens"));
  ASSIGN_OR_RETURN(r.ttft, r.table.Column("ttft_s"));
  ASSIGN_OR_RETURN(r.tpot, r.table.Column("tpot_s"));
  ASSIGN_OR_RETURN(r.e2e, r.table.Column("e2e_s"));
  ASSIGN_OR_RETURN(r.status, r.table.Column("status"));
  if (r.table.rows.size() != planned) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", r.table.rows.size(), " requests; the replay sent ", planned));
  }
  return r;
}

// Each stage's last finish (a refused request ends at its arrival), in
// the run's clock.
absl::StatusOr<std::vector<double>> RunDrains(const std::vector<PlannedRequest>& plan, int stages,
                                              const SimRequests& r) {
  std::vector<double> drain(static_cast<size_t>(stages), 0.0);
  for (size_t i = 0; i < r.table.rows.size(); ++i) {
    const int k = plan[i].stage;
    double end = 0;
    if (r.table.rows[i][r.status] == "done") {
      ASSIGN_OR_RETURN(end, r.table.Number(i, r.finish));
    } else {
      ASSIGN_OR_RETURN(end, r.table.Number(i, r.arrival));
    }
    drain[static_cast<size_t>(k)] = std::max(drain[static_cast<size_t>(k)], end);
  }
  return drain;
}

// The run starts its clock at the first arrival; the trace's clock starts
// at stage 0's start, the first send's offset before it.
std::vector<double> InTraceClock(const std::vector<PlannedRequest>& plan,
                                 std::vector<double> run_clock) {
  for (double& d : run_clock) d += plan.front().offset_s;
  return run_clock;
}

}  // namespace

absl::StatusOr<std::vector<double>> StageDrains(const std::vector<PlannedRequest>& plan, int stages,
                                                const std::string& requests_csv) {
  ASSIGN_OR_RETURN(const SimRequests r, ReadRequests(requests_csv, plan.size()));
  ASSIGN_OR_RETURN(std::vector<double> drain, RunDrains(plan, stages, r));
  return InTraceClock(plan, std::move(drain));
}

absl::StatusOr<std::vector<StageReport>> SimulatedStages(const std::vector<PlannedRequest>& plan,
                                                         int stages,
                                                         const std::string& requests_csv,
                                                         const std::string& iterations_csv,
                                                         std::vector<double>* drain_s) {
  ASSIGN_OR_RETURN(const SimRequests r, ReadRequests(requests_csv, plan.size()));
  ASSIGN_OR_RETURN(const std::vector<double> sim_drain, RunDrains(plan, stages, r));
  *drain_s = InTraceClock(plan, sim_drain);
  const size_t n = static_cast<size_t>(stages);
  std::vector<std::vector<double>> e2e(n), ttft(n), tpot(n), itl(n);
  std::vector<double> first(n, std::numeric_limits<double>::infinity()), last(n, 0);
  std::vector<double> out_tokens(n, 0), in_tokens(n, 0);
  std::vector<StageReport> rep(n);
  for (size_t k = 0; k < n; ++k) rep[k].stage = static_cast<int>(k);
  for (size_t i = 0; i < r.table.rows.size(); ++i) {
    const size_t k = static_cast<size_t>(plan[i].stage);
    ASSIGN_OR_RETURN(const double arrival, r.table.Number(i, r.arrival));
    first[k] = std::min(first[k], arrival);
    if (r.table.rows[i][r.status] != "done") {
      ++rep[k].failures;
      continue;
    }
    ++rep[k].successes;
    ASSIGN_OR_RETURN(const double finish, r.table.Number(i, r.finish));
    ASSIGN_OR_RETURN(const double in, r.table.Number(i, r.in));
    ASSIGN_OR_RETURN(const double out, r.table.Number(i, r.out));
    ASSIGN_OR_RETURN(const double e, r.table.Number(i, r.e2e));
    ASSIGN_OR_RETURN(const double t, r.table.Number(i, r.ttft));
    last[k] = std::max(last[k], finish);
    out_tokens[k] += out;
    in_tokens[k] += in;
    e2e[k].push_back(e);
    ttft[k].push_back(t);
    if (out > 1) {
      ASSIGN_OR_RETURN(const double tp, r.table.Number(i, r.tpot));
      tpot[k].push_back(tp);
    }
  }
  // Inter-token gaps: each step's duration, once per sequence that got a
  // later token in it, for the steps that start while the stage runs.
  ASSIGN_OR_RETURN(const Table it, ReadTable(iterations_csv));
  ASSIGN_OR_RETURN(const size_t c_start, it.Column("start_s"));
  ASSIGN_OR_RETURN(const size_t c_dur, it.Column("duration_s"));
  ASSIGN_OR_RETURN(const size_t c_dec, it.Column("decode_tokens"));
  for (size_t i = 0; i < it.rows.size(); ++i) {
    ASSIGN_OR_RETURN(const double start, it.Number(i, c_start));
    ASSIGN_OR_RETURN(const double dur, it.Number(i, c_dur));
    ASSIGN_OR_RETURN(const double dec, it.Number(i, c_dec));
    for (size_t k = 0; k < n; ++k) {
      if (start >= first[k] && start < sim_drain[k]) {
        itl[k].insert(itl[k].end(), static_cast<size_t>(dec), dur);
        break;
      }
    }
  }
  for (size_t k = 0; k < n; ++k) {
    StageReport& s = rep[k];
    s.requested_rate = kNaN;
    s.achieved_rate = kNaN;
    const auto put = [&s](const char* name, std::vector<double>& v) {
      if (v.empty()) {
        s.latency[name] = {kNaN, kNaN, kNaN, kNaN};
        return;
      }
      const metrics::Distribution d = metrics::Summarize(v);
      s.latency[name] = {d.mean, d.p50, d.p90, d.p99};
    };
    put("e2e_s", e2e[k]);
    put("ttft_s", ttft[k]);
    put("tpot_s", tpot[k]);
    put("itl_s", itl[k]);
    const double span = last[k] - first[k];
    s.output_tokens_per_s = span > 0 ? out_tokens[k] / span : kNaN;
    s.requests_per_s = span > 0 ? static_cast<double>(s.successes) / span : kNaN;
    s.prompt_len_mean = s.successes > 0 ? in_tokens[k] / static_cast<double>(s.successes) : kNaN;
    s.output_len_mean = s.successes > 0 ? out_tokens[k] / static_cast<double>(s.successes) : kNaN;
  }
  return rep;
}

namespace {

struct Row {
  std::string metric, stat;
  double measured, simulated;
};

// (mean E2E - mean TTFT) / (mean output length - 1): the time per output
// token after the first, from figures every report version gets right
// (the client's own TPOT and ITL came out halved before it stopped counting
// a BOS token in every streamed chunk; inference-perf #564).
double DecodePerToken(const StageReport& r) {
  const double e2e = r.latency.at("e2e_s")[0], ttft = r.latency.at("ttft_s")[0];
  if (!std::isfinite(e2e) || !std::isfinite(ttft) || !(r.output_len_mean > 1)) return kNaN;
  return (e2e - ttft) / (r.output_len_mean - 1);
}

std::vector<Row> Rows(const StageReport& m, const StageReport& s) {
  std::vector<Row> rows;
  for (const char* metric : {"e2e_s", "ttft_s", "tpot_s", "itl_s"}) {
    const auto& mv = m.latency.at(metric);
    const auto& sv = s.latency.at(metric);
    const char* stats[] = {"mean", "p50", "p90", "p99"};
    for (int i = 0; i < 4; ++i) rows.push_back({metric, stats[i], mv[i], sv[i]});
  }
  rows.push_back({"decode_s_per_token", "from_means", DecodePerToken(m), DecodePerToken(s)});
  rows.push_back({"output_tokens_per_s", "value", m.output_tokens_per_s, s.output_tokens_per_s});
  rows.push_back({"requests_per_s", "value", m.requests_per_s, s.requests_per_s});
  rows.push_back({"prompt_len", "mean", m.prompt_len_mean, s.prompt_len_mean});
  rows.push_back({"output_len", "mean", m.output_len_mean, s.output_len_mean});
  rows.push_back(
      {"successes", "count", static_cast<double>(m.successes), static_cast<double>(s.successes)});
  rows.push_back(
      {"failures", "count", static_cast<double>(m.failures), static_cast<double>(s.failures)});
  return rows;
}

std::string Num(double v) { return std::isfinite(v) ? absl::StrFormat("%.6g", v) : ""; }

std::string ErrorPct(double m, double s) {
  if (!std::isfinite(m) || !std::isfinite(s) || m == 0) return "";
  return absl::StrFormat("%.2f", 100.0 * (s - m) / m);
}

}  // namespace

std::string StagesCsv(const InferencePerfConfig& config, const std::vector<StageReport>& measured,
                      const std::vector<StageReport>& simulated) {
  std::string csv = "stage,rate,metric,stat,measured,simulated,error_pct\n";
  for (size_t k = 0; k < measured.size() && k < simulated.size(); ++k) {
    for (const Row& r : Rows(measured[k], simulated[k])) {
      absl::StrAppend(&csv, k, ",", Num(config.stages[k].rate), ",", r.metric, ",", r.stat, ",",
                      Num(r.measured), ",", Num(r.simulated), ",",
                      ErrorPct(r.measured, r.simulated), "\n");
    }
  }
  return csv;
}

std::string StagesTable(const InferencePerfConfig& config, const std::vector<StageReport>& measured,
                        const std::vector<StageReport>& simulated) {
  std::string out =
      absl::StrFormat("  %-5s %-7s %-6s %-22s %-22s %-22s %-22s %s\n", "stage", "rate/s", "metric",
                      "mean  meas -> sim", "p50", "p90", "p99", "");
  const auto cell = [](double m, double s) {
    if (!std::isfinite(m) && !std::isfinite(s)) return std::string("-");
    std::string c = absl::StrCat(std::isfinite(m) ? absl::StrFormat("%.4g", m) : "?", " -> ",
                                 std::isfinite(s) ? absl::StrFormat("%.4g", s) : "?");
    if (const std::string e = ErrorPct(m, s); !e.empty()) absl::StrAppend(&c, " (", e, "%)");
    return c;
  };
  for (size_t k = 0; k < measured.size() && k < simulated.size(); ++k) {
    const StageReport& m = measured[k];
    const StageReport& s = simulated[k];
    for (const char* metric : {"e2e_s", "ttft_s", "itl_s", "tpot_s"}) {
      const auto& mv = m.latency.at(metric);
      const auto& sv = s.latency.at(metric);
      absl::StrAppendFormat(
          &out, "  %-5d %-7.4g %-6s %-22s %-22s %-22s %-22s\n", k, config.stages[k].rate,
          absl::string_view(metric).substr(0, std::string(metric).size() - 2), cell(mv[0], sv[0]),
          cell(mv[1], sv[1]), cell(mv[2], sv[2]), cell(mv[3], sv[3]));
    }
    absl::StrAppendFormat(&out,
                          "  %-5d %-7.4g (E2E-TTFT)/(out-1) %s   output tok/s %s   failures %d -> "
                          "%d\n",
                          k, config.stages[k].rate, cell(DecodePerToken(m), DecodePerToken(s)),
                          cell(m.output_tokens_per_s, s.output_tokens_per_s), m.failures,
                          s.failures);
  }
  return out;
}

}  // namespace servesim::studies
