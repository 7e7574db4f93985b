// What the scenario tests share: a valid scenario to edit, and the
// pipeline run on text (parse -> --set -> Normalize -> Resolve).
#ifndef SERVESIM_TESTS_SCENARIO_SCENARIO_TEST_UTIL_H_
#define SERVESIM_TESTS_SCENARIO_SCENARIO_TEST_UTIL_H_

#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "scenario/scenario.h"

namespace servesim::scenario::test {

inline constexpr char kPath[] = "s.pbtxt";

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
inline constexpr char kValid[] =
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

inline absl::StatusOr<LoadedScenario> Parse(const std::string& text) {
  return ParseScenarioText(text, kPath);
}

// Runs the whole pipeline on `text` with the --set assignments `sets`.
inline absl::StatusOr<ResolvedScenario> ParseAndResolve(
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
inline LoadedScenario Normalized(const std::string& text) {
  absl::StatusOr<LoadedScenario> sc = Parse(text);
  EXPECT_TRUE(sc.ok()) << sc.status();
  if (!sc.ok()) return LoadedScenario{};
  const absl::Status st = Normalize(&*sc);
  EXPECT_TRUE(st.ok()) << st;
  return *std::move(sc);
}

// A model given by its dimensions (no preset); num_kv_heads does not
// divide num_heads.
inline constexpr char kExplicitModel[] =
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

// Llama-3.1-8B on one RTX PRO 6000 under vLLM v1's batching: the vLLM
// memory plan's worked example, and a pair the example profile bundles
// (examples/vllm/profiles) measure.
inline constexpr char kLlama31OnRtxPro[] =
    "model { preset: \"llama3.1-8b\" }\n"
    "cluster { xpu { preset: \"rtx-pro-6000\" } }\n"
    "scheduler { batching: BATCHING_POLICY_VLLM_V1 max_batch_size: 128 "
    "max_tokens_per_iteration: 2048 }\n"
    "workload { saturated { num_requests: 4 input_tokens: 128 output_tokens: 16 } }\n";

}  // namespace servesim::scenario::test

#endif  // SERVESIM_TESTS_SCENARIO_SCENARIO_TEST_UTIL_H_
