// Golden outputs: small scenarios whose summary.json is checked in under
// tests/testdata/golden/. Any difference is a model change and is reviewed
// as one: regenerate with scripts/update_goldens.sh and commit the diff
// together with the change that caused it.
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs the golden scenario from the repository root (relative paths in the
// outputs depend on it) and returns its summary.json.
std::string RunGolden(const std::string& name) {
  const std::string out = ::testing::TempDir() + "/golden_" + name;
  const std::string cmd = std::string("cd '") + SERVESIM_SOURCE_DIR + "' && '" +
                          SERVESIM_BINARY + "' run tests/testdata/golden_" + name +
                          ".pbtxt --quiet --out '" + out + "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr);
  std::string output;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) output.append(buf, n);
  const int status = pclose(p);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  return ReadAll(out + "/summary.json");
}

class GoldenTest : public ::testing::TestWithParam<const char*> {};

TEST_P(GoldenTest, SummaryMatchesReviewedGolden) {
  const std::string name = GetParam();
  const std::string golden = ReadAll(std::string(SERVESIM_SOURCE_DIR) +
                                     "/tests/testdata/golden/" + name + ".summary.json");
  ASSERT_FALSE(golden.empty()) << "missing golden for " << name;
  EXPECT_EQ(RunGolden(name), golden)
      << "summary.json of golden_" << name << ".pbtxt changed: if the model "
      << "change is intended, run scripts/update_goldens.sh and commit the diff";
}

INSTANTIATE_TEST_SUITE_P(Scenarios, GoldenTest,
                         ::testing::Values("llama2_13b_azure_5min", "gpt3_saturated",
                                           "qwen3_moe_dp2_ep2"));

}  // namespace
