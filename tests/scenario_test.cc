// Unit tests of the scenario pipeline (cluster/scenario.h): parse ->
// --set override -> Normalize -> Resolve. Every bad input must come back
// with the right status code and a message that names the file and line
// (or the --set), the field path, the value and what is allowed.
#include "cluster/scenario.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "servesim/v1/scenario.pb.h"

namespace servesim::cluster {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using servesim::v1::BATCHING_POLICY_CHUNKED_PREFILL;
using servesim::v1::BATCHING_POLICY_PREFILL_FIRST;

constexpr char kPath[] = "s.pbtxt";

// A complete, valid scenario; tests append or edit lines. Line numbers:
//   1 name
//   2 model {
//   3   preset
//   4 }
//   5 cluster {
//   6   replicas
//   7   tensor_parallel
//   8   xpu { preset }
//   9 }
//  10 workload { saturated ... }
constexpr char kValid[] =
    "name: \"t\"\n"
    "model {\n"
    "  preset: \"llama2-7b\"\n"
    "}\n"
    "cluster {\n"
    "  replicas: 2\n"
    "  tensor_parallel: 1\n"
    "  xpu { preset: \"a100-80gb\" }\n"
    "}\n"
    "workload { saturated { num_requests: 4 input_tokens: 128 output_tokens: 16 } }\n";

absl::StatusOr<LoadedScenario> Parse(const std::string& text) {
  return ParseScenarioText(text, kPath);
}

// Runs the whole pipeline on `text` with the --set assignments `sets`.
absl::StatusOr<ResolvedScenario> ParseAndResolve(
    const std::string& text, std::initializer_list<const char*> sets = {}) {
  absl::StatusOr<LoadedScenario> sc = Parse(text);
  if (!sc.ok()) return sc.status();
  for (const char* s : sets) {
    if (absl::Status st = ApplyOverride(&*sc, s); !st.ok()) return st;
  }
  if (absl::Status st = Normalize(&*sc); !st.ok()) return st;
  return Resolve(*sc);
}

// Parses and normalises; fails the test on any error.
LoadedScenario Normalized(const std::string& text) {
  absl::StatusOr<LoadedScenario> sc = Parse(text);
  EXPECT_TRUE(sc.ok()) << sc.status();
  if (!sc.ok()) return LoadedScenario{};
  const absl::Status st = Normalize(&*sc);
  EXPECT_TRUE(st.ok()) << st;
  return *std::move(sc);
}

// A model given by its dimensions (no preset); num_kv_heads does not
// divide num_heads.
constexpr char kExplicitModel[] =
    "model {\n"                     // 1
    "  num_layers: 2\n"             // 2
    "  d_model: 768\n"              // 3
    "  num_heads: 12\n"             // 4
    "  num_kv_heads: 5\n"           // 5
    "  d_head: 64\n"                // 6
    "  d_ff: 3072\n"                // 7
    "  vocab_size: 1000\n"          // 8
    "  max_context_tokens: 1024\n"  // 9
    "}\n"                           // 10
    "cluster { xpu { preset: \"a100-80gb\" } }\n";

// ------------------------------------------------------------ parsing ----

TEST(ScenarioParseTest, ValidScenarioParses) {
  absl::StatusOr<LoadedScenario> sc = Parse(kValid);
  ASSERT_TRUE(sc.ok()) << sc.status();
  EXPECT_EQ(sc->path, "s.pbtxt");
  EXPECT_EQ(sc->base_dir, ".");
  EXPECT_EQ(sc->proto.model().preset(), "llama2-7b");
  EXPECT_EQ(sc->proto.cluster().replicas(), 2);
  EXPECT_EQ(sc->Where("cluster.replicas"), "s.pbtxt:6");
  EXPECT_EQ(sc->Where("cluster.xpu.preset"), "s.pbtxt:8");
  // Unwritten fields fall back to the nearest written ancestor, or the file.
  EXPECT_EQ(sc->Where("cluster.memory_utilization"), "s.pbtxt:5");
  EXPECT_EQ(sc->Where("slo.ttft_s"), "s.pbtxt");
}

TEST(ScenarioParseTest, SyntaxErrorNamesLineAndColumn) {
  const std::string text =
      "name: \"x\"\n"
      "cluster {\n"
      "  replicas: 2\n"
      "  xpu { preset \"a100-80gb\" }\n"
      "}\n";
  absl::StatusOr<LoadedScenario> sc = Parse(text);
  ASSERT_FALSE(sc.ok());
  EXPECT_EQ(sc.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(sc.status().message()), StartsWith("s.pbtxt:4:16: "));
  EXPECT_THAT(std::string(sc.status().message()), HasSubstr("Expected \":\""));
}

TEST(ScenarioParseTest, UnclosedBraceIsASyntaxErrorAtTheEnd) {
  absl::StatusOr<LoadedScenario> sc = Parse("name: \"x\"\ncluster {\n  replicas: 2\n");
  ASSERT_FALSE(sc.ok());
  EXPECT_EQ(sc.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(sc.status().message()), StartsWith("s.pbtxt:4:1: "));
}

TEST(ScenarioParseTest, UnknownFieldNamesLineColumnAndField) {
  const std::string text =
      "name: \"x\"\n"
      "cluster {\n"
      "  replicas: 2\n"
      "  nosuch: 1\n"
      "}\n";
  absl::StatusOr<LoadedScenario> sc = Parse(text);
  ASSERT_FALSE(sc.ok());
  EXPECT_EQ(sc.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(sc.status().message()),
            "s.pbtxt:4:9: Message type \"servesim.v1.ClusterSpec\" has no "
            "field named \"nosuch\".");
}

TEST(ScenarioParseTest, UnknownTopLevelFieldIsAnError) {
  absl::StatusOr<LoadedScenario> sc = Parse("name: \"x\"\nreplicas: 2\n");
  ASSERT_FALSE(sc.ok());
  EXPECT_EQ(sc.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(sc.status().message()), StartsWith("s.pbtxt:2:"));
  EXPECT_THAT(std::string(sc.status().message()), HasSubstr("servesim.v1.Scenario"));
  EXPECT_THAT(std::string(sc.status().message()), HasSubstr("\"replicas\""));
}

TEST(ScenarioParseTest, RepeatedSingularFieldIsAnError) {
  absl::StatusOr<LoadedScenario> sc =
      Parse("cluster { replicas: 1 }\nname: \"x\"\ncluster { replicas: 2 }\n");
  ASSERT_FALSE(sc.ok());
  EXPECT_EQ(sc.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(sc.status().message()), StartsWith("s.pbtxt:3:"));
  EXPECT_THAT(std::string(sc.status().message()), HasSubstr("\"cluster\""));
}

TEST(ScenarioParseTest, MissingFileIsNotFoundNamingThePath) {
  const std::string path = (std::filesystem::path(testing::TempDir()) / "scenario_test_no_such_file.pbtxt").string();
  std::remove(path.c_str());
  absl::StatusOr<LoadedScenario> sc = LoadScenarioFile(path);
  ASSERT_FALSE(sc.ok());
  EXPECT_EQ(sc.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(sc.status().message()), path + ": cannot open scenario file");
}

TEST(ScenarioParseTest, LoadsFileAndKeepsItsFolder) {
  const std::string dir = (std::filesystem::path(testing::TempDir()) / "scenario_test_load").string();
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/ok.pbtxt";
  {
    std::ofstream out(path);
    out << kValid;
  }
  absl::StatusOr<LoadedScenario> sc = LoadScenarioFile(path);
  ASSERT_TRUE(sc.ok()) << sc.status();
  EXPECT_EQ(sc->path, path);
  EXPECT_EQ(sc->base_dir, dir);
  EXPECT_EQ(sc->Where("cluster.replicas"), path + ":6");

  // Errors in a loaded file name that file.
  {
    std::ofstream out(path);
    out << "cluster {\n  replicas: 0\n}\n";
  }
  absl::StatusOr<LoadedScenario> bad = LoadScenarioFile(path);
  ASSERT_TRUE(bad.ok()) << bad.status();
  ASSERT_TRUE(Normalize(&*bad).ok());
  absl::StatusOr<ResolvedScenario> r = Resolve(*bad);
  ASSERT_FALSE(r.ok());
  // The model is checked first; it has no dimensions and no preset.
  EXPECT_EQ(std::string(r.status().message()),
            path + ": model.num_layers is not set: set model.preset or every "
                   "model dimension");
}

// ----------------------------------------------------- value ranges ----

TEST(ScenarioRangeTest, ReplicasZero) {
  std::string text = kValid;
  text.replace(text.find("replicas: 2"), 11, "replicas: 0");
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:6: cluster.replicas = 0: allowed range [1, 4096]");
}

TEST(ScenarioRangeTest, TensorParallelMustDivideHeads) {
  // 96 heads: 3 divides them (and d_ff 49,152), so TP 5 is the bad value.
  const std::string text =
      "model { preset: \"gpt3-175b\" }\n"
      "cluster {\n"
      "  xpu { preset: \"a100-80gb\" }\n"
      "  tensor_parallel: 5\n"
      "}\n";
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:4: cluster.tensor_parallel = 5: must divide "
            "model.num_heads (96)");
}

