// `servesim plot TABLE.csv --x COL --y COL`: a line chart (SVG) of a table
// servesim wrote (reports/plot.h).
#include "reports/plot.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/read_text.h"
#include "services/commands/commands.h"

namespace servesim::services {
namespace {

// A table to plot is read whole: sweeps and searches write kilobytes.
constexpr int64_t kMaxPlotTableBytes = int64_t{256} << 20;

struct PlotFlags {
  std::string table;
  std::string out;
  reports::PlotSpec plot;
};

}  // namespace

int PlotCommand(const Args& args) {
  PlotFlags o;
  FlagParser flags;
  flags.Positional([&o](const std::string& a) -> std::string {
    if (!o.table.empty()) return "unexpected argument " + a;
    o.table = a;
    return "";
  });
  flags.String("--out", &o.out, "--out needs a file");
  flags.String("--x", &o.plot.x, "--x needs a column name");
  flags.String("--y", &o.plot.y, "--y needs a column name");
  flags.Value("--group", "--group needs column names", [&o](const std::string& v) {
    o.plot.group = absl::StrSplit(v, ',', absl::SkipEmpty());
    return std::string();
  });
  flags.Value("--where", "--where needs COLUMN=VALUE", [&o](const std::string& v) -> std::string {
    if (v.find('=') == std::string::npos) return "--where needs COLUMN=VALUE";
    o.plot.where.emplace_back(v.substr(0, v.find('=')), v.substr(v.find('=') + 1));
    return "";
  });
  flags.String("--title", &o.plot.title, "--title needs a text");
  if (auto exit = ParseFlags(flags, args)) return *exit;
  if (o.table.empty() || o.plot.x.empty() || o.plot.y.empty()) {
    return UsageError("plot needs a CSV table, --x COLUMN and --y COLUMN");
  }
  auto text = ReadTextFile(o.table, kMaxPlotTableBytes, "a CSV table");
  if (!text.ok()) return Fail(text.status());
  auto svg = reports::PlotCsv(*text, o.table, o.plot);
  if (!svg.ok()) return Fail(svg.status());
  std::string out = o.out;
  if (out.empty()) {
    out = absl::EndsWith(o.table, ".csv") ? o.table.substr(0, o.table.size() - 4) : o.table;
    out += ".svg";
  }
  // Never over its own input; written whole (a temporary name, renamed).
  namespace fs = std::filesystem;
  std::error_code ec1, ec2;
  if (fs::weakly_canonical(fs::absolute(out), ec1) ==
      fs::weakly_canonical(fs::absolute(o.table), ec2)) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat(out, ": is the table plotted; give --out another file")));
  }
  const std::string tmp = absl::StrCat(out, ".partial");
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << *svg;
    f.close();
    if (!f.good() || std::rename(tmp.c_str(), out.c_str()) != 0) {
      std::remove(tmp.c_str());
      return Fail(absl::UnavailableError(absl::StrCat(out, ": cannot write")));
    }
  }
  std::cerr << "wrote " << out << "\n";
  return 0;
}

}  // namespace servesim::services
