// Reading inference-perf configs and reports, and the requests a replay
// plans from them: the YAML subset, the config's fields and refusals, the
// client's load timers and data, and where stages start.
#include "studies/inference_perf.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "studies/yaml_subset.h"

namespace servesim::studies {
namespace {

namespace fs = std::filesystem;

TEST(YamlSubsetTest, ReadsBlockAndFlowCollectionsAsTheClientWritesThem) {
  const auto root = ParseYaml(R"(---
# a comment
load:
  type: constant   # trailing comment
  stages:
  - rate: 1.5
    duration: 30
  - {rate: 2, duration: 60}
data:
  shared_prefix:
    system_prompt_len: {min: 10, max: 20, mean: 15, std_dev: 2}
    name: "a # not a comment"
    other: 'it''s'
  list: [1, "two", [3, 4]]
server:
  base_url: http://0.0.0.0:8000
  empty:
)",
                              "c.yml");
  ASSERT_TRUE(root.ok()) << root.status();
  const YamlNode* load = root->Find("load");
  ASSERT_NE(load, nullptr);
  EXPECT_EQ(load->Find("type")->scalar, "constant");
  const YamlNode* stages = load->Find("stages");
  ASSERT_TRUE(stages->is_seq());
  ASSERT_EQ(stages->seq.size(), 2u);
  EXPECT_EQ(stages->seq[0].Find("rate")->scalar, "1.5");
  EXPECT_EQ(stages->seq[0].Find("duration")->scalar, "30");
  EXPECT_EQ(stages->seq[1].Find("duration")->scalar, "60");
  EXPECT_EQ(stages->seq[1].line, 8);
  const YamlNode* sp = root->Find("data")->Find("shared_prefix");
  EXPECT_EQ(sp->Find("system_prompt_len")->Find("std_dev")->scalar, "2");
  EXPECT_EQ(sp->Find("name")->scalar, "a # not a comment");
  EXPECT_TRUE(sp->Find("name")->quoted);
  EXPECT_EQ(sp->Find("other")->scalar, "it's");
  const YamlNode* list = root->Find("data")->Find("list");
  ASSERT_EQ(list->seq.size(), 3u);
  EXPECT_EQ(list->seq[1].scalar, "two");
  EXPECT_EQ(list->seq[2].seq[1].scalar, "4");
  EXPECT_EQ(root->Find("server")->Find("base_url")->scalar, "http://0.0.0.0:8000");
  EXPECT_TRUE(root->Find("server")->Find("empty")->is_null());
}

TEST(YamlSubsetTest, RefusesWhatItDoesNotReadNamingTheLine) {
  const std::map<std::string, std::string> cases = {
      {"a: 1\nb: &x 2\n", "c.yml:2: anchors and aliases"},
      {"a: 1\nb: |\n  text\n", "c.yml:2: block scalars"},
      {"a:\n\tb: 1\n", "c.yml:2: a tab in the indentation"},
      {"a: 1\na: 2\n", "c.yml:2: duplicate key \"a\""},
      {"a: [1, 2\nb: 3\n", "c.yml:1: '[' not closed on its line"},
      {"a: 1\n  b: 2\n", "c.yml:2: indented where no block can start"},
      {"a: 1\n---\nb: 2\n", "c.yml:2: a second document"},
      {"a: \"open\n", "c.yml:1: quoted text not closed"},
      // An item that ends in neither a comma nor the bracket (found by the
      // fuzzer: the parser used to loop on it).
      {"a: [: 1]\n", "c.yml:1: expected ',' or ']' at \": 1]\""},
      {"a: {b: \"x\" c}\n", "c.yml:1: expected ',' or '}' at \"c}\""},
  };
  for (const auto& [text, message] : cases) {
    const auto r = ParseYaml(text, "c.yml");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(message), std::string::npos)
        << text << " -> " << r.status().message();
  }
}

constexpr char kConfig[] = R"(load:
  type: constant
  interval: 0.5
  stages:
  - rate: 3
    duration: 10
  - rate: 5
    duration: 4
data:
  type: shared_prefix
  shared_prefix:
    num_groups: 2
    num_prompts_per_group: 2
    system_prompt_len: 100
    question_len: 20
    output_len: 7
server:
  ignore_eos: true
)";

