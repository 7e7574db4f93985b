// devices/interrupt.h: every kind's functional kernel polls the current
// thread's interrupt between heads, stops with the poll's status, and
// computes exactly as without a scope while the poll says go on.
#include "devices/interrupt.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "agents/agent_service.h"
#include "devices/device.h"
#include "devices/registry.h"
#include "devices/tensor.h"
#include "gtest/gtest.h"

namespace servesim::devices {
namespace {

Tensor Wave(std::vector<int64_t> shape, float f) {
  Tensor t = Tensor::Zeros(ElementType::kFp16, std::move(shape));
  for (int64_t i = 0; i < t.NumElements(); ++i) t.Set(i, std::sin(f * static_cast<float>(i + 1)));
  return t;
}

class KernelInterruptTest : public ::testing::TestWithParam<std::string> {};

TEST_P(KernelInterruptTest, KernelsStopWithThePollsStatusAndComputeAlikeOtherwise) {
  auto spec = agents::AgentPresetSpec(GetParam(), "");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto device = CreateDevice(*spec);
  ASSERT_TRUE(device.ok()) << device.status();
  AttentionCall call;
  call.q = Wave({8, 1, 64}, 0.11f);
  call.k = Wave({8, 96, 64}, 0.07f);
  call.v = Wave({8, 96, 64}, 0.05f);
  auto plain = (*device)->Execute(call);
  ASSERT_TRUE(plain.ok()) << plain.status();
  int polls = 0;
  {
    InterruptScope counting([&polls] {
      ++polls;
      return absl::OkStatus();
    });
    auto polled = (*device)->Execute(call);
    ASSERT_TRUE(polled.ok()) << polled.status();
    EXPECT_EQ(polled->out.bytes, plain->out.bytes);
    EXPECT_EQ(polled->stats.kv_positions_read, plain->stats.kv_positions_read);
  }
  EXPECT_GE(polls, 8) << "one poll per head at least";
  {
    int seen = 0;
    InterruptScope stop(
        [&seen] { return ++seen < 3 ? absl::OkStatus() : absl::CancelledError("caller gone"); });
    auto stopped = (*device)->Execute(call);
    EXPECT_EQ(stopped.status().code(), absl::StatusCode::kCancelled) << stopped.status();
    EXPECT_EQ(seen, 3) << "the kernel stops at the first poll that says so";
  }
  // Out of the scope: never interrupted again.
  EXPECT_TRUE(PollInterrupt().ok());
  auto after = (*device)->Execute(call);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->out.bytes, plain->out.bytes);
}

INSTANTIATE_TEST_SUITE_P(AllKinds, KernelInterruptTest,
                         ::testing::Values("gpu", "attacc", "topick", "spatten", "cta", "lad"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace servesim::devices
