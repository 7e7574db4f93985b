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
  kAllReduce,    // a collective among peers (Op.collective; all-reduce by default)
  // A mixture-of-experts block: router plus the experts' grouped GEMMs
  // (devices/moe_routing.h gives the expected load on this device).
  kMoe,
};

// Which collective an OpKind::kAllReduce op is (devices/collectives.h).
enum class CollectiveOp : uint8_t { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kSendRecv };
inline constexpr int kNumCollectiveOps = 5;

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
  kFinalNorm,    // the norm after the last layer
  kMoe,          // router and routed experts
  kMoeDispatch,  // tokens to the experts' ranks and back (all-gather, reduce-scatter)
  kCount,
};
inline constexpr int kNumStages = static_cast<int>(Stage::kCount);
std::string_view StageName(Stage stage);

// A fresh Op::kv_head_stack_id: nonzero, never returned twice in one process
// (thread-safe).
uint64_t NewStackListId();

// One sequence's part of an attention op: `new_tokens` queries (1 for a
// decode step, the chunk length for prefill) attending causally to
// `past_tokens` cached positions plus the new ones.
struct AttentionSeq {
  int64_t new_tokens = 0;
  int64_t past_tokens = 0;
  // The request the sequence belongs to (the scheduler's id), so stateful
  // devices (SpAtten's cascade pruning, memoised functional kernels) can key
  // per-request state; -1 when unknown.
  int64_t request_id = -1;
  // The request's context length once its output is done (prompt plus
  // output tokens), where the scheduler knows it; 0 when unknown. A hint
  // for spreading work (agents/remote_device): no cost may depend on it.
  int64_t final_tokens = 0;
};

struct Op {
  OpKind kind = OpKind::kGemm;
  Stage stage = Stage::kQkv;
  // kGemm.
  int64_t m = 0, n = 0, k = 0;
  // kAttention: heads handled by this device; the span is borrowed.
  int64_t heads = 0, kv_heads = 0, d_head = 0;
  // Multi-head latent attention (kv_latent > 0; DeepSeek-V3): the cache
  // holds one latent of kv_latent elements and a RoPE key of d_rope per
  // token, shared by all heads; d_head is a head's non-RoPE key width and
  // d_value its value width. A one-token query attends in the latent
  // (absorbed: keys kv_latent + d_rope, values kv_latent wide, one KV head);
  // a longer chunk as `kv_heads` ordinary heads of keys d_head + d_rope and
  // values d_value wide, up-projected from the latents by the planner's
  // GEMMs.
  int64_t kv_latent = 0, d_rope = 0, d_value = 0;
  // Sliding-window attention: each query sees the last `window` positions
  // (itself included) of its sequence; 0: all of them.
  int64_t window = 0;
  absl::Span<const AttentionSeq> seqs;
  // Attention devices that hold whole heads (AttAcc): only the query heads
  // [head_begin, head_end) of every sequence are in this op (a head group of
  // head-level pipelining); head_end < 0 means all heads.
  int64_t head_begin = 0, head_end = -1;
  // Which memory stack holds each (sequence, KV head):
  // kv_head_stack[seq * kv_heads + kv_head]. Empty: the device places heads
  // itself (greedy least-loaded, as at admission).
  absl::Span<const int32_t> kv_head_stack;
  // Optional identity of kv_head_stack's contents, for devices that keep
  // memos by stack list (AttAcc): ops with the same nonzero id carry equal
  // kv_head_stack contents, so a device may recognise a list it has seen
  // without reading it. Callers take ids from NewStackListId() (unique in
  // the process) and keep one while the list stays the same (a decode batch
  // whose requests and placement did not change). 0: unknown; the device
  // compares contents. An id never changes a result, only how fast a memo
  // finds it, and agents receive 0.
  uint64_t kv_head_stack_id = 0;
  // kElementwise: elements touched, bytes moved per element (reads+writes)
  // and FLOPs per element.
  int64_t elements = 0;
  double bytes_per_element = 0;
  double flops_per_element = 0;
  // kAllReduce: the collective, its message (nccl-tests' size: a rank's
  // buffer for all-reduce, all-to-all and send/recv, the whole gathered
  // buffer for all-gather and reduce-scatter) and the group size.
  CollectiveOp collective = CollectiveOp::kAllReduce;
  double bytes = 0;
  int participants = 1;
  // The iteration's tokens and scheduled sequences, for devices that cost an
  // op by them (measured profiles, devices/gpu/profile.h); 0: not given.
  int64_t tokens = 0;
  int64_t sequences = 0;
  // kMoe: m rows of width k (d_model) enter the block; the experts are n
  // wide (expert_d_ff, or its share when experts are split by width).
  // `routed` (token, expert) assignments land on this device's experts,
  // `experts_touched` of them distinct (expectations, so fractional), out
  // of the model's `experts_total` routed experts; each token picks `top_k`;
  // an expert has `expert_matrices` weight matrices (3 gated, 2 not).
  double routed = 0;
  double experts_touched = 0;
  int64_t experts_total = 0;
  int32_t top_k = 0;
  int32_t expert_matrices = 3;
};

