// The scenario pipeline's first steps (scenario/scenario.h): parse, --set
// overrides and Normalize. Every bad input comes back with the right status
// code and a message that names the file and line (or the --set), the
// field path, the value and what is allowed.
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
#include "scenario/scenario.h"
#include "servesim/v1/scenario.pb.h"
#include "tests/scenario/scenario_test_util.h"

namespace servesim::scenario {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using servesim::v1::BATCHING_POLICY_CHUNKED_PREFILL;
using servesim::v1::BATCHING_POLICY_PREFILL_FIRST;
using test::kExplicitModel;
using test::kPath;
using test::kValid;
using test::Normalized;
using test::Parse;
using test::ParseAndResolve;

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
            "BATCHING_POLICY_PREFILL_FIRST, BATCHING_POLICY_CHUNKED_PREFILL, "
            "BATCHING_POLICY_VLLM_V1");
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
                           "BATCHING_POLICY_CHUNKED_PREFILL, BATCHING_POLICY_VLLM_V1"));
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
  EXPECT_EQ(
      std::string(st.message()),
      "--set cluster.nosuch: ClusterSpec has no field \"nosuch\"; its "
      "fields: replicas, xpu, tensor_parallel, interconnect, frontend, "
      "memory_utilization, attacc, overlap, head_groups, overlap_rule, ff_min_batch, ff_max_batch, "
      "attention_pool, xpu_endpoints, attention_endpoints, profile, data_parallel, "
      "expert_parallel, xpus_per_node, internode, pipeline_parallel, node, disaggregation, power, "
      "kv_tiers, collectives, internode_collectives");
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
}  // namespace servesim::scenario
