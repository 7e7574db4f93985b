// The attention-device path's timing: PlanWithDevice asks the xPU and the
// attention device for the costs of the ops planner_offload.cc lowers a
// batch to (one Estimate call each, memoised across iterations of the same
// shape), then lays one layer out over the three resources, xPU, link and
// device, under the overlap policy (see planner.h):
//  - TimeSerial: kSerial, each piece waits for the last;
//  - TimeHeadLevelAsAuthors: kHeadLevel(Ff) under the AttAcc simulator's
//    rule (OverlapRule::kAttAccSimulator);
//  - TimeHeadLevelListSchedule: kHeadLevel(Ff) as a list schedule over head
//    groups;
//  - TimeBatchLevel: kBatchLevel, two halves chained across layers;
// and adds the layers, the tail and the link into the IterationCost. Each
// timing also records its schedule's spans while Plan(batch, spans) runs.
//
// Every sum keeps its operations' order and grouping: outputs are compared
// byte for byte across builds (scripts/compare_outputs.sh). Times in
// seconds, link bytes over the whole TP group, xPU energy one xPU's until
// FinishWithDevice scales it to the group.
#include <algorithm>
#include <array>
#include <vector>

#include "absl/base/casts.h"
#include "common/same_key.h"
#include "common/status_macros.h"
#include "scheduler/planner.h"

