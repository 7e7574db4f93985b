// `servesim plot TABLE.csv --x COL --y COL`: a line chart (SVG) of a table
// servesim wrote (reports/plot.h).
#include "reports/plot.h"

#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "services/commands/commands.h"

namespace servesim::services {
namespace {

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
  flags.String("--out", &o.out, "--out needs a folder");
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
  std::ifstream in(o.table, std::ios::binary);
  if (!in) return Fail(absl::NotFoundError(absl::StrCat(o.table, ": cannot read")));
  std::stringstream text;
  text << in.rdbuf();
  auto svg = reports::PlotCsv(text.str(), o.table, o.plot);
  if (!svg.ok()) return Fail(svg.status());
  std::string out = o.out;
  if (out.empty()) {
    out = absl::EndsWith(o.table, ".csv") ? o.table.substr(0, o.table.size() - 4) : o.table;
    out += ".svg";
  }
  std::ofstream f(out, std::ios::binary);
  f << *svg;
  if (!f.good()) return Fail(absl::InternalError(absl::StrCat(out, ": cannot write")));
  std::cerr << "wrote " << out << "\n";
  return 0;
}

}  // namespace servesim::services
