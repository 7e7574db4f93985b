#include "studies/sweep.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "reports/output_dir.h"
#include "reports/summary.h"

namespace servesim::studies {

using reports::JsonString;

namespace fs = std::filesystem;

const std::vector<SweepFigure> kSweepFigures = {
    {"requests", "requests", ""},
    {"completed", "requests_completed", ""},
    {"rejected", "requests_rejected", ""},
    {"throughput_tokens_per_s", "throughput_tokens_per_s", ""},
    {"ttft_p50_s", "ttft_s", "p50"},
    {"ttft_p99_s", "ttft_s", "p99"},
    {"tbt_p50_s", "tbt_s", "p50"},
    {"tbt_p99_s", "tbt_s", "p99"},
    {"tpot_p99_s", "tpot_s", "p99"},
    {"e2e_p99_s", "e2e_s", "p99"},
    {"slo_attainment", "slo_attainment", ""},
    {"goodput_requests_per_s", "goodput_requests_per_s", ""},
    {"energy_per_token_j", "energy_per_token_j", ""},
    {"batch_size_mean", "batch_size_mean", ""},
};

namespace {

std::string ReadText(const std::string& path, bool* ok) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  *ok = in.good() || in.eof();
  if (!in.is_open()) *ok = false;
  return s.str();
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat(path, ": cannot write"));
  return absl::OkStatus();
}

// The string tokens of one JSON line, unescaped (the writer escapes only
// quotes, backslashes and control characters).
std::vector<std::string> JsonStrings(absl::string_view line) {
  std::vector<std::string> out;
  size_t i = 0;
  while ((i = line.find('"', i)) != absl::string_view::npos) {
    std::string s;
    ++i;
    while (i < line.size() && line[i] != '"') {
      if (line[i] == '\\' && i + 1 < line.size()) {
        ++i;
        switch (line[i]) {
          case 'n': s += '\n'; break;
          case 't': s += '\t'; break;
          case 'u':
            // \uXXXX as JsonString writes it; anything else is dropped.
            if (int c = 0; i + 4 < line.size() && absl::SimpleHexAtoi(line.substr(i + 1, 4), &c)) {
              s += static_cast<char>(c);
              i += 4;
            }
            break;
          default: s += line[i];
        }
      } else {
        s += line[i];
      }
      ++i;
    }
    out.push_back(std::move(s));
    ++i;
  }
  return out;
}

std::string Slug(const std::vector<std::pair<std::string, std::string>>& vary) {
  std::vector<std::string> parts;
  for (const auto& [field, value] : vary) {
    const size_t dot = field.rfind('.');
    parts.push_back(absl::StrCat(dot == std::string::npos ? field : field.substr(dot + 1), "-",
                                 value));
  }
  std::string s = absl::StrJoin(parts, "_");
  for (char& c : s) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') {
      c = '-';
    }
  }
  if (s.size() > 96) s.resize(96);
  return s;
}

}  // namespace

std::string FormatValue(double v) { return absl::StrFormat("%.10g", v); }

absl::StatusOr<VaryAxis> ParseVary(const std::string& spec) {
  const size_t eq = spec.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--vary ", spec, ": expected field.path=v1,v2,..."));
  }
  VaryAxis axis;
  axis.field = std::string(absl::StripAsciiWhitespace(spec.substr(0, eq)));
  std::set<std::string> seen;
  for (absl::string_view v : absl::StrSplit(spec.substr(eq + 1), ',')) {
    const std::string value(absl::StripAsciiWhitespace(v));
    if (value.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--vary ", spec, ": empty value in the list of ", axis.field));
    }
    if (!seen.insert(value).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--vary ", spec, ": ", axis.field, " value ", value, " given twice"));
    }
    axis.values.push_back(value);
  }
  return axis;
}