namespace servesim::scheduler {

using devices::Cost;
using devices::Op;
using devices::Stage;

namespace {
// The transfers (x2g) the AttAcc simulator's rule (OverlapRule) leaves
// exposed beside an attention of a, with m one head's share.
double ExposedX2g(double m, double x2g, double a) { return a > x2g ? m * x2g : x2g - (1 - m) * a; }
}  // namespace

absl::Status IterationPlanner::PlanWithDevice(const Batch& batch, IterationCost* result) {
  const DeviceShape sh = ShapeWithDevice(batch, &scratch_);
  IterationCost& out = *result;  // zeroed by Plan
  out.ff_device_fraction = sh.f;
  RETURN_IF_ERROR(EstimateWithDevice(batch, sh));
  OffloadSums sum;
  if (sh.policy != OverlapPolicy::kBatchLevel) {
    TimeOffloadedLayer(sh, &sum, &out);
  } else {
    TimeBatchLevel(sh, &sum, &out);
  }
  FinishWithDevice(&sum, &out);
  return absl::OkStatus();
}

absl::Status IterationPlanner::EstimateWithDevice(const Batch& batch, const DeviceShape& sh) {
  const devices::Device* dev = config_.attention;
  const DeviceScratch& s = scratch_;
  const int64_t t = sh.t;
  const std::vector<devices::AttentionSeq>& pre_seqs = s.pre_seqs;
  const int64_t b_dec = sh.b_dec;
  const OverlapPolicy policy = sh.policy;
  const int groups = sh.groups;
  const double f = sh.f;

  // One Estimate call per device per iteration: every xPU op (the layer
  // pieces, both halves under batch-level pipelining, and the tail), then
  // every device op (the head groups' attention and the FF share). Costs
  // are per op, so batching them changes no result.
  std::vector<Op>& xpu_ops = xpu_ops_;
  std::vector<Op>& dev_ops = dev_ops_;
  // The xPU ops depend on the policy, the token counts, the FF split, the
  // head groups and the prefill sequences only: a decode batch of the same
  // size as the last iteration's asks the same question, and the xPU device
  // (pure: same ops, same costs) is not asked again.
  std::vector<Cost>& xpu_costs = xpu_costs_;
  const std::array<int64_t, 7> xpu_key = {static_cast<int64_t>(policy),
                                          t,
                                          batch.emitting,
                                          absl::bit_cast<int64_t>(f),
                                          groups,
                                          b_dec,
                                          static_cast<int64_t>(batch.entries.size())};
  const bool xpu_same =
      xpu_valid_ && SameKey(xpu_key, xpu_key_) && pre_seqs.size() == xpu_pre_.size() &&
      std::equal(pre_seqs.begin(), pre_seqs.end(), xpu_pre_.begin(),
                 [](const devices::AttentionSeq& x, const devices::AttentionSeq& y) {
                   return x.new_tokens == y.new_tokens && x.past_tokens == y.past_tokens &&
                          x.request_id == y.request_id;
                 });
  // The device ops depend on the policy, head groups, token count, FF
  // split and the sequence and stack lists (by address and length: the
  // lists themselves are this planner's scratch, refilled each iteration):
  // the same shape as the last iteration keeps its ops, which are large to
  // build and copy.
  auto addr = [](const void* p) { return static_cast<int64_t>(reinterpret_cast<intptr_t>(p)); };
  const std::array<int64_t, 16> dev_key = {static_cast<int64_t>(policy),
                                           groups,
                                           t,
                                           absl::bit_cast<int64_t>(f),
                                           addr(s.dec_seqs.data()),
                                           static_cast<int64_t>(s.dec_seqs.size()),
                                           addr(s.dec_stacks.data()),
                                           static_cast<int64_t>(s.dec_stacks.size()),
                                           addr(s.seqs_a.data()),
                                           static_cast<int64_t>(s.seqs_a.size()),
                                           addr(s.seqs_b.data()),
                                           static_cast<int64_t>(s.seqs_b.size()),
                                           addr(s.st_a.data()),
                                           static_cast<int64_t>(s.st_a.size()),
                                           addr(s.st_b.data()),
                                           static_cast<int64_t>(s.st_b.size())};
  if (!dev_ops_valid_ || !SameKey(dev_key, dev_key_)) {
    dev_ops_valid_ = false;
    dev_ops.clear();
    DeviceOpsOf(sh, s, &dev_ops, &att_at_, &att_b_at_, &ff_at_);
    dev_key_ = dev_key;
    dev_ops_valid_ = true;
  }
  if (att_at_ >= 0 && policy != OverlapPolicy::kBatchLevel) {
    for (int j = 0; j < groups; ++j) dev_ops[att_at_ + j].kv_head_stack_id = s.dec_stacks_id;
  }
  if (!xpu_same) {
    xpu_valid_ = false;
    xpu_ops.clear();
    XpuOpsWithDevice(sh, batch, s, &xpu_ops);
    xpu_costs.assign(xpu_ops.size(), Cost{});
    // Both devices on agents: the device's round trip starts first and
    // overlaps the xPU's (joined in the same order below).
    if (!dev_ops.empty() && device_->Remote() && dev->Remote()) dev->Prepare(dev_ops);
    RETURN_IF_ERROR(device_->Estimate(xpu_ops, absl::MakeSpan(xpu_costs)));
    xpu_key_ = xpu_key;
    xpu_pre_ = pre_seqs;
    xpu_valid_ = true;
  }
  std::vector<Cost>& dev_costs = dev_costs_;
  dev_costs.assign(dev_ops.size(), Cost{});
  if (!dev_ops.empty()) RETURN_IF_ERROR(dev->Estimate(dev_ops, absl::MakeSpan(dev_costs)));
  return absl::OkStatus();
}

const std::vector<Cost>& IterationPlanner::AttentionCosts(int at, int g,
                                                          std::vector<Cost>* c) const {
  c->assign(g, Cost{});
  if (at >= 0) std::copy(dev_costs_.begin() + at, dev_costs_.begin() + at + g, c->begin());
  return *c;
}

void IterationPlanner::TimeOffloadedLayer(const DeviceShape& sh, OffloadSums* sum,
                                          IterationCost* result) {
  const double elem = model_.act_bytes_per_element;
  const double kv_elem = model_.kv_bytes_per_element;
  const int64_t H = model_.num_heads, KV = model_.num_kv_heads, dh = model_.d_head;
  const int64_t d = model_.d_model;
  const int64_t t = sh.t;
  const int64_t prefill_tokens = sh.prefill_tokens;
  const int64_t b_dec = sh.b_dec;
  const OverlapPolicy policy = sh.policy;
  const bool head_level =
      policy == OverlapPolicy::kHeadLevel || policy == OverlapPolicy::kHeadLevelFf;
  const int groups = sh.groups;
  const double f = sh.f;
  const int att_at = att_at_, ff_at = ff_at_;
  const std::vector<Cost>& dev_costs = dev_costs_;
  IterationCost& out = *result;
  const double layers = static_cast<double>(model_.num_layers);
  Cost& xpu_energy = sum->xpu_energy;
  Cost& dev_energy = sum->dev_energy;
  double& link_bytes = sum->link_bytes;

  const XpuLayer x = XpuLayerFrom(xpu_costs_, !scratch_.pre_seqs.empty());
  const std::vector<Cost>& att = AttentionCosts(att_at, groups, &att_);
  const double send = static_cast<double>(b_dec) * (H + 2 * KV) * dh * elem;
  const double recv = static_cast<double>(b_dec) * H * dh * elem;
  const double kv_copy = static_cast<double>(prefill_tokens) * 2 * KV * dh * kv_elem;
  link_bytes += send + recv + kv_copy;
  // Feed-forward: the xPUs' share, and the device's in parallel.
  Cost dev_ff;
  double ff_link = 0;
  if (f > 0) {
    dev_ff = dev_costs[ff_at];
    dev_ff += dev_costs[ff_at + 1];
    const double ff_bytes = 2.0 * static_cast<double>(t) * d * elem;  // in, partial out
    ff_link = 2 * LinkTime(ff_bytes / 2);
    link_bytes += ff_bytes;
  }
  const double ff_block = x.ff_norm.time_s + std::max(x.ff.time_s, ff_link + dev_ff.time_s) +
                          x.allreduce.time_s + x.residual.time_s;
  const double kv_copy_time = LinkTime(kv_copy);
  double att_total = 0;
  for (const Cost& c : att) att_total += c.time_s;

  const bool authors = config_.overlap_rule == OverlapRule::kAttAccSimulator;
  // The AttAcc simulator's rule (OverlapRule): one head's share of a
  // pipelined kernel stays exposed.
  const double m = 1.0 / static_cast<double>(std::max<int64_t>(1, heads_));
  const double send_t = b_dec > 0 ? LinkTime(send) : 0.0;
  const double recv_t = b_dec > 0 ? LinkTime(recv) : 0.0;
  const OffloadedLayer layer{.x = &x,
                             .att = att,
                             .b_dec = b_dec,
                             .groups = groups,
                             .send = send,
                             .recv = recv,
                             .send_t = send_t,
                             .recv_t = recv_t,
                             .att_total = att_total,
                             .kv_copy_time = kv_copy_time,
                             .ff_link = ff_link,
                             .dev_ff_s = dev_ff.time_s,
                             .ff_block = ff_block,
                             .m = m};
  if (!head_level) {
    TimeSerial(layer, authors, sum);
  } else if (authors) {
    TimeHeadLevelAsAuthors(layer, sum);
  } else {
    TimeHeadLevelListSchedule(layer, sum);
  }
  double& dev_busy = sum->dev_busy;
  double& link_busy = sum->link_busy;
  dev_busy = att_total + dev_ff.time_s;
  link_busy = (b_dec > 0 ? LinkTime(send) + LinkTime(recv) : 0.0) + kv_copy_time + ff_link;
  // Energy and traffic.
  for (const Cost* c : {&x.norm, &x.ff_norm, &x.xattn, &x.allreduce, &x.allreduce, &x.residual,
                        &x.residual, &x.ff}) {
    xpu_energy += *c;
  }
  xpu_energy += x.qkv;
  xpu_energy += x.proj;
  for (const Cost& c : att) dev_energy += c;
  dev_energy += dev_ff;
  // Per-stage breakdown (all layers): the xPU's ops and the device's.
  auto stage = [&](Stage st, const Cost& c, double times) {
    out.stages[static_cast<int>(st)] += c.Scaled(layers * times);
  };
  stage(Stage::kNorm, x.norm, 2);
  stage(Stage::kQkv, x.qkv, 1);
  stage(Stage::kAttention, x.xattn, 1);
  for (const Cost& c : att) stage(Stage::kAttention, c, 1);
  stage(Stage::kProjection, x.proj, 1);
  stage(Stage::kAllReduce, x.allreduce, 2);
  stage(Stage::kResidual, x.residual, 2);
  stage(Stage::kFf1, x.ff, 1);    // FF1 + activation + FF2 on the xPUs
  stage(Stage::kFf2, dev_ff, 1);  // the device's FF share
}

void IterationPlanner::TimeSerial(const OffloadedLayer& in, bool authors, OffloadSums* sum) {
  const XpuLayer& x = *in.x;
  const int64_t b_dec = in.b_dec;
  const double send_t = in.send_t, recv_t = in.recv_t, att_total = in.att_total, m = in.m;
  const double kv_copy_time = in.kv_copy_time, ff_link = in.ff_link, ff_block = in.ff_block;
  double& layer_time = sum->layer_time;
  double& xpu_busy = sum->xpu_busy;
  // Serially, the authors still hide the transfers behind the
  // attention but for one head's share.
  double send_s = send_t, recv_s = recv_t;
  if (authors && b_dec > 0 && send_t + recv_t > 0) {
    const double x2g = send_t + recv_t;
    const double exposed = ExposedX2g(m, x2g, att_total);
    send_s = exposed * send_t / x2g;
    recv_s = exposed - send_s;
  }
  const double attn_path = b_dec > 0 ? send_s + att_total + recv_s : 0.0;
  const double post = x.proj.time_s + x.allreduce.time_s + x.residual.time_s;
  layer_time = x.norm.time_s + x.qkv.time_s + x.xattn.time_s + attn_path + post + ff_block +
               std::max(0.0, kv_copy_time - (post + ff_block));
  xpu_busy = x.norm.time_s + x.qkv.time_s + x.xattn.time_s + post + x.ff_norm.time_s + x.ff.time_s +
             x.allreduce.time_s + x.residual.time_s;
  if (spans_ != nullptr) {
    for (int32_t l = 0; l < model_.num_layers; ++l) {
      EmitSerialLayer(l, l * layer_time, x, send_s, att_total, recv_s, kv_copy_time, ff_link,
                      in.dev_ff_s);
    }
  }
}

void IterationPlanner::TimeHeadLevelAsAuthors(const OffloadedLayer& in, OffloadSums* sum) {
  const XpuLayer& x = *in.x;
  const double send_t = in.send_t, recv_t = in.recv_t, att_total = in.att_total, m = in.m;
  const double kv_copy_time = in.kv_copy_time, ff_link = in.ff_link, ff_block = in.ff_block;
  double& layer_time = sum->layer_time;
  double& xpu_busy = sum->xpu_busy;
  // Head-level pipelining as the authors time it (OverlapRule): QKV and
  // projection (FC) against the device's attention (A) and the link (X).
  const double qkv = x.qkv.time_s, proj = x.proj.time_s, fc = qkv + proj;
  const double a = att_total, x2g = send_t + recv_t;
  double core;  // QKV to the projection's end
  if (a > fc) {
    core = m * fc + ExposedX2g(m, x2g, a) + a;
  } else if (fc > x2g) {
    core = fc + m * a + m * x2g;
  } else {
    core = m * fc + x2g + m * a;
  }
  const double post = x.allreduce.time_s + x.residual.time_s;
  const double pre = x.norm.time_s + x.xattn.time_s;
  layer_time = pre + core + post + ff_block + std::max(0.0, kv_copy_time - (post + ff_block));
  if (spans_ != nullptr) {
    // A schedule with that length: QKV first, the projection last, and
    // the attention (with the transfers, as far as they fit) between
    // the first head's QKV and the last head's projection.
    for (int32_t l = 0; l < model_.num_layers; ++l) {
      const double at = l * layer_time;
      Emit(Track::kXpu, "norm", l, -1, at, at + x.norm.time_s);
      const double c0 = at + pre;
      Emit(Track::kXpu, "attention (prefill)", l, -1, at + x.norm.time_s, c0);
      Emit(Track::kXpu, "qkv", l, -1, c0, c0 + qkv);
      Emit(Track::kXpu, "projection", l, -1, c0 + core - proj, c0 + core);
      const double ws = c0 + m * qkv;
      const double slack = std::max(0.0, core - m * fc - a);
      const double so = std::min(send_t, slack / 2), sr = std::min(recv_t, slack / 2);
      Emit(Track::kLinkOut, "send q/k/v", l, -1, ws, ws + so);
      Emit(Track::kDevice, "attention", l, -1, ws + so, ws + so + a);
      Emit(Track::kLinkBack, "recv outputs", l, -1, ws + so + a, ws + so + a + sr);
      EmitPostAndFf(l, c0 + core, x, kv_copy_time, ff_link, in.dev_ff_s);
    }
  }
  xpu_busy = x.norm.time_s + x.qkv.time_s + x.xattn.time_s + x.proj.time_s + post +
             x.ff_norm.time_s + x.ff.time_s + x.allreduce.time_s + x.residual.time_s;
}

void IterationPlanner::TimeHeadLevelListSchedule(const OffloadedLayer& in, OffloadSums* sum) {
  const XpuLayer& x = *in.x;
  const absl::Span<const Cost> att = in.att;
  const int64_t b_dec = in.b_dec;
  const int groups = in.groups;
  const double send = in.send, recv = in.recv, att_total = in.att_total;
  const double kv_copy_time = in.kv_copy_time, ff_link = in.ff_link, ff_block = in.ff_block;
  double& layer_time = sum->layer_time;
  double& xpu_busy = sum->xpu_busy;
  // List schedule over head groups (§6.1): the QKV kernel's output tiles
  // complete one head group at a time (the GEMM is tiled anyway, so a
  // tile is 1/groups of the kernel, not a kernel of its own); each group
  // is sent, attended on the device and sent back; the projection kernel
  // consumes the groups in order as they return. Resources: xPU, link
  // out, device, link back; each runs its work in order.
  double xpu = x.norm.time_s;
  double link_out = 0, device = 0, link_back = 0;
  std::vector<double>& back_done = back_done_;
  back_done.assign(groups, 0);
  const double send_g = b_dec > 0 ? LinkTime(send / groups) : 0.0;
  const double recv_g = b_dec > 0 ? LinkTime(recv / groups) : 0.0;
  const double qkv_tile = x.qkv.time_s / groups;
  const double proj_tile = x.proj.time_s / groups;
  for (int j = 0; j < groups; ++j) {
    xpu += qkv_tile;
    link_out = std::max(link_out, xpu) + send_g;
    device = std::max(device, link_out) + att[j].time_s;
    link_back = std::max(link_back, device) + recv_g;
    back_done[j] = link_back;
  }
  xpu += x.xattn.time_s;
  for (int j = 0; j < groups; ++j) xpu = std::max(xpu, back_done[j]) + proj_tile;
  const double post = x.allreduce.time_s + x.residual.time_s;
  layer_time = xpu + post + ff_block + std::max(0.0, kv_copy_time - (post + ff_block));
  // Per-group messages each pay the link latency; for tiny batches that
  // can outweigh the overlap, and the host then keeps the serial order.
  const double attn_path = b_dec > 0 ? LinkTime(send) + att_total + LinkTime(recv) : 0.0;
  const double serial_time = x.norm.time_s + x.qkv.time_s + x.xattn.time_s + attn_path +
                             x.proj.time_s + post + ff_block +
                             std::max(0.0, kv_copy_time - (x.proj.time_s + post + ff_block));
  const bool pipelined = layer_time < serial_time;
  layer_time = std::min(layer_time, serial_time);
  if (spans_ != nullptr) {
    for (int32_t l = 0; l < model_.num_layers; ++l) {
      const double at = l * layer_time;
      if (!pipelined) {
        EmitSerialLayer(l, at, x, b_dec > 0 ? LinkTime(send) : 0, att_total,
                        b_dec > 0 ? LinkTime(recv) : 0, kv_copy_time, ff_link, in.dev_ff_s);
        continue;
      }
      // The list schedule above, replayed with its start times.
      double xp = at + x.norm.time_s, lo = at, dv = at, lb = at;
      Emit(Track::kXpu, "norm", l, -1, at, xp);
      std::vector<double> back(groups);
      for (int j = 0; j < groups; ++j) {
        Emit(Track::kXpu, "qkv", l, j, xp, xp + qkv_tile);
        xp += qkv_tile;
        lo = std::max(lo, xp);
        Emit(Track::kLinkOut, "send q/k/v", l, j, lo, lo + send_g);
        lo += send_g;
        dv = std::max(dv, lo);
        Emit(Track::kDevice, "attention", l, j, dv, dv + att[j].time_s);
        dv += att[j].time_s;
        lb = std::max(lb, dv);
        Emit(Track::kLinkBack, "recv outputs", l, j, lb, lb + recv_g);
        lb += recv_g;
        back[j] = lb;
      }
      Emit(Track::kXpu, "attention (prefill)", l, -1, xp, xp + x.xattn.time_s);
      xp += x.xattn.time_s;
      for (int j = 0; j < groups; ++j) {
        xp = std::max(xp, back[j]);
        Emit(Track::kXpu, "projection", l, j, xp, xp + proj_tile);
        xp += proj_tile;
      }
      EmitPostAndFf(l, xp, x, kv_copy_time, ff_link, in.dev_ff_s);
    }
  }
  xpu_busy = x.norm.time_s + x.qkv.time_s + x.xattn.time_s + x.proj.time_s + post +
             x.ff_norm.time_s + x.ff.time_s + x.allreduce.time_s + x.residual.time_s;
}

void IterationPlanner::TimeBatchLevel(const DeviceShape& sh, OffloadSums* sum,
                                      IterationCost* result) {
  const double elem = model_.act_bytes_per_element;
  const int64_t H = model_.num_heads, KV = model_.num_kv_heads, dh = model_.d_head;
  const int64_t b_dec = sh.b_dec;
  const int64_t half = sh.half;
  const int att_at = att_at_, att_b_at = att_b_at_;
  const std::vector<Cost>& xpu_costs = xpu_costs_;
  IterationCost& out = *result;
  const double layers = static_cast<double>(model_.num_layers);
  Cost& xpu_energy = sum->xpu_energy;
  Cost& dev_energy = sum->dev_energy;
  double& link_bytes = sum->link_bytes;
  double& layer_time = sum->layer_time;
  double& xpu_busy = sum->xpu_busy;
  double& dev_busy = sum->dev_busy;
  double& link_busy = sum->link_busy;
  double& batch_level_time = sum->batch_level_time;
  // Batch-level pipelining: halves A and B, chained across layers.
  const XpuLayer xa = XpuLayerFrom(absl::MakeConstSpan(xpu_costs).subspan(0, kXpuLayerOps), false);
  const XpuLayer xb =
      XpuLayerFrom(absl::MakeConstSpan(xpu_costs).subspan(kXpuLayerOps, kXpuLayerOps), false);
  const std::vector<Cost>& att_a = AttentionCosts(att_at, 1, &att_);
  const std::vector<Cost>& att_b = AttentionCosts(att_b_at, 1, &att_b_);
  auto pre = [](const XpuLayer& x) { return x.norm.time_s + x.qkv.time_s; };
  auto post = [](const XpuLayer& x) {
    return x.proj.time_s + 2 * (x.allreduce.time_s + x.residual.time_s) + x.ff_norm.time_s +
           x.ff.time_s;
  };
  auto sends = [&](int64_t n) { return LinkTime(double(n) * (H + 2 * KV) * dh * elem); };
  auto recvs = [&](int64_t n) { return LinkTime(double(n) * H * dh * elem); };
  double xpu = 0, device = 0, out_link = 0, back_link = 0;
  double post_a = 0, post_b = 0;
  // Each step: a resource starts at max(its own free time, the input's
  // ready time) and runs `d`; recorded as a span when tracing.
  auto step = [&](double* resource, double ready, double d, Track tr, std::string_view name,
                  int32_t l, int32_t half_index) {
    const double start = std::max(*resource, ready);
    *resource = start + d;
    Emit(tr, name, l, half_index, start, *resource);
  };
  for (int32_t l = 0; l < model_.num_layers; ++l) {
    step(&xpu, post_a, pre(xa), Track::kXpu, "norm+qkv", l, 0);
    step(&out_link, xpu, sends(half), Track::kLinkOut, "send q/k/v", l, 0);
    step(&device, out_link, att_a[0].time_s, Track::kDevice, "attention", l, 0);
    step(&back_link, device, recvs(half), Track::kLinkBack, "recv outputs", l, 0);
    const double ready_a = back_link;
    step(&xpu, post_b, pre(xb), Track::kXpu, "norm+qkv", l, 1);
    step(&out_link, xpu, sends(b_dec - half), Track::kLinkOut, "send q/k/v", l, 1);
    step(&device, out_link, att_b[0].time_s, Track::kDevice, "attention", l, 1);
    step(&back_link, device, recvs(b_dec - half), Track::kLinkBack, "recv outputs", l, 1);
    const double ready_b = back_link;
    step(&xpu, ready_a, post(xa), Track::kXpu, "projection..ff", l, 0);
    post_a = xpu;
    step(&xpu, ready_b, post(xb), Track::kXpu, "projection..ff", l, 1);
    post_b = xpu;
  }
  // The chain covers every layer already.
  layer_time = xpu / layers;
  batch_level_time = xpu;
  xpu_busy = pre(xa) + pre(xb) + post(xa) + post(xb);
  dev_busy = att_a[0].time_s + att_b[0].time_s;
  link_busy = sends(half) + sends(b_dec - half) + recvs(half) + recvs(b_dec - half);
  link_bytes += static_cast<double>(b_dec) * (2 * H + 2 * KV) * dh * elem;
  for (const XpuLayer* x : {&xa, &xb}) {
    for (const Cost* c : {&x->norm, &x->qkv, &x->proj, &x->allreduce, &x->allreduce, &x->residual,
                          &x->residual, &x->ff_norm, &x->ff}) {
      xpu_energy += *c;
    }
  }
  dev_energy += att_a[0];
  dev_energy += att_b[0];
  for (const XpuLayer* x : {&xa, &xb}) {
    auto stage = [&](Stage st, const Cost& c, double times) {
      out.stages[static_cast<int>(st)] += c.Scaled(layers * times);
    };
    stage(Stage::kNorm, x->norm, 2);
    stage(Stage::kQkv, x->qkv, 1);
    stage(Stage::kProjection, x->proj, 1);
    stage(Stage::kAllReduce, x->allreduce, 2);
    stage(Stage::kResidual, x->residual, 2);
    stage(Stage::kFf1, x->ff, 1);
  }
  out.stages[static_cast<int>(Stage::kAttention)] += att_a[0].Scaled(layers);
  out.stages[static_cast<int>(Stage::kAttention)] += att_b[0].Scaled(layers);
}

void IterationPlanner::FinishWithDevice(OffloadSums* sum, IterationCost* result) {
  const std::vector<Op>& xpu_ops = xpu_ops_;
  const std::vector<Cost>& xpu_costs = xpu_costs_;
  const size_t tail_at = xpu_ops.size() - kTailOps;
  IterationCost& out = *result;
  const double layers = static_cast<double>(model_.num_layers);
  const double tp = static_cast<double>(tp_);
  Cost& xpu_energy = sum->xpu_energy;
  const Cost& dev_energy = sum->dev_energy;
  const double link_bytes = sum->link_bytes;
  const double layer_time = sum->layer_time, xpu_busy = sum->xpu_busy;
  const double dev_busy = sum->dev_busy, link_busy = sum->link_busy;
  const double batch_level_time = sum->batch_level_time;

  // Once per iteration on the xPUs: embedding, final norm, LM head.
  const absl::Span<const Op> tail = absl::MakeConstSpan(xpu_ops).subspan(tail_at, kTailOps);
  const absl::Span<const Cost> tc = absl::MakeConstSpan(xpu_costs).subspan(tail_at, kTailOps);
  double tail_time = 0;
  const double layers_end = batch_level_time >= 0 ? batch_level_time : layer_time * layers;
  for (size_t i = 0; i < tail.size(); ++i) {
    Emit(Track::kXpu, devices::StageName(tail[i].stage), -1, -1, layers_end + tail_time,
         layers_end + tail_time + tc[i].time_s);
    tail_time += tc[i].time_s;
    xpu_energy += tc[i].Scaled(1.0 / layers);  // folded into the per-layer sum
    out.stages[static_cast<int>(tail[i].stage)] += tc[i];
  }

  out.time_s = (batch_level_time >= 0 ? batch_level_time : layer_time * layers) + tail_time;
  out.xpu_busy_s = xpu_busy * layers + tail_time;
  out.xpu_collective_s = out.stages[static_cast<int>(Stage::kAllReduce)].time_s +
                         out.stages[static_cast<int>(Stage::kMoeDispatch)].time_s;
  out.device_busy_s = dev_busy * layers;
  out.link_busy_s = link_busy * layers;
  Cost total = xpu_energy.Scaled(layers * tp);
  out.device_total = dev_energy.Scaled(layers);
  out.device_total.time_s = out.device_busy_s;
  total += out.device_total;
  total.link_bytes += link_bytes * layers;
  out.device_link_bytes = link_bytes * layers;
  total.link_energy_pj += link_bytes * layers * config_.link_energy_pj_per_byte;
  total.time_s = out.time_s;
  out.total = total;
}

double IterationPlanner::LinkTime(double bytes) const {
  if (bytes <= 0) return 0;
  return config_.link_latency_s + bytes / (config_.link_bytes_per_s * static_cast<double>(tp_));
}

void IterationPlanner::EmitPostAndFf(int32_t l, double at, const XpuLayer& x, double kv_copy_s,
                                     double ff_link_s, double dev_ff_s) {
  // The prefill's K/V copy to the device overlaps everything after the
  // attention block.
  Emit(Track::kKvCopy, "kv copy", l, -1, at, at + kv_copy_s);
  double xp = at;
  for (const auto& [name, c] :
       {std::pair<std::string_view, const devices::Cost*>{"all-reduce", &x.allreduce},
        {"residual", &x.residual},
        {"norm", &x.ff_norm}}) {
    Emit(Track::kXpu, name, l, -1, xp, xp + c->time_s);
    xp += c->time_s;
  }
  // FF: the xPUs' share, and the device's share beside it (inputs out,
  // partial sums back, half the FF link time each way).
  Emit(Track::kXpu, "ff", l, -1, xp, xp + x.ff.time_s);
  Emit(Track::kLinkOut, "send ff inputs", l, -1, xp, xp + ff_link_s / 2);
  Emit(Track::kDevice, "ff (device share)", l, -1, xp + ff_link_s / 2,
       xp + ff_link_s / 2 + dev_ff_s);
  Emit(Track::kLinkBack, "recv ff partials", l, -1, xp + ff_link_s / 2 + dev_ff_s,
       xp + ff_link_s + dev_ff_s);
  xp += std::max(x.ff.time_s, ff_link_s + dev_ff_s);
  for (const auto& [name, c] :
       {std::pair<std::string_view, const devices::Cost*>{"all-reduce", &x.allreduce},
        {"residual", &x.residual}}) {
    Emit(Track::kXpu, name, l, -1, xp, xp + c->time_s);
    xp += c->time_s;
  }
}

void IterationPlanner::EmitSerialLayer(int32_t l, double at, const XpuLayer& x, double send_s,
                                       double attention_s, double recv_s, double kv_copy_s,
                                       double ff_link_s, double dev_ff_s) {
  double xp = at;
  for (const auto& [name, c] : {std::pair<std::string_view, const devices::Cost*>{"norm", &x.norm},
                                {"qkv", &x.qkv},
                                {"attention (prefill)", &x.xattn}}) {
    Emit(Track::kXpu, name, l, -1, xp, xp + c->time_s);
    xp += c->time_s;
  }
  Emit(Track::kLinkOut, "send q/k/v", l, -1, xp, xp + send_s);
  Emit(Track::kDevice, "attention", l, -1, xp + send_s, xp + send_s + attention_s);
  Emit(Track::kLinkBack, "recv outputs", l, -1, xp + send_s + attention_s,
       xp + send_s + attention_s + recv_s);
  xp += send_s + attention_s + recv_s;
  // The K/V copy overlaps everything from the projection on.
  Emit(Track::kKvCopy, "kv copy", l, -1, xp, xp + kv_copy_s);
  Emit(Track::kXpu, "projection", l, -1, xp, xp + x.proj.time_s);
  EmitPostAndFf(l, xp + x.proj.time_s, x, 0, ff_link_s, dev_ff_s);
}

}  // namespace servesim::scheduler