TEST(ScenarioRangeTest, TensorParallelThreeDividesGpt3ButDoesNotFit) {
  // 96 heads, 96 KV heads and d_ff 49,152 all split three ways; what fails
  // is memory: 349.14 GB / 3 = 116.38 GB of weights per 80 GiB xPU.
  const std::string text =
      "model { preset: \"gpt3-175b\" }\n"
      "cluster {\n"
      "  xpu { preset: \"a100-80gb\" }\n"
      "  tensor_parallel: 3\n"
      "}\n";
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              StartsWith("s.pbtxt:4: GPT-3 175B does not fit a replica of 3 x "
                         "a100-80gb: required "));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("(weights 116.38 GB"));
}

TEST(ScenarioRangeTest, TensorParallelMustDivideFeedForward) {
  std::string text = kExplicitModel;
  text.replace(text.find("num_kv_heads: 5"), 15, "num_kv_heads: 4");
  text.replace(text.find("d_ff: 3072"), 10, "d_ff: 3070");
  text.replace(text.find("cluster {"), 9, "cluster { tensor_parallel: 4");
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:11: cluster.tensor_parallel = 4: must divide model.d_ff (3070)");
}

TEST(ScenarioRangeTest, TensorParallelAboveLimit) {
  std::string text = kValid;
  text.replace(text.find("tensor_parallel: 1"), 18, "tensor_parallel: 128");
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:7: cluster.tensor_parallel = 128: allowed range [1, 64]");
}

TEST(ScenarioRangeTest, KvWatermark) {
  const std::string text = std::string(kValid) + "scheduler {\n  kv_watermark: 0.7\n}\n";
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:12: scheduler.kv_watermark = 0.7: allowed range [0, 0.5)");
}

TEST(ScenarioRangeTest, XpuComputeUtilization) {
  std::string text = kValid;
  text.replace(text.find("xpu { preset: \"a100-80gb\" }"), 27,
               "xpu { preset: \"a100-80gb\"\n    compute_utilization: 1.5 }");
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:9: cluster.xpu.compute_utilization = 1.5: allowed range (0, 1]");
}