std::vector<SweepPoint> ExpandPoints(const std::vector<VaryAxis>& axes) {
  size_t total = 1;
  for (const VaryAxis& a : axes) total *= a.values.size();
  const int width = static_cast<int>(absl::StrCat(total > 0 ? total - 1 : 0).size());
  std::vector<SweepPoint> points;
  for (size_t i = 0; i < total; ++i) {
    SweepPoint p;
    p.index = static_cast<int64_t>(i);
    size_t rest = i;
    p.vary.resize(axes.size());
    for (size_t a = axes.size(); a-- > 0;) {
      p.vary[a] = {axes[a].field, axes[a].values[rest % axes[a].values.size()]};
      rest /= axes[a].values.size();
    }
    p.name = absl::StrFormat("%0*d_%s", width, i, Slug(p.vary));
    points.push_back(std::move(p));
  }
  return points;
}

uint64_t Fnv1a64(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

absl::StatusOr<std::string> ScenarioHash(const std::string& path) {
  bool ok = false;
  const std::string text = ReadText(path, &ok);
  if (!ok) return absl::NotFoundError(absl::StrCat(path, ": cannot read the scenario file"));
  return absl::StrFormat("%016x", Fnv1a64(text));
}

std::string PointJson(const PointSpec& p) {
  std::vector<std::string> overrides, vary;
  for (const std::string& o : p.overrides) overrides.push_back(JsonString(o));
  for (const auto& [f, v] : p.vary) {
    vary.push_back(absl::StrCat("[", JsonString(f), ", ", JsonString(v), "]"));
  }
  return absl::StrCat("{\n  \"scenario\": ", JsonString(p.scenario),
                      ",\n  \"scenario_fnv1a64\": ", JsonString(p.scenario_hash),
                      ",\n  \"index\": ", p.index, ",\n  \"overrides\": [",
                      absl::StrJoin(overrides, ", "), "],\n  \"vary\": [",
                      absl::StrJoin(vary, ", "), "]\n}\n");
}

absl::StatusOr<PointSpec> ParsePointJson(const std::string& text, const std::string& where) {
  PointSpec p;
  bool has[5] = {false, false, false, false, false};
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (absl::ConsumePrefix(&line, "\"scenario\": ")) {
      auto s = JsonStrings(line);
      if (s.size() == 1) p.scenario = s[0], has[0] = true;
    } else if (absl::ConsumePrefix(&line, "\"scenario_fnv1a64\": ")) {
      auto s = JsonStrings(line);
      if (s.size() == 1) p.scenario_hash = s[0], has[1] = true;
    } else if (absl::ConsumePrefix(&line, "\"index\": ")) {
      has[2] = absl::SimpleAtoi(absl::StripSuffix(line, ","), &p.index);
    } else if (absl::ConsumePrefix(&line, "\"overrides\": ")) {
      p.overrides = JsonStrings(line);
      has[3] = true;
    } else if (absl::ConsumePrefix(&line, "\"vary\": ")) {
      const auto s = JsonStrings(line);
      if (s.size() % 2 == 0) {
        for (size_t i = 0; i < s.size(); i += 2) p.vary.push_back({s[i], s[i + 1]});
        has[4] = true;
      }
    }
  }
  for (bool h : has) {
    if (!h) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": malformed point.json (needs scenario, scenario_fnv1a64, index, overrides, "
                 "vary, as servesim sweep writes it)"));
    }
  }
  return p;
}

std::string ShellQuote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789_-./=:,+") == std::string::npos) {
    return s;
  }
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') {
      q += "'\\''";
    } else {
      q += c;
    }
  }
  return q + "'";
}

std::vector<std::string> RunArgs(const PointSpec& p, const std::string& out_dir) {
  std::vector<std::string> args = {"run", p.scenario, "--quiet", "--out", out_dir};
  for (const std::string& o : p.overrides) {
    args.push_back("--set");
    args.push_back(o);
  }
  return args;
}