// What an op costs on one device. Energies in pJ, sizes in bytes.
struct Cost {
  double time_s = 0;
  double flops = 0;
  double dram_bytes = 0;   // device-memory traffic
  double link_bytes = 0;   // bytes this device sent over links
  // Of those, the bytes it sent out of its node over its NIC (collectives
  // among more xPUs than a node holds); the engine carries them over the
  // platform's NIC links (docs/disaggregation.md, "Collectives on the
  // fabric").
  double internode_bytes = 0;
  double compute_energy_pj = 0;
  double dram_energy_pj = 0;
  double link_energy_pj = 0;
  // Processing-in-memory devices: bytes moved at each level of the stack
  // (device-memory bytes above are the cell reads), the device's own cycles,
  // and the attention stages' busy time (score GEMV, softmax, context GEMV).
  double bg_bus_bytes = 0;    // over bank-group buses to the GBUS
  double tsv_bytes = 0;       // over TSVs to the buffer die
  double external_bytes = 0;  // over the stack's PHY / the device interface
  double cycles = 0;
  double score_s = 0, softmax_s = 0, context_s = 0;

  double energy_pj() const {
    return compute_energy_pj + dram_energy_pj + link_energy_pj;
  }
  Cost& operator+=(const Cost& o) {
    time_s += o.time_s;
    flops += o.flops;
    dram_bytes += o.dram_bytes;
    link_bytes += o.link_bytes;
    internode_bytes += o.internode_bytes;
    compute_energy_pj += o.compute_energy_pj;
    dram_energy_pj += o.dram_energy_pj;
    link_energy_pj += o.link_energy_pj;
    bg_bus_bytes += o.bg_bus_bytes;
    tsv_bytes += o.tsv_bytes;
    external_bytes += o.external_bytes;
    cycles += o.cycles;
    score_s += o.score_s;
    softmax_s += o.softmax_s;
    context_s += o.context_s;
    return *this;
  }
  Cost Scaled(double f) const {
    Cost c;
    c.time_s = time_s * f;
    c.flops = flops * f;
    c.dram_bytes = dram_bytes * f;
    c.link_bytes = link_bytes * f;
    c.internode_bytes = internode_bytes * f;
    c.compute_energy_pj = compute_energy_pj * f;
    c.dram_energy_pj = dram_energy_pj * f;
    c.link_energy_pj = link_energy_pj * f;
    c.bg_bus_bytes = bg_bus_bytes * f;
    c.tsv_bytes = tsv_bytes * f;
    c.external_bytes = external_bytes * f;
    c.cycles = cycles * f;
    c.score_s = score_s * f;
    c.softmax_s = softmax_s * f;
    c.context_s = context_s * f;
    return c;
  }
};

using StageCosts = std::array<Cost, kNumStages>;

}  // namespace servesim::devices

#endif  // SERVESIM_DEVICES_OPS_H_