TEST(ScenarioRangeTest, MemoryBytesHaveAnUpperLimit) {
  // Found by scenario_fuzz: 1e96 bytes of xPU memory made a KV block count
  // past int64 (undefined behaviour in the conversion). 1 PB is the limit,
  // for an xPU and for an attention unit alike; 1 PB itself resolves.
  auto xpu = ParseAndResolve(kValid, {"cluster.xpu.memory_bytes=1e96"});
  ASSERT_FALSE(xpu.ok());
  EXPECT_EQ(xpu.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(xpu.status().message()),
            "s.pbtxt (--set cluster.xpu.memory_bytes): cluster.xpu.memory_bytes = 1e+96: "
            "allowed range (0, 1e+15]");
  auto at_limit = ParseAndResolve(kValid, {"cluster.xpu.memory_bytes=1e15"});
  ASSERT_TRUE(at_limit.ok()) << at_limit.status();
  EXPECT_GT(at_limit->kv.blocks, 0);
  EXPECT_LT(at_limit->kv.blocks, scheduler::kMaxKvBlocks);
  // --set refuses inf itself; a file can still write it.
  std::string text = kValid;
  text.replace(text.find("xpu { preset: \"a100-80gb\" }"), 27,
               "xpu { preset: \"a100-80gb\"\n    memory_bytes: inf }");
  auto inf = ParseAndResolve(text);
  ASSERT_FALSE(inf.ok());
  EXPECT_EQ(std::string(inf.status().message()),
            "s.pbtxt:9: cluster.xpu.memory_bytes = inf: allowed range (0, 1e+15]");

  auto unit = ParseAndResolve(
      "model { preset: \"gpt2-medium\" }\n"
      "cluster { xpu { preset: \"a100-80gb\" } attention_pool { topick { } } }\n",
      {"cluster.attention_pool.memory_bytes_per_unit=2e15"});
  ASSERT_FALSE(unit.ok());
  EXPECT_EQ(std::string(unit.status().message()),
            "s.pbtxt (--set cluster.attention_pool.memory_bytes_per_unit): "
            "cluster.attention_pool.memory_bytes_per_unit = 2e+15: allowed range (0, 1e+15]");
}

TEST(ScenarioRangeTest, SloTpotZero) {
  const std::string text = std::string(kValid) + "slo { ttft_s: 1\n  tpot_s: 0 }\n";
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()), "s.pbtxt:12: slo.tpot_s = 0: expected > 0");
}

TEST(ScenarioRangeTest, ClusterMemoryUtilization) {
  std::string text = kValid;
  text.replace(text.find("  replicas: 2\n"), 14,
               "  replicas: 2\n  memory_utilization: 0\n");
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:7: cluster.memory_utilization = 0: allowed range (0, 1]");
}

TEST(ScenarioRangeTest, KvHeadsMustDivideHeads) {
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(kExplicitModel);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:5: model.num_kv_heads = 5: must divide num_heads (12)");
}

TEST(ScenarioRangeTest, KvHeadsAboveHeads) {
  std::string text = kExplicitModel;
  text.replace(text.find("num_kv_heads: 5"), 15, "num_kv_heads: 24");
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:5: model.num_kv_heads = 24: allowed range [1, 12]");
}

TEST(ScenarioRangeTest, ExplicitModelWithDividingKvHeadsResolves) {
  std::string text = kExplicitModel;
  text.replace(text.find("num_kv_heads: 5"), 15, "num_kv_heads: 4");
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model.num_kv_heads, 4);
  EXPECT_EQ(r->proto.model().name(), "custom");
}

TEST(ScenarioRangeTest, MissingModelDimensionNamesTheFirstOne) {
  std::string text = kExplicitModel;
  text.erase(text.find("  d_model: 768\n"), 15);
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  // d_model was not written: the location is the model block's line.
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:1: model.d_model is not set: set model.preset or every "
            "model dimension");
}

TEST(ScenarioRangeTest, MissingXpuFigureWithoutPreset) {
  const std::string text =
      "model { preset: \"llama2-7b\" }\n"
      "cluster {\n"
      "  replicas: 1\n"
      "}\n";
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:2: cluster.xpu.peak_flops_fp16 is not set: set "
            "cluster.xpu.preset or every xPU figure");
}

// ------------------------------------------------------------ presets ----

TEST(ScenarioPresetTest, UnknownModelPreset) {
  std::string text = kValid;
  text.replace(text.find("llama2-7b"), 9, "gpt5");
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:3: model.preset: unknown model preset \"gpt5\"; known: "
            "gpt2-large, gpt2-medium, gpt2-xl, gpt3-175b, llama-65b, "
            "llama2-13b, llama2-70b, llama2-7b, mt-nlg-530b, opt-13b, "
            "opt-6.7b, opt-66b");
}

TEST(ScenarioPresetTest, UnknownXpuPreset) {
  std::string text = kValid;
  text.replace(text.find("a100-80gb"), 9, "tpu-v9");
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:8: cluster.xpu.preset: unknown xpu preset \"tpu-v9\"; "
            "known: a100-40gb, a100-80gb, a100-hbm3, h100-sxm-80gb");
}

TEST(ScenarioPresetTest, UnknownLinkPreset) {
  std::string text = kValid;
  text.replace(text.find("  tensor_parallel: 1\n"), 21,
               "  tensor_parallel: 1\n  interconnect {\n    preset: \"nvlink9\"\n  }\n");
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:9: cluster.interconnect.preset: unknown link preset "
            "\"nvlink9\"; known: ethernet-100g, ethernet-400g, nvlink3, "
            "nvlink4, pcie4, pcie5");
}

TEST(ScenarioPresetTest, UnknownFrontendPreset) {
  std::string text = kValid;
  text.replace(text.find("  replicas: 2\n"), 14,
               "  replicas: 2\n  frontend { preset: \"carrier-pigeon\" }\n");
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(r.status().message()),
              StartsWith("s.pbtxt:7: cluster.frontend.preset: unknown link "
                         "preset \"carrier-pigeon\"; known: ethernet-100g"));
}

// ------------------------------------------------- whole configuration ----

TEST(ScenarioResolveTest, Gpt3DoesNotFitOneA100_40GB) {
  const std::string text =
      "name: \"too big\"\n"
      "model { preset: \"gpt3-175b\" }\n"
      "cluster {\n"
      "  replicas: 1\n"
      "  tensor_parallel: 1\n"
      "  xpu { preset: \"a100-40gb\" }\n"
      "}\n";
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  // Weights: 174,568,476,672 parameters x 2 bytes = 349.14 GB. Activations
  // for 8,192 tokens: 2 x (12288 + 3 x 96 x 128 + 49152) x 8192 x 2 bytes
  // = 3.22 GB. One KV block: 16 x 2 x 96 x 96 x 128 x 2 = 0.08 GB.
  // Available: 40 GiB = 42,949,672,960 bytes x 0.9 = 38.65 GB.
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:5: GPT-3 175B does not fit a replica of 1 x a100-40gb: "
            "required 352.36 GB per xPU (weights 349.14 GB + activations "
            "3.22 GB) plus at least one KV block (0.08 GB) vs available "
            "38.65 GB (memory 42.95 GB x cluster.memory_utilization 0.9); "
            "raise cluster.tensor_parallel or use a larger xPU");
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("required"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("available"));
}

