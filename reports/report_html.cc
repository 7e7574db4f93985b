#include "reports/report_html.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace servesim::reports {
namespace {

using metrics::Distribution;
using metrics::EnergyParts;
using metrics::MetricsCollector;
using metrics::QuantileAccumulator;
using metrics::Summary;
using metrics::TimelineIteration;
using metrics::TimeSeries;
using scenario::ResolvedScenario;

constexpr double kW = 640, kH = 300;                       // chart size
constexpr double kLeft = 70, kRight = 150, kTop = 30, kBottom = 45;  // margins
// Distinct colours (Tableau 20's strong and light halves).
const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
                         "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#aec7e8", "#ffbb78",
                         "#98df8a", "#ff9896", "#c5b0d5", "#c49c94"};
constexpr size_t kNumColors = sizeof(kColors) / sizeof(kColors[0]);

std::string Esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

// 1, 2 or 5 times a power of ten, about (hi - lo) / 5 apart.
double NiceStep(double lo, double hi) {
  const double raw = (hi - lo) / 5;
  if (!(raw > 0)) return 1;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0}) {
    if (raw <= m * p) return m * p;
  }
  return 10 * p;
}

std::string Fmt(double v) {
  if (v != 0 && (std::fabs(v) >= 1e5 || std::fabs(v) < 1e-3)) return absl::StrFormat("%.1e", v);
  return absl::StrFormat("%g", v);
}

// Empirical CDF of an accumulator's samples, values times `scale`, thinned
// to at most 400 points: the exact samples' values at those ranks, or the
// sketch's estimates.
Series Cdf(const std::string& name, const QuantileAccumulator& acc, double scale) {
  Series s{name, {}, {}};
  const int64_t n = acc.count();
  if (n == 0) return s;
  const int64_t step = std::max<int64_t>(1, n / 400);
  for (int64_t i = 0; i < n; i += step) {
    s.x.push_back(acc.ValueAtRank(i) * scale);
    s.y.push_back(static_cast<double>(i + 1) / static_cast<double>(n));
  }
  s.x.push_back(acc.ValueAtRank(n - 1) * scale);
  s.y.push_back(1.0);
  return s;
}

}  // namespace

std::string LineChartSvg(const std::string& title, const std::string& x_label,
                         const std::string& y_label, const std::vector<Series>& series,
                         bool markers) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = 0, y1 = -INFINITY;
  for (const Series& s : series) {
    for (double v : s.x) x0 = std::min(x0, v), x1 = std::max(x1, v);
    for (double v : s.y) y0 = std::min(y0, v), y1 = std::max(y1, v);
  }
  std::string svg = absl::StrFormat(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" font-family="sans-serif" font-size="11">)"
      "\n<text x=\"%g\" y=\"18\" font-size=\"13\" font-weight=\"bold\">%s</text>\n",
      kW, kH, kW, kH, kLeft, Esc(title));
  if (!(x1 >= x0) || !(y1 >= y0)) {
    return svg + absl::StrFormat("<text x=\"%g\" y=\"%g\">no data</text></svg>\n", kLeft,
                                 kH / 2);
  }
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1;
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  auto px = [&](double x) { return kLeft + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return kTop + ph - (y - y0) / (y1 - y0) * ph; };
  absl::StrAppendFormat(&svg,
                        "<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" fill=\"none\" "
                        "stroke=\"#999\"/>\n",
                        kLeft, kTop, pw, ph);
  const double xs = NiceStep(x0, x1), ys = NiceStep(y0, y1);
  for (double t = std::ceil(x0 / xs) * xs; t <= x1 + 1e-9 * xs; t += xs) {
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" y1=\"%g\" x2=\"%.1f\" y2=\"%g\" stroke=\"#eee\"/>"
                          "<text x=\"%.1f\" y=\"%g\" text-anchor=\"middle\">%s</text>\n",
                          px(t), kTop, px(t), kTop + ph, px(t), kTop + ph + 14, Fmt(t));
  }
  for (double t = std::ceil(y0 / ys) * ys; t <= y1 + 1e-9 * ys; t += ys) {
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%g\" y1=\"%.1f\" x2=\"%g\" y2=\"%.1f\" stroke=\"#eee\"/>"
                          "<text x=\"%g\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                          kLeft, py(t), kLeft + pw, py(t), kLeft - 4, py(t) + 4, Fmt(t));
  }
  absl::StrAppendFormat(&svg,
                        "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">%s</text>\n"
                        "<text x=\"14\" y=\"%g\" text-anchor=\"middle\" "
                        "transform=\"rotate(-90 14 %g)\">%s</text>\n",
                        kLeft + pw / 2, kH - 8, Esc(x_label), kTop + ph / 2, kTop + ph / 2,
                        Esc(y_label));
  int k = 0;
  for (const Series& s : series) {
    if (s.x.empty()) continue;
    const char* color = kColors[k % kNumColors];
    std::string pts;
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      absl::StrAppendFormat(&pts, "%.1f,%.1f ", px(s.x[i]), py(s.y[i]));
    }
    if (s.line) {
      absl::StrAppendFormat(&svg,
                            "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" "
                            "points=\"%s\"/>\n",
                            color, pts);
    }
    absl::StrAppendFormat(&svg,
                          "<rect x=\"%g\" y=\"%g\" width=\"10\" height=\"10\" "
                          "fill=\"%s\"/><text x=\"%g\" y=\"%g\">%s</text>\n",
                          kLeft + pw + 10, kTop + 16.0 * k, color, kLeft + pw + 24,
                          kTop + 16.0 * k + 9, Esc(s.name));
    for (size_t i = 0; (markers || !s.line) && i < s.x.size() && i < s.y.size(); ++i) {
      absl::StrAppendFormat(&svg, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"/>\n",
                            px(s.x[i]), py(s.y[i]), color);
    }
    ++k;
  }
  return svg + "</svg>\n";
}

