// ANALYTIC fidelity charges a preset's table of keep/prune ratios. A knob
// that table cannot describe (an algorithm knob that differs from the
// preset's, or attention data to measure) is refused, naming the knob and
// the modes that model it; hardware knobs still change the result; and the
// outputs say where the ratios came from.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

#include "absl/strings/match.h"
#include "devices/cta/cta_device.h"
#include "devices/lad/lad_device.h"
#include "devices/ops.h"
#include "devices/prune_common.h"
#include "devices/registry.h"
#include "devices/spatten/spatten_device.h"
#include "devices/topick/topick_device.h"
#include "gtest/gtest.h"

namespace servesim::devices {
namespace {

using servesim::v1::DeviceSpec;
using servesim::v1::PRUNE_FIDELITY_ANALYTIC;
using servesim::v1::PRUNE_FIDELITY_CALIBRATED;
using servesim::v1::PRUNE_FIDELITY_FULL;

DeviceSpec Topick() {
  DeviceSpec d;
  *d.mutable_topick()->mutable_topick() = *TopickPreset("topick");
  d.mutable_topick()->set_fidelity(PRUNE_FIDELITY_ANALYTIC);
  return d;
}

// One decode-attention op: 4 sequences at L = 1024, GPT-2-medium heads.
double AttentionTime(const DeviceSpec& spec) {
  auto dev = CreateDevice(spec);
  EXPECT_TRUE(dev.ok()) << dev.status();
  if (!dev.ok()) return -1;
  const std::vector<AttentionSeq> seqs = {{1, 1023, 0}, {1, 1023, 1}, {1, 1023, 2}, {1, 1023, 3}};
  Op op;
  op.kind = OpKind::kAttention;
  op.heads = 16, op.kv_heads = 16, op.d_head = 64;
  op.seqs = seqs;
  Cost c;
  EXPECT_TRUE((*dev)->Estimate({&op, 1}, {&c, 1}).ok());
  return c.time_s;
}

TEST(AnalyticKnobsTest, ChangedThresholdIsRefusedNamingTheModesThatModelIt) {
  DeviceSpec spec = Topick();
  spec.mutable_topick()->mutable_topick()->set_threshold(0.5);
  const auto dev = CreateDevice(spec);
  ASSERT_FALSE(dev.ok());
  EXPECT_EQ(dev.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dev.status().message(),
            "topick device: threshold = 0.5 differs from preset \"topick\"'s 0.001, and fidelity "
            "ANALYTIC charges that preset's table of ratios, which holds only for 0.001; set "
            "fidelity: PRUNE_FIDELITY_CALIBRATED or PRUNE_FIDELITY_FULL to model threshold = 0.5 "
            "(the functional kernel then measures the ratios), or use a preset whose threshold "
            "is 0.5");
  // The same knob under CALIBRATED is modelled: the kernel measures it.
  spec.mutable_topick()->set_fidelity(PRUNE_FIDELITY_CALIBRATED);
  spec.mutable_topick()->mutable_calibration()->add_lengths(256);
  spec.mutable_topick()->mutable_calibration()->set_instances(1);
  EXPECT_TRUE(CreateDevice(spec).ok());
}

TEST(AnalyticKnobsTest, EveryDevicesAlgorithmKnobsAreChecked) {
  struct Case {
    const char* knob;
    DeviceSpec spec;
  };
  std::vector<Case> cases;
  {
    DeviceSpec d = Topick();
    d.mutable_topick()->mutable_topick()->set_estimation(false);
    d.mutable_topick()->mutable_topick()->set_on_demand_k(false);
    cases.push_back({"estimation", d});
  }
  {
    DeviceSpec d;
    *d.mutable_spatten()->mutable_spatten() = *SpattenPreset("spatten");
    d.mutable_spatten()->mutable_spatten()->set_head_ratio_end(0);
    cases.push_back({"head_ratio_end", d});
  }
  {
    DeviceSpec d;
    *d.mutable_cta()->mutable_cta() = *CtaPreset("cta_0");
    d.mutable_cta()->mutable_cta()->set_kv1_width(3.0);
    cases.push_back({"kv1_width", d});
  }
  {
    DeviceSpec d;
    *d.mutable_lad()->mutable_lad() = *LadPreset("lad_1.5");
    d.mutable_lad()->mutable_lad()->set_centre_cos(0.9);
    cases.push_back({"centre_cos", d});
  }
  for (const Case& c : cases) {
    const auto dev = CreateDevice(c.spec);
    ASSERT_FALSE(dev.ok()) << c.knob;
    EXPECT_TRUE(absl::StrContains(dev.status().message(),
                                  absl::StrCat(" device: ", c.knob, " = ")))
        << dev.status();
    EXPECT_TRUE(absl::StrContains(dev.status().message(), "PRUNE_FIDELITY_CALIBRATED"));
  }
}

TEST(AnalyticKnobsTest, AttentionDataUnderAnalyticIsRefused) {
  DeviceSpec spec = Topick();
  spec.mutable_topick()->mutable_data()->set_query_drift_rad_per_step(0.001);
  const auto dev = CreateDevice(spec);
  ASSERT_FALSE(dev.ok());
  EXPECT_TRUE(absl::StartsWith(dev.status().message(),
                               "topick device: data is set, but fidelity ANALYTIC"))
      << dev.status();
  // Calibration settings belong to the other modes and are accepted, so a
  // scenario can sweep the fidelity.
  DeviceSpec sweep = Topick();
  sweep.mutable_topick()->mutable_calibration()->add_lengths(512);
  EXPECT_TRUE(CreateDevice(sweep).ok());
}

TEST(AnalyticKnobsTest, HardwareKnobsChangeTheCost) {
  // The cycle model honours hardware in every mode: half the channels,
  // a memory-bound attention op takes longer.
  const double full = AttentionTime(Topick());
  DeviceSpec half = Topick();
  half.mutable_topick()->mutable_topick()->set_hbm_channels(4);
  const double slow = AttentionTime(half);
  ASSERT_GT(full, 0);
  EXPECT_GT(slow, 1.5 * full);
}

TEST(AnalyticKnobsTest, RatioSourceFollowsTheMode) {
  DeviceSpec d = Topick();
  EXPECT_STREQ(RatioSourceOf(d), "paper");
  d.mutable_topick()->set_fidelity(PRUNE_FIDELITY_CALIBRATED);
  EXPECT_STREQ(RatioSourceOf(d), "calibrated");
  d.mutable_topick()->set_fidelity(PRUNE_FIDELITY_FULL);
  EXPECT_STREQ(RatioSourceOf(d), "measured");
  DeviceSpec lad;
  *lad.mutable_lad()->mutable_lad() = *LadPreset("lad_1.5");
  EXPECT_STREQ(RatioSourceOf(lad), "assumption");  // the paper gives no fractions
  DeviceSpec gpu;
  gpu.mutable_gpu();
  EXPECT_EQ(RatioSourceOf(gpu), nullptr);
}

}  // namespace
}  // namespace servesim::devices