TEST(ScenarioResolveTest, DoesNotFitNamesClusterLineWhenTensorParallelUnset) {
  const std::string text =
      "model { preset: \"gpt3-175b\" }\n"
      "cluster {\n"
      "  xpu { preset: \"a100-40gb\" }\n"
      "}\n";
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              StartsWith("s.pbtxt:2: GPT-3 175B does not fit a replica of 1 x "
                         "a100-40gb: required 352.36 GB"));
}

TEST(ScenarioResolveTest, Gpt3KvCapacityOnEightA100Hbm3) {
  const std::string text =
      "model { preset: \"gpt3-175b\" }\n"
      "cluster { tensor_parallel: 8 xpu { preset: \"a100-hbm3\" } }\n";
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_TRUE(r.ok()) << r.status();
  // Per xPU: 85,899,345,920 x 0.9 = 77,309,411,328 usable; weights
  // 349,136,953,344 / 8 = 43,642,119,168; activations for 8,192 tokens
  // 2 x (12288 + 36 x 128 + 6144) x 8192 x 2 = 754,974,720; KV per token
  // per xPU 2 x 96 layers x 12 heads x 128 x 2 = 589,824 bytes, a block of
  // 16 tokens 9,437,184 bytes. 32,912,317,440 / 9,437,184 = 3487.5 -> 3487.
  EXPECT_DOUBLE_EQ(r->weight_bytes_per_xpu, 43642119168.0);
  EXPECT_DOUBLE_EQ(r->activation_bytes_per_xpu, 754974720.0);
  EXPECT_DOUBLE_EQ(r->kv.usable_bytes_per_xpu, 32912317440.0);
  EXPECT_EQ(r->kv.blocks, 3487);
  EXPECT_EQ(r->kv.tokens, 55792);
  EXPECT_EQ(r->batching.kv_capacity_blocks, 3487);
  EXPECT_EQ(r->tensor_parallel, 8);
  EXPECT_EQ(r->replicas, 1);
  EXPECT_EQ(r->model.num_layers, 96);
}

TEST(ScenarioResolveTest, AttentionPoolHoldsTheKvAndTakesTheModelShape) {
  // GPT-2 medium on one A100 with 2 ToPick units (defaults: 8 GiB each, one
  // HBM2 stack of 8 channels; pcie4 link). KV per token: 2 x 24 layers x 16
  // heads x 64 x 2 bytes = 98,304; 2 x 8 GiB / (98,304 x 16) = 10,922.7 ->
  // 10,922 blocks.
  const std::string text =
      "model { preset: \"gpt2-medium\" }\n"
      "cluster { xpu { preset: \"a100-80gb\" } attention_pool { topick { } units: 2 } }\n";
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->has_attention_device);
  EXPECT_EQ(r->attention_kind, "topick");
  EXPECT_EQ(r->attention_label, "topick x 2");
  EXPECT_EQ(r->attention_units, 2);
  EXPECT_DOUBLE_EQ(r->device_memory_bytes, 2 * 8.0 * (1 << 30));
  EXPECT_EQ(r->kv.blocks, 10922);
  const auto& dev = r->proto.cluster().attention_pool().topick();
  EXPECT_EQ(dev.topick().preset(), "topick");
  EXPECT_EQ(dev.model().layers(), 24);
  EXPECT_EQ(dev.model().heads(), 16);
  EXPECT_EQ(dev.model().d_head(), 64);
  EXPECT_EQ(r->attention_link.preset(), "pcie4");
  ASSERT_NE(r->attention_shared, nullptr);
  EXPECT_DOUBLE_EQ(r->attention_shared->Describe().memory_bytes, 2 * 8.0 * (1 << 30));
  // SpAtten: 16 channels, so 16 GiB a unit by default.
  absl::StatusOr<ResolvedScenario> sp = ParseAndResolve(
      "model { preset: \"gpt2-medium\" }\n"
      "cluster { xpu { preset: \"a100-80gb\" } attention_pool { spatten { } units: 1 } }\n");
  ASSERT_TRUE(sp.ok()) << sp.status();
  EXPECT_EQ(sp->attention_kind, "spatten");
  EXPECT_DOUBLE_EQ(sp->device_memory_bytes, 16.0 * (1 << 30));
  // CTA: preset cta_0 by default, the model's shape, 8 channels: 8 GiB; a
  // bad width names the field (at the scenario's line).
  absl::StatusOr<ResolvedScenario> ct = ParseAndResolve(
      "model { preset: \"gpt2-medium\" }\n"
      "cluster { xpu { preset: \"a100-80gb\" } attention_pool { cta { } units: 2 } }\n");
  ASSERT_TRUE(ct.ok()) << ct.status();
  EXPECT_EQ(ct->attention_kind, "cta");
  EXPECT_EQ(ct->attention_label, "cta_0 x 2");
  const auto& cd = ct->proto.cluster().attention_pool().cta();
  EXPECT_EQ(cd.cta().preset(), "cta_0");
  EXPECT_DOUBLE_EQ(cd.cta().kv1_width(), 0.6);
  EXPECT_EQ(cd.model().layers(), 24);
  EXPECT_EQ(cd.model().heads(), 16);
  EXPECT_EQ(cd.model().d_head(), 64);
  EXPECT_DOUBLE_EQ(ct->device_memory_bytes, 2 * 8.0 * (1 << 30));
  absl::StatusOr<ResolvedScenario> bad = ParseAndResolve(
      "model { preset: \"gpt2-medium\" }\n"
      "cluster { xpu { preset: \"a100-80gb\" } attention_pool { cta { cta { kv2_width: -1 } } } }\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("cta device: kv2_width = -1"));
  // LAD: its 5 HBM2 cubes, 40 GiB a unit; the model shape from LLaMA-2-7B.
  absl::StatusOr<ResolvedScenario> ld = ParseAndResolve(
      "model { preset: \"llama2-7b\" }\n"
      "cluster { xpu { preset: \"a100-40gb\" } attention_pool { lad { } units: 1 } }\n");
  ASSERT_TRUE(ld.ok()) << ld.status();
  EXPECT_EQ(ld->attention_kind, "lad");
  EXPECT_EQ(ld->attention_label, "lad_1.5 x 1");
  EXPECT_DOUBLE_EQ(ld->device_memory_bytes, 40.0 * (1 << 30));
  const auto& lm = ld->proto.cluster().attention_pool().lad();
  EXPECT_EQ(lm.lad().tiles(), 6);
  EXPECT_EQ(lm.model().layers(), 32);
  EXPECT_EQ(lm.model().heads(), 32);
  EXPECT_EQ(lm.model().d_head(), 128);
}

