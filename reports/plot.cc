#include "reports/plot.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "reports/report_html.h"

namespace servesim::reports {

namespace {

// `s` fit for a terminal: control bytes (a CSV is any user's file) as \xNN.
std::string Printable(absl::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) {
      absl::StrAppendFormat(&out, "\\x%02x", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string PrintableList(const std::vector<std::string>& names) {
  std::vector<std::string> shown;
  for (const std::string& n : names) shown.push_back(Printable(n));
  return absl::StrJoin(shown, ", ");
}

}  // namespace

absl::StatusOr<std::string> PlotCsv(const std::string& csv, const std::string& path,
                                    const PlotSpec& spec) {
  std::vector<std::string> lines = absl::StrSplit(csv, '\n', absl::SkipWhitespace());
  if (lines.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": empty"));
  std::vector<std::string> header = absl::StrSplit(absl::StripSuffix(lines[0], "\r"), ',');
  auto column = [&](const std::string& name, const char* what) -> absl::StatusOr<size_t> {
    auto it = std::find(header.begin(), header.end(), name);
    if (it == header.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", what, " column '", Printable(name),
                       "' not in the header; columns: ", PrintableList(header)));
    }
    return static_cast<size_t>(it - header.begin());
  };
  auto xc = column(spec.x, "--x");
  if (!xc.ok()) return xc.status();
  auto yc = column(spec.y, "--y");
  if (!yc.ok()) return yc.status();
  std::vector<size_t> gc;
  for (const std::string& g : spec.group) {
    auto c = column(g, "--group");
    if (!c.ok()) return c.status();
    gc.push_back(*c);
  }
  std::vector<std::pair<size_t, std::string>> wc;
  for (const auto& [col, value] : spec.where) {
    auto c = column(col, "--where");
    if (!c.ok()) return c.status();
    wc.emplace_back(*c, value);
  }
  // Lines in order of first appearance.
  std::vector<std::string> order;
  std::map<std::string, std::vector<std::pair<double, double>>> points;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<std::string> f = absl::StrSplit(absl::StripSuffix(lines[i], "\r"), ',');
    if (f.size() != header.size()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", i + 1, ": ", f.size(),
                                                     " fields; the header has ", header.size()));
    }
    bool keep = true;
    for (const auto& [c, value] : wc) keep = keep && f[c] == value;
    if (!keep || f[*xc].empty() || f[*yc].empty()) continue;
    double x, y;
    for (auto [c, v] : {std::pair{*xc, &x}, std::pair{*yc, &y}}) {
      if (!absl::SimpleAtod(f[c], v) || !std::isfinite(*v)) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ":", i + 1, ": column '", Printable(header[c]), "' = '",
                         Printable(f[c]), "' is not a finite number"));
      }
    }
    std::vector<std::string> key;
    for (size_t c : gc) key.push_back(f[c]);
    std::string name = Printable(key.empty() ? spec.y : absl::StrJoin(key, " / "));
    if (!points.count(name)) order.push_back(name);
    points[name].emplace_back(x, y);
  }
  std::vector<Series> series;
  for (const std::string& name : order) {
    auto& p = points[name];
    std::stable_sort(p.begin(), p.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    Series s{name, {}, {}};
    for (const auto& [x, y] : p) s.x.push_back(x), s.y.push_back(y);
    series.push_back(std::move(s));
  }
  const std::string title =
      Printable(spec.title.empty() ? absl::StrCat(spec.y, " vs ", spec.x) : spec.title);
  return LineChartSvg(title, Printable(spec.x), Printable(spec.y), series, /*markers=*/true);
}

}  // namespace servesim::reports
