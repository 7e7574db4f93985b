// Device::Measure and Absorb (devices/device.h): a FULL-fidelity device whose
// steps were measured partly by other instances of the same spec costs every
// op and describes itself bit for bit as one instance that measured them
// all, for each of the four kinds that measure per step; and bad input is
// refused by name.
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "devices/cta/cta_device.h"
#include "devices/device.h"
#include "devices/lad/lad_device.h"
#include "devices/registry.h"
#include "devices/spatten/spatten_device.h"
#include "devices/topick/topick_device.h"
#include "gtest/gtest.h"

namespace servesim::devices {
namespace {

using servesim::v1::PRUNE_FIDELITY_ANALYTIC;
using servesim::v1::PRUNE_FIDELITY_FULL;

// A small model (2 layers, 2 heads, d_head 32) in `fidelity`, calibrated at
// one short length.
servesim::v1::DeviceSpec Spec(const std::string& kind, servesim::v1::PruneFidelity fidelity) {
  servesim::v1::DeviceSpec spec;
  servesim::v1::AttentionShape* m = nullptr;
  servesim::v1::PruneCalibrationSpec* cal = nullptr;
  if (kind == "topick") {
    *spec.mutable_topick()->mutable_topick() = *TopickPreset("topick");
    spec.mutable_topick()->set_fidelity(fidelity);
    m = spec.mutable_topick()->mutable_model();
    cal = spec.mutable_topick()->mutable_calibration();
  } else if (kind == "spatten") {
    *spec.mutable_spatten()->mutable_spatten() = *SpattenPreset("spatten");
    spec.mutable_spatten()->set_fidelity(fidelity);
    m = spec.mutable_spatten()->mutable_model();
    cal = spec.mutable_spatten()->mutable_calibration();
  } else if (kind == "cta") {
    *spec.mutable_cta()->mutable_cta() = *CtaPreset("cta_0.5");
    spec.mutable_cta()->set_fidelity(fidelity);
    m = spec.mutable_cta()->mutable_model();
    cal = spec.mutable_cta()->mutable_calibration();
  } else {
    *spec.mutable_lad()->mutable_lad() = *LadPreset("lad_1.5");
    spec.mutable_lad()->set_fidelity(fidelity);
    m = spec.mutable_lad()->mutable_model();
    cal = spec.mutable_lad()->mutable_calibration();
  }
  m->set_layers(2);
  m->set_heads(2);
  m->set_d_head(32);
  cal->add_lengths(64);
  cal->set_instances(1);
  return spec;
}

std::unique_ptr<Device> Make(const servesim::v1::DeviceSpec& spec) {
  auto d = CreateDevice(spec);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? std::move(*d) : nullptr;
}

// One decode op over `seqs` (heads 2, d_head 32).
Op DecodeOp(const std::vector<AttentionSeq>& seqs) {
  Op op;
  op.kind = OpKind::kAttention;
  op.heads = op.kv_heads = 2;
  op.d_head = 32;
  op.seqs = seqs;
  return op;
}

// Describe's parameters but the calibration's wall time.
std::vector<std::pair<std::string, double>> Params(const Device& d) {
  std::vector<std::pair<std::string, double>> p;
  for (const auto& kv : d.Describe().parameters) {
    if (!absl::StrContains(kv.first, "calibration_s")) p.push_back(kv);
  }
  return p;
}

class MeasureTest : public testing::TestWithParam<std::string> {};

TEST_P(MeasureTest, AbsorbedStepsCostAndDescribeAsIfMeasuredHere) {
  const servesim::v1::DeviceSpec spec = Spec(GetParam(), PRUNE_FIDELITY_FULL);
  auto alone = Make(spec), home = Make(spec), worker = Make(spec);
  ASSERT_NE(alone, nullptr);
  ASSERT_NE(home, nullptr);
  ASSERT_NE(worker, nullptr);
  EXPECT_TRUE(home->Describe().measures_steps);
  EXPECT_EQ(home->Describe().splits_layers, GetParam() == "topick" || GetParam() == "cta");
  // Three requests decoding together for 6 steps: request 7 on the home,
  // requests 8 and 9 on the worker; request 9 joins two steps late.
  for (int step = 0; step < 6; ++step) {
    std::vector<AttentionSeq> seqs;
    for (int64_t r : {7, 8, 9}) {
      if (r == 9 && step < 2) continue;
      AttentionSeq s;
      s.request_id = r;
      s.new_tokens = 1;
      s.past_tokens = 40 + 10 * (r - 7) + step;
      seqs.push_back(s);
    }
    const Op op = DecodeOp(seqs);
    std::vector<StepKey> mine, theirs;
    for (const AttentionSeq& s : seqs) {
      (s.request_id == 7 ? mine : theirs).push_back({s.request_id, s.past_tokens + 1});
    }
    auto own = home->Measure(mine);
    ASSERT_TRUE(own.ok()) << own.status();
    ASSERT_EQ(own->size(), 1u);
    EXPECT_EQ(own->front().step, mine.front());
    auto got = worker->Measure(theirs);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), theirs.size());  // in order, nothing filled in
    for (size_t i = 0; i < theirs.size(); ++i) EXPECT_EQ((*got)[i].step, theirs[i]);
    ASSERT_TRUE(home->Absorb(*got).ok());
    Cost a, h;
    ASSERT_TRUE(alone->Estimate({op}, absl::MakeSpan(&a, 1)).ok());
    ASSERT_TRUE(home->Estimate({op}, absl::MakeSpan(&h, 1)).ok());
    EXPECT_EQ(a.time_s, h.time_s) << "step " << step;
    EXPECT_EQ(a.dram_bytes, h.dram_bytes) << "step " << step;
    EXPECT_EQ(a.compute_energy_pj, h.compute_energy_pj) << "step " << step;
    EXPECT_EQ(a.flops, h.flops) << "step " << step;
  }
  // The description (the mean over every step measured) is the same bits;
  // the worker's, which holds two of the three requests, is not.
  EXPECT_EQ(Params(*alone), Params(*home));
  EXPECT_NE(Params(*alone), Params(*worker));
}

