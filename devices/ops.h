// The operations a device is asked to cost, and what a cost is.
//
// The iteration planner (scheduler/planner.h) lowers one batched iteration to
// a list of Ops for ONE xPU of a tensor-parallel group (shapes are already
// divided by the TP degree) and ONE decoder layer; it multiplies the layer
// cost by the number of layers itself. Keeping ops per-layer keeps Estimate
// calls small: an iteration is tens of ops plus one attention op that lists
// every sequence with its own KV length.
#ifndef SERVESIM_DEVICES_OPS_H_
#define SERVESIM_DEVICES_OPS_H_

#include <array>
#include <cstdint>
#include <string_view>

#include "absl/types/span.h"

namespace servesim::devices {

enum class OpKind : uint8_t {
  kGemm,         // activations [m x k] times a weight matrix [k x n]
  kAttention,    // softmax(Q K^T / sqrt(dh)) V per sequence and head
  kElementwise,  // layernorm, activation, residual add, embedding gather
  kAllReduce,    // ring all-reduce among tensor-parallel peers
};

// Where an op sits in the decoder; the unit of the per-stage breakdown.
enum class Stage : uint8_t {
  kEmbedding,
  kNorm,
  kQkv,
  kAttention,
  kProjection,
  kFf1,
  kActivation,
  kFf2,
  kResidual,
  kAllReduce,
  kLmHead,
  kCount,
};
inline constexpr int kNumStages = static_cast<int>(Stage::kCount);
std::string_view StageName(Stage stage);

// One sequence's part of an attention op: `new_tokens` queries (1 for a
// decode step, the chunk length for prefill) attending causally to
// `past_tokens` cached positions plus the new ones.
struct AttentionSeq {
  int64_t new_tokens = 0;
  int64_t past_tokens = 0;
};

struct Op {
  OpKind kind = OpKind::kGemm;
  Stage stage = Stage::kQkv;
  // kGemm.
  int64_t m = 0, n = 0, k = 0;
  // kAttention: heads handled by this xPU; the span is borrowed.
  int64_t heads = 0, kv_heads = 0, d_head = 0;
  absl::Span<const AttentionSeq> seqs;
  // kElementwise: elements touched, bytes moved per element (reads+writes)
  // and FLOPs per element.
  int64_t elements = 0;
  double bytes_per_element = 0;
  double flops_per_element = 0;
  // kAllReduce: payload each participant contributes, and the group size.
  double bytes = 0;
  int participants = 1;
};

// What an op costs on one device. Energies in pJ, sizes in bytes.
struct Cost {
  double time_s = 0;
  double flops = 0;
  double dram_bytes = 0;   // device-memory traffic
  double link_bytes = 0;   // bytes this device sent over links
  double compute_energy_pj = 0;
  double dram_energy_pj = 0;
  double link_energy_pj = 0;

  double energy_pj() const {
    return compute_energy_pj + dram_energy_pj + link_energy_pj;
  }
  Cost& operator+=(const Cost& o) {
    time_s += o.time_s;
    flops += o.flops;
    dram_bytes += o.dram_bytes;
    link_bytes += o.link_bytes;
    compute_energy_pj += o.compute_energy_pj;
    dram_energy_pj += o.dram_energy_pj;
    link_energy_pj += o.link_energy_pj;
    return *this;
  }
  Cost Scaled(double f) const {
    return Cost{time_s * f,         flops * f,          dram_bytes * f,
                link_bytes * f,     compute_energy_pj * f, dram_energy_pj * f,
                link_energy_pj * f};
  }
};

using StageCosts = std::array<Cost, kNumStages>;

}  // namespace servesim::devices

#endif  // SERVESIM_DEVICES_OPS_H_