std::string BarChartSvg(const std::string& title, const std::string& unit,
                        const std::vector<std::pair<std::string, double>>& bars) {
  const double row = 22, label_w = 150, h = kTop + row * static_cast<double>(bars.size()) + 10;
  double top = 0;
  for (const auto& b : bars) top = std::max(top, b.second);
  std::string svg = absl::StrFormat(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" font-family="sans-serif" font-size="11">)"
      "\n<text x=\"10\" y=\"18\" font-size=\"13\" font-weight=\"bold\">%s</text>\n",
      kW, h, kW, h, Esc(title));
  const double bw = kW - label_w - 120;
  for (size_t i = 0; i < bars.size(); ++i) {
    const double y = kTop + row * static_cast<double>(i);
    const double w = top > 0 ? bars[i].second / top * bw : 0;
    absl::StrAppendFormat(&svg,
                          "<text x=\"%g\" y=\"%g\" text-anchor=\"end\">%s</text>"
                          "<rect x=\"%g\" y=\"%g\" width=\"%.1f\" height=\"%g\" fill=\"%s\"/>"
                          "<text x=\"%.1f\" y=\"%g\">%s %s</text>\n",
                          label_w - 6, y + 14, Esc(bars[i].first), label_w, y + 3, w, row - 6,
                          kColors[i % kNumColors], label_w + w + 6, y + 14, Fmt(bars[i].second),
                          Esc(unit));
  }
  return svg + "</svg>\n";
}