TEST_P(MeasureTest, AStepMeasuredTwiceIsFoundNotRerunAndBadInputIsRefusedByName) {
  auto d = Make(Spec(GetParam(), PRUNE_FIDELITY_FULL));
  ASSERT_NE(d, nullptr);
  auto first = d->Measure({{3, 50}});
  ASSERT_TRUE(first.ok()) << first.status();
  auto again = d->Measure({{3, 50}});
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(again->size(), 1u);
  EXPECT_EQ(again->front().values, first->front().values);
  EXPECT_LE(first->front().values.size(), static_cast<size_t>(kMaxStepValues));

  auto bad = d->Measure({{-1, 50}});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "steps[0]")) << bad.status();
  StepMeasurement short_one = first->front();
  short_one.values.pop_back();
  absl::Status st = d->Absorb({first->front(), short_one});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(st.message(), "measured[1] has")) << st;
  StepMeasurement nan = first->front();
  nan.values[0] = std::numeric_limits<double>::quiet_NaN();
  st = d->Absorb({nan});
  EXPECT_TRUE(absl::StrContains(st.message(), "measured[0].values[0] is not finite")) << st;

  // Absorbed values are what Estimate reads: no kernel reruns the step.
  auto other = Make(Spec(GetParam(), PRUNE_FIDELITY_FULL));
  ASSERT_NE(other, nullptr);
  StepMeasurement halved = first->front();
  for (double& v : halved.values) v *= 0.5;
  ASSERT_TRUE(other->Absorb({halved}).ok());
  AttentionSeq s;
  s.request_id = 3;
  s.new_tokens = 1;
  s.past_tokens = 49;
  Cost measured, absorbed;
  ASSERT_TRUE(d->Estimate({DecodeOp({s})}, absl::MakeSpan(&measured, 1)).ok());
  ASSERT_TRUE(other->Estimate({DecodeOp({s})}, absl::MakeSpan(&absorbed, 1)).ok());
  EXPECT_NE(measured.time_s, absorbed.time_s);

  // Devices that do not measure per step say so.
  auto analytic = Make(Spec(GetParam(), PRUNE_FIDELITY_ANALYTIC));
  ASSERT_NE(analytic, nullptr);
  EXPECT_FALSE(analytic->Describe().measures_steps);
  EXPECT_EQ(analytic->Measure({{3, 50}}).status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(analytic->Absorb({}).code(), absl::StatusCode::kUnimplemented);
}

class MeasureLayersTest : public testing::TestWithParam<std::string> {};

