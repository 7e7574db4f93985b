// What the workload tests share: the shipped traces' paths and a status
// matcher (tests/workload/workload_test.cc, synthetic_test.cc).
#ifndef SERVESIM_TESTS_WORKLOAD_WORKLOAD_TEST_UTIL_H_
#define SERVESIM_TESTS_WORKLOAD_WORKLOAD_TEST_UTIL_H_

#include <initializer_list>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

#ifndef SERVESIM_SOURCE_DIR
#error "SERVESIM_SOURCE_DIR must name the repository root"
#endif

namespace servesim::workload {

#define SERVESIM_TRACES_ SERVESIM_SOURCE_DIR "/examples/traces/"
inline constexpr char kAzureConv[] = SERVESIM_TRACES_ "AzureLLMInferenceTrace_conv.csv";
inline constexpr char kAzureCode[] = SERVESIM_TRACES_ "AzureLLMInferenceTrace_code.csv";
inline constexpr char kMooncake[] = SERVESIM_TRACES_ "synthetic_trace.jsonl";
inline constexpr char kBurstGpt[] = SERVESIM_TRACES_ "burstgpt_slice.csv";
inline constexpr char kShareGpt[] =
    SERVESIM_TRACES_ "sharegpt_8k_filtered_stats_llama2_tokenizer.csv";
#undef SERVESIM_TRACES_

// `status` has `code` and its message contains every piece.
inline ::testing::AssertionResult IsError(const absl::Status& status, absl::StatusCode code,
                                          std::initializer_list<absl::string_view> pieces) {
  if (status.code() != code) {
    return ::testing::AssertionFailure()
           << "code " << absl::StatusCodeToString(status.code()) << ", expected "
           << absl::StatusCodeToString(code) << ": " << status.message();
  }
  for (absl::string_view piece : pieces) {
    if (!absl::StrContains(status.message(), piece)) {
      return ::testing::AssertionFailure()
             << "message \"" << status.message() << "\" lacks \"" << piece << "\"";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace servesim::workload

#endif  // SERVESIM_TESTS_WORKLOAD_WORKLOAD_TEST_UTIL_H_