absl::StatusOr<std::map<std::string, std::string>> ReadSummaryFigures(
    const std::string& point_dir) {
  const std::string path = point_dir + "/summary.json";
  if (!fs::exists(path)) {
    return absl::NotFoundError(absl::StrCat(
        point_dir, ": no summary.json (the point has not run, or its run failed: see ",
        point_dir, "/run.log)"));
  }
  bool ok = false;
  const std::string text = ReadText(path, &ok);
  if (!ok) return absl::UnavailableError(absl::StrCat(path, ": cannot read"));
  if (!absl::StartsWith(text, "{\n") || !absl::EndsWith(text, "}\n")) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": malformed (not a complete JSON object; an interrupted run?)"));
  }
  std::map<std::string, std::string> figures;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (!absl::ConsumePrefix(&line, "\"")) continue;
    const size_t q = line.find("\": ");
    if (q == absl::string_view::npos) continue;
    const std::string key(line.substr(0, q));
    absl::string_view value = absl::StripSuffix(line.substr(q + 3), ",");
    if (absl::ConsumePrefix(&value, "{")) {
      value = absl::StripSuffix(value, "}");
      for (absl::string_view item : absl::StrSplit(value, ", ", absl::SkipEmpty())) {
        const auto kv = JsonStrings(item.substr(0, item.find(':')));
        const size_t colon = item.find(": ");
        if (kv.size() == 1 && colon != absl::string_view::npos) {
          figures[absl::StrCat(key, ".", kv[0])] = std::string(item.substr(colon + 2));
        }
      }
    } else {
      figures[key] = std::string(value);
    }
  }
  if (figures.count("partial") != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": partial results (the run failed; see ", point_dir, "/run.log)"));
  }
  for (const SweepFigure& f : kSweepFigures) {
    const std::string key = *f.field ? absl::StrCat(f.key, ".", f.field) : f.key;
    double v = 0;
    auto it = figures.find(key);
    // null: a statistic of no samples (a run that completed nothing).
    if (it == figures.end() || (it->second != "null" && !absl::SimpleAtod(it->second, &v))) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": malformed: no number for \"", key, "\""));
    }
  }
  return figures;
}

bool PointFinished(const std::string& dir, const PointSpec& p) {
  bool ok = false;
  const std::string text = ReadText(dir + "/point.json", &ok);
  return ok && text == PointJson(p) && ReadSummaryFigures(dir).ok();
}

absl::Status PreparePoint(const std::string& dir, const PointSpec& p) {
  // Marked as servesim's, so that its run takes it with point.json in it.
  RETURN_IF_ERROR(reports::OutputDir::MarkOwned(dir));
  std::error_code ec;
  fs::remove(dir + "/summary.json", ec);
  return WriteText(dir + "/point.json", PointJson(p));
}