TEST_P(MeasureLayersTest, SharesSumToTheWholeStepBitForBit) {
  // A 5-layer model in 2, 3 and 5 shares (uneven shares included): the
  // shares' counts, absorbed, give the whole step's fractions bit for bit,
  // and an incomplete or repeated set is refused.
  servesim::v1::DeviceSpec spec = Spec(GetParam(), PRUNE_FIDELITY_FULL);
  (GetParam() == "topick" ? spec.mutable_topick()->mutable_model()
                          : spec.mutable_cta()->mutable_model())
      ->set_layers(5);
  auto alone = Make(spec);
  ASSERT_NE(alone, nullptr);
  EXPECT_TRUE(alone->Describe().splits_layers);
  const std::vector<StepKey> steps = {{1, 70}, {2, 33}};
  auto whole = alone->Measure(steps);
  ASSERT_TRUE(whole.ok()) << whole.status();
  for (int parts : {2, 3, 5}) {
    auto home = Make(spec), worker = Make(spec);
    std::vector<StepMeasurement> shares;
    for (int part = 0; part < parts; ++part) {
      auto got = (part % 2 == 0 ? home : worker)->MeasureLayers(steps, part, parts);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ(got->size(), steps.size());
      EXPECT_EQ((*got)[0].values.size(), GetParam() == "topick" ? 4u : 2u);
      EXPECT_EQ((*got)[0].parts, parts);
      shares.insert(shares.end(), got->begin(), got->end());
    }
    // A share alone is counts, not the step: nothing is memoised yet.
    std::vector<StepMeasurement> missing(shares.begin() + 1, shares.end());
    absl::Status st = home->Absorb(missing);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(st.message(), "missing a share")) << st;
    std::vector<StepMeasurement> twice = shares;
    twice.push_back(shares.front());
    EXPECT_TRUE(absl::StrContains(home->Absorb(twice).message(), "came already")) << parts;
    ASSERT_TRUE(home->Absorb(shares).ok());
    auto again = home->Measure(steps);  // found in the memo
    ASSERT_TRUE(again.ok());
    for (size_t i = 0; i < steps.size(); ++i) {
      EXPECT_EQ((*again)[i].values, (*whole)[i].values) << parts << " shares, step " << i;
    }
  }
  // Share numbers out of range, and shares given to a device that takes
  // whole steps only.
  EXPECT_EQ(alone->MeasureLayers(steps, 2, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(alone->MeasureLayers(steps, 0, kMaxLayerParts + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto lad = Make(Spec("lad", PRUNE_FIDELITY_FULL));
  ASSERT_NE(lad, nullptr);
  EXPECT_FALSE(lad->Describe().splits_layers);
  EXPECT_EQ(lad->MeasureLayers(steps, 0, 2).status().code(), absl::StatusCode::kUnimplemented);
  StepMeasurement share{{1, 70}, {1, 2, 3, 4, 5}, 0, 2};
  absl::Status st = lad->Absorb({share});
  EXPECT_TRUE(absl::StrContains(st.message(), "takes whole steps")) << st;
}

TEST(MeasureAheadTest, StepsMeasuredAheadAreTheAskedStepsAndStayUnseenUntilAsked) {
  const servesim::v1::DeviceSpec spec = Spec("spatten", PRUNE_FIDELITY_FULL);
  auto alone = Make(spec), ahead = Make(spec);
  ASSERT_NE(alone, nullptr);
  ASSERT_NE(ahead, nullptr);
  for (Device* d : {alone.get(), ahead.get()}) ASSERT_TRUE(d->Measure({{5, 41}}).ok());
  // Request 6 was never asked: its steps are passed over, not started.
  ASSERT_TRUE(ahead->MeasureAhead({{5, 42}, {5, 43}, {5, 44}, {5, 45}, {6, 50}}).ok());
  ASSERT_TRUE(ahead->MeasureAhead({{5, 43}}).ok());  // measured already: passed over
  EXPECT_EQ(Params(*alone), Params(*ahead));         // nothing ahead in the description
  // Asked one at a time, each step answers alone; asked past steps not yet
  // asked, those come too (filled in), as from a device that ran them then.
  for (const std::vector<StepKey>& asked :
       std::vector<std::vector<StepKey>>{{{5, 42}}, {{5, 44}}, {{6, 50}}, {{5, 47}}}) {
    auto want = alone->Measure(asked);
    auto got = ahead->Measure(asked);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), want->size()) << asked.front().l;
    for (size_t i = 0; i < want->size(); ++i) {
      EXPECT_EQ((*got)[i].step, (*want)[i].step) << asked.front().l;
      EXPECT_EQ((*got)[i].values, (*want)[i].values) << asked.front().l;
    }
    EXPECT_EQ(Params(*alone), Params(*ahead)) << asked.front().l;
  }
  // 44 came with 43 filled in; 47 with 45 and 46 (45 measured ahead).
  auto again = ahead->Measure({{5, 45}});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->size(), 1u);

  EXPECT_EQ(ahead->MeasureAhead({{5, 0}}).code(), absl::StatusCode::kInvalidArgument);
  for (const char* kind : {"topick", "cta", "lad"}) {
    auto other = Make(Spec(kind, PRUNE_FIDELITY_FULL));
    ASSERT_NE(other, nullptr);
    const absl::Status st = other->MeasureAhead({{5, 42}});
    EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << kind;
    EXPECT_TRUE(absl::StrContains(st.message(), "MeasureAhead needs spatten")) << st;
  }
  auto analytic = Make(Spec("spatten", PRUNE_FIDELITY_ANALYTIC));
  ASSERT_NE(analytic, nullptr);
  EXPECT_EQ(analytic->MeasureAhead({{5, 42}}).code(), absl::StatusCode::kUnimplemented);
}

