// The iteration planner's hints to devices that answer from far away
// (planner_hints.cc): Expect and ExpectLater tell the devices exactly the
// ops Plan later asks, and with both devices remote the attention device is
// prepared before the xPU is asked. Hints change no cost.
#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "devices/device.h"
#include "gtest/gtest.h"
#include "scheduler/batching.h"
#include "scheduler/planner.h"
#include "tests/scheduler/hetero_test_util.h"

namespace servesim::scheduler {
namespace {

using devices::Cost;
using devices::Op;
using test::Config;
using test::Decode;
using test::Gpt3;
using test::HeteroPlannerTest;

// A device that answers with another and records what it is asked and
// told (Expect), each op by its full content.
class HintedDevice : public devices::Device {
 public:
  explicit HintedDevice(const devices::Device* inner) : inner_(inner) {}
  static std::string Key(const Op& op) {
    std::string k = absl::StrCat(static_cast<int>(op.kind), ",", static_cast<int>(op.stage), ",",
                                 op.m, ",", op.n, ",", op.k, ",", op.heads, ",", op.kv_heads, ",",
                                 op.head_begin, ",", op.head_end, ",", op.elements, ",",
                                 op.bytes_per_element, ",", op.flops_per_element, ",", op.bytes,
                                 ",", op.participants, ",", op.tokens, ",", op.sequences, "|");
    for (const auto& q : op.seqs)
      absl::StrAppend(&k, q.new_tokens, ":", q.past_tokens, ":", q.request_id, ";");
    k += "|";
    for (int32_t st : op.kv_head_stack) absl::StrAppend(&k, st, ";");
    return k;
  }
  devices::DeviceDescription Describe() const override { return inner_->Describe(); }
  absl::Status Estimate(absl::Span<const Op> ops, absl::Span<Cost> costs) const override {
    for (const Op& op : ops) asked.push_back(Key(op));
    return inner_->Estimate(ops, costs);
  }
  absl::StatusOr<devices::AttentionResult> Execute(
      const devices::AttentionCall& call) const override {
    return inner_->Execute(call);
  }
  int ExpectSteps() const override { return 8; }
  // Each op told, and the steps after it told with it.
  void Expect(absl::Span<const Op> ops, absl::Span<const int32_t> steps) const override {
    for (size_t i = 0; i < ops.size(); ++i) {
      told.insert(Key(ops[i]));
      const int32_t n = steps.empty() ? 0 : steps[i];
      for (int32_t j = 1; j <= n; ++j) {
        std::vector<devices::AttentionSeq> seqs(ops[i].seqs.begin(), ops[i].seqs.end());
        for (auto& q : seqs) q.past_tokens += j;
        Op later = ops[i];
        later.seqs = seqs;
        told.insert(Key(later));
      }
      if (n > 0) ++with_steps;
    }
  }
  void ExpectLater(absl::Span<const Op> ops) const override {
    for (const Op& op : ops) told_later.insert(Key(op));
  }
  mutable int with_steps = 0;
  mutable std::vector<std::string> asked;
  mutable std::set<std::string> told, told_later;

