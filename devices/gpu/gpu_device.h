// The GPU (xPU) baseline device.
//
// Cycle model: a roofline per kernel with utilisation caps (AttAcc's own
// simulator uses the same caps, 0.8 of peak FLOP/s and 0.85 of peak memory
// bandwidth; XpuSpec.roofline may give an op class its own caps, as
// `servesim calibrate` fits them to measured kernels):
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
//    as one fused kernel (one overhead). With a sliding window W (Op.window)
//    a query sees its last W positions: pairs sum min(past + i + 1, W), and
//    a block reads from W - 1 rows before its first query. Multi-head
//    latent attention: MlaAttentionCost (docs/models.md).
//  - Elementwise: elements * bytes_per_element bytes, the op's FLOPs.
//  - All-reduce among p peers (ring): 2(p-1) steps, each one link latency
//    plus (bytes / p) / link_bw; each peer sends 2(p-1)/p * bytes. Among
//    more peers than a node's xpus_per_node = C: C ring channels, one per
//    NIC; a step lasts max(net latency + (bytes/p)/C / nic_bw, link latency
//    + (bytes/p)(C-1)/C / link_bw) (docs/models.md, "Across nodes").
//  - MoE block (m rows, routed assignments a over x touched experts of width
//    n, E experts): router 2 m k E FLOPs; experts a (2 k n mats + 6 n)
//    FLOPs; bytes: router weights, the touched experts' weights x mats k n,
//    activations 2 m k + a (2 mats n + k). Time: the roofline with each
//    expert's rows padded to 16 (the grouped GEMM's tile) plus four kernel
//    overheads (MoeCost).
// Energy: FLOPs * flop_energy (int8 ops for DTYPE_INT8), device-memory bytes
// * dram_energy, link bytes * link energy (figures in devices/presets.cc).
// Functional kernel: exact attention (devices/reference_attention.h).
//
// With a profile bundle (GpuDeviceSpec.profile; devices/gpu/profile.h) the
// times come from measured latencies where the bundle covers the op, the way
// vLLM runs it (LLMServingSim's trace generator maps them the same way):
//  - QKV GEMM: qkv_proj + rotary_emb (+ qk_norm when measured); projection:
//    o_proj; FF1: gate_up_proj; activation: act_fn; FF2: down_proj; each
//    norm: layernorm; the final norm: final_layernorm; embedding: embedding;
//    all by the iteration's tokens (Op.tokens, or m for GEMMs).
//  - LM head: lm_head + sampler by the iteration's scheduled sequences (vLLM
//    computes logits for every scheduled request, partial prefills too).
//  - Residual adds: no time (vLLM fuses them into the next RMSNorm).
//  - Attention: the bundle's table (profile.h), for the op's sequences.
//  - All-reduce: the link model above (the bundle measures one rank).
//  - MoE block: moe.csv at (assignments / top-k tokens, touched experts);
//    experts narrower than the bundle's (split by width) scaled by the
//    roofline's ratio of the two widths.
// Past the measured grid, a time is the last measured point's scaled by the
// roofline's ratio of the two shapes (anchored extrapolation); a GEMM of
// another shape than the model's (a head-group tile) likewise. FLOPs, bytes
// and energy stay the roofline's. An op the bundle has no layer for keeps
// the roofline's time. GpuProfile::counts() says how often each happened.
#ifndef SERVESIM_DEVICES_GPU_GPU_DEVICE_H_
#define SERVESIM_DEVICES_GPU_GPU_DEVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "devices/collectives.h"
#include "devices/device.h"
#include "devices/gpu/profile.h"
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
  // MoE block (OpKind::kMoe): the grouped GEMM's row tile and the block's
  // kernels (router, top-k and sort, two grouped GEMMs).
  static constexpr double kMoeRowTile = 16;
  static constexpr double kMoeKernels = 4;

 private:
  explicit GpuDevice(const servesim::v1::GpuDeviceSpec& spec);
  // Op classes with their own roofline caps (XpuSpec.roofline).
  enum OpClass { kOther, kGemmClass, kAttentionClass, kNormClass, kActivationClass,
                 kEmbeddingClass, kNumOpClasses };
  static OpClass ClassOf(const Op& op);
  Cost Roofline(double flops, double bytes, OpClass cls) const;
  // The roofline's cost of `op` (what Estimate charges without a profile).
  Cost RooflineCost(const Op& op) const;
  // The roofline time of a GEMM [m x k] x [k x n], and of one attention
  // batch as the profile sees it (profile.h).
  double GemmTime(double m, double n, double k) const;
  Cost MoeCost(const Op& op) const;
  double AttentionTime(const Op& op, const AttentionShapeQuery& q) const;
  // The measured time of `op` (roofline cost `c`), or c.time_s where the
  // bundle does not cover it.
  double ProfiledTime(const Op& op, const Cost& c) const;

  // Collectives (OpKind::kAllReduce, gpu_collectives.cc): the measured
  // tables of spec.collectives / internode_collectives where they answer,
  // vLLM's custom all-reduce where vLLM takes it, else the ring model.
  absl::Status InitCollectives();
  Cost CollectiveCost(const Op& op) const;
  Cost RingCost(const Op& op) const;
  bool TakesCustomAllReduce(double bytes, int participants) const;
  double CustomAllReduceTime(double bytes, int participants) const;

  // Multi-head latent attention (Op.kv_latent > 0).
  Cost MlaAttentionCost(const Op& op) const;
  // Adds `op`'s on-die traffic energy (XpuSpec.on_die) to `c`, and with
  // on_die.occupancy_time stretches its time by the SMs its blocks leave
  // idle. Only called with on_die set.
  void AddOnDie(const Op& op, Cost* c) const;

  servesim::v1::GpuDeviceSpec spec_;
  struct Caps {
    double flops_per_s;  // effective: peak * compute_utilization
    double bytes_per_s;  // effective: bw * memory_utilization
    double overhead_s;   // per kernel
    double energy_pj;    // per FLOP (16-bit) or OP (8-bit)
  };
  Caps caps_[kNumOpClasses];
  // Element bytes of weights, of activations and of the KV cache; the LM
  // head's weights (16-bit in FP8 checkpoints).
  double w_bytes_, a_bytes_, kv_bytes_, lm_head_bytes_;
  double expert_w_bytes_;                      // routed experts' weights (MXFP4: 0.53125)
  std::shared_ptr<const GpuProfile> profile_;  // null: the roofline only
  CollectiveTable intra_, inter_;              // no curves: the ring model
  bool custom_all_reduce_ = false, full_nvlink_ = false;
  double custom_bw_[4] = {};  // the custom all-reduce's bandwidth among 2, 4, 6, 8 GPUs
};

}  // namespace servesim::devices

#endif  // SERVESIM_DEVICES_GPU_GPU_DEVICE_H_
