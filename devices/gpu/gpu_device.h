// The GPU (xPU) baseline device.
//
// Cycle model: a roofline per kernel with utilisation caps (AttAcc's own
// simulator uses the same caps, 0.8 of peak FLOP/s and 0.85 of peak memory
// bandwidth):
//   time = max(flops / (peak_flops * compute_util),
//              bytes / (memory_bw * memory_util)) + kernel_overhead
//  - GEMM [m x k] x [k x n]: 2mnk FLOPs; bytes (mk + kn + mn) * elem, i.e.
//    each operand moved once (ideal tiling; weights dominate in decode).
//  - Attention, per sequence with its OWN KV length (never a batch
//    average): score and context 2 * heads * d_head FLOPs per attended
//    (query, key) pair, softmax 5 FLOPs per pair; bytes are Q in, O out, the
//    new K/V rows written, and the cached K/V read once per 128-row query
//    block (FlashAttention-2 tiling; one block for a decode step), causally:
//    block j reads the past plus its own prefix. All sequences of the op run
//    as one fused kernel (one overhead).
//  - Elementwise: elements * bytes_per_element bytes, the op's FLOPs.
//  - All-reduce among p peers (ring): 2(p-1) steps, each one link latency
//    plus (bytes / p) / link_bw; each peer sends 2(p-1)/p * bytes.
// Energy: FLOPs * flop_energy (int8 ops for DTYPE_INT8), device-memory bytes
// * dram_energy, link bytes * link energy (figures in devices/presets.cc).
// Functional kernel: exact attention (devices/reference_attention.h).
#ifndef SERVESIM_DEVICES_GPU_GPU_DEVICE_H_
#define SERVESIM_DEVICES_GPU_GPU_DEVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "devices/device.h"
#include "servesim/v1/hardware.pb.h"

namespace servesim::devices {

class GpuDevice : public Device {
 public:
  // The spec's xpu and interconnect must be resolved (every field set, as
  // the scenario normaliser leaves them); INVALID_ARGUMENT names a missing
  // or out-of-range field.
  static absl::StatusOr<std::unique_ptr<Device>> Create(
      const servesim::v1::DeviceSpec& spec);

  DeviceDescription Describe() const override;
  absl::Status Estimate(absl::Span<const Op> ops,
                        absl::Span<Cost> costs) const override;
  absl::StatusOr<AttentionResult> Execute(
      const AttentionCall& call) const override;

  // Query-block height of the prefill attention tiling.
  static constexpr int64_t kQueryBlock = 128;

 private:
  explicit GpuDevice(const servesim::v1::GpuDeviceSpec& spec);
  Cost Roofline(double flops, double bytes) const;

  servesim::v1::GpuDeviceSpec spec_;
  double flops_per_s_;     // effective: peak * compute_utilization
  double bytes_per_s_;     // effective: bw * memory_utilization
  double op_energy_pj_;    // per FLOP (fp16) or OP (int8)
  double elem_bytes_;
};

}  // namespace servesim::devices

#endif  // SERVESIM_DEVICES_GPU_GPU_DEVICE_H_
