#include "devices/pool.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace servesim::devices {

PooledDevice::PooledDevice(std::unique_ptr<Device> unit, int units,
                           double memory_bytes_per_unit)
    : unit_(std::move(unit)), units_(std::max(1, units)),
      memory_bytes_per_unit_(memory_bytes_per_unit) {}

DeviceDescription PooledDevice::Describe() const {
  DeviceDescription d = unit_->Describe();
  d.parameters.insert(d.parameters.begin(), {"units", static_cast<double>(units_)});
  d.parameters.insert(d.parameters.begin() + 1,
                      {"memory_bytes_per_unit", memory_bytes_per_unit_});
  d.memory_bytes = memory_bytes_per_unit_ * units_;
  d.static_power_w *= units_;
  return d;
}

void PooledDevice::Split(absl::Span<const Op> ops, std::vector<Op>* parts,
                         std::vector<int>* owner) const {
  parts->reserve(ops.size() * units_);
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (op.kind != OpKind::kAttention) {
      parts->push_back(op);  // not split: the unit model decides what it accepts
      owner->push_back(static_cast<int>(i));
      continue;
    }
    const int64_t hb = op.head_begin, he = op.head_end < 0 ? op.heads : op.head_end;
    for (int u = 0; u < units_; ++u) {
      const int64_t lo = std::max(hb, op.heads * u / units_);
      const int64_t hi = std::min(he, op.heads * (u + 1) / units_);
      if (lo >= hi) continue;
      Op part = op;
      part.head_begin = lo;
      part.head_end = hi;
      parts->push_back(part);
      owner->push_back(static_cast<int>(i));
    }
  }
}

void PooledDevice::Expect(absl::Span<const Op> ops, absl::Span<const int32_t> steps) const {
  if (unit_->ExpectSteps() <= 0) return;
  std::vector<Op> parts;
  std::vector<int> owner;
  Split(ops, &parts, &owner);
  std::vector<int32_t> part_steps;
  if (steps.size() == ops.size()) {
    for (int o : owner) part_steps.push_back(steps[o]);
  }
  unit_->Expect(parts, part_steps);
}

void PooledDevice::ExpectLater(absl::Span<const Op> ops) const {
  if (unit_->ExpectSteps() <= 0) return;
  std::vector<Op> parts;
  std::vector<int> owner;
  Split(ops, &parts, &owner);
  unit_->ExpectLater(parts);
}

void PooledDevice::Prepare(absl::Span<const Op> ops) const {
  if (!unit_->Remote()) return;
  std::vector<Op> parts;
  std::vector<int> owner;
  Split(ops, &parts, &owner);
  unit_->Prepare(parts);
}

absl::Status PooledDevice::Estimate(absl::Span<const Op> ops, absl::Span<Cost> costs) const {
  if (ops.size() != costs.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("device pool: ", ops.size(), " ops but ", costs.size(), " cost slots"));
  }
  // Every op's share on every unit, in one call to the unit's model.
  std::vector<Op> parts;
  std::vector<int> owner;
  Split(ops, &parts, &owner);
  std::vector<Cost> part_costs(parts.size());
  RETURN_IF_ERROR(unit_->Estimate(parts, absl::MakeSpan(part_costs)));
  for (Cost& c : costs) c = Cost{};
  for (size_t p = 0; p < parts.size(); ++p) {
    Cost& c = costs[owner[p]];
    const double slowest = std::max(c.time_s, part_costs[p].time_s);
    const double cycles = std::max(c.cycles, part_costs[p].cycles);
    c += part_costs[p];
    c.time_s = slowest;  // units run in parallel
    c.cycles = cycles;
  }
  return absl::OkStatus();
}

}  // namespace servesim::devices
