// The measured run against the simulated one (studies/replay.h):
// CompareWithTruth reads truth.csv, the trace and the simulated
// requests.csv, checks that they list the same requests in the same
// order, and sets the latency distributions, makespan and throughput side
// by side; CompareCsv and CompareTable print the rows. Times in seconds.
#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "metrics/quantiles.h"
#include "studies/replay.h"
#include "studies/replay_files.h"

namespace servesim::studies {
namespace {

using replay_internal::ReadTable;
using replay_internal::Table;

// Percentiles as numpy's default (linear between closest ranks).
metrics::Distribution Dist(std::vector<double> v) { return metrics::Summarize(v); }

}  // namespace

double CompareRow::error_pct() const {
  return measured != 0 ? 100.0 * (simulated - measured) / measured : 0.0;
}

namespace {

// The measured run: truth.csv checked against the trace.
struct Measured {
  std::vector<double> ttft, tpot, e2e;
  double tokens = 0, end = 0;
  size_t requests = 0;
};

absl::StatusOr<Measured> ReadMeasured(const std::string& truth_path,
                                      const std::string& trace_path) {
  ASSIGN_OR_RETURN(const Table truth, ReadTable(truth_path));
  ASSIGN_OR_RETURN(const Table trace, ReadTable(trace_path));
  if (truth.rows.size() != trace.rows.size()) {
    return absl::InvalidArgumentError(absl::StrCat(truth_path, ": ", truth.rows.size(),
                                                   " requests but ", trace_path, " has ",
                                                   trace.rows.size()));
  }
  ASSIGN_OR_RETURN(const size_t m_arr, truth.Column("arrival_s"));
  ASSIGN_OR_RETURN(const size_t m_in, truth.Column("input_tokens"));
  ASSIGN_OR_RETURN(const size_t m_ttft, truth.Column("ttft_s"));
  ASSIGN_OR_RETURN(const size_t m_tpot, truth.Column("tpot_s"));
  ASSIGN_OR_RETURN(const size_t m_e2e, truth.Column("e2e_s"));
  ASSIGN_OR_RETURN(const size_t m_tok, truth.Column("tokens"));
  ASSIGN_OR_RETURN(const size_t t_arr, trace.Column("arrival_s"));
  ASSIGN_OR_RETURN(const size_t t_in, trace.Column("input_tokens"));
  Measured m;
  m.requests = truth.rows.size();
  for (size_t r = 0; r < truth.rows.size(); ++r) {
    ASSIGN_OR_RETURN(const double a, truth.Number(r, m_arr));
    ASSIGN_OR_RETURN(const double b, trace.Number(r, t_arr));
    ASSIGN_OR_RETURN(const double in_m, truth.Number(r, m_in));
    ASSIGN_OR_RETURN(const double in_t, trace.Number(r, t_in));
    if (std::fabs(a - b) > 1e-6 || in_m != in_t) {
      return absl::InvalidArgumentError(absl::StrCat(
          truth_path, ":", truth.lines[r], ": request ", truth.rows[r][0], " arrives at ",
          truth.rows[r][m_arr], " with ", truth.rows[r][m_in], " input tokens but ", trace_path,
          ":", trace.lines[r], " has ", trace.rows[r][t_arr], " and ", trace.rows[r][t_in],
          "; truth.csv must list the trace's requests in its order"));
    }
    ASSIGN_OR_RETURN(const double ttft, truth.Number(r, m_ttft));
    ASSIGN_OR_RETURN(const double e2e, truth.Number(r, m_e2e));
    ASSIGN_OR_RETURN(const double tokens, truth.Number(r, m_tok));
    m.ttft.push_back(ttft);
    m.e2e.push_back(e2e);
    if (tokens > 1) {
      ASSIGN_OR_RETURN(const double tpot, truth.Number(r, m_tpot));
      m.tpot.push_back(tpot);
    }
    m.tokens += tokens;
    m.end = std::max(m.end, a + e2e);
  }
  return m;
}

}  // namespace

absl::Status CheckTruth(const std::string& truth_path, const std::string& trace_path) {
  return ReadMeasured(truth_path, trace_path).status();
}

absl::StatusOr<std::vector<CompareRow>> CompareWithTruth(const std::string& truth_path,
                                                         const std::string& trace_path,
                                                         const std::string& requests_path) {
  ASSIGN_OR_RETURN(Measured measured, ReadMeasured(truth_path, trace_path));
  ASSIGN_OR_RETURN(const Table sim, ReadTable(requests_path));
  ASSIGN_OR_RETURN(const size_t s_id, sim.Column("id"));
  ASSIGN_OR_RETURN(const size_t s_ttft, sim.Column("ttft_s"));
  ASSIGN_OR_RETURN(const size_t s_tpot, sim.Column("tpot_s"));
  ASSIGN_OR_RETURN(const size_t s_e2e, sim.Column("e2e_s"));
  ASSIGN_OR_RETURN(const size_t s_out, sim.Column("output_tokens"));
  ASSIGN_OR_RETURN(const size_t s_fin, sim.Column("finish_s"));
  ASSIGN_OR_RETURN(const size_t s_status, sim.Column("status"));
  std::vector<double>&mt = measured.ttft, &ms = measured.tpot, &me = measured.e2e;
  const double m_tokens = measured.tokens, m_end = measured.end;
  std::vector<double> st, ss, se;
  double s_tokens = 0, s_end = 0;
  if (sim.rows.size() != measured.requests) {
    return absl::InvalidArgumentError(absl::StrCat(requests_path, ": ", sim.rows.size(),
                                                   " requests but ", truth_path, " has ",
                                                   measured.requests));
  }
  for (size_t r = 0; r < sim.rows.size(); ++r) {
    if (sim.rows[r][s_id] != absl::StrCat(r)) {
      return absl::InvalidArgumentError(absl::StrCat(requests_path, ":", sim.lines[r], ": id ",
                                                     sim.rows[r][s_id], "; expected ", r,
                                                     " (requests in arrival order)"));
    }
    if (sim.rows[r][s_status] != "done") {
      return absl::FailedPreconditionError(absl::StrCat(
          requests_path, ":", sim.lines[r], ": request ", r, " is ", sim.rows[r][s_status],
          " in the simulation but was served in the measured run"));
    }
    ASSIGN_OR_RETURN(const double ttft, sim.Number(r, s_ttft));
    ASSIGN_OR_RETURN(const double e2e, sim.Number(r, s_e2e));
    ASSIGN_OR_RETURN(const double tokens, sim.Number(r, s_out));
    ASSIGN_OR_RETURN(const double fin, sim.Number(r, s_fin));
    st.push_back(ttft);
    se.push_back(e2e);
    if (tokens > 1) {
      ASSIGN_OR_RETURN(const double tpot, sim.Number(r, s_tpot));
      ss.push_back(tpot);
    }
    s_tokens += tokens;
    s_end = std::max(s_end, fin);
  }
  std::vector<CompareRow> rows;
  for (auto [name, m, s] : {std::tuple{"ttft_s", &mt, &st}, std::tuple{"tpot_s", &ms, &ss},
                            std::tuple{"e2e_s", &me, &se}}) {
    const metrics::Distribution a = Dist(*m), b = Dist(*s);
    rows.push_back({name, "mean", a.mean, b.mean});
    rows.push_back({name, "p50", a.p50, b.p50});
    rows.push_back({name, "p90", a.p90, b.p90});
    rows.push_back({name, "p99", a.p99, b.p99});
  }
  rows.push_back({"makespan_s", "value", m_end, s_end});
  rows.push_back({"output_tokens_per_s", "value", m_end > 0 ? m_tokens / m_end : 0,
                  s_end > 0 ? s_tokens / s_end : 0});
  return rows;
}

std::string CompareCsv(const std::vector<CompareRow>& rows) {
  std::string out = "metric,stat,measured,simulated,error_pct\n";
  for (const CompareRow& r : rows) {
    absl::StrAppendFormat(&out, "%s,%s,%.6g,%.6g,%.2f\n", r.metric, r.stat, r.measured, r.simulated,
                          r.error_pct());
  }
  return out;
}

std::string CompareTable(const std::vector<CompareRow>& rows) {
  std::string out = absl::StrFormat("  %-20s %-6s %12s %12s %9s\n", "metric", "stat", "measured",
                                    "simulated", "error");
  for (const CompareRow& r : rows) {
    absl::StrAppendFormat(&out, "  %-20s %-6s %12.6g %12.6g %+8.1f%%\n", r.metric, r.stat,
                          r.measured, r.simulated, r.error_pct());
  }
  return out;
}

}  // namespace servesim::studies
