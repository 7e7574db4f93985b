// AttAcc device: the functional kernel against exact attention on random
// inputs, every placement, odd shapes, GQA, fp32 inputs, large scores.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "common/rng.h"
#include "devices/attacc/attacc_device.h"
#include "devices/reference_attention.h"
#include "devices/registry.h"
#include "gtest/gtest.h"
#include "tests/devices/attacc_test_util.h"
#include "tests/test_util.h"

namespace servesim::devices::attacc_test {
namespace {

// ------------------------------------------------------------ functional --

// |got - want| <= atol + rtol |want| with rtol 1e-2, atol 2e-3: fp16
// products and fp16 lane accumulation against the fp32 reference on inputs
// in [-1, 1] (fp16 has an 11-bit significand: 4.9e-4 relative per rounding).
// Returns the largest absolute error.
double ExpectClose(const Tensor& got, const Tensor& want, const char* what) {
  EXPECT_EQ(got.shape, want.shape) << what;
  double worst = 0;
  for (int64_t i = 0; i < got.NumElements(); ++i) {
    const double g = got.At(i), w = want.At(i);
    EXPECT_TRUE(std::isfinite(g)) << what << " element " << i;
    worst = std::max(worst, std::fabs(g - w));
    EXPECT_LE(std::fabs(g - w), 2e-3 + 1e-2 * std::fabs(w))
        << what << " element " << i << ": " << g << " vs " << w;
  }
  std::printf("%s: largest |error| %.2e\n", what, worst);
  return worst;
}

// Runs the kernel and checks it against ExactAttention, and its bytes and
// MACs against Estimate for the same single-sequence op.
double CheckKernel(const AttAccDevice& d, const AttentionCall& call, const char* what) {
  int64_t macs = 0;
  auto got = d.ExecuteCounted(call, &macs);
  EXPECT_TRUE(got.ok()) << got.status();
  if (!got.ok()) return 0;
  auto want = ExactAttention(call);
  EXPECT_TRUE(want.ok());
  const double worst = ExpectClose(got->out, want->out, what);
  const int64_t heads = call.q.shape[0], kv_heads = call.k.shape[0];
  const int64_t l = call.k.shape[1], dh = call.q.shape[2];
  EXPECT_EQ(got->stats.kv_positions, heads * l);
  EXPECT_EQ(got->stats.kv_positions_read, heads * l);
  EXPECT_EQ(got->stats.v_rows_read, heads * l);
  EXPECT_EQ(macs, heads * d.HeadMacs(l, dh)) << what;
  std::vector<AttentionSeq> seqs = {{1, l - 1}};
  const Cost c = Estimate1(d, Attention(seqs, heads, kv_heads, dh));
  EXPECT_DOUBLE_EQ(got->stats.bytes_read, c.dram_bytes) << what;
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * macs + 5.0 * heads * l) << what;
  return worst;
}

TEST(AttAccKernelTest, RandomInputsAllPlacements) {
  Rng rng(11, "attacc-kernel");
  for (const char* preset : {"attacc_bank", "attacc_bg", "attacc_buffer"}) {
    const auto d = Make(preset);
    AttentionCall call;
    call.q = Random(ElementType::kFp16, {4, 1, 128}, rng);
    call.k = Random(ElementType::kFp16, {4, 2048, 128}, rng);
    call.v = Random(ElementType::kFp16, {4, 2048, 128}, rng);
    // fp16 products and lane sums differ from the fp32 reference, within
    // the tolerance.
    EXPECT_GT(CheckKernel(*d, call, preset), 0) << preset;
  }
}

TEST(AttAccKernelTest, OddShapesGqaAndFp32Inputs) {
  Rng rng(12, "attacc-kernel");
  const auto d = Make();
  struct Case {
    int64_t heads, kv_heads, l, dh;
    ElementType type;
    const char* what;
  } cases[] = {
      {2, 2, 1, 128, ElementType::kFp16, "L = 1"},
      {3, 3, 301, 128, ElementType::kFp16, "L = 301 (not a multiple of 16)"},
      {2, 2, 777, 160, ElementType::kFp16, "d_head 160"},
      {8, 2, 515, 128, ElementType::kFp16, "GQA 8:2"},
      {2, 1, 100, 64, ElementType::kFp32, "fp32 inputs, d_head 64"},
  };
  for (const Case& c : cases) {
    AttentionCall call;
    call.q = Random(c.type, {c.heads, 1, c.dh}, rng);
    call.k = Random(c.type, {c.kv_heads, c.l, c.dh}, rng);
    call.v = Random(c.type, {c.kv_heads, c.l, c.dh}, rng);
    CheckKernel(*d, call, c.what);
  }
}

TEST(AttAccKernelTest, LargeScoreRange) {
  // scale 1 and q = 0.5: key 7 aligned (k = +0.9375: score +60), key 100
  // anti-aligned (-60), the rest random (|score| ~ 3). The max-subtracted
  // fp32 softmax neither overflows nor loses the winner.
  Rng rng(13, "attacc-kernel");
  for (const char* preset : {"attacc_bank", "attacc_buffer"}) {
    const auto d = Make(preset);
    const int64_t l = 531, dh = 128;
    AttentionCall call;
    call.scale = 1;
    call.q = Tensor::Zeros(ElementType::kFp16, {1, 1, dh});
    for (int64_t c = 0; c < dh; ++c) call.q.Set(c, 0.5f);
    call.k = Random(ElementType::kFp16, {1, l, dh}, rng);
    call.v = Random(ElementType::kFp16, {1, l, dh}, rng);
    for (int64_t c = 0; c < dh; ++c) {
      call.k.Set(7 * dh + c, 0.9375f);
      call.k.Set(100 * dh + c, -0.9375f);
    }
    CheckKernel(*d, call, "scores +-60");
    // A second key close to the winner (score 56): both matter.
    for (int64_t c = 0; c < dh; ++c) call.k.Set(300 * dh + c, 0.875f);
    CheckKernel(*d, call, "scores 60 and 56");
  }
}

}  // namespace
}  // namespace servesim::devices::attacc_test