TEST(MeasureAheadTest, CallsDuringAStretchAheadGetTheStepsTheyWouldHaveGotAlone) {
  // A thread measures 120 steps of two requests ahead, one call each, while
  // this one asks the steps and costs them: whenever the thread yields (a
  // call waits; a step begun ends first, and the thread goes on later), the
  // answers and the description are those of a device that never went
  // ahead.
  const servesim::v1::DeviceSpec spec = Spec("spatten", PRUNE_FIDELITY_FULL);
  auto alone = Make(spec), ahead = Make(spec);
  ASSERT_NE(alone, nullptr);
  ASSERT_NE(ahead, nullptr);
  for (Device* d : {alone.get(), ahead.get()}) ASSERT_TRUE(d->Measure({{1, 60}, {2, 90}}).ok());
  std::thread runner([&] {
    for (int64_t j = 1; j <= 120; ++j) {
      ASSERT_TRUE(ahead->MeasureAhead({{1, 60 + j}}).ok());
      ASSERT_TRUE(ahead->MeasureAhead({{2, 90 + j}}).ok());
    }
  });
  for (int64_t j = 1; j <= 80; ++j) {
    std::vector<AttentionSeq> seqs(2);
    seqs[0].request_id = 1;
    seqs[0].past_tokens = 59 + j;
    seqs[1].request_id = 2;
    seqs[1].past_tokens = 89 + j;
    for (AttentionSeq& s : seqs) s.new_tokens = 1;
    const Op op = DecodeOp(seqs);
    Cost a, b;
    if (j % 2 == 0) {
      const std::vector<StepKey> asked = {{1, 60 + j}, {2, 90 + j}};
      auto want = alone->Measure(asked);
      auto got = ahead->Measure(asked);
      ASSERT_TRUE(want.ok() && got.ok());
      ASSERT_EQ(got->size(), want->size()) << j;
      for (size_t i = 0; i < want->size(); ++i) {
        EXPECT_EQ((*got)[i].step, (*want)[i].step) << j;
        EXPECT_EQ((*got)[i].values, (*want)[i].values) << j;
      }
    }
    ASSERT_TRUE(alone->Estimate({op}, absl::MakeSpan(&a, 1)).ok());
    ASSERT_TRUE(ahead->Estimate({op}, absl::MakeSpan(&b, 1)).ok());
    EXPECT_EQ(a.time_s, b.time_s) << j;
    EXPECT_EQ(a.dram_bytes, b.dram_bytes) << j;
  }
  runner.join();
  EXPECT_EQ(Params(*alone), Params(*ahead));
}

INSTANTIATE_TEST_SUITE_P(SplittingKinds, MeasureLayersTest, testing::Values("topick", "cta"));

INSTANTIATE_TEST_SUITE_P(FullKinds, MeasureTest,
                         testing::Values("topick", "spatten", "cta", "lad"));

}  // namespace
}  // namespace servesim::devices
