// report.html: a self-contained page (inline SVG, no scripts, no network)
// of a finished run: TTFT / TBT / E2E CDFs, throughput and batch size over
// simulated time, xPU and attention-device utilisation over time, the
// energy breakdown, and one sampled iteration's schedule per resource (the
// picture of head-level pipelining). Deterministic like every other output.
#ifndef SERVESIM_REPORTS_REPORT_HTML_H_
#define SERVESIM_REPORTS_REPORT_HTML_H_

#include <string>
#include <vector>

#include "metrics/collector.h"
#include "scenario/scenario.h"

namespace servesim::reports {

// A partial run (stopped early: `why`) says so in the title and the first
// line of the page.
std::string ReportHtml(const scenario::ResolvedScenario& sc,
                       const metrics::MetricsCollector& metrics, const metrics::Summary& summary,
                       double simulated_s, bool partial = false, const std::string& why = "");

// The SVG building blocks (exposed for tests).
struct Series {
  std::string name;
  std::vector<double> x, y;
  bool line = true;  // false: the points only (a scatter)
};
// A line chart; empty series are skipped. Axes span the data. `markers`:
// a dot at each point too.
std::string LineChartSvg(const std::string& title, const std::string& x_label,
                         const std::string& y_label, const std::vector<Series>& series,
                         bool markers = false);
// Horizontal bars with their values.
std::string BarChartSvg(const std::string& title, const std::string& unit,
                        const std::vector<std::pair<std::string, double>>& bars);

}  // namespace servesim::reports

#endif  // SERVESIM_REPORTS_REPORT_HTML_H_
