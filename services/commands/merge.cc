// `servesim merge DIR...`: sweep.csv from finished points (after running
// the command lines `sweep --emit-jobs` wrote, elsewhere).
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "services/commands/commands.h"
#include "services/commands/points.h"
#include "services/commands/run.h"
#include "studies/sweep.h"

namespace servesim::services {
namespace {

struct MergeFlags {
  std::vector<std::string> merge_dirs;
  std::string out;
  bool quiet = false;
  bool force = false;
};

}  // namespace

int MergeCommand(const Args& args) {
  MergeFlags o;
  FlagParser flags;
  flags.Positional([&o](const std::string& a) {
    o.merge_dirs.push_back(a);
    return std::string();
  });
  flags.String("--out", &o.out, "--out needs a folder");
  flags.Switch("--quiet", [&o] { o.quiet = true; });
  flags.Switch("--force", [&o] { o.force = true; });
  if (auto exit = ParseFlags(flags, args)) return *exit;
  if (o.merge_dirs.empty())
    return UsageError("merge needs one or more sweep folders (or point folders)");
  std::vector<std::string> dirs;
  for (const std::string& d : o.merge_dirs) dirs.push_back(std::filesystem::absolute(d).string());
  auto table = studies::MergePoints(dirs);
  if (!table.ok()) return Fail(table.status());
  const std::string out = o.out.empty() ? o.merge_dirs[0] : o.out;
  reports::OutputDir::Options options;
  options.run_outputs = false;
  options.also_clear = {"sweep.csv"};
  auto claimed = AcquireOutputs(out, "servesim merge", o.force, options);
  if (!claimed.ok()) return Fail(claimed.status());
  if (absl::Status w = WriteTextFile(out + "/sweep.csv", studies::TableCsv(*table)); !w.ok()) {
    return Fail(w);
  }
  if (!o.quiet) std::cout << studies::TableText(*table);
  std::cout << absl::StrFormat("wrote %s/sweep.csv: %d points\n", out, table->rows.size());
  return 0;
}

}  // namespace servesim::services
