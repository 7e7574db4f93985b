// What the AttAcc device tests share (tests/devices/attacc_test.cc,
// attacc_schedule_test.cc, attacc_kernel_test.cc): the preset's timing
// figures, a device from a preset, a decode attention op, one op's cost.
//
// Figures used (attacc_bank preset, fp16, see devices/attacc/presets.cc):
// tCK 769 ps, t_rcd = t_rp = 19, t_ccdl 4, t_ccds 2, t_refi 5070, t_rfc
// 455, t_pim_move 4; per pCH 32 bank units of which 18 stream (factor
// 32/18 = 16/9); 2 pCHs per channel; 16 lanes (32 B columns of fp16); L
// split 16 ways (pCH x rank x BG), d_head 4 ways (banks).
#ifndef SERVESIM_TESTS_DEVICES_ATTACC_TEST_UTIL_H_
#define SERVESIM_TESTS_DEVICES_ATTACC_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "common/rng.h"
#include "devices/attacc/attacc_device.h"
#include "devices/registry.h"
#include "gtest/gtest.h"

namespace servesim::devices::attacc_test {

inline constexpr double kTck = 769e-12;
inline constexpr double kRefresh = 5070.0 / (5070.0 - 455.0);  // t_refi / (t_refi - t_rfc)
inline constexpr double kCap = 32.0 / 18.0;                    // 32 units, 18 stream

inline servesim::v1::DeviceSpec Spec(const char* preset = "attacc_bank") {
  servesim::v1::DeviceSpec spec;
  auto p = AttAccPreset(preset);
  EXPECT_TRUE(p.ok()) << p.status();
  *spec.mutable_attacc()->mutable_attacc() = *p;
  spec.mutable_attacc()->set_dtype(servesim::v1::DTYPE_FP16);
  return spec;
}

inline std::unique_ptr<AttAccDevice> Make(const servesim::v1::DeviceSpec& spec) {
  auto d = AttAccDevice::Create(spec);
  EXPECT_TRUE(d.ok()) << d.status();
  return std::unique_ptr<AttAccDevice>(static_cast<AttAccDevice*>(d->release()));
}

inline std::unique_ptr<AttAccDevice> Make(const char* preset = "attacc_bank",
                                          bool power_constraint = true) {
  auto spec = Spec(preset);
  spec.mutable_attacc()->mutable_attacc()->set_power_constraint(power_constraint);
  return Make(spec);
}

inline Op Attention(const std::vector<AttentionSeq>& seqs, int64_t heads, int64_t kv_heads,
                    int64_t d_head) {
  Op op;
  op.kind = OpKind::kAttention;
  op.stage = Stage::kAttention;
  op.heads = heads, op.kv_heads = kv_heads, op.d_head = d_head;
  op.seqs = seqs;
  return op;
}

inline Cost Estimate1(const Device& d, const Op& op) {
  Cost c;
  const absl::Status s = d.Estimate({&op, 1}, {&c, 1});
  EXPECT_TRUE(s.ok()) << s;
  return c;
}

inline absl::Status EstimateStatus(const Device& d, const Op& op) {
  Cost c;
  return d.Estimate({&op, 1}, {&c, 1});
}

// A tensor of `shape` with elements uniform in [-1, 1).
inline Tensor Random(ElementType type, std::vector<int64_t> shape, Rng& rng) {
  Tensor t = Tensor::Zeros(type, std::move(shape));
  for (int64_t i = 0; i < t.NumElements(); ++i) {
    t.Set(i, static_cast<float>(2 * rng.Uniform() - 1));
  }
  return t;
}

}  // namespace servesim::devices::attacc_test

#endif  // SERVESIM_TESTS_DEVICES_ATTACC_TEST_UTIL_H_
