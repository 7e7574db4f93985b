// docs/fidelity.md, "inference-perf runs": the public run's table of
// per-stage errors, rerun through the real binary (one decimal, as
// published). Part of the DocFiguresTest suite (tests/docs/figures_test.cc).
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace servesim {
namespace {

TEST(DocFiguresTest, InferencePerfStagesTable) {
  const std::string out = test_util::FreshDir("ip_figures");
  const test_util::CommandResult r = test_util::RunServesim(
      {"replay",
       SERVESIM_SOURCE_DIR
       "/examples/vllm/inference_perf/H100_Llama-3.1-8B-Instruct_prefix-caching",
       "--out", out, "--quiet"});
  ASSERT_EQ(r.code, 0) << r.out;
  // No profile: the H100 preset's GEMM caps were fitted to measured
  // kernels; the other classes take the default caps.
  const std::string info = test_util::ReadFile(out + "/run_info.json");
  EXPECT_NE(info.find("\"op_costs\": {\"gemm\": \"roofline, caps fitted to measured kernels "
                      "(compute 0.741, memory 0.821, 3.67 us per kernel)\", \"attention\": "
                      "\"roofline, default caps (compute 0.8, memory 0.85, 4 us per kernel)\""),
            std::string::npos)
      << info;
  std::map<std::string, double> error;  // "stage.metric.stat" -> error_pct
  for (const std::string& line :
       test_util::Lines(test_util::ReadFile(out + "/replay_stages.csv"))) {
    const std::vector<std::string> f = absl::StrSplit(line, ',');
    double e = 0;
    if (f.size() == 7 && absl::SimpleAtod(f[6], &e)) error[f[0] + "." + f[2] + "." + f[3]] = e;
  }
  // E2E mean, TTFT mean, decode s/token, output tok/s.
  const std::vector<std::vector<double>> published = {
      {-9.9, -72.9, -9.3, 4.3},   {-13.6, -60.2, -13.3, 2.6}, {-18.4, -60.9, -18.2, 2.7},
      {-25.8, -63.3, -25.8, 2.7}, {-36.2, -87.8, -30.7, 3.1}, {-77.3, -98.9, -29.6, 26.8},
      {-32.1, -35.0, -26.9, 36.4}};
  const char* keys[] = {"e2e_s.mean", "ttft_s.mean", "decode_s_per_token.from_means",
                        "output_tokens_per_s.value"};
  for (size_t k = 0; k < published.size(); ++k) {
    for (size_t i = 0; i < 4; ++i) {
      const std::string key = absl::StrCat(k, ".", keys[i]);
      ASSERT_TRUE(error.count(key)) << key;
      EXPECT_NEAR(error[key], published[k][i], 0.051) << key;
    }
  }
}

}  // namespace
}  // namespace servesim