TEST(InferencePerfConfigTest, ReadsStagesAndSharedPrefixData) {
  const auto c = ParseInferencePerfConfig(kConfig, "c.yml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->load_type, "constant");
  EXPECT_DOUBLE_EQ(c->interval_s, 0.5);
  ASSERT_EQ(c->stages.size(), 2u);
  EXPECT_EQ(c->stages[0].requests(), 30);
  EXPECT_EQ(c->stages[1].requests(), 20);
  EXPECT_EQ(c->data_type, "shared_prefix");
  EXPECT_EQ(c->groups, 2);
  EXPECT_EQ(c->prompts_per_group, 2);
  EXPECT_EQ(c->system_prompt.min, 100);
  EXPECT_EQ(c->question.max, 20);
  EXPECT_EQ(c->output.mean, 7);
  EXPECT_TRUE(c->ignore_eos);
  // No num_workers: the client's limit is its machine's CPU count x 100,
  // not recorded, so none is applied, and a note says so.
  EXPECT_EQ(c->max_in_flight, 0);
  ASSERT_EQ(c->notes.size(), 1u);
  EXPECT_NE(c->notes[0].find("load.num_workers not given"), std::string::npos);
  std::string workers = kConfig;
  workers.replace(workers.find("  interval: 0.5\n"), 16,
                  "  interval: 0.5\n  num_workers: 44\n  worker_max_concurrency: 10\n");
  const auto w = ParseInferencePerfConfig(workers, "c.yml");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->max_in_flight, 440);
  EXPECT_TRUE(w->notes.empty());
  EXPECT_TRUE(LooksLikeInferencePerf(kConfig));
  EXPECT_FALSE(LooksLikeInferencePerf("rate-type: sweep\ndata:\n  prompt_tokens: 10\n"));
}

// Some run bundles record the config as one line of JSON (which YAML
// reads as a flow mapping).
TEST(InferencePerfConfigTest, ReadsTheOneLineJsonSomeBundlesRecord) {
  const auto c = ParseInferencePerfConfig(
      R"({"load": {"type": "poisson", "stages": [{"rate": 2, "duration": 5}]}, "data": )"
      R"({"type": "random", "input_distribution": {"min": 1, "max": 300, "mean": 100, )"
      R"("std_dev": 40, "total_count": 50}, "output_distribution": {"type": "lognormal", )"
      R"("min": 1, "max": 90, "mean": 30, "std_dev": 10, "total_count": 20}}, "server": )"
      R"({"ignore_eos": true, "num_workers": null}})",
      "setup.json workload.profile_yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->load_type, "poisson");
  ASSERT_EQ(c->stages.size(), 1u);
  EXPECT_EQ(c->stages[0].requests(), 10);
  EXPECT_EQ(c->data_type, "random");
  EXPECT_EQ(c->input_count, 50);
  EXPECT_EQ(c->output.type, "lognormal");
  EXPECT_EQ(c->output.max, 90);
  const auto plan = PlanRequests(*c, 5);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const PlannedRequest& r : *plan) {
    EXPECT_GE(r.input_tokens, 1);
    EXPECT_LE(r.input_tokens, 300);
    EXPECT_LE(r.output_tokens, 90);
    EXPECT_EQ(r.prefix_group, -1);
    EXPECT_EQ(r.prompt, -1);
  }
}

TEST(InferencePerfConfigTest, RefusesLoadsAndDataItCannotReplayNamingTheField) {
  const std::string base = kConfig;
  const auto with = [&base](const std::string& from, const std::string& to) {
    std::string s = base;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  const std::map<std::string, std::string> cases = {
      {with("type: constant", "type: concurrent"),
       "c.yml:2: load.type is concurrent; the replay reads constant and poisson"},
      {with("type: shared_prefix", "type: shareGPT"),
       "c.yml:10: data.type is shareGPT; the replay reads shared_prefix, random and synthetic"},
      {with("output_len: 7", "output_len: 7\n    enable_multi_turn_chat: true"),
       "c.yml:17: data.shared_prefix.enable_multi_turn_chat is true"},
      {with("question_len: 20", "question_len: {type: skew_normal, mean: 5}"),
       "c.yml:15: data.shared_prefix.question_len.type is skew_normal"},
      {with("duration: 10", "duration: 10\n    num_requests: 5"),
       "c.yml:5: load.stages[0].num_requests is set"},
      {with("rate: 3", "rate: -3"), "c.yml:5: load.stages[0].rate is -3; expected (0, 1e6]"},
      {with("question_len: 20", "question_len: {min: 10, max: 20, mean: 50}"),
       "c.yml:15: data.shared_prefix.question_len.mean 50 is outside [min, max] = [10, 20]"},
      {with("num_groups: 2", "num_groups: two"),
       "c.yml:12: data.shared_prefix.num_groups is \"two\"; expected a number"},
  };
  for (const auto& [text, message] : cases) {
    const auto r = ParseInferencePerfConfig(text, "c.yml");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(message), std::string::npos)
        << message << "\n  got: " << r.status().message();
  }
}

