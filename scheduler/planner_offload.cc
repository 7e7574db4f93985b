// The attention-device path's lowering: how a batch splits between the
// xPUs and the attention device (decode attention to the device, prefill
// attention and every GEMM to the xPUs; the halves under batch-level
// pipelining; the FF share under kHeadLevelFf), and the ops each is asked
// to cost. The ops borrow the sequence and stack lists of a DeviceScratch,
// which the caller owns and keeps alive until the devices have answered.
//
// Lowering only: PlanWithDevice (planner_overlap.cc) asks the devices for
// these ops' costs and times the overlap, and Tell (planner_hints.cc) tells
// remote devices the same ops ahead. Token counts are per iteration, sizes
// per xPU of the TP group unless a name says otherwise.
#include <algorithm>
#include <cmath>

#include "scheduler/planner.h"

namespace servesim::scheduler {

using devices::Op;
using devices::OpKind;
using devices::Stage;

double IterationPlanner::FfDeviceFraction(int64_t tokens) const {
  if (!(config_.device_bandwidth > 0) || !std::isfinite(config_.device_bandwidth)) return 0;
  auto f = [&](double bs) {
    return config_.device_bandwidth / (config_.xpu_bandwidth * bs + config_.device_bandwidth);
  };
  const double bs = static_cast<double>(std::max<int64_t>(tokens, 1));
  const double hi = f(static_cast<double>(std::max<int64_t>(config_.ff_min_batch, 1)));
  const double lo = f(static_cast<double>(std::max<int64_t>(config_.ff_max_batch, 1)));
  return std::clamp(f(bs), lo, hi);
}

IterationPlanner::DeviceShape IterationPlanner::ShapeWithDevice(const Batch& batch,
                                                                DeviceScratch* s) const {
  const int64_t H = model_.num_heads, KV = model_.num_kv_heads;
  DeviceShape sh;
  sh.t = batch.prefill_tokens + batch.decode_tokens;
  // Decode sequences go to the device, prefill ones stay on the xPUs.
  s->dec_seqs.clear();
  s->pre_seqs.clear();
  // The stack list stays as it was, with its id, when the batch's placement
  // generation and decode slots are the last list's (the same requests in
  // the same order, none placed or released since): most decode iterations.
  bool same_stacks = batch.stacks_generation != 0 && batch.stacks_generation == s->dec_generation;
  size_t n_dec = 0;
  for (const BatchEntry& e : batch.entries) {
    if (e.prefill) {
      s->pre_seqs.push_back({e.new_tokens, e.past_tokens, e.request_id, e.final_tokens});
      sh.prefill_tokens += e.new_tokens;
    } else {
      s->dec_seqs.push_back({e.new_tokens, e.past_tokens, e.request_id, e.final_tokens});
      same_stacks = same_stacks && n_dec < s->dec_slots.size() && s->dec_slots[n_dec] == e.slot;
      ++n_dec;
    }
  }
  same_stacks = same_stacks && n_dec == s->dec_slots.size();
  if (!same_stacks) {
    s->dec_stacks.clear();
    s->dec_slots.clear();
    for (const BatchEntry& e : batch.entries) {
      if (e.prefill) continue;
      s->dec_stacks.insert(s->dec_stacks.end(), e.kv_stacks.begin(), e.kv_stacks.end());
      s->dec_slots.push_back(e.slot);
    }
    if (!s->dec_stacks.empty() && s->dec_stacks.size() != s->dec_seqs.size() * KV) {
      s->dec_stacks.clear();
    }
    s->dec_generation = batch.stacks_generation;
    s->dec_stacks_id =
        batch.stacks_generation != 0 && !s->dec_stacks.empty() ? devices::NewStackListId() : 0;
  }
  sh.b_dec = static_cast<int64_t>(s->dec_seqs.size());
  sh.policy = config_.overlap;
  if (sh.policy == OverlapPolicy::kBatchLevel && (!s->pre_seqs.empty() || sh.b_dec < 2)) {
    sh.policy = OverlapPolicy::kSerial;  // two halves need a pure decode batch
  }
  const bool head_level =
      sh.policy == OverlapPolicy::kHeadLevel || sh.policy == OverlapPolicy::kHeadLevelFf;
  // The AttAcc simulator's rule times the attention of all heads at once.
  sh.groups = head_level && config_.overlap_rule == OverlapRule::kListSchedule
                  ? static_cast<int>(std::clamp<int64_t>(config_.head_groups, 1, H))
                  : 1;
  sh.f = sh.policy == OverlapPolicy::kHeadLevelFf ? FfDeviceFraction(sh.t) : 0.0;
  sh.half = (sh.b_dec + 1) / 2;  // batch-level halves A and B
  s->st_a.clear();
  s->st_b.clear();
  if (sh.policy == OverlapPolicy::kBatchLevel) {
    s->seqs_a.assign(s->dec_seqs.begin(), s->dec_seqs.begin() + sh.half);
    s->seqs_b.assign(s->dec_seqs.begin() + sh.half, s->dec_seqs.end());
    if (!s->dec_stacks.empty()) {
      s->st_a.assign(s->dec_stacks.begin(), s->dec_stacks.begin() + sh.half * KV);
      s->st_b.assign(s->dec_stacks.begin() + sh.half * KV, s->dec_stacks.end());
    }
  }
  return sh;
}

void IterationPlanner::XpuOpsWithDevice(const DeviceShape& sh, const Batch& batch,
                                        const DeviceScratch& s, std::vector<Op>* out) const {
  const size_t at = out->size();
  if (sh.policy != OverlapPolicy::kBatchLevel) {
    XpuLayerOps(sh.t, s.pre_seqs, 1.0 - sh.f, sh.groups, out);
  } else {
    XpuLayerOps(sh.half, {}, 1.0, 1, out);
    XpuLayerOps(sh.b_dec - sh.half, {}, 1.0, 1, out);
  }
  TailOps(sh.t, batch.emitting, out);
  SetCounts(sh.t, static_cast<int64_t>(batch.entries.size()), out, at);
}

void IterationPlanner::DeviceOpsOf(const DeviceShape& sh, const DeviceScratch& s,
                                   std::vector<Op>* out, int* att_at, int* att_b_at,
                                   int* ff_at) const {
  const int64_t H = model_.num_heads, KV = model_.num_kv_heads, dh = model_.d_head;
  // Attention of `seqs` as g head groups; returns where its ops start in
  // `out` (-1: no sequences, zero cost, no call).
  auto device_attention = [&](absl::Span<const devices::AttentionSeq> seqs,
                              absl::Span<const int32_t> stacks, int g) -> int {
    if (seqs.empty()) return -1;
    const int at = static_cast<int>(out->size());
    for (int j = 0; j < g; ++j) {
      Op op;
      op.kind = OpKind::kAttention;
      op.stage = Stage::kAttention;
      op.heads = H, op.kv_heads = KV, op.d_head = dh;
      op.seqs = seqs;
      op.kv_head_stack = stacks;
      op.head_begin = H * j / g;
      op.head_end = H * (j + 1) / g;
      out->push_back(op);
    }
    return at;
  };
  *att_at = *att_b_at = *ff_at = -1;
  if (sh.policy != OverlapPolicy::kBatchLevel) {
    // The ops' kv_head_stack_id is set by PlanWithDevice, also on reused ops.
    *att_at = device_attention(s.dec_seqs, s.dec_stacks, sh.groups);
    if (sh.f > 0) {
      *ff_at = static_cast<int>(out->size());
      Op ops[2];
      ops[0].kind = ops[1].kind = OpKind::kGemm;
      ops[0].stage = Stage::kFf1;
      ops[0].m = sh.t;
      ops[0].n = static_cast<int64_t>(
          std::llround(static_cast<double>(model_.FfInputMatrices() * model_.d_ff) * sh.f));
      ops[0].k = model_.d_model;
      ops[1].stage = Stage::kFf2;
      ops[1].m = sh.t;
      ops[1].n = model_.d_model;
      ops[1].k = static_cast<int64_t>(std::llround(static_cast<double>(model_.d_ff) * sh.f));
      out->push_back(ops[0]);
      out->push_back(ops[1]);
    }
  } else {
    *att_at = device_attention(s.seqs_a, s.st_a, 1);
    *att_b_at = device_attention(s.seqs_b, s.st_b, 1);
  }
}

void IterationPlanner::XpuLayerOps(int64_t tokens, absl::Span<const devices::AttentionSeq> xpu_seqs,
                                   double ff_xpu_share, int groups, std::vector<Op>* out) const {
  const int64_t t = tokens, d = model_.d_model;
  const double elem = model_.act_bytes_per_element;
  const int64_t qkv_n = (heads_ + 2 * kv_heads_) * model_.d_head;
  const int64_t proj_k = heads_ * model_.d_head;
  const int64_t ff_n = static_cast<int64_t>(
      std::llround(static_cast<double>(model_.FfInputMatrices() * ff_) * ff_xpu_share));
  const int64_t ff_k = static_cast<int64_t>(std::llround(static_cast<double>(ff_) * ff_xpu_share));
  const size_t at = out->size();
  out->resize(at + kXpuLayerOps);
  Op* ops = out->data() + at;
  auto set_gemm = [&](Op& op, Stage st, int64_t m, int64_t n, int64_t k) {
    op.kind = OpKind::kGemm;
    op.stage = st;
    op.m = m, op.n = n, op.k = k;
  };
  auto set_elem = [&](Op& op, Stage st, int64_t n, double bytes, double flops) {
    op.kind = OpKind::kElementwise;
    op.stage = st;
    op.elements = n;
    op.bytes_per_element = bytes;
    op.flops_per_element = flops;
  };
  set_elem(ops[0], Stage::kNorm, t * d, 2 * elem, 5);
  set_gemm(ops[1], Stage::kQkv, t, qkv_n, d);
  set_gemm(ops[2], Stage::kQkv, t, (qkv_n + groups - 1) / groups, d);
  ops[3].kind = OpKind::kAttention;
  ops[3].stage = Stage::kAttention;
  ops[3].heads = heads_;
  ops[3].kv_heads = kv_heads_;
  ops[3].d_head = model_.d_head;
  ops[3].seqs = xpu_seqs;
  set_gemm(ops[4], Stage::kProjection, t, d, proj_k);
  set_gemm(ops[5], Stage::kProjection, t, d, (proj_k + groups - 1) / groups);
  ops[6].kind = OpKind::kAllReduce;
  ops[6].stage = Stage::kAllReduce;
  ops[6].bytes = static_cast<double>(t) * d * elem;
  ops[6].participants = static_cast<int>(tp_);
  set_elem(ops[7], Stage::kResidual, t * d, 3 * elem, 1);
  set_gemm(ops[8], Stage::kFf1, t, ff_n, d);
  if (model_.ff_kind == devices::FfKind::kSwiGlu) {
    set_elem(ops[9], Stage::kActivation, t * ff_k, 3 * elem, 6);
  } else {
    set_elem(ops[9], Stage::kActivation, t * ff_k, 2 * elem, 8);
  }
  set_gemm(ops[10], Stage::kFf2, t, d, ff_k);
  if (model_.moe()) {
    // The MoE block in the FF's place (one data-parallel rank, no shared
    // experts, no dense layers: scenario resolution refuses the rest with
    // an attention device); its exchange is the TP all-reduce the FF block
    // already ends with, so MoeOps' all-reduce is not taken.
    std::vector<Op> moe;
    MoeOps(t, &moe);
    ops[8] = moe.front();
    ops[9] = Op{};
    set_elem(ops[9], Stage::kActivation, 0, 0, 0);
    ops[10] = Op{};
    set_gemm(ops[10], Stage::kFf2, 0, d, 0);
  }
}

IterationPlanner::XpuLayer IterationPlanner::XpuLayerFrom(absl::Span<const devices::Cost> c,
                                                          bool has_xattn) {
  XpuLayer x;
  x.norm = c[0];
  x.ff_norm = c[0];
  x.qkv = c[1];
  x.qkv_tile = c[2];
  x.xattn = has_xattn ? c[3] : devices::Cost{};
  x.proj = c[4];
  x.proj_tile = c[5];
  x.allreduce = c[6];
  x.residual = c[7];
  x.ff = c[8];
  x.ff += c[9];
  x.ff += c[10];
  return x;
}

void IterationPlanner::TailOps(int64_t tokens, int64_t emitting, std::vector<Op>* out) const {
  // Once per iteration on the xPUs: embedding, final norm, LM head.
  const double elem = model_.act_bytes_per_element;
  const int64_t d = model_.d_model;
  const size_t at = out->size();
  out->resize(at + kTailOps);
  Op* tail = out->data() + at;
  tail[0].kind = tail[1].kind = OpKind::kElementwise;
  tail[0].stage = Stage::kEmbedding;
  tail[0].elements = tokens * d;
  tail[0].bytes_per_element = 2 * elem;
  tail[1].stage = Stage::kFinalNorm;
  tail[1].elements = emitting * d;
  tail[1].bytes_per_element = 2 * elem;
  tail[1].flops_per_element = 5;
  tail[2].kind = OpKind::kGemm;
  tail[2].stage = Stage::kLmHead;
  tail[2].m = emitting;
  tail[2].n = (model_.vocab_size + tp_ - 1) / tp_;
  tail[2].k = d;
}

}  // namespace servesim::scheduler
