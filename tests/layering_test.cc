// The source layout's rules (docs/design.md "Libraries and their
// dependencies"), checked on the sources themselves: each library folder
// includes only its own headers and those of the folders below it, and the
// headers a library keeps to itself are included nowhere else.
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace servesim {
namespace {

namespace fs = std::filesystem;

// What each library folder may include besides itself (generated protobuf
// headers, under servesim/v1/, belong to proto).
const std::map<std::string, std::set<std::string>>& Allowed() {
  static const auto* kAllowed = new std::map<std::string, std::set<std::string>>{
      {"common", {}},
      {"proto", {}},
      {"devices", {"proto", "common"}},
      {"agents", {"devices", "proto", "common"}},
      {"scheduler", {"devices", "proto", "common"}},
      {"workload", {"proto", "common", "scheduler"}},
      {"metrics", {"scheduler", "devices", "proto", "common"}},
      {"scenario", {"agents", "scheduler", "devices", "proto", "common"}},
      {"cluster",
       {"scenario", "workload", "metrics", "agents", "scheduler", "devices", "proto", "common"}},
      {"reports",
       {"metrics", "scenario", "workload", "agents", "scheduler", "devices", "proto", "common"}},
      {"studies",
       {"reports", "metrics", "scenario", "workload", "agents", "scheduler", "devices", "proto",
        "common"}},
  };
  return *kAllowed;
}

// Headers internal to their library: included only from the library
// itself and from its tests (and fuzz targets).
const std::set<std::string>& Internal() {
  static const auto* kInternal = new std::set<std::string>{
      "workload/text_reader.h", "workload/row_reader.h", "workload/sources.h",
      // The simulation's parts: only cluster/simulation.h is public.
      "cluster/actors.h", "cluster/device_hints.h", "cluster/engine.h", "cluster/fabric.h",
      "cluster/fabric_flows.h", "cluster/kv_transfer.h", "cluster/platform.h",
      "cluster/power.h", "cluster/rank.h", "cluster/run_state.h",
      // Parts of one class or one step shared by a library's files.
      "agents/agent_service_internal.h", "agents/remote_device_internal.h",
      "scenario/resolve_internal.h", "studies/replay_files.h", "studies/replay_workload.h"};
  return *kInternal;
}

// The project's own includes of `path`: "folder/..." names (generated
// protobuf headers count as proto).
std::vector<std::string> Includes(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  static const std::regex kInclude(R"re(^\s*#\s*include\s+"([^"]+)")re");
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_search(line, m, kInclude)) out.push_back(m[1]);
  }
  return out;
}

std::string FolderOf(const std::string& include) {
  if (include.rfind("servesim/v1/", 0) == 0) return "proto";
  return include.substr(0, include.find('/'));
}

TEST(LayeringTest, LibrariesIncludeOnlyWhatIsBelowThem) {
  const fs::path root = SERVESIM_SOURCE_DIR;
  int checked = 0;
  for (const auto& [folder, allowed] : Allowed()) {
    if (!fs::exists(root / folder)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(root / folder)) {
      const std::string ext = entry.path().extension().string();
      if (ext != ".h" && ext != ".cc") continue;
      ++checked;
      for (const std::string& inc : Includes(entry.path())) {
        const std::string to = FolderOf(inc);
        const bool ours =
            Allowed().count(to) > 0 || to == "services" || to == "tests" || to == "bench";
        if (!ours) continue;  // a third-party header
        EXPECT_TRUE(to == folder || allowed.count(to) > 0)
            << fs::relative(entry.path(), root).string() << " includes \"" << inc
            << "\": " << folder << "/ may include only " << folder << "/ and the folders below it";
      }
    }
  }
  EXPECT_GT(checked, 100) << "the layout's folders were not found under " << root;
}

TEST(LayeringTest, InternalHeadersStayInTheirLibrary) {
  const fs::path root = SERVESIM_SOURCE_DIR;
  for (const char* top : {"services", "studies", "reports", "cluster", "scenario", "metrics",
                          "scheduler", "devices", "agents", "bench", "tests"}) {
    for (const auto& entry : fs::recursive_directory_iterator(root / top)) {
      const std::string ext = entry.path().extension().string();
      if (ext != ".h" && ext != ".cc") continue;
      const std::string rel = fs::relative(entry.path(), root).string();
      for (const std::string& inc : Includes(entry.path())) {
        if (Internal().count(inc) == 0) continue;
        const std::string lib = FolderOf(inc);
        const bool own = rel.rfind(lib + "/", 0) == 0 ||
                         rel.rfind("tests/" + lib + "/", 0) == 0 ||
                         rel.rfind("tests/fuzz/", 0) == 0;
        EXPECT_TRUE(own) << rel << " includes \"" << inc << "\", internal to " << lib << "/";
      }
    }
  }
}

}  // namespace
}  // namespace servesim