TEST(ScenarioResolveTest, AttentionPoolBadInputNamesTheField) {
  auto text = [](const char* pool, const char* cluster) {
    return absl::StrCat("model { preset: \"gpt2-medium\" }\n",
                        "cluster { xpu { preset: \"a100-80gb\" } attention_pool { topick { } ",
                        pool, " } ", cluster, " }\n");
  };
  auto run = [&](const char* pool, const char* cluster) {
    return ParseAndResolve(text(pool, cluster));
  };
  auto units = run("units: 0", "");
  ASSERT_FALSE(units.ok());
  EXPECT_THAT(units.status().message(), HasSubstr("cluster.attention_pool.units"));
  EXPECT_THAT(units.status().message(), HasSubstr("[1, 1024]"));
  auto ff = run("", "overlap: OVERLAP_POLICY_HEAD_LEVEL_FF");
  ASSERT_FALSE(ff.ok());
  EXPECT_THAT(ff.status().message(), HasSubstr("cluster.attacc's GEMV units"));
  auto both = run("", "attacc { }");
  ASSERT_FALSE(both.ok());
  EXPECT_THAT(both.status().message(), HasSubstr("at most one of cluster.attacc"));
  auto preset = run("", "");
  ASSERT_TRUE(preset.ok()) << preset.status();
  auto bad = ParseAndResolve(text("", ""),
                             {"cluster.attention_pool.topick.topick.preset=nope"});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("cluster.attention_pool.topick.topick.preset"));
}

TEST(ScenarioResolveTest, Llama2_70bTensorParallelAboveKvHeadsResolves) {
  const std::string text =
      "model { preset: \"llama2-70b\" }\n"
      "cluster { tensor_parallel: 16 xpu { preset: \"a100-80gb\" } }\n";
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tensor_parallel, 16);
  EXPECT_EQ(r->model.num_kv_heads, 8);
  EXPECT_GT(r->kv.blocks, 0);
}

TEST(ScenarioResolveTest, TensorParallelNeitherDividingNorMultipleOfKvHeads) {
  // 12 heads, 4 KV heads, d_ff 3072: TP 6 divides the heads and d_ff but is
  // neither a divisor nor a multiple of the 4 KV heads.
  std::string text = kExplicitModel;
  text.replace(text.find("num_kv_heads: 5"), 15, "num_kv_heads: 4");
  text.replace(text.find("cluster {"), 9, "cluster { tensor_parallel: 6");
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt:11: cluster.tensor_parallel = 6: must divide "
            "model.num_kv_heads (4) or be a multiple of it");
}

TEST(ScenarioResolveTest, ResolvedFieldsFollowTheScenario) {
  const std::string text = std::string(kValid) +
                           "scheduler { batching: BATCHING_POLICY_CHUNKED_PREFILL "
                           "routing: ROUTING_POLICY_LEAST_KV_LOAD }\n"
                           "slo { ttft_s: 2 tpot_s: 0.05 }\nseed: 9\n";
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(text);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->replicas, 2);
  EXPECT_EQ(r->seed, 9u);
  EXPECT_EQ(r->batching.policy, scheduler::BatchingPolicy::kChunkedPrefill);
  EXPECT_EQ(r->batching.max_tokens_per_iteration, 512);
  EXPECT_EQ(r->batching.max_context_tokens, 4096);
  EXPECT_EQ(r->routing, scheduler::RoutingPolicy::kLeastKvLoad);
  EXPECT_DOUBLE_EQ(r->ttft_slo_s, 2.0);
  EXPECT_DOUBLE_EQ(r->tpot_slo_s, 0.05);
  ASSERT_TRUE(r->xpu_device.has_gpu());
  EXPECT_EQ(r->xpu_device.gpu().xpu().preset(), "a100-80gb");
  EXPECT_EQ(r->xpu_device.gpu().interconnect().preset(), "nvlink3");
}

// -------------------------------------------------------------- --set ----

constexpr char kTraceScenario[] =
    "model { preset: \"llama2-7b\" }\n"
    "cluster { xpu { preset: \"a100-80gb\" } }\n"
    "workload {\n"
    "  trace { path: \"traces/x.csv\" }\n"
    "}\n";

TEST(ScenarioOverrideTest, SettingAOneofMemberSwitchesTheSource) {
  absl::StatusOr<LoadedScenario> sc = Parse(kTraceScenario);
  ASSERT_TRUE(sc.ok()) << sc.status();
  ASSERT_TRUE(sc->proto.workload().has_trace());
  ASSERT_TRUE(ApplyOverride(&*sc, "workload.poisson.rate_rps=8").ok());
  EXPECT_FALSE(sc->proto.workload().has_trace());
  ASSERT_TRUE(sc->proto.workload().has_poisson());
  EXPECT_DOUBLE_EQ(sc->proto.workload().poisson().rate_rps(), 8.0);
  EXPECT_EQ(sc->proto.workload().source_case(), servesim::v1::WorkloadSpec::kPoisson);
  EXPECT_EQ(sc->overridden.count("workload.poisson.rate_rps"), 1u);
}

