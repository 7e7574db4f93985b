#include "reports/outputs.h"

#include "absl/strings/str_cat.h"
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

absl::Status WriteOutputs(const OutputDir& dir, const scenario::ResolvedScenario& sc,
                          const workload::Workload& wl, const metrics::MetricsCollector& metrics,
                          const metrics::Summary& s, const RunInfo& info) {
  const std::string partial = info.partial ? info.error : std::string();
  if (absl::Status st =
          dir.Write("summary.json", SummaryJson(sc, wl, s, info.simulated_s, info.partial));
      !st.ok()) {
    return st;
  }
  if (absl::Status st = dir.Write(
          "run_info.json",
          absl::StrCat(
              "{\n  \"wall_time_s\": ", FormatFigure(info.wall_s), ",\n  \"realtime_factor\": ",
              FormatFigure(info.wall_s > 0 ? info.simulated_s / info.wall_s : 0),
              info.partial
                  ? absl::StrCat(",\n  \"partial\": true,\n  \"error\": ", JsonString(info.error))
                  : "",
              info.agents_json.empty() ? "" : ",\n  \"agents\": " + info.agents_json,
              info.profile_json.empty() ? "" : ",\n  \"profile\": " + info.profile_json,
              FallbacksJson(info.fallbacks), "\n}\n"));
      !st.ok()) {
    return st;
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
  return absl::OkStatus();
}

}  // namespace servesim::reports
