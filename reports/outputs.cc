#include "reports/outputs.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "reports/report_html.h"
#include "reports/timeline.h"

namespace servesim::reports {
namespace {

std::string FallbacksJson(const std::vector<std::string>& fallbacks) {
  if (fallbacks.empty()) return "";
  std::vector<std::string> items;
  for (const std::string& f : fallbacks) items.push_back("    " + JsonString(f));
  return absl::StrCat(",\n  \"fallbacks\": [\n", absl::StrJoin(items, ",\n"), "\n  ]");
}

}  // namespace

std::string LinksCsv(const metrics::MetricsCollector& metrics, double makespan_s) {
  const double bin_s = metrics.link_bin_s();
  size_t bins = makespan_s > 0 ? static_cast<size_t>(std::ceil(makespan_s / bin_s)) : 0;
  std::string out = "time_s";
  for (const metrics::LinkLoad& l : metrics.link_loads()) {
    if (l.split_duplex) {
      absl::StrAppend(&out, ",", l.name, ".up,", l.name, ".down");
    } else {
      absl::StrAppend(&out, ",", l.name);
    }
    for (const auto& dir : l.bins) bins = std::max(bins, dir.size());
  }
  out += "\n";
  for (size_t k = 0; k < bins; ++k) {
    const double start = static_cast<double>(k) * bin_s;
    // The last bin ends with the run.
    const double width = std::min(bin_s, std::max(makespan_s - start, 0.0));
    absl::StrAppendFormat(&out, "%.9g", start);
    for (const metrics::LinkLoad& l : metrics.link_loads()) {
      for (int d = 0; d < (l.split_duplex ? 2 : 1); ++d) {
        const double b = k < l.bins[d].size() ? l.bins[d][k] : 0.0;
        const double u =
            width > 0 && l.bandwidth_bytes_per_s > 0 ? b / (l.bandwidth_bytes_per_s * width) : 0.0;
        absl::StrAppendFormat(&out, ",%.6g", u);
      }
    }
    out += "\n";
  }
  return out;
}

absl::Status WriteOutputs(const OutputDir& dir, const scenario::ResolvedScenario& sc,
                          const workload::Workload& wl, const metrics::MetricsCollector& metrics,
                          const metrics::Summary& s, const RunInfo& info) {
  const std::string partial = info.partial ? info.error : std::string();
  if (absl::Status st = dir.Write(
          "run_info.json",
          absl::StrCat(
              "{\n  \"wall_time_s\": ", FormatFigure(info.wall_s), ",\n  \"realtime_factor\": ",
              FormatFigure(info.wall_s > 0 ? info.simulated_s / info.wall_s : 0),
              info.engine_waits >= 0 ? absl::StrCat(",\n  \"engine_waits\": ", info.engine_waits)
                                     : "",
              info.partial
                  ? absl::StrCat(",\n  \"partial\": true,\n  \"error\": ", JsonString(info.error))
                  : "",
              info.agents_json.empty() ? "" : ",\n  \"agents\": " + info.agents_json,
              info.hint_projections + info.hint_renewals + info.hint_renewals_alongside > 0
                  ? absl::StrCat(",\n  \"hints\": {\"projections\": ", info.hint_projections,
                                 ", \"renewals\": ", info.hint_renewals,
                                 ", \"renewals_alongside\": ", info.hint_renewals_alongside, "}")
                  : "",
              info.op_costs_json.empty() ? "" : ",\n  \"op_costs\": " + info.op_costs_json,
              info.profile_json.empty() ? "" : ",\n  \"profile\": " + info.profile_json,
              info.collectives_json.empty() ? "" : ",\n  \"collectives\": " + info.collectives_json,
              info.client_json.empty() ? "" : ",\n  \"client\": " + info.client_json,
              FallbacksJson(info.fallbacks), "\n}\n"));
      !st.ok()) {
    return st;
  }
  if (!metrics.link_loads().empty() && sc.proto.output().links_csv()) {
    if (absl::Status st = dir.Write("links.csv", LinksCsv(metrics, s.makespan_s)); !st.ok()) {
      return st;
    }
  }
  if (sc.proto.output().timeline()) {
    if (absl::Status st =
            dir.Write("timeline.json", TimelineJson(sc, metrics, info.partial, partial));
        !st.ok()) {
      return st;
    }
  }
  if (sc.proto.output().report_html()) {
    if (absl::Status st = dir.Write(
            "report.html", ReportHtml(sc, metrics, s, info.simulated_s, info.partial, partial));
        !st.ok()) {
      return st;
    }
  }
  // Last: a folder with summary.json holds the whole set (a second signal
  // before it renames the others back to their temporary names).
  return dir.Write("summary.json", SummaryJson(sc, wl, s, info.simulated_s, info.partial));
}

}  // namespace servesim::reports
