// The replay's charts (studies/replay.h), as SVG through reports'
// LineChartSvg: each request's simulated against measured end-to-end
// latency, and the requests running and waiting over time, measured
// (the engine's timeseries.csv) and simulated (iterations.csv, sampled
// each second). Times in seconds.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "reports/report_html.h"
#include "studies/replay.h"
#include "studies/replay_files.h"

namespace servesim::studies {
namespace {

using replay_internal::ReadTable;
using replay_internal::Table;

}  // namespace

absl::StatusOr<std::string> E2eScatterSvg(const std::string& truth_path,
                                          const std::string& requests_path) {
  ASSIGN_OR_RETURN(const Table truth, ReadTable(truth_path));
  ASSIGN_OR_RETURN(const Table sim, ReadTable(requests_path));
  ASSIGN_OR_RETURN(const size_t m_e2e, truth.Column("e2e_s"));
  ASSIGN_OR_RETURN(const size_t s_e2e, sim.Column("e2e_s"));
  reports::Series points{"requests", {}, {}, /*line=*/false};
  double hi = 0;
  for (size_t r = 0; r < truth.rows.size() && r < sim.rows.size(); ++r) {
    ASSIGN_OR_RETURN(const double m, truth.Number(r, m_e2e));
    ASSIGN_OR_RETURN(const double s, sim.Number(r, s_e2e));
    points.x.push_back(m);
    points.y.push_back(s);
    hi = std::max({hi, m, s});
  }
  reports::Series diagonal{"simulated = measured", {0, hi}, {0, hi}};
  return reports::LineChartSvg("End-to-end latency per request", "measured E2E (s)",
                               "simulated E2E (s)", {points, diagonal}, /*markers=*/true);
}

absl::StatusOr<std::string> QueueOverTimeSvg(const std::string& iterations_path,
                                             const std::string& timeseries_path) {
  ASSIGN_OR_RETURN(const Table it, ReadTable(iterations_path));
  ASSIGN_OR_RETURN(const Table ts, ReadTable(timeseries_path));
  ASSIGN_OR_RETURN(const size_t i_rep, it.Column("replica"));
  ASSIGN_OR_RETURN(const size_t i_start, it.Column("start_s"));
  ASSIGN_OR_RETURN(const size_t i_dur, it.Column("duration_s"));
  ASSIGN_OR_RETURN(const size_t i_batch, it.Column("batch_size"));
  ASSIGN_OR_RETURN(const size_t i_wait, it.Column("waiting"));
  ASSIGN_OR_RETURN(const size_t m_t, ts.Column("t"));
  ASSIGN_OR_RETURN(const size_t m_run, ts.Column("running"));
  ASSIGN_OR_RETURN(const size_t m_wait, ts.Column("waiting"));
  reports::Series m_running{"running, measured", {}, {}}, m_waiting{"waiting, measured", {}, {}};
  double t_end = 0;
  for (size_t r = 0; r < ts.rows.size(); ++r) {
    ASSIGN_OR_RETURN(const double t, ts.Number(r, m_t));
    ASSIGN_OR_RETURN(const double run, ts.Number(r, m_run));
    ASSIGN_OR_RETURN(const double wait, ts.Number(r, m_wait));
    m_running.x.push_back(t);
    m_running.y.push_back(run);
    m_waiting.x.push_back(t);
    m_waiting.y.push_back(wait);
    t_end = std::max(t_end, t);
  }
  // Per replica, the iterations' (start, end, running, waiting), in order.
  struct Step {
    double start, end, running, waiting;
  };
  std::map<std::string, std::vector<Step>> steps;
  for (size_t r = 0; r < it.rows.size(); ++r) {
    ASSIGN_OR_RETURN(const double start, it.Number(r, i_start));
    ASSIGN_OR_RETURN(const double dur, it.Number(r, i_dur));
    ASSIGN_OR_RETURN(const double batch, it.Number(r, i_batch));
    ASSIGN_OR_RETURN(const double wait, it.Number(r, i_wait));
    steps[it.rows[r][i_rep]].push_back({start, start + dur, batch, wait});
    t_end = std::max(t_end, start + dur);
  }
  reports::Series s_running{"running, simulated", {}, {}}, s_waiting{"waiting, simulated", {}, {}};
  for (double t = 1; t <= std::ceil(t_end); t += 1) {
    double run = 0, wait = 0;
    for (const auto& [replica, v] : steps) {
      // The step in progress at t (an idle engine holds no requests).
      auto after = std::upper_bound(v.begin(), v.end(), t,
                                    [](double x, const Step& s) { return x < s.start; });
      if (after == v.begin()) continue;
      const Step& s = *(after - 1);
      // Between steps: the last one's counts unless the engine went idle
      // (no step for longer than the last one took).
      const double next = after == v.end() ? INFINITY : after->start;
      if (t <= s.end || next - s.end <= std::max(s.end - s.start, 1e-3)) {
        run += s.running;
        wait += s.waiting;
      }
    }
    s_running.x.push_back(t);
    s_running.y.push_back(run);
    s_waiting.x.push_back(t);
    s_waiting.y.push_back(wait);
  }
  return reports::LineChartSvg("Requests running and waiting", "time (s)", "requests",
                               {m_running, s_running, m_waiting, s_waiting});
}

}  // namespace servesim::studies
