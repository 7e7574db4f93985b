// What the heterogeneous-system tests share (tests/scheduler/hetero_test.cc,
// planner_hints_test.cc): an attention device with simple, known costs, an
// A100 xPU device, GPT-3 175B, a decode batch, an AttAcc-like planner
// configuration, and the planner fixture built from them.
#ifndef SERVESIM_TESTS_SCHEDULER_HETERO_TEST_UTIL_H_
#define SERVESIM_TESTS_SCHEDULER_HETERO_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "devices/device.h"
#include "devices/model.h"
#include "devices/presets.h"
#include "devices/registry.h"
#include "gtest/gtest.h"
#include "scheduler/batching.h"
#include "scheduler/planner.h"

namespace servesim::scheduler::test {

using devices::Cost;
using devices::Op;
using devices::OpKind;

// An attention device with simple, known costs: attention takes 1 ns per
// (query head, cached position) spread evenly over its stacks; a GEMV pass
// over a [k x n] slice reads its k*n*2 bytes at 241.2 TB/s (9 x a DGX) per
// input vector.
class FakeAttentionDevice : public devices::Device {
 public:
  explicit FakeAttentionDevice(int stacks) : stacks_(stacks) {}
  devices::DeviceDescription Describe() const override {
    devices::DeviceDescription d;
    d.kind = "fake";
    return d;
  }
  absl::Status Estimate(absl::Span<const Op> ops, absl::Span<Cost> costs) const override {
    for (size_t i = 0; i < ops.size(); ++i) {
      const Op& op = ops[i];
      Cost c;
      if (op.kind == OpKind::kAttention) {
        const int64_t end = op.head_end < 0 ? op.heads : op.head_end;
        double positions = 0;
        for (const auto& s : op.seqs) positions += double(s.past_tokens + 1);
        c.time_s = positions * double(end - op.head_begin) * 1e-9 / stacks_;
        attention_calls.push_back(static_cast<int64_t>(op.seqs.size()));
      } else if (op.kind == OpKind::kGemm) {
        c.time_s = double(op.m) * double(op.k) * double(op.n) * 2 / (9 * 8 * 3.35e12);
      } else {
        return absl::InvalidArgumentError("fake device: attention and GEMV only");
      }
      c.dram_energy_pj = c.time_s * 1e12;
      costs[i] = c;
    }
    return absl::OkStatus();
  }
  absl::StatusOr<devices::AttentionResult> Execute(const devices::AttentionCall&) const override {
    return absl::FailedPreconditionError("the fake attention device models costs only");
  }
  mutable std::vector<int64_t> attention_calls;

 private:
  int stacks_;
};

inline std::unique_ptr<devices::Device> Gpu() {
  servesim::v1::DeviceSpec spec;
  *spec.mutable_gpu()->mutable_xpu() = *devices::XpuPreset("a100-hbm3");
  *spec.mutable_gpu()->mutable_interconnect() = *devices::LinkPreset("nvlink3");
  spec.mutable_gpu()->set_dtype(servesim::v1::DTYPE_FP16);
  return *devices::CreateDevice(spec);
}

inline devices::ModelDims Gpt3() {
  return devices::ModelDimsFromSpec(*devices::ModelPreset("gpt3-175b"));
}

inline Batch Decode(int64_t b, int64_t past) {
  Batch batch;
  batch.entries.assign(b, BatchEntry{0, 1, past, false, true, {}});
  batch.decode_tokens = batch.emitting = b;
  return batch;
}

inline PlannerConfig Config(const devices::Device* xpu, const devices::Device* att,
                            OverlapPolicy policy) {
  PlannerConfig c;
  c.tensor_parallel = 8;
  c.xpu = xpu;
  c.attention = att;
  c.overlap = policy;
  c.head_groups = 8;
  c.link_bytes_per_s = 300e9;
  c.link_latency_s = 3e-6;
  c.xpu_bandwidth = 8 * 3.35e12;
  c.device_bandwidth = 9 * 8 * 3.35e12;  // AttAcc: 9x the DGX's aggregate
  c.ff_max_batch = 256;
  return c;
}

class HeteroPlannerTest : public ::testing::Test {
 protected:
  absl::StatusOr<IterationCost> Plan(OverlapPolicy policy, const Batch& batch) {
    IterationPlanner planner(Gpt3(), Config(gpu_.get(), &fake_, policy));
    return planner.Plan(batch);
  }
  std::unique_ptr<devices::Device> gpu_ = Gpu();
  FakeAttentionDevice fake_{40};
};

}  // namespace servesim::scheduler::test

#endif  // SERVESIM_TESTS_SCHEDULER_HETERO_TEST_UTIL_H_