TEST(ScenarioOverrideTest, EnumWithOrWithoutTypePrefix) {
  for (const char* value :
       {"scheduler.batching=CHUNKED_PREFILL",
        "scheduler.batching=BATCHING_POLICY_CHUNKED_PREFILL"}) {
    absl::StatusOr<LoadedScenario> sc = Parse(kValid);
    ASSERT_TRUE(sc.ok()) << sc.status();
    const absl::Status st = ApplyOverride(&*sc, value);
    ASSERT_TRUE(st.ok()) << value << ": " << st;
    EXPECT_EQ(sc->proto.scheduler().batching(), BATCHING_POLICY_CHUNKED_PREFILL)
        << value;
  }
}

TEST(ScenarioOverrideTest, UnknownEnumValueListsTheValues) {
  absl::StatusOr<LoadedScenario> sc = Parse(kValid);
  ASSERT_TRUE(sc.ok()) << sc.status();
  const absl::Status st = ApplyOverride(&*sc, "scheduler.batching=GREEDY");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(st.message()),
            "--set scheduler.batching=GREEDY: expected one of "
            "BATCHING_POLICY_PREFILL_FIRST, BATCHING_POLICY_CHUNKED_PREFILL");
}

TEST(ScenarioOverrideTest, EnumSuffixMustBeTheWholeNameAfterThePrefix) {
  // "PREFILL" is the tail of BATCHING_POLICY_CHUNKED_PREFILL but not a value
  // name; it must not silently pick chunked prefill.
  for (const char* value : {"PREFILL", "FIRST", "POLICY_CHUNKED_PREFILL"}) {
    absl::StatusOr<LoadedScenario> sc = Parse(kValid);
    ASSERT_TRUE(sc.ok()) << sc.status();
    const absl::Status st =
        ApplyOverride(&*sc, absl::StrCat("scheduler.batching=", value));
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << value;
    EXPECT_EQ(std::string(st.message()),
              absl::StrCat("--set scheduler.batching=", value,
                           ": expected one of BATCHING_POLICY_PREFILL_FIRST, "
                           "BATCHING_POLICY_CHUNKED_PREFILL"));
    EXPECT_EQ(sc->proto.scheduler().batching(),
              servesim::v1::BATCHING_POLICY_UNSPECIFIED)
        << value;
  }
  // Other enums strip their own prefixes.
  absl::StatusOr<LoadedScenario> sc = Parse(kValid);
  ASSERT_TRUE(sc.ok()) << sc.status();
  EXPECT_TRUE(ApplyOverride(&*sc, "model.ff_kind=SWIGLU").ok());
  EXPECT_TRUE(ApplyOverride(&*sc, "model.dtype=INT8").ok());
  EXPECT_TRUE(ApplyOverride(&*sc, "scheduler.routing=LEAST_KV_LOAD").ok());
  EXPECT_TRUE(ApplyOverride(&*sc, "workload.trace.format=TRACE_FORMAT_AZURE").ok());
  EXPECT_EQ(sc->proto.model().ff_kind(), servesim::v1::FF_KIND_SWIGLU);
  EXPECT_EQ(sc->proto.model().dtype(), servesim::v1::DTYPE_INT8);
  EXPECT_EQ(sc->proto.scheduler().routing(), servesim::v1::ROUTING_POLICY_LEAST_KV_LOAD);
  EXPECT_EQ(sc->proto.workload().trace().format(), servesim::v1::TRACE_FORMAT_AZURE);
}

TEST(ScenarioOverrideTest, ScalarsOfEachKind) {
  absl::StatusOr<LoadedScenario> sc = Parse(kValid);
  ASSERT_TRUE(sc.ok()) << sc.status();
  for (const char* s :
       {"cluster.replicas=3", "model.max_context_tokens = 2048", "seed=42",
        "cluster.memory_utilization=0.8", "model.tied_embeddings=true",
        "name=a=b", "cluster.xpu.preset=a100-hbm3"}) {
    const absl::Status st = ApplyOverride(&*sc, s);
    EXPECT_TRUE(st.ok()) << s << ": " << st;
  }
  EXPECT_EQ(sc->proto.cluster().replicas(), 3);
  EXPECT_EQ(sc->proto.model().max_context_tokens(), 2048);
  EXPECT_EQ(sc->proto.seed(), 42u);
  EXPECT_DOUBLE_EQ(sc->proto.cluster().memory_utilization(), 0.8);
  EXPECT_TRUE(sc->proto.model().tied_embeddings());
  EXPECT_EQ(sc->proto.name(), "a=b");
  EXPECT_EQ(sc->proto.cluster().xpu().preset(), "a100-hbm3");
}

TEST(ScenarioOverrideTest, BadIntegerValue) {
  absl::StatusOr<LoadedScenario> sc = Parse(kValid);
  ASSERT_TRUE(sc.ok()) << sc.status();
  const absl::Status st = ApplyOverride(&*sc, "cluster.replicas=abc");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(st.message()), "--set cluster.replicas=abc: expected a 32-bit integer");
  EXPECT_EQ(sc->proto.cluster().replicas(), 2);  // unchanged
  EXPECT_EQ(sc->overridden.count("cluster.replicas"), 0u);
}

TEST(ScenarioOverrideTest, BadValuesOfOtherKinds) {
  absl::StatusOr<LoadedScenario> sc = Parse(kValid);
  ASSERT_TRUE(sc.ok()) << sc.status();
  EXPECT_EQ(std::string(ApplyOverride(&*sc, "model.num_layers=1.5").message()),
            "--set model.num_layers=1.5: expected an integer");
  EXPECT_EQ(std::string(ApplyOverride(&*sc, "seed=-1").message()),
            "--set seed=-1: expected a non-negative integer");
  EXPECT_EQ(std::string(ApplyOverride(&*sc, "slo.ttft_s=inf").message()),
            "--set slo.ttft_s=inf: expected a finite number");
  EXPECT_EQ(std::string(ApplyOverride(&*sc, "model.tied_embeddings=maybe").message()),
            "--set model.tied_embeddings=maybe: expected true or false");
}