 private:
  const devices::Device* inner_;
};

// Expect tells the devices exactly the ops Plan later asks for the same
// batches, under every overlap policy; hints change no cost.
TEST_F(HeteroPlannerTest, ExpectTellsTheOpsPlanAsks) {
  const int64_t kv = Gpt3().num_kv_heads;
  std::vector<std::vector<int32_t>> stacks(3);
  for (int r = 0; r < 3; ++r) {
    for (int64_t h = 0; h < kv; ++h) stacks[r].push_back(static_cast<int32_t>((r * 7 + h) % 40));
  }
  // Steps 0..5 of three decoding requests; the second leaves after step 2.
  auto step = [&](int j) {
    Batch b;
    for (int r = 0; r < 3; ++r) {
      if (r == 1 && j > 2) continue;
      b.entries.push_back(BatchEntry{r, 1, 100 * (r + 1) + j, false, true, stacks[r], 10 + r});
    }
    b.decode_tokens = b.emitting = static_cast<int64_t>(b.entries.size());
    return b;
  };
  for (OverlapPolicy policy : {OverlapPolicy::kSerial, OverlapPolicy::kHeadLevel,
                               OverlapPolicy::kHeadLevelFf, OverlapPolicy::kBatchLevel}) {
    const char* name = OverlapPolicyName(policy);
    HintedDevice xpu(gpu_.get()), att(&fake_);
    IterationPlanner hinted(Gpt3(), Config(&xpu, &att, policy));
    IterationPlanner plain(Gpt3(), Config(gpu_.get(), &fake_, policy));
    EXPECT_EQ(hinted.ExpectSteps(), 8);
    EXPECT_EQ(plain.ExpectSteps(), 0);  // in-process devices take no hints
    ASSERT_TRUE(hinted.Plan(step(0)).ok());
    std::vector<Batch> ahead;
    for (int j = 1; j <= 5; ++j) ahead.push_back(step(j));
    hinted.Expect(ahead);
    ASSERT_FALSE(att.told.empty()) << name;
    ASSERT_FALSE(xpu.told.empty()) << name;
    // Steps 1-2 and 3-5 are runs of the same requests: their attention ops
    // are told once, with their further steps.
    EXPECT_GT(att.with_steps, 0) << name;
    xpu.asked.clear();
    att.asked.clear();
    for (int j = 1; j <= 5; ++j) {
      auto got = hinted.Plan(step(j));
      auto want = plain.Plan(step(j));
      ASSERT_TRUE(got.ok() && want.ok()) << name;
      EXPECT_EQ(got->time_s, want->time_s) << name << " step " << j;
      EXPECT_EQ(got->total.compute_energy_pj, want->total.compute_energy_pj) << name;
    }
    ASSERT_FALSE(att.asked.empty()) << name;
    for (const std::string& k : att.asked) EXPECT_TRUE(att.told.count(k)) << name << ": " << k;
    for (const std::string& k : xpu.asked) EXPECT_TRUE(xpu.told.count(k)) << name << ": " << k;
  }
}

// ExpectLater tells the devices the ops Plan asks for a prompt prefilling
// alone (the step an arriving request's hint guesses: the hint knows no
// KV-head stacks, which a prefill's ops do not use), under every overlap
// policy.
TEST_F(HeteroPlannerTest, ExpectLaterTellsTheOpsOfAPromptPrefillingAlone) {
  const int64_t kv = Gpt3().num_kv_heads;
  std::vector<int32_t> stacks;
  for (int64_t h = 0; h < kv; ++h) stacks.push_back(static_cast<int32_t>((h * 3) % 40));
  for (OverlapPolicy policy : {OverlapPolicy::kSerial, OverlapPolicy::kHeadLevel,
                               OverlapPolicy::kHeadLevelFf, OverlapPolicy::kBatchLevel}) {
    const char* name = OverlapPolicyName(policy);
    HintedDevice xpu(gpu_.get()), att(&fake_);
    IterationPlanner hinted(Gpt3(), Config(&xpu, &att, policy));
    Batch hint;
    hint.entries.push_back(BatchEntry{0, 377, 0, true, true, {}, 42, 377 + 120});
    hint.prefill_tokens = 377;
    hint.emitting = 1;
    hinted.ExpectLater(hint);
    EXPECT_TRUE(att.told.empty() && xpu.told.empty()) << name;  // not Expect's
    ASSERT_FALSE(xpu.told_later.empty()) << name;
    Batch step = hint;
    step.entries[0].slot = 5;
    step.entries[0].kv_stacks = stacks;
    ASSERT_TRUE(hinted.Plan(step).ok()) << name;
    ASSERT_FALSE(xpu.asked.empty()) << name;
    for (const std::string& k : att.asked)
      EXPECT_TRUE(att.told_later.count(k)) << name << ": " << k;
    for (const std::string& k : xpu.asked)
      EXPECT_TRUE(xpu.told_later.count(k)) << name << ": " << k;
    // Another prompt's step is another set of ops.
    xpu.asked.clear();
    step.entries[0].new_tokens = step.prefill_tokens = 378;
    ASSERT_TRUE(hinted.Plan(step).ok()) << name;
    EXPECT_FALSE(std::all_of(xpu.asked.begin(), xpu.asked.end(), [&](const std::string& k) {
      return xpu.told_later.count(k) > 0;
    })) << name;
  }
}

// A device that answers with another, says it is remote, and logs what it
// is told to prepare and asked, in order, in a log it shares with another.
class RemoteLoggingDevice : public devices::Device {
 public:
  RemoteLoggingDevice(const devices::Device* inner, std::string name, std::vector<std::string>* log,
                      bool remote = true)
      : inner_(inner), name_(std::move(name)), log_(log), remote_(remote) {}
  devices::DeviceDescription Describe() const override { return inner_->Describe(); }
  absl::Status Estimate(absl::Span<const Op> ops, absl::Span<Cost> costs) const override {
    log_->push_back(absl::StrCat(name_, " estimate ", Keys(ops)));
    return inner_->Estimate(ops, costs);
  }
  absl::StatusOr<devices::AttentionResult> Execute(
      const devices::AttentionCall& call) const override {
    return inner_->Execute(call);
  }
  bool Remote() const override { return remote_; }
  void Prepare(absl::Span<const Op> ops) const override {
    log_->push_back(absl::StrCat(name_, " prepare ", Keys(ops)));
  }