namespace {

// One sampled iteration's first layers as lanes per resource.
std::string ScheduleSvg(const ResolvedScenario& sc, const TimelineIteration& it) {
  const int32_t layers =
      std::min<int32_t>(metrics::kScheduleLayers, static_cast<int32_t>(sc.model.num_layers));
  double end = 0;
  for (const scheduler::Span& s : it.spans) {
    if (s.layer >= 0 && s.layer < layers) end = std::max(end, s.end_s);
  }
  const std::string lanes[] = {"xPU", "link out", sc.attention_kind, "link back", "kv copy"};
  const int nl = sc.has_attention_device ? 5 : 1;
  const double lane = 34, label_w = 80, w = 1100, pw = w - label_w - 20;
  const double h = 40 + lane * nl + 30;
  std::string svg = absl::StrFormat(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" font-family="sans-serif" font-size="10">)"
      "\n<text x=\"10\" y=\"18\" font-size=\"13\" font-weight=\"bold\">Iteration %d of "
      "replica %d (batch %d: %d decode, %d prefill tokens), layers 0-%d of %d, %s</text>\n",
      w, h, w, h, it.index, it.replica, it.batch_size, it.decode_tokens, it.prefill_tokens,
      layers - 1, sc.model.num_layers, scheduler::OverlapPolicyName(sc.planner.overlap));
  if (!(end > 0)) return svg + "</svg>\n";
  std::map<std::string, const char*> color;
  for (int l = 0; l < nl; ++l) {
    absl::StrAppendFormat(&svg, "<text x=\"%g\" y=\"%g\" text-anchor=\"end\">%s</text>\n",
                          label_w - 6, 40 + lane * l + lane / 2 + 4, Esc(lanes[l]));
  }
  for (const scheduler::Span& s : it.spans) {
    if (s.layer < 0 || s.layer >= layers) continue;
    const int l = static_cast<int>(s.track);
    if (l >= nl) continue;
    const std::string key(s.name);
    if (!color.count(key)) color[key] = kColors[color.size() % kNumColors];
    const double x = label_w + s.start_s / end * pw, bw = (s.end_s - s.start_s) / end * pw;
    const std::string tip = absl::StrFormat("%s%s layer %d: %.1f us", key,
                                            s.group >= 0 ? absl::StrCat(" g", s.group) : "",
                                            s.layer, (s.end_s - s.start_s) * 1e6);
    absl::StrAppendFormat(&svg,
                          "<rect x=\"%.2f\" y=\"%g\" width=\"%.2f\" height=\"%g\" fill=\"%s\" "
                          "stroke=\"#fff\" stroke-width=\"0.5\"><title>%s</title></rect>\n",
                          x, 40 + lane * l + 4, std::max(bw, 0.5), lane - 8, color[key],
                          Esc(tip));
  }
  double lx = label_w;
  for (const auto& [name, c] : color) {
    absl::StrAppendFormat(&svg,
                          "<rect x=\"%g\" y=\"%g\" width=\"10\" height=\"10\" fill=\"%s\"/>"
                          "<text x=\"%g\" y=\"%g\">%s</text>\n",
                          lx, h - 18, c, lx + 13, h - 9, Esc(name));
    lx += 20 + 6.0 * static_cast<double>(name.size());
  }
  absl::StrAppendFormat(&svg, "<text x=\"%g\" y=\"%g\" text-anchor=\"end\">%.3f ms</text>\n",
                        w - 20, 34.0, end * 1e3);
  return svg + "</svg>\n";
}

// The four busiest links' utilisation (a split-duplex uplink's directions
// apart, each against its own bandwidth) over `bins` bins of the run, from links.csv's finer bins:
// each fine bin's bytes go to the chart's bins in proportion to their overlap.
std::string LinksChart(const MetricsCollector& m, double span, int bins) {
  const double fine = m.link_bin_s(), bw = span / bins;
  struct Line {
    const metrics::LinkLoad* link;
    int dir;
    double bytes;
  };
  std::vector<Line> lines;
  for (const metrics::LinkLoad& l : m.link_loads()) {
    for (int d = 0; d < (l.split_duplex ? 2 : 1); ++d) {
      if (l.direction_bytes[d] > 0) {
        lines.push_back({&l, d, l.direction_bytes[d] / l.bandwidth_bytes_per_s});
      }
    }
  }
  std::stable_sort(lines.begin(), lines.end(),
                   [](const Line& a, const Line& b) { return a.bytes > b.bytes; });
  if (lines.size() > 4) lines.resize(4);
  std::vector<Series> series;
  for (const Line& line : lines) {
    std::vector<double> bytes(static_cast<size_t>(bins), 0.0);
    const std::vector<double>& v = line.link->bins[line.dir];
    for (size_t k = 0; k < v.size(); ++k) {
      const double lo = static_cast<double>(k) * fine, hi = lo + fine;
      for (int b = std::max(0, static_cast<int>(lo / bw)); b < bins && b * bw < hi; ++b) {
        const double overlap = std::min(hi, (b + 1) * bw) - std::max(lo, b * bw);
        if (overlap > 0) bytes[static_cast<size_t>(b)] += v[k] * overlap / fine;
      }
    }
    Series sr{line.link->split_duplex
                  ? absl::StrCat(line.link->name, line.dir == 0 ? " up" : " down")
                  : line.link->name,
              {},
              {}};
    for (int b = 0; b < bins; ++b) {
      sr.x.push_back((b + 0.5) * bw);
      sr.y.push_back(bytes[static_cast<size_t>(b)] / (line.link->bandwidth_bytes_per_s * bw));
    }
    series.push_back(std::move(sr));
  }
  return LineChartSvg("Links (busiest four; links.csv has all)", "simulated seconds", "utilisation",
                      series);
}

}  // namespace