TEST(ScenarioOverrideTest, UnknownFieldListsTheMessagesFields) {
  absl::StatusOr<LoadedScenario> sc = Parse(kValid);
  ASSERT_TRUE(sc.ok()) << sc.status();
  const absl::Status st = ApplyOverride(&*sc, "cluster.nosuch=1");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(st.message()),
            "--set cluster.nosuch: ClusterSpec has no field \"nosuch\"; its "
            "fields: replicas, xpu, tensor_parallel, interconnect, frontend, "
            "memory_utilization, attacc, overlap, head_groups, ff_min_batch, ff_max_batch, "
            "attention_pool, xpu_endpoints, attention_endpoints");
}

TEST(ScenarioOverrideTest, MessageFieldIsNotAssignable) {
  absl::StatusOr<LoadedScenario> sc = Parse(kValid);
  ASSERT_TRUE(sc.ok()) << sc.status();
  const absl::Status st = ApplyOverride(&*sc, "model=3");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(st.message()), "--set model: model is a message; name one of its scalar fields");
}

TEST(ScenarioOverrideTest, NothingBelowAScalar) {
  absl::StatusOr<LoadedScenario> sc = Parse(kValid);
  ASSERT_TRUE(sc.ok()) << sc.status();
  const absl::Status st = ApplyOverride(&*sc, "cluster.replicas.x=3");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(st.message()), "--set cluster.replicas.x: replicas is a scalar; nothing below it");
}

TEST(ScenarioOverrideTest, MissingEquals) {
  absl::StatusOr<LoadedScenario> sc = Parse(kValid);
  ASSERT_TRUE(sc.ok()) << sc.status();
  for (const char* s : {"missing_equals", "=5"}) {
    const absl::Status st = ApplyOverride(&*sc, s);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(std::string(st.message()), absl::StrCat("--set ", s, ": expected field.path=value"));
  }
}

TEST(ScenarioOverrideTest, ErrorOnOverriddenFieldNamesTheSet) {
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(kValid, {"cluster.replicas=0"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()),
            "s.pbtxt (--set cluster.replicas): cluster.replicas = 0: allowed "
            "range [1, 4096]");
}