 private:
  static std::string Keys(absl::Span<const Op> ops) {
    std::string k;
    for (const Op& op : ops) k += HintedDevice::Key(op);
    return k;
  }
  const devices::Device* inner_;
  std::string name_;
  std::vector<std::string>* log_;
  bool remote_;
};

// Both devices on agents: whenever the xPU device is asked, the attention
// device was told the ops it is asked next just before, so its round trip
// overlaps the xPU's; with an in-process xPU nothing is prepared. Costs
// are the same either way.
TEST_F(HeteroPlannerTest, TheDeviceIsPreparedBeforeARemoteXpuIsAsked) {
  Batch prefill;
  prefill.entries.push_back(BatchEntry{3, 300, 0, true, true, {}, 3});
  prefill.entries.push_back(BatchEntry{0, 1, 700, false, true, {}, 0});
  prefill.prefill_tokens = 300;
  prefill.decode_tokens = 1;
  prefill.emitting = 2;
  const std::vector<Batch> batches = {Decode(8, 2048), Decode(8, 2049), prefill, Decode(9, 2050)};
  for (OverlapPolicy policy : {OverlapPolicy::kSerial, OverlapPolicy::kHeadLevelFf}) {
    const char* name = OverlapPolicyName(policy);
    for (bool xpu_remote : {true, false}) {
      std::vector<std::string> log;
      RemoteLoggingDevice xpu(gpu_.get(), "xpu", &log, xpu_remote), att(&fake_, "att", &log);
      IterationPlanner planner(Gpt3(), Config(&xpu, &att, policy));
      IterationPlanner plain(Gpt3(), Config(gpu_.get(), &fake_, policy));
      int xpu_asked = 0;
      for (const Batch& b : batches) {
        const size_t from = log.size();
        auto got = planner.Plan(b);
        auto want = plain.Plan(b);
        ASSERT_TRUE(got.ok() && want.ok()) << name;
        EXPECT_EQ(got->time_s, want->time_s) << name;
        EXPECT_EQ(got->total.energy_pj(), want->total.energy_pj()) << name;
        const std::vector<std::string> it(log.begin() + from, log.end());
        const bool asked = std::any_of(it.begin(), it.end(), [](const std::string& e) {
          return absl::StartsWith(e, "xpu estimate");
        });
        xpu_asked += asked ? 1 : 0;
        if (!xpu_remote || !asked) {
          for (const std::string& e : it) EXPECT_FALSE(absl::StrContains(e, "prepare")) << name;
          continue;
        }
        // att prepare X, xpu estimate, att estimate X.
        ASSERT_EQ(it.size(), 3u) << name;
        EXPECT_TRUE(absl::StartsWith(it[0], "att prepare ")) << name;
        EXPECT_TRUE(absl::StartsWith(it[1], "xpu estimate ")) << name;
        EXPECT_EQ(it[2].substr(std::string("att estimate ").size()),
                  it[0].substr(std::string("att prepare ").size()))
            << name;
      }
      // The two decodes of 8 ask the xPU once: 3 of the 4 iterations ask it.
      EXPECT_EQ(xpu_asked, 3) << name;
    }
  }
}

}  // namespace
}  // namespace servesim::scheduler