TEST(InferencePerfPlanTest, ConstantStagesEndAtTheirDurationAndCycleThePromptsFromTheFirst) {
  const auto c = ParseInferencePerfConfig(kConfig, "c.yml");
  ASSERT_TRUE(c.ok());
  const auto plan = PlanRequests(*c, 7);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 50u);
  std::vector<const PlannedRequest*> stage[2];
  for (const PlannedRequest& r : *plan) stage[r.stage].push_back(&r);
  ASSERT_EQ(stage[0].size(), 30u);
  ASSERT_EQ(stage[1].size(), 20u);
  for (int k = 0; k < 2; ++k) {
    // ConstantLoadTimer: gaps scaled to sum to the duration.
    EXPECT_NEAR(stage[k].back()->offset_s, c->stages[k].duration_s, 1e-9);
    for (size_t j = 1; j < stage[k].size(); ++j) {
      EXPECT_GT(stage[k][j]->offset_s, stage[k][j - 1]->offset_s);
    }
  }
  // Four prompts (2 groups x 2), shuffled once, cycled; each stage starts
  // from the first.
  for (size_t j = 0; j < 20; ++j) {
    EXPECT_EQ(stage[0][j]->prompt, stage[0][j % 4]->prompt);
    EXPECT_EQ(stage[1][j]->prompt, stage[0][j]->prompt);
  }
  std::vector<int64_t> seen;
  for (size_t j = 0; j < 4; ++j) seen.push_back(stage[0][j]->prompt);
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3}));
  for (const PlannedRequest& r : *plan) {
    EXPECT_EQ(r.input_tokens, 120);
    EXPECT_EQ(r.output_tokens, 7);
    EXPECT_EQ(r.prefix_tokens, 100);
    // Prompts 0, 1 are group 0's; 2, 3 group 1's.
    EXPECT_EQ(r.prefix_group, r.prompt / 2);
  }
  // The same seed draws the same plan; another seed other send times.
  const auto again = PlanRequests(*c, 7);
  const auto other = PlanRequests(*c, 8);
  EXPECT_EQ((*again)[3].offset_s, (*plan)[3].offset_s);
  EXPECT_NE((*other)[3].offset_s, (*plan)[3].offset_s);
}

TEST(InferencePerfPlanTest, PoissonStagesDrawACountPerSecond) {
  std::string text = kConfig;
  text.replace(text.find("type: constant"), 14, "type: poisson");
  text.replace(text.find("rate: 3\n    duration: 10"), 24, "rate: 40\n    duration: 50");
  const auto c = ParseInferencePerfConfig(text, "c.yml");
  ASSERT_TRUE(c.ok()) << c.status();
  const auto plan = PlanRequests(*c, 1);
  ASSERT_TRUE(plan.ok());
  std::vector<double> offsets;
  for (const PlannedRequest& r : *plan) {
    if (r.stage == 0) offsets.push_back(r.offset_s);
  }
  ASSERT_EQ(offsets.size(), 2000u);
  EXPECT_TRUE(std::is_sorted(offsets.begin(), offsets.end()));
  // PoissonLoadTimer spreads each second's count over that second: the
  // 2000th request falls in the second where the running count passes it,
  // near 2000 / 40 = 50 s (Poisson counts: sd sqrt(2000) / 40 ~ 1.1 s).
  EXPECT_NEAR(offsets.back(), 50.0, 4.0);
  std::map<int, int> per_second;
  for (double t : offsets) ++per_second[static_cast<int>(t)];
  double mean = 0, var = 0;
  int full = 0;
  for (const auto& [s, n] : per_second) {
    if (s + 1 >= static_cast<int>(offsets.back())) continue;  // the last, cut short
    mean += n;
    ++full;
  }
  mean /= full;
  for (const auto& [s, n] : per_second) {
    if (s + 1 >= static_cast<int>(offsets.back())) continue;
    var += (n - mean) * (n - mean);
  }
  var /= full - 1;
  EXPECT_NEAR(mean, 40.0, 3.0);
  EXPECT_NEAR(var, 40.0, 20.0);  // Poisson: variance = mean
}