absl::StatusOr<SweepTable> MergePoints(const std::vector<std::string>& dirs) {
  std::vector<std::string> folders;
  for (const std::string& d : dirs) {
    if (fs::exists(d + "/point.json")) {
      folders.push_back(d);
    } else if (fs::exists(d + "/points.txt")) {
      bool ok = false;
      const std::string list = ReadText(d + "/points.txt", &ok);
      for (absl::string_view name : absl::StrSplit(list, '\n', absl::SkipEmpty())) {
        folders.push_back(absl::StrCat(d, "/points/", name));
      }
    } else if (fs::is_directory(d + "/points")) {
      std::vector<std::string> names;
      for (const auto& e : fs::directory_iterator(d + "/points")) {
        if (e.is_directory()) names.push_back(e.path().string());
      }
      std::sort(names.begin(), names.end());
      folders.insert(folders.end(), names.begin(), names.end());
    } else {
      return absl::NotFoundError(absl::StrCat(
          d, ": neither a sweep folder (with points/) nor a point folder (with point.json)"));
    }
  }
  if (folders.empty()) return absl::NotFoundError("merge: no point folders found");
  struct Row {
    int64_t index;
    std::string folder;
    std::vector<std::string> cells;
  };
  std::vector<Row> rows;
  std::vector<std::string> fields;
  std::string fields_from;
  PointSpec first;  // the first folder's point: every other must share its scenario
  std::set<int64_t> seen;
  for (const std::string& folder : folders) {
    bool ok = false;
    const std::string pj = ReadText(folder + "/point.json", &ok);
    if (!ok) {
      return absl::NotFoundError(
          absl::StrCat(folder, ": no point.json (not a point folder of servesim sweep)"));
    }
    auto spec = ParsePointJson(pj, folder + "/point.json");
    if (!spec.ok()) return spec.status();
    auto figures = ReadSummaryFigures(folder);
    if (!figures.ok()) return figures.status();
    std::vector<std::string> these;
    for (const auto& fv : spec->vary) these.push_back(fv.first);
    // What the point ran besides its varied values: the scenario and the
    // --set list the sweep started from.
    const std::vector<std::string> base(
        spec->overrides.begin(),
        spec->overrides.end() - std::min(spec->overrides.size(), spec->vary.size()));
    if (fields_from.empty()) {
      fields = these;
      fields_from = folder;
      first = *spec;
      first.overrides = base;
    } else if (spec->scenario_hash != first.scenario_hash) {
      return absl::InvalidArgumentError(absl::StrCat(
          folder, ": ran ", spec->scenario, " (hash ", spec->scenario_hash, ") but ", fields_from,
          " ran ", first.scenario, " (hash ", first.scenario_hash, "); merge points of one sweep"));
    } else if (base != first.overrides) {
      return absl::InvalidArgumentError(absl::StrCat(
          folder, ": ran with --set ", absl::StrJoin(base, " "), " but ", fields_from, " with ",
          first.overrides.empty() ? "none" : absl::StrJoin(first.overrides, " "),
          "; merge points of one sweep"));
    } else if (these != fields) {
      return absl::InvalidArgumentError(absl::StrCat(
          folder, ": varies ", absl::StrJoin(these, ", "), " but ", fields_from, " varies ",
          absl::StrJoin(fields, ", "), "; merge points of one sweep"));
    }
    if (!seen.insert(spec->index).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          folder, ": point index ", spec->index, " appears twice (two sweeps in one folder?)"));
    }
    Row r{spec->index, folder, {fs::path(folder).filename().string()}};
    for (const auto& fv : spec->vary) r.cells.push_back(fv.second);
    for (const SweepFigure& f : kSweepFigures) {
      r.cells.push_back(figures->at(*f.field ? absl::StrCat(f.key, ".", f.field) : f.key));
    }
    rows.push_back(std::move(r));
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.index < b.index; });
  SweepTable t;
  t.header.push_back("point");
  t.header.insert(t.header.end(), fields.begin(), fields.end());
  for (const SweepFigure& f : kSweepFigures) t.header.push_back(f.column);
  for (Row& r : rows) t.rows.push_back(std::move(r.cells));
  return t;
}

std::string TableCsv(const SweepTable& t) {
  auto cell = [](const std::string& s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string q = "\"";
    for (char c : s) {
      if (c == '"') q += '"';
      q += c;
    }
    return q + "\"";
  };
  std::string csv;
  auto line = [&](const std::vector<std::string>& cells) {
    std::vector<std::string> c;
    for (const std::string& s : cells) c.push_back(cell(s));
    absl::StrAppend(&csv, absl::StrJoin(c, ","), "\n");
  };
  line(t.header);
  for (const auto& r : t.rows) line(r);
  return csv;
}

std::string TableText(const SweepTable& t) {
  std::vector<size_t> width(t.header.size(), 0);
  auto grow = [&](const std::vector<std::string>& cells) {
    for (size_t i = 0; i < cells.size() && i < width.size(); ++i) {
      width[i] = std::max(width[i], cells[i].size());
    }
  };
  grow(t.header);
  for (const auto& r : t.rows) grow(r);
  std::string out;
  auto line = [&](const std::vector<std::string>& cells) {
    for (size_t i = 0; i < cells.size(); ++i) {
      absl::StrAppend(&out, i ? "  " : "", cells[i], std::string(width[i] - cells[i].size(), ' '));
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    out += "\n";
  };
  line(t.header);
  for (const auto& r : t.rows) line(r);
  return out;
}

}  // namespace servesim::studies
