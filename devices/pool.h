// A pool of identical attention accelerators serving one replica: the query
// heads of every attention op are split evenly among `units` instances (unit
// u holds heads [H*u/U, H*(u+1)/U) and their KV), which run in parallel. The
// op takes as long as its slowest unit; bytes, FLOPs and energy add up.
// Token-pruning accelerators (ToPick, SpAtten) are single chips with one
// HBM2 interface each; a replica needs several of them beside its xPUs.
#ifndef SERVESIM_DEVICES_POOL_H_
#define SERVESIM_DEVICES_POOL_H_

#include <memory>

#include "devices/device.h"

namespace servesim::devices {

class PooledDevice : public Device {
 public:
  // `unit` is one accelerator; `memory_bytes_per_unit` its memory.
  PooledDevice(std::unique_ptr<Device> unit, int units, double memory_bytes_per_unit);

  DeviceDescription Describe() const override;
  absl::Status Estimate(absl::Span<const Op> ops, absl::Span<Cost> costs) const override;
  absl::StatusOr<AttentionResult> Execute(const AttentionCall& call) const override {
    return unit_->Execute(call);
  }
  // The units share one measurement per step (the fractions are per request
  // and L, over all heads), so these go to the unit model as they are.
  absl::StatusOr<std::vector<StepMeasurement>> Measure(
      absl::Span<const StepKey> steps) const override {
    return unit_->Measure(steps);
  }
  absl::Status Absorb(absl::Span<const StepMeasurement> measured) const override {
    return unit_->Absorb(measured);
  }
  absl::StatusOr<std::vector<StepMeasurement>> MeasureLayers(absl::Span<const StepKey> steps,
                                                             int part, int parts) const override {
    return unit_->MeasureLayers(steps, part, parts);
  }
  int ExpectSteps() const override { return unit_->ExpectSteps(); }
  // The ops' shares, as Estimate would ask the unit model.
  void Expect(absl::Span<const Op> ops, absl::Span<const int32_t> steps) const override;
  void ExpectLater(absl::Span<const Op> ops) const override;
  bool Remote() const override { return unit_->Remote(); }
  // The ops' shares, as Estimate will ask the unit model.
  void Prepare(absl::Span<const Op> ops) const override;
  int units() const { return units_; }

 private:
  // Every op's share on every unit (attention ops split by heads, the rest
  // whole) into `parts`; owner[p] is the op parts[p] comes from.
  void Split(absl::Span<const Op> ops, std::vector<Op>* parts, std::vector<int>* owner) const;

  std::unique_ptr<Device> unit_;
  int units_;
  double memory_bytes_per_unit_;
};

}  // namespace servesim::devices

#endif  // SERVESIM_DEVICES_POOL_H_