TEST(InferencePerfPlanTest, LengthDistributionsAreClippedAndRoundedAsTheClientDraws) {
  std::string text = kConfig;
  text.replace(text.find("question_len: 20"), 16,
               "question_len: {min: 90, max: 110, mean: 100, std_dev: 50}");
  text.replace(text.find("output_len: 7"), 13,
               "output_len: {type: uniform, min: 5, max: 9, mean: 7, std_dev: 0}");
  const auto c = ParseInferencePerfConfig(text, "c.yml");
  ASSERT_TRUE(c.ok()) << c.status();
  const auto plan = PlanRequests(*c, 3);
  ASSERT_TRUE(plan.ok());
  int at_min = 0, at_max = 0;
  for (const PlannedRequest& r : *plan) {
    const int64_t q = r.input_tokens - 100;
    EXPECT_GE(q, 90);
    EXPECT_LE(q, 110);
    at_min += q == 90;
    at_max += q == 110;
    EXPECT_GE(r.output_tokens, 5);
    EXPECT_LE(r.output_tokens, 9);
  }
  // sd 50 around 100 in [90, 110]: most draws clip to a bound.
  EXPECT_GT(at_min + at_max, 0);
}

TEST(InferencePerfPlanTest, StagesStartIntervalPlusOneSecondAfterTheDrainBefore) {
  const auto c = ParseInferencePerfConfig(kConfig, "c.yml");
  ASSERT_TRUE(c.ok());
  const std::vector<double> starts = StageStarts(*c, {10.25, 30.0});
  ASSERT_EQ(starts.size(), 2u);
  EXPECT_DOUBLE_EQ(starts[0], 0.0);
  EXPECT_DOUBLE_EQ(starts[1], 10.25 + 0.5 + 1.0);
  const auto plan = PlanRequests(*c, 7);
  const std::string csv = StagedTraceCsv(*plan, starts);
  EXPECT_EQ(csv.substr(0, csv.find('\n')),
            "arrival_s,input_tokens,output_tokens,prefix_group,prefix_tokens,prompt_id");
  // The last request of stage 1 is sent at its start + its duration.
  const std::string last = csv.substr(csv.rfind('\n', csv.size() - 2) + 1);
  EXPECT_EQ(last.substr(0, last.find(',')), "15.750000");
}

TEST(InferencePerfReportsTest, ReadsStageReportsAndASweepsRates) {
  const fs::path dir = fs::path(testing::TempDir()) / "ip_reports";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (int k = 0; k < 2; ++k) {
    std::ofstream(dir / ("stage_" + std::to_string(k) + "_lifecycle_metrics.json"))
        << R"({"load_summary": {"count": 10, "requested_rate": )" << (k + 1) * 2.5
        << R"(, "achieved_rate": 2.4}, "successes": {"count": 9, "latency": {"request_latency":
        {"mean": 1.5, "median": 1.25, "p90": 2.0, "p99": 3.0}, "time_to_first_token": null},
        "throughput": {"output_tokens_per_sec": 100, "requests_per_sec": 2}, "prompt_len":
        {"mean": 120}, "output_len": {"mean": 7}}, "failures": {"count": 1}})";
  }
  const auto reports = ReadStageReports(dir.string());
  ASSERT_TRUE(reports.ok()) << reports.status();
  ASSERT_EQ(reports->size(), 2u);
  const StageReport& r = (*reports)[1];
  EXPECT_EQ(r.successes, 9);
  EXPECT_EQ(r.failures, 1);
  EXPECT_DOUBLE_EQ(r.requested_rate, 5.0);
  EXPECT_DOUBLE_EQ(r.latency.at("e2e_s")[1], 1.25);
  EXPECT_TRUE(std::isnan(r.latency.at("ttft_s")[0]));
  EXPECT_DOUBLE_EQ(r.prompt_len_mean, 120);

  std::string text = kConfig;
  text.replace(text.find("  stages:"), text.find("data:") - text.find("  stages:"),
               "  sweep:\n    type: linear\n    stage_duration: 30\n");
  auto c = ParseInferencePerfConfig(text, "c.yml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->stages.empty());
  ASSERT_TRUE(FillStagesFromReports(*reports, &*c).ok());
  ASSERT_EQ(c->stages.size(), 2u);
  EXPECT_DOUBLE_EQ(c->stages[1].rate, 5.0);
  EXPECT_DOUBLE_EQ(c->stages[1].duration_s, 30.0);

  // A gap in the numbering is an error.
  fs::rename(dir / "stage_1_lifecycle_metrics.json", dir / "stage_2_lifecycle_metrics.json");
  const auto gap = ReadStageReports(dir.string());
  ASSERT_FALSE(gap.ok());
  EXPECT_NE(gap.status().message().find("stage_1_lifecycle_metrics.json: missing"),
            std::string::npos)
      << gap.status();
}

}  // namespace
}  // namespace servesim::studies
