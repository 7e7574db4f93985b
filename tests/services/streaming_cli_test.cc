// `servesim run` of a repeated workload with sketched percentiles, through
// the real binary.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/rng.h"
#include "gtest/gtest.h"
#include "servesim/v1/scenario.pb.h"
#include "tests/test_util.h"

namespace servesim::services {
namespace {

using test_util::Lines;
using test_util::ReadFile;
using test_util::RunServesim;

TEST(StreamingCliTest, RepeatWithSketchedPercentiles) {
  const std::string dir = test_util::FreshDir("streaming_cli");
  const std::string sc =
      SERVESIM_SOURCE_DIR "/tests/testdata/golden_llama2_13b_azure_5min.pbtxt";
  const auto exact = RunServesim({"run", sc, "--quiet", "--out", dir + "/exact", "--set",
                                  "workload.repeat=3"});
  ASSERT_EQ(exact.code, 0) << exact.out;
  const auto sketched =
      RunServesim({"run", sc, "--quiet", "--out", dir + "/sketch", "--set", "workload.repeat=3",
                   "--set", "output.exact_percentile_max_samples=1000"});
  ASSERT_EQ(sketched.code, 0) << sketched.out;
  const std::string je = ReadFile(dir + "/exact/summary.json");
  const std::string js = ReadFile(dir + "/sketch/summary.json");
  EXPECT_FALSE(absl::StrContains(je, "\"percentiles\""));
  EXPECT_TRUE(absl::StrContains(
      js, "\"percentiles\": {\"ttft_s\": \"sketch(rel_err=0.0001)\", \"tbt_s\": "
          "\"sketch(rel_err=0.0001)\", \"tpot_s\": \"sketch(rel_err=0.0001)\", \"e2e_s\": "
          "\"sketch(rel_err=0.0001)\"}"))
      << js;
  // Same run, same CSVs; percentiles within the sketch's error.
  EXPECT_EQ(ReadFile(dir + "/exact/requests.csv"), ReadFile(dir + "/sketch/requests.csv"));
  EXPECT_EQ(ReadFile(dir + "/exact/iterations.csv"), ReadFile(dir + "/sketch/iterations.csv"));
  for (const char* key : {"\"tbt_s\": ", "\"ttft_s\": ", "\"e2e_s\": "}) {
    for (const char* stat : {"\"p50\": ", "\"p90\": ", "\"p99\": "}) {
      auto value = [&](const std::string& json) {
        const size_t at = json.find(stat, json.find(key));
        double v = 0;
        EXPECT_TRUE(absl::SimpleAtod(
            json.substr(at + strlen(stat), json.find_first_of(",}", at) - at - strlen(stat)),
            &v));
        return v;
      };
      const double e = value(je), s = value(js);
      EXPECT_LE(std::fabs(s - e), 1.0001e-4 * e + 1e-9) << key << stat << e << " vs " << s;
    }
  }
  // requests.csv in id order, iterations.csv in (start, replica) order.
  const std::vector<std::string> req = Lines(ReadFile(dir + "/exact/requests.csv"));
  ASSERT_GT(req.size(), 3u);
  for (size_t i = 1; i < req.size(); ++i) {
    ASSERT_TRUE(absl::StartsWith(req[i], absl::StrCat(i - 1, ","))) << req[i];
  }
  const std::vector<std::string> its = Lines(ReadFile(dir + "/exact/iterations.csv"));
  ASSERT_GT(its.size(), 100u);
  double last_start = -1;
  for (size_t i = 1; i < its.size(); ++i) {
    const std::vector<std::string> f = absl::StrSplit(its[i], ',');
    double start = 0;
    ASSERT_TRUE(absl::SimpleAtod(f[1], &start));
    ASSERT_GE(start, last_start) << "line " << i + 1 << ": " << its[i];
    last_start = start;
  }
}


}  // namespace
}  // namespace servesim::services
