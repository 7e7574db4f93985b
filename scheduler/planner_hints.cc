// Hints to devices that answer from far away (devices::Device::
// ExpectSteps): the ops the attention-device path would ask for batches a
// later step may run, told ahead so a remote device can cost them while the
// simulation goes on. Lowers through the same ShapeWithDevice,
// XpuOpsWithDevice and DeviceOpsOf as PlanWithDevice, into lists of its own
// (PlanWithDevice's scratch and memos are left alone). Hints change no cost.
#include <algorithm>
#include <deque>

#include "scheduler/planner.h"

namespace servesim::scheduler {

using devices::Op;
using devices::OpKind;

int IterationPlanner::ExpectSteps() {
  if (expect_steps_ < 0) {
    expect_steps_ = 0;
    // Projections cover the attention-device path (the other one reuses
    // its ops by token counts, which the memo of a remote xPU catches).
    if (config_.attention != nullptr) {
      expect_steps_ = std::max(config_.attention->ExpectSteps(),
                               device_ != nullptr ? device_->ExpectSteps() : 0);
    }
  }
  return expect_steps_;
}

void IterationPlanner::Expect(absl::Span<const Batch> batches) { Tell(batches, /*later=*/false); }

void IterationPlanner::Tell(absl::Span<const Batch> batches, bool later) {
  if (batches.empty() || ExpectSteps() <= 0) return;
  const bool to_dev = config_.attention->ExpectSteps() > 0;
  const bool to_xpu = device_ != nullptr && device_->ExpectSteps() > 0;
  // A run of batches of the same requests, decoding, differs step to step
  // only in every context being one longer: its first batch's ops stand for
  // it, the attention ops with the run's further steps, the others (the
  // same token counts throughout) alone.
  auto same_requests = [](const Batch& a, const Batch& b) {
    return a.entries.size() == b.entries.size() &&
           std::equal(a.entries.begin(), a.entries.end(), b.entries.begin(),
                      [](const BatchEntry& x, const BatchEntry& y) {
                        return x.request_id == y.request_id && !x.prefill && !y.prefill &&
                               y.past_tokens == x.past_tokens + 1;
                      });
  };
  std::deque<DeviceScratch> lists;  // each run's lists, until the devices copied them
  std::vector<Op> dev, xpu;
  std::vector<int32_t> dev_steps;
  int att_at = -1, att_b_at = -1, ff_at = -1;
  for (size_t r = 0; r < batches.size();) {
    size_t e = r + 1;
    while (e < batches.size() && same_requests(batches[e - 1], batches[e])) ++e;
    const Batch& b = batches[r];
    const int32_t further = static_cast<int32_t>(e - r - 1);
    r = e;
    if (b.empty()) continue;
    DeviceScratch& s = lists.emplace_back();
    const DeviceShape sh = ShapeWithDevice(b, &s);
    if (to_xpu) XpuOpsWithDevice(sh, b, s, &xpu);
    if (!to_dev) continue;
    const size_t from = dev.size();
    DeviceOpsOf(sh, s, &dev, &att_at, &att_b_at, &ff_at);
    for (size_t i = from; i < dev.size(); ++i) {
      dev_steps.push_back(dev[i].kind == OpKind::kAttention ? further : 0);
    }
  }
  if (later) {  // one batch: no further steps
    if (!dev.empty()) config_.attention->ExpectLater(dev);
    if (!xpu.empty()) device_->ExpectLater(xpu);
    return;
  }
  if (!dev.empty()) config_.attention->Expect(dev, dev_steps);
  if (!xpu.empty()) device_->Expect(xpu, {});
}

void IterationPlanner::ExpectLater(const Batch& batch) {
  Tell(absl::MakeConstSpan(&batch, 1), /*later=*/true);
}

}  // namespace servesim::scheduler