TEST(ScenarioOverrideTest, UnknownPresetBySetNamesTheSet) {
  absl::StatusOr<ResolvedScenario> r =
      ParseAndResolve(kValid, {"cluster.xpu.preset=tpu-v9"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(r.status().message()),
              StartsWith("s.pbtxt (--set cluster.xpu.preset): "
                         "cluster.xpu.preset: unknown xpu preset \"tpu-v9\"; known: "));
}

TEST(ScenarioOverrideTest, OverridesApplyInOrderAndBeatTheFile) {
  absl::StatusOr<ResolvedScenario> r = ParseAndResolve(
      kValid, {"cluster.replicas=5", "cluster.replicas=3", "scheduler.batching=CHUNKED_PREFILL"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->replicas, 3);
  // The override is applied before defaults: the chunked-prefill budget.
  EXPECT_EQ(r->proto.scheduler().max_tokens_per_iteration(), 512);
}

// ---------------------------------------------------------- Normalize ----

TEST(ScenarioNormalizeTest, FillsDocumentedDefaults) {
  const LoadedScenario sc = Normalized(
      "model { preset: \"llama2-7b\" }\ncluster { xpu { preset: \"a100-80gb\" } }\n");
  const auto& p = sc.proto;
  EXPECT_EQ(p.seed(), 1u);
  EXPECT_EQ(p.cluster().replicas(), 1);
  EXPECT_EQ(p.cluster().tensor_parallel(), 1);
  EXPECT_DOUBLE_EQ(p.cluster().memory_utilization(), 0.9);
  EXPECT_EQ(p.cluster().interconnect().preset(), "nvlink3");
  EXPECT_DOUBLE_EQ(p.cluster().interconnect().bandwidth_bytes_per_s(), 300e9);
  EXPECT_EQ(p.cluster().frontend().preset(), "ethernet-100g");
  EXPECT_DOUBLE_EQ(p.cluster().frontend().bandwidth_bytes_per_s(), 12.5e9);
  EXPECT_EQ(p.scheduler().batching(), BATCHING_POLICY_PREFILL_FIRST);
  EXPECT_EQ(p.scheduler().routing(), servesim::v1::ROUTING_POLICY_ROUND_ROBIN);
  EXPECT_EQ(p.scheduler().max_batch_size(), 256);
  EXPECT_EQ(p.scheduler().max_tokens_per_iteration(), 8192);
  EXPECT_EQ(p.scheduler().kv_block_tokens(), 16);
  EXPECT_DOUBLE_EQ(p.scheduler().kv_watermark(), 0.01);
  EXPECT_DOUBLE_EQ(p.slo().ttft_s(), 5.0);
  EXPECT_DOUBLE_EQ(p.slo().tpot_s(), 0.1);
  EXPECT_TRUE(p.output().requests_csv());
  EXPECT_TRUE(p.output().iterations_csv());
  EXPECT_DOUBLE_EQ(p.workload().rate_scale(), 1.0);
  EXPECT_EQ(p.model().dtype(), servesim::v1::DTYPE_FP16);
  EXPECT_EQ(p.model().name(), "LLaMA-2 7B");
}

TEST(ScenarioNormalizeTest, ChunkedPrefillDefaultsToA512TokenBudget) {
  const LoadedScenario sc = Normalized(
      "model { preset: \"llama2-7b\" }\n"
      "scheduler { batching: BATCHING_POLICY_CHUNKED_PREFILL }\n");
  EXPECT_EQ(sc.proto.scheduler().max_tokens_per_iteration(), 512);
}

TEST(ScenarioNormalizeTest, ExplicitValuesAreKept) {
  const LoadedScenario sc = Normalized(
      "model { preset: \"llama2-7b\" }\n"
      "cluster { replicas: 3 memory_utilization: 0.5 }\n"
      "scheduler { batching: BATCHING_POLICY_CHUNKED_PREFILL "
      "max_tokens_per_iteration: 1024 kv_block_tokens: 32 }\n"
      "slo { ttft_s: 2 }\nseed: 0\n");
  EXPECT_EQ(sc.proto.seed(), 0u);  // explicit 0 is not "unset"
  EXPECT_EQ(sc.proto.cluster().replicas(), 3);
  EXPECT_DOUBLE_EQ(sc.proto.cluster().memory_utilization(), 0.5);
  EXPECT_EQ(sc.proto.scheduler().max_tokens_per_iteration(), 1024);
  EXPECT_EQ(sc.proto.scheduler().kv_block_tokens(), 32);
  EXPECT_DOUBLE_EQ(sc.proto.slo().ttft_s(), 2.0);
  EXPECT_DOUBLE_EQ(sc.proto.slo().tpot_s(), 0.1);
}

TEST(ScenarioNormalizeTest, PresetFillsButExplicitFieldsWin) {
  const LoadedScenario sc = Normalized(
      "model { preset: \"gpt3-175b\" max_context_tokens: 4096 }\n");
  const auto& m = sc.proto.model();
  EXPECT_EQ(m.max_context_tokens(), 4096);  // explicit, preset says 2048
  EXPECT_EQ(m.num_layers(), 96);
  EXPECT_EQ(m.d_model(), 12288);
  EXPECT_EQ(m.num_heads(), 96);
  EXPECT_EQ(m.num_kv_heads(), 96);
  EXPECT_EQ(m.d_head(), 128);
  EXPECT_EQ(m.d_ff(), 49152);
  EXPECT_EQ(m.vocab_size(), 50257);
  EXPECT_TRUE(m.tied_embeddings());
  EXPECT_EQ(m.ff_kind(), servesim::v1::FF_KIND_GELU);
  EXPECT_EQ(m.name(), "GPT-3 175B");
}

TEST(ScenarioNormalizeTest, XpuPresetFillsHardwareFigures) {
  const LoadedScenario sc = Normalized(
      "model { preset: \"gpt3-175b\" }\n"
      "cluster { xpu { preset: \"a100-hbm3\" compute_utilization: 0.5 } }\n");
  const auto& x = sc.proto.cluster().xpu();
  EXPECT_DOUBLE_EQ(x.memory_bw_bytes_per_s(), 3.35e12);
  EXPECT_DOUBLE_EQ(x.memory_bytes(), 85899345920.0);
  EXPECT_DOUBLE_EQ(x.peak_flops_fp16(), 312e12);
  EXPECT_DOUBLE_EQ(x.peak_flops_int8(), 624e12);
  EXPECT_DOUBLE_EQ(x.compute_utilization(), 0.5);  // explicit wins
  EXPECT_DOUBLE_EQ(x.memory_utilization(), 0.85);
}

TEST(ScenarioNormalizeTest, ExplicitHardwareGetsDocumentedDefaults) {
  const LoadedScenario sc = Normalized(
      "cluster { xpu { peak_flops_fp16: 100e12 memory_bytes: 1e10 "
      "memory_bw_bytes_per_s: 1e12 } }\n");
  const auto& x = sc.proto.cluster().xpu();
  EXPECT_DOUBLE_EQ(x.peak_flops_int8(), 200e12);
  EXPECT_DOUBLE_EQ(x.compute_utilization(), 0.8);
  EXPECT_DOUBLE_EQ(x.memory_utilization(), 0.85);
  EXPECT_DOUBLE_EQ(x.kernel_overhead_s(), 4e-6);
  EXPECT_DOUBLE_EQ(x.dram_energy_pj_per_byte(), 28.72);
  EXPECT_DOUBLE_EQ(x.flop_energy_pj(), 0.16);
}

TEST(ScenarioNormalizeTest, GqaKvHeadsDefaultToHeadsForExplicitModels) {
  std::string text = kExplicitModel;
  text.erase(text.find("  num_kv_heads: 5\n"), 18);
  const LoadedScenario sc = Normalized(text);
  EXPECT_EQ(sc.proto.model().num_kv_heads(), 12);
  EXPECT_EQ(sc.proto.model().name(), "custom");
}

TEST(ScenarioNameTest, UntitledScenarioIsNamedAfterItsFile) {
  auto sc = ParseScenarioText("model { preset: \"gpt2-xl\" }", "runs/sweep_a.pbtxt");
  ASSERT_TRUE(sc.ok());
  ASSERT_TRUE(Normalize(&*sc).ok());
  EXPECT_EQ(sc->proto.name(), "sweep_a");
  auto named = ParseScenarioText("name: \"mine\"", "runs/x.pbtxt");
  ASSERT_TRUE(Normalize(&*named).ok());
  EXPECT_EQ(named->proto.name(), "mine");
}

TEST(AnnotateFieldErrorTest, PrefixesWorkloadErrorsWithTheirLine) {
  auto sc = ParseScenarioText(
      "model { preset: \"gpt2-xl\" }\n"
      "workload {\n"
      "  poisson { rate_rps: 0 }\n"
      "}\n",
      "w.pbtxt");
  ASSERT_TRUE(sc.ok()) << sc.status();
  const absl::Status st = AnnotateFieldError(
      *sc, absl::InvalidArgumentError("workload.poisson.rate_rps = 0; expected > 0"));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "w.pbtxt:3: workload.poisson.rate_rps = 0; expected > 0");
  // A field the file never wrote falls back to its nearest written parent.
  EXPECT_EQ(AnnotateFieldError(*sc, absl::InvalidArgumentError(
                                        "workload.num_requests = 0; expected >= 1"))
                .message(),
            "w.pbtxt:2: workload.num_requests = 0; expected >= 1");
  // Messages that do not start with a scenario field pass through.
  const absl::Status trace = absl::InvalidArgumentError("x.csv:3: bad row");
  EXPECT_EQ(AnnotateFieldError(*sc, trace), trace);
  EXPECT_TRUE(AnnotateFieldError(*sc, absl::OkStatus()).ok());
}

}  // namespace
}  // namespace servesim::cluster