std::string ReportHtml(const ResolvedScenario& sc, const MetricsCollector& m,
                       const Summary& summary, double simulated_s, bool partial,
                       const std::string& why) {
  std::string html = absl::StrFormat(
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>servesim%s: %s</title>\n"
      "<style>body{font-family:sans-serif;margin:20px;max-width:1150px}"
      "h2{margin-top:28px;border-bottom:1px solid #ccc}table{border-collapse:collapse}"
      "td,th{padding:2px 10px;text-align:right}td:first-child{text-align:left}"
      ".row{display:flex;flex-wrap:wrap;gap:10px}%s</style></head><body>\n",
      partial ? " (PARTIAL)" : "", Esc(sc.proto.name()),
      partial ? ".partial{background:#fde2e1;border:2px solid #c0392b;padding:8px}" : "");
  if (partial) {
    absl::StrAppend(&html, "<p class=\"partial\"><b>PARTIAL RUN</b>: stopped at ",
                    absl::StrFormat("%.1f", simulated_s), " simulated seconds (", Esc(why),
                    "). Every figure below covers only what was simulated until then.</p>\n");
  }
  absl::StrAppend(
      &html,
      absl::StrFormat(
          "<h1>servesim report</h1><p>%s &mdash; %d requests, %.1f simulated seconds, overlap "
          "policy %s.</p>\n",
          Esc(sc.proto.name()), summary.requests, simulated_s,
          scheduler::OverlapPolicyName(sc.planner.overlap)));
  auto row = [](const char* k, const Distribution& d, double scale, const char* unit) {
    return absl::StrFormat("<tr><td>%s</td><td>%.3f</td><td>%.3f</td><td>%.3f</td>"
                           "<td>%.3f</td><td>%s</td></tr>\n",
                           k, d.mean * scale, d.p50 * scale, d.p90 * scale, d.p99 * scale,
                           unit);
  };
  absl::StrAppend(
      &html, "<h2>Summary</h2><table><tr><th></th><th>mean</th><th>p50</th><th>p90</th>"
             "<th>p99</th><th></th></tr>\n",
      row("TTFT", summary.ttft_s, 1, "s"), row("TBT", summary.tbt_s, 1e3, "ms"),
      row("TPOT", summary.tpot_s, 1e3, "ms"), row("E2E", summary.e2e_s, 1, "s"), "</table>\n",
      absl::StrFormat("<p>Throughput %.1f tokens/s, %.3f requests/s; SLO attainment %.1f%%; "
                      "completed %d, rejected %d, preemptions %d; mean batch %.1f; energy "
                      "%.4g J (%.4g J/token).</p>\n",
                      summary.throughput_tokens_per_s, summary.throughput_requests_per_s,
                      100 * summary.slo_attainment, summary.completed, summary.rejected,
                      summary.preemptions, summary.batch_size_mean, summary.energy_j,
                      summary.energy_per_token_j));

  // Latency CDFs.
  absl::StrAppend(&html, "<h2>Latency</h2><div class=\"row\">\n",
                  LineChartSvg("TTFT CDF", "seconds", "fraction of requests",
                               {Cdf("TTFT", m.ttft(), 1)}),
                  LineChartSvg("TBT CDF", "milliseconds", "fraction of gaps",
                               {Cdf("TBT", m.tbt(), 1e3)}),
                  LineChartSvg("E2E CDF", "seconds", "fraction of requests",
                               {Cdf("E2E", m.e2e(), 1)}),
                  "</div>\n");

  // Over simulated time: ~100 bins.
  const double span = std::max(simulated_s, 1e-9);
  const int bins = 100;
  const double bw = span / bins;
  const TimeSeries::Binned binned = m.time_series().Bin(span, bins, sc.replicas);
  const std::vector<double>& tokens = binned.tokens;
  const std::vector<double>& batch_time = binned.batch_time;
  const std::vector<double>& batch_w = binned.batch_w;
  const std::vector<std::vector<double>>& xpu_busy = binned.xpu_busy;
  const std::vector<std::vector<double>>& dev_busy = binned.dev_busy;
  Series thr{"decode tokens/s", {}, {}}, bs{"mean batch size", {}, {}};
  for (int b = 0; b < bins; ++b) {
    const double mid = (b + 0.5) * bw;
    thr.x.push_back(mid);
    thr.y.push_back(tokens[b] / bw);
    bs.x.push_back(mid);
    bs.y.push_back(batch_w[b] > 0 ? batch_time[b] / batch_w[b] : 0);
  }
  std::vector<Series> util;
  for (int64_t r = 0; r < sc.replicas && r < 4; ++r) {
    Series x{absl::StrCat("r", r, " xPU"), {}, {}}, d{absl::StrCat("r", r, " ", sc.attention_kind), {}, {}};
    for (int b = 0; b < bins; ++b) {
      x.x.push_back((b + 0.5) * bw);
      x.y.push_back(std::min(1.0, xpu_busy[r][b] / bw));
      d.x.push_back((b + 0.5) * bw);
      d.y.push_back(std::min(1.0, dev_busy[r][b] / bw));
    }
    util.push_back(x);
    if (sc.has_attention_device) util.push_back(d);
  }
  // The cluster's power: its static power (constant over the run) plus
  // each bin's iterations' energy over the bin (an iteration's energy goes
  // to the bin it starts in).
  const EnergyParts& e = m.energy();
  const double static_w = m.last_event_s() > 0 ? e.static_total() / m.last_event_s() : 0.0;
  Series power{"cluster", {}, {}};
  for (int b = 0; b < bins; ++b) {
    power.x.push_back((b + 0.5) * bw);
    power.y.push_back(static_w + binned.energy[b] / bw);
  }
  absl::StrAppend(&html, "<h2>Over simulated time</h2><div class=\"row\">\n",
                  LineChartSvg("Throughput", "simulated seconds", "tokens/s", {thr}),
                  LineChartSvg("Batch size", "simulated seconds", "requests", {bs}),
                  LineChartSvg("Utilisation (busy fraction)", "simulated seconds", "busy", util),
                  LineChartSvg("Power", "simulated seconds", "W", {power}),
                  sc.disaggregated() ? LinksChart(m, span, bins) : "", "</div>\n");

  std::vector<std::pair<std::string, double>> bars = {{"xPU compute", e.xpu_compute},
                                                      {"xPU memory", e.xpu_memory}};
  if (e.xpu_active > 0) bars.push_back({"xPU active", e.xpu_active});
  bars.push_back({"xPU idle", e.xpu_idle});
  if (sc.has_attention_device) {
    bars.push_back({sc.attention_kind + " compute", e.device_compute});
    bars.push_back({sc.attention_kind + " memory", e.device_memory});
    bars.push_back({sc.attention_kind + " static", e.device_static});
  }
  bars.push_back({"links", e.links});
  if (e.host > 0) bars.push_back({"host", e.host});
  absl::StrAppend(&html, "<h2>Energy</h2>\n", BarChartSvg("Energy by part", "J", bars));

  // The schedule of the sampled iteration with the most decode tokens.
  const TimelineIteration* pick = nullptr;
  for (const TimelineIteration& it : m.timeline()) {
    if (pick == nullptr || it.decode_tokens > pick->decode_tokens) pick = &it;
  }
  if (pick != nullptr) {
    absl::StrAppend(&html,
                    "<h2>One iteration's schedule</h2><p>Spans per resource (hover for "
                    "names and durations); timeline.json has every sampled iteration.</p>\n",
                    ScheduleSvg(sc, *pick));
  }
  return html + "</body></html>\n";
}

}  // namespace servesim::reports
