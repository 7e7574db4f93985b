#include "scheduler/planner.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>

#include "absl/base/casts.h"
#include "common/same_key.h"
#include "common/status_macros.h"

namespace servesim::scheduler {

using devices::Op;
using devices::OpKind;
using devices::Stage;

const char* OverlapPolicyName(OverlapPolicy p) {
  switch (p) {
    case OverlapPolicy::kSerial: return "serial";
    case OverlapPolicy::kHeadLevel: return "head_level";
    case OverlapPolicy::kHeadLevelFf: return "head_level_ff";
    case OverlapPolicy::kBatchLevel: return "batch_level";
  }
  return "unknown";
}

namespace {
PlannerConfig XpuOnly(int64_t tp, const devices::Device* device) {
  PlannerConfig c;
  c.tensor_parallel = tp;
  c.xpu = device;
  return c;
}
}  // namespace

IterationPlanner::IterationPlanner(const devices::ModelDims& model,
                                   int64_t tensor_parallel,
                                   const devices::Device* device)
    : IterationPlanner(model, XpuOnly(tensor_parallel, device)) {}

IterationPlanner::IterationPlanner(const devices::ModelDims& model,
                                   const PlannerConfig& config)
    : model_(model), config_(config), tp_(config.tensor_parallel), device_(config.xpu) {
  heads_ = model_.num_heads / tp_;
  kv_heads_ = std::max<int64_t>(1, model_.num_kv_heads / tp_);
  ff_ = model_.d_ff / tp_;
  dp_ = std::max<int64_t>(1, config_.data_parallel);
  routing_ = config_.routing.get();
}

int64_t IterationPlanner::MoeGroup() const { return dp_ * tp_; }

double IterationPlanner::FfDeviceFraction(int64_t tokens) const {
  if (!(config_.device_bandwidth > 0) || !std::isfinite(config_.device_bandwidth)) return 0;
  auto f = [&](double bs) {
    return config_.device_bandwidth /
           (config_.xpu_bandwidth * bs + config_.device_bandwidth);
  };
  const double bs = static_cast<double>(std::max<int64_t>(tokens, 1));
  const double hi = f(static_cast<double>(std::max<int64_t>(config_.ff_min_batch, 1)));
  const double lo = f(static_cast<double>(std::max<int64_t>(config_.ff_max_batch, 1)));
  return std::clamp(f(bs), lo, hi);
}

double IterationPlanner::LinkTime(double bytes) const {
  if (bytes <= 0) return 0;
  return config_.link_latency_s +
         bytes / (config_.link_bytes_per_s * static_cast<double>(tp_));
}

int64_t IterationPlanner::KvBytesPerTokenPerXpu() const {
  return model_.num_layers * model_.KvElementsPerLayer(kv_heads_) * model_.kv_bytes_per_element;
}

double IterationPlanner::WeightBytesPerXpu() const {
  // Routed experts are split over the whole MoE group (by expert or by
  // width); MLA's down-projections are on every xPU; everything else is
  // split over the tensor-parallel group.
  const double w = static_cast<double>(model_.bytes_per_element);
  const double routed =
      static_cast<double>(model_.RoutedExpertParams()) * model_.expert_bytes_per_element;
  const double replicated = static_cast<double>(model_.ReplicatedParams()) * w;
  return (model_.WeightBytes() - routed - replicated) / static_cast<double>(tp_) + replicated +
         routed / static_cast<double>(MoeGroup());
}

double IterationPlanner::ActivationBytesPerXpu(int64_t tokens) const {
  const double t = static_cast<double>(tokens);
  // The FF intermediate (gate and up, or up): the dense FF's, or an MoE
  // layer's, the larger where the model has both. vLLM's fused MoE kernel
  // runs every row it is given (the group's tokens when ranks exchange
  // them) against each of its top-k experts, at most kFusedMoeChunkRows
  // rows at a time; the experts are this xPU's width (whole with expert
  // parallelism).
  double ff = t * static_cast<double>(ff_);
  if (model_.moe()) {
    const double rows = std::min(t * static_cast<double>(dp_), kFusedMoeChunkRows);
    const int64_t width =
        config_.expert_parallel ? model_.expert_d_ff : model_.expert_d_ff / MoeGroup();
    const double moe = rows * static_cast<double>(model_.experts_per_token * width);
    ff = model_.DenseFfLayers() == 0 ? moe : std::max(ff, moe);
  }
  // The attention block's outputs: Q, K and V, or with MLA the latents,
  // the queries and the up-projected keys and values of a prefill.
  const double qkv =
      model_.mla()
          ? static_cast<double>(model_.q_lora_rank + model_.kv_lora_rank + model_.rope_head_dim +
                                heads_ * (2 * model_.d_head + model_.rope_head_dim + model_.dv()))
          : static_cast<double>(heads_ + 2 * kv_heads_) * model_.d_head;
  const double live = t * (static_cast<double>(model_.d_model) + qkv) +
                      static_cast<double>(model_.FfInputMatrices()) * ff;
  return 2.0 * live * static_cast<double>(model_.act_bytes_per_element);
}

void IterationPlanner::BuildLayerOps(const Batch& batch) {
  ops_.clear();
  seqs_.clear();
  for (const BatchEntry& e : batch.entries) {
    seqs_.push_back({e.new_tokens, e.past_tokens, e.request_id, e.final_tokens});
  }
  const int64_t t = batch.prefill_tokens + batch.decode_tokens;
  const int64_t d = model_.d_model;
  const double elem = model_.act_bytes_per_element;
  const double act_bytes = static_cast<double>(t) * d * elem;

  auto elementwise = [&](Stage s, int64_t elements, double bytes_per_element,
                         double flops_per_element) {
    Op op;
    op.kind = OpKind::kElementwise;
    op.stage = s;
    op.elements = elements;
    op.bytes_per_element = bytes_per_element;
    op.flops_per_element = flops_per_element;
    ops_.push_back(op);
  };
  auto gemm = [&](Stage s, int64_t m, int64_t n, int64_t k) {
    Op op;
    op.kind = OpKind::kGemm;
    op.stage = s;
    op.m = m;
    op.n = n;
    op.k = k;
    ops_.push_back(op);
  };
  auto allreduce = [&]() {
    Op op;
    op.kind = OpKind::kAllReduce;
    op.stage = Stage::kAllReduce;
    op.bytes = act_bytes;
    op.participants = static_cast<int>(tp_);
    ops_.push_back(op);
  };

  // LayerNorm/RMSNorm: read x, write y; ~5 FLOPs per element (mean,
  // variance, scale, shift).
  elementwise(Stage::kNorm, t * d, 2 * elem, 5);
  const MlaRows rows = MlaRowsOf(batch);
  if (!model_.mla()) {
    gemm(Stage::kQkv, t, (heads_ + 2 * kv_heads_) * model_.d_head, d);
  } else {
    // MLA the way vLLM runs it (DeepSeek-V3's absorbed decode): the query
    // and KV down-projections (replicated over TP) and their norms, the
    // query up-projection; decode tokens fold W_UK into the query
    // ([t_dec x dh] x [dh x c] per head) and attend over the latent;
    // prefill tokens up-project their whole context's latents to per-head
    // keys and values (kv_b_proj) and attend as ordinary heads.
    const int64_t c = model_.kv_lora_rank, r = model_.rope_head_dim;
    const int64_t q_lora = model_.q_lora_rank;
    gemm(Stage::kQkv, t, q_lora + c + r, d);
    elementwise(Stage::kNorm, t * (q_lora + c), 2 * elem, 5);
    if (q_lora > 0) {
      gemm(Stage::kQkv, t, heads_ * (model_.d_head + r), q_lora);
    } else {
      gemm(Stage::kQkv, t, heads_ * (model_.d_head + r), d);
    }
    gemm(Stage::kQkv, rows.decode, heads_ * c, model_.d_head);
    gemm(Stage::kQkv, rows.prefill_context, heads_ * (model_.d_head + model_.dv()), c);
  }
  {
    Op op;
    op.kind = OpKind::kAttention;
    op.stage = Stage::kAttention;
    op.heads = heads_;
    op.kv_heads = kv_heads_;
    op.d_head = model_.d_head;
    if (model_.mla()) {
      op.kv_latent = model_.kv_lora_rank;
      op.d_rope = model_.rope_head_dim;
      op.d_value = model_.dv();
    }
    op.seqs = seqs_;
    attention_at_ = ops_.size();
    window_at_ = -1;
    if (model_.sliding_window > 0 && model_.FullAttentionLayers() == 0) {
      op.window = model_.sliding_window;  // every layer slides
    }
    ops_.push_back(op);
    if (model_.sliding_window > 0 && model_.FullAttentionLayers() > 0) {
      // The sliding layers' attention beside the full layers'.
      op.window = model_.sliding_window;
      window_at_ = static_cast<int>(ops_.size());
      ops_.push_back(op);
    }
  }
  if (model_.mla()) {
    // Decode: the latent context times W_UV per head, then o_proj.
    gemm(Stage::kProjection, rows.decode, heads_ * model_.dv(), model_.kv_lora_rank);
  }
  gemm(Stage::kProjection, t, d, heads_ * model_.dv());
  allreduce();
  elementwise(Stage::kResidual, t * d, 3 * elem, 1);  // a + b -> c
  elementwise(Stage::kNorm, t * d, 2 * elem, 5);
  auto dense_ff = [&](int64_t width) {
    gemm(Stage::kFf1, t, model_.FfInputMatrices() * width, d);
    if (model_.ff_kind == devices::FfKind::kSwiGlu) {
      // silu(gate) * up: read two, write one; ~6 FLOPs.
      elementwise(Stage::kActivation, t * width, 3 * elem, 6);
    } else {
      // GELU (tanh form): read, write; ~8 FLOPs.
      elementwise(Stage::kActivation, t * width, 2 * elem, 8);
    }
    gemm(Stage::kFf2, t, d, width);
  };
  op_layers_.assign(ops_.size(), LayerSet::kEvery);
  if (window_at_ >= 0) {
    op_layers_[attention_at_] = LayerSet::kFullAttention;
    op_layers_[static_cast<size_t>(window_at_)] = LayerSet::kSlidingAttention;
  }
  if (!model_.moe()) {
    dense_ff(ff_);
    allreduce();
    elementwise(Stage::kResidual, t * d, 3 * elem, 1);
    op_layers_.resize(ops_.size(), LayerSet::kEvery);
  } else {
    // MoE layers: shared experts (a dense FF on the rank's own tokens,
    // split by TP), the routed experts, the exchange with the group.
    if (model_.shared_experts > 0 && t > 0) {
      dense_ff(model_.shared_experts * model_.expert_d_ff / tp_);
    }
    moe_at_ = static_cast<int>(ops_.size());
    moe_group_tokens_ = group_tokens_ > 0 ? group_tokens_ : t * dp_;
    MoeOps(moe_group_tokens_, &ops_);
    elementwise(Stage::kResidual, t * d, 3 * elem, 1);
    op_layers_.resize(ops_.size(), LayerSet::kMoe);
    if (model_.DenseFfLayers() > 0) {
      dense_ff(ff_);
      allreduce();
      elementwise(Stage::kResidual, t * d, 3 * elem, 1);
      op_layers_.resize(ops_.size(), LayerSet::kDenseFf);
    }
  }
  layer_ops_ = ops_.size();

  // Once per iteration.
  elementwise(Stage::kEmbedding, t * d, 2 * elem, 0);  // gather rows
  elementwise(Stage::kFinalNorm, batch.emitting * d, 2 * elem, 5);
  gemm(Stage::kLmHead, batch.emitting, (model_.vocab_size + tp_ - 1) / tp_, d);
  op_layers_.resize(ops_.size(), LayerSet::kOnce);
  SetCounts(t, static_cast<int64_t>(batch.entries.size()), &ops_, 0);
}

IterationPlanner::MlaRows IterationPlanner::MlaRowsOf(const Batch& batch) const {
  MlaRows rows;
  if (!model_.mla()) return rows;
  // vLLM's MLA backends take a request with one new token down the decode
  // path and any longer chunk down the prefill path.
  for (const BatchEntry& e : batch.entries) {
    if (e.new_tokens == 1) {
      ++rows.decode;
    } else {
      rows.prefill_context += e.past_tokens + e.new_tokens;
    }
  }
  return rows;
}

void IterationPlanner::MoeOps(int64_t group_tokens, std::vector<Op>* out) const {
  const int64_t g = MoeGroup();
  const double elem = model_.act_bytes_per_element;
  Op op;
  op.kind = OpKind::kMoe;
  op.stage = Stage::kMoe;
  op.k = model_.d_model;
  op.experts_total = model_.num_experts;
  op.top_k = static_cast<int32_t>(model_.experts_per_token);
  op.expert_matrices = model_.ff_kind == devices::FfKind::kSwiGlu ? 3 : 2;
  // Every rank of the group sees the group's tokens (all-gathered, or
  // replicated within a TP group).
  op.m = group_tokens;
  const double tokens = static_cast<double>(group_tokens);
  if (config_.expert_parallel && routing_ != nullptr) {
    // Whole experts on each rank: the slowest rank's expected load, the
    // one with the most assignments or the one touching the most experts
    // (the same rank unless routing is skewed).
    op.n = model_.expert_d_ff;
    if (routing_->uniform()) {
      const devices::ExpertLoad busiest = routing_->Busiest(tokens);
      op.routed = busiest.assignments;
      op.experts_touched = busiest.experts_touched;
    } else {
      // Skewed: the slower of the two candidates, memoised per count (the
      // search over ranks costs an exp per expert).
      auto hit = slowest_load_.find(group_tokens);
      if (hit == slowest_load_.end()) {
        const devices::ExpertLoad busiest = routing_->Busiest(tokens);
        devices::ExpertLoad pick = busiest;
        const int64_t widest = routing_->ranks() > 1 ? routing_->MostTouched(tokens) : 0;
        if (widest != routing_->busiest_rank() && device_ != nullptr) {
          const devices::ExpertLoad wide = routing_->Rank(widest, tokens);
          Op one = op, other = op;
          one.routed = busiest.assignments;
          one.experts_touched = busiest.experts_touched;
          other.routed = wide.assignments;
          other.experts_touched = wide.experts_touched;
          const Op both[2] = {one, other};
          devices::Cost c[2];
          if (device_->Estimate(both, absl::MakeSpan(c, 2)).ok() && c[1].time_s > c[0].time_s) {
            pick = wide;
          }
        }
        if (slowest_load_.size() > 65536) slowest_load_.clear();
        hit = slowest_load_.emplace(group_tokens, pick).first;
      }
      op.routed = hit->second.assignments;
      op.experts_touched = hit->second.experts_touched;
    }
  } else {
    // Every expert on every rank, 1/g of its width.
    op.n = model_.expert_d_ff / g;
    op.routed = tokens * static_cast<double>(model_.experts_per_token);
    op.experts_touched = routing_ != nullptr ? routing_->Rank(0, tokens).experts_touched : 0;
  }
  out->push_back(op);
  if (g > 1) {
    // Dispatch and combine: all-gather the group's tokens, reduce-scatter
    // the outputs (vLLM's allgather_reducescatter; with one DP rank, TP's
    // all-reduce): the two halves of one ring all-reduce.
    Op ar;
    ar.kind = OpKind::kAllReduce;
    ar.stage = Stage::kMoeDispatch;
    ar.bytes = tokens * static_cast<double>(model_.d_model) * elem;
    ar.participants = static_cast<int>(g);
    out->push_back(ar);
  }
}

absl::StatusOr<IterationCost> IterationPlanner::PlanIdleRank(int64_t group_tokens) {
  IterationCost out;
  if (!model_.moe() || group_tokens <= 0) return out;
  idle_ops_.clear();
  MoeOps(group_tokens, &idle_ops_);
  idle_costs_.assign(idle_ops_.size(), devices::Cost{});
  RETURN_IF_ERROR(device_->Estimate(idle_ops_, absl::MakeSpan(idle_costs_)));
  idle_sets_.assign(idle_ops_.size(), LayerSet::kMoe);
  AddUp(idle_ops_, idle_costs_, idle_sets_, &out);
  return out;
}

void IterationPlanner::AddUp(absl::Span<const Op> ops, absl::Span<const devices::Cost> costs,
                             absl::Span<const LayerSet> sets, IterationCost* out) const {
  // The running total in a local (not behind `out`, which the stages
  // alias), the layer counts looked up once: the same additions in the
  // same order, so the same sums to the bit.
  const double layers[] = {
      LayersOf(LayerSet::kEvery),         LayersOf(LayerSet::kMoe),
      LayersOf(LayerSet::kDenseFf),       LayersOf(LayerSet::kOnce),
      LayersOf(LayerSet::kFullAttention), LayersOf(LayerSet::kSlidingAttention)};
  static_assert(static_cast<int>(LayerSet::kSlidingAttention) == 5, "one count per set");
  devices::Cost total = out->total;
  for (size_t i = 0; i < ops.size(); ++i) {
    const devices::Cost c = costs[i].Scaled(layers[static_cast<int>(sets[i])]);
    out->stages[static_cast<int>(ops[i].stage)] += c;
    total += c;
  }
  out->total = total;
  out->time_s = out->total.time_s;
  out->xpu_busy_s = out->time_s;
  out->xpu_collective_s = out->stages[static_cast<int>(Stage::kAllReduce)].time_s +
                          out->stages[static_cast<int>(Stage::kMoeDispatch)].time_s;
  // Energy and traffic of the whole group; time is one xPU's.
  out->total = out->total.Scaled(static_cast<double>(tp_));
  out->total.time_s = out->time_s;
}

double IterationPlanner::LayersOf(LayerSet set) const {
  switch (set) {
    case LayerSet::kEvery:
      return static_cast<double>(model_.num_layers);
    case LayerSet::kMoe:
      return static_cast<double>(model_.MoeLayers());
    case LayerSet::kDenseFf:
      return static_cast<double>(model_.DenseFfLayers());
    case LayerSet::kOnce:
      return 1;
    case LayerSet::kFullAttention:
      return static_cast<double>(model_.FullAttentionLayers());
    case LayerSet::kSlidingAttention:
      return static_cast<double>(model_.SlidingLayers());
  }
  return 1;
}

bool IterationPlanner::InLayer(LayerSet set, int32_t layer) const {
  switch (set) {
    case LayerSet::kEvery:
      return true;
    case LayerSet::kMoe:
      return layer >= model_.DenseFfLayers();
    case LayerSet::kDenseFf:
      return layer < model_.DenseFfLayers();
    case LayerSet::kOnce:
      return false;
    case LayerSet::kFullAttention:
    case LayerSet::kSlidingAttention: {
      const bool full =
          model_.full_attention_interval > 0 && (layer + 1) % model_.full_attention_interval == 0;
      return full == (set == LayerSet::kFullAttention);
    }
  }
  return false;
}

void IterationPlanner::SetCounts(int64_t tokens, int64_t sequences, std::vector<Op>* ops,
                                 size_t from) {
  for (size_t i = from; i < ops->size(); ++i) {
    (*ops)[i].tokens = tokens;
    (*ops)[i].sequences = sequences;
  }
}

const char* TrackName(Track t) {
  switch (t) {
    case Track::kXpu:
      return "xpu";
    case Track::kLinkOut:
      return "link out";
    case Track::kDevice:
      return "device";
    case Track::kLinkBack:
      return "link back";
    case Track::kKvCopy:
      return "link kv copy";
  }
  return "?";
}

absl::StatusOr<IterationCost> IterationPlanner::Plan(const Batch& batch, std::vector<Span>* spans,
                                                     int32_t fold_from_layer) {
  spans->clear();
  spans_ = spans;
  fold_from_ = fold_from_layer;
  fold_lo_.fill(std::numeric_limits<double>::infinity());
  fold_hi_.fill(-std::numeric_limits<double>::infinity());
  auto cost = Plan(batch);
  for (int t = 0; t < kNumTracks; ++t) {
    if (fold_hi_[t] > fold_lo_[t]) {
      spans->push_back(
          {static_cast<Track>(t), "layers", fold_from_layer, -1, fold_lo_[t], fold_hi_[t]});
    }
  }
  spans_ = nullptr;
  fold_from_ = kNoFold;
  return cost;
}

absl::StatusOr<IterationCost> IterationPlanner::Plan(const Batch& batch) {
  IterationCost out;
  RETURN_IF_ERROR(Plan(batch, &out));
  return out;
}

absl::Status IterationPlanner::Plan(const Batch& batch, IterationCost* out) {
  *out = IterationCost{};
  if (batch.empty()) return absl::OkStatus();
  if (config_.attention != nullptr) return PlanWithDevice(batch, out);
  // Every op but the attention depends on the token counts only: a batch
  // with the same counts as the last re-costs its attention alone (the
  // device is pure, and costs are per op).
  // MoE layers also depend on the group's tokens: when only those changed,
  // the MoE ops are rebuilt and re-costed in place.
  // (MLA's up-projections also depend on the decode and prefill rows.)
  const MlaRows rows = MlaRowsOf(batch);
  const std::array<int64_t, 6> key = {
      batch.prefill_tokens, batch.decode_tokens,
      batch.emitting,       static_cast<int64_t>(batch.entries.size()),
      rows.decode,          rows.prefill_context};
  if (ops_valid_ && SameKey(key, ops_key_)) {
    seqs_.clear();
    for (const BatchEntry& e : batch.entries) {
      seqs_.push_back({e.new_tokens, e.past_tokens, e.request_id, e.final_tokens});
    }
    ops_[attention_at_].seqs = seqs_;
    RETURN_IF_ERROR(device_->Estimate(absl::MakeConstSpan(&ops_[attention_at_], 1),
                                      absl::MakeSpan(&costs_[attention_at_], 1)));
    if (window_at_ >= 0) {
      const size_t w = static_cast<size_t>(window_at_);
      ops_[w].seqs = seqs_;
      RETURN_IF_ERROR(
          device_->Estimate(absl::MakeConstSpan(&ops_[w], 1), absl::MakeSpan(&costs_[w], 1)));
    }
    const int64_t group =
        group_tokens_ > 0 ? group_tokens_ : (batch.prefill_tokens + batch.decode_tokens) * dp_;
    if (moe_at_ >= 0 && group != moe_group_tokens_) {
      idle_ops_.clear();
      MoeOps(group, &idle_ops_);
      const size_t at = static_cast<size_t>(moe_at_);
      for (size_t i = 0; i < idle_ops_.size(); ++i) {
        const int64_t tokens = ops_[at + i].tokens, sequences = ops_[at + i].sequences;
        ops_[at + i] = idle_ops_[i];
        ops_[at + i].tokens = tokens;
        ops_[at + i].sequences = sequences;
      }
      RETURN_IF_ERROR(device_->Estimate(absl::MakeConstSpan(&ops_[at], idle_ops_.size()),
                                        absl::MakeSpan(&costs_[at], idle_ops_.size())));
      moe_group_tokens_ = group;
    }
  } else {
    ops_valid_ = false;
    BuildLayerOps(batch);
    costs_.assign(ops_.size(), devices::Cost{});
    RETURN_IF_ERROR(device_->Estimate(ops_, absl::MakeSpan(costs_)));
    ops_key_ = key;
    ops_valid_ = true;
  }
  if (spans_ != nullptr) {
    // The ops run one after another on each xPU, layer after layer.
    double at = 0;
    for (int32_t l = 0; l < model_.num_layers; ++l) {
      for (size_t i = 0; i < layer_ops_; ++i) {
        if (!InLayer(op_layers_[i], l)) continue;
        Emit(Track::kXpu, devices::StageName(ops_[i].stage), l, -1, at, at + costs_[i].time_s);
        at += costs_[i].time_s;
      }
    }
    for (size_t i = layer_ops_; i < ops_.size(); ++i) {
      Emit(Track::kXpu, devices::StageName(ops_[i].stage), -1, -1, at, at + costs_[i].time_s);
      at += costs_[i].time_s;
    }
  }
  AddUp(ops_, costs_, op_layers_, out);
  return absl::OkStatus();
}

void IterationPlanner::XpuLayerOps(int64_t tokens,
                                   absl::Span<const devices::AttentionSeq> xpu_seqs,
                                   double ff_xpu_share, int groups,
                                   std::vector<Op>* out) const {
  const int64_t t = tokens, d = model_.d_model;
  const double elem = model_.act_bytes_per_element;
  const int64_t qkv_n = (heads_ + 2 * kv_heads_) * model_.d_head;
  const int64_t proj_k = heads_ * model_.d_head;
  const int64_t ff_n = static_cast<int64_t>(
      std::llround(static_cast<double>(model_.FfInputMatrices() * ff_) * ff_xpu_share));
  const int64_t ff_k = static_cast<int64_t>(
      std::llround(static_cast<double>(ff_) * ff_xpu_share));
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

void IterationPlanner::EmitPostAndFf(int32_t l, double at, const XpuLayer& x,
                                     double kv_copy_s, double ff_link_s, double dev_ff_s) {
  // The prefill's K/V copy to the device overlaps everything after the
  // attention block.
  Emit(Track::kKvCopy, "kv copy", l, -1, at, at + kv_copy_s);
  double xp = at;
  for (const auto& [name, c] : {std::pair<std::string_view, const devices::Cost*>{
                                    "all-reduce", &x.allreduce},
                                {"residual", &x.residual}, {"norm", &x.ff_norm}}) {
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
  for (const auto& [name, c] : {std::pair<std::string_view, const devices::Cost*>{
                                    "all-reduce", &x.allreduce},
                                {"residual", &x.residual}}) {
    Emit(Track::kXpu, name, l, -1, xp, xp + c->time_s);
    xp += c->time_s;
  }
}

void IterationPlanner::EmitSerialLayer(int32_t l, double at, const XpuLayer& x, double send_s,
                                       double attention_s, double recv_s, double kv_copy_s,
                                       double ff_link_s, double dev_ff_s) {
  double xp = at;
  for (const auto& [name, c] : {std::pair<std::string_view, const devices::Cost*>{
                                    "norm", &x.norm},
                                {"qkv", &x.qkv}, {"attention (prefill)", &x.xattn}}) {
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

absl::Status IterationPlanner::PlanWithDevice(const Batch& batch, IterationCost* result) {
  using devices::Cost;
  const devices::Device* dev = config_.attention;
  const double elem = model_.act_bytes_per_element;
  const double kv_elem = model_.kv_bytes_per_element;
  const int64_t H = model_.num_heads, KV = model_.num_kv_heads, dh = model_.d_head;
  const int64_t d = model_.d_model;

  DeviceScratch& s = scratch_;
  const DeviceShape sh = ShapeWithDevice(batch, &s);
  const int64_t t = sh.t;
  const std::vector<devices::AttentionSeq>& pre_seqs = s.pre_seqs;
  const int64_t prefill_tokens = sh.prefill_tokens;
  const int64_t b_dec = sh.b_dec;
  const OverlapPolicy policy = sh.policy;
  const bool head_level =
      policy == OverlapPolicy::kHeadLevel || policy == OverlapPolicy::kHeadLevelFf;
  const int groups = sh.groups;
  const double f = sh.f;

  IterationCost& out = *result;  // zeroed by Plan
  out.ff_device_fraction = f;
  const double layers = static_cast<double>(model_.num_layers);
  const double tp = static_cast<double>(tp_);
  Cost xpu_energy, dev_energy;  // per layer: one xPU / the device
  double link_bytes = 0;         // per layer, whole group
  double layer_time = 0, xpu_busy = 0, dev_busy = 0, link_busy = 0;
  double batch_level_time = -1;  // whole-iteration chain of kBatchLevel

  // One Estimate call per device per iteration: every xPU op (the layer
  // pieces, both halves under batch-level pipelining, and the tail), then
  // every device op (the head groups' attention and the FF share). Costs
  // are per op, so batching them changes no result.
  const int64_t half = sh.half;
  std::vector<Op>& xpu_ops = xpu_ops_;
  std::vector<Op>& dev_ops = dev_ops_;
  // The xPU ops depend on the policy, the token counts, the FF split, the
  // head groups and the prefill sequences only: a decode batch of the same
  // size as the last iteration's asks the same question, and the xPU device
  // (pure: same ops, same costs) is not asked again.
  std::vector<Cost>& xpu_costs = xpu_costs_;
  const std::array<int64_t, 7> xpu_key = {static_cast<int64_t>(policy), t, batch.emitting,
                                          absl::bit_cast<int64_t>(f), groups, b_dec,
                                          static_cast<int64_t>(batch.entries.size())};
  const bool xpu_same = xpu_valid_ && SameKey(xpu_key, xpu_key_) &&
                        pre_seqs.size() == xpu_pre_.size() &&
                        std::equal(pre_seqs.begin(), pre_seqs.end(), xpu_pre_.begin(),
                                   [](const devices::AttentionSeq& x,
                                      const devices::AttentionSeq& y) {
                                     return x.new_tokens == y.new_tokens &&
                                            x.past_tokens == y.past_tokens &&
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
  const size_t tail_at = xpu_ops.size() - kTailOps;
  const int att_at = att_at_, att_b_at = att_b_at_, ff_at = ff_at_;
  std::vector<Cost>& dev_costs = dev_costs_;
  dev_costs.assign(dev_ops.size(), Cost{});
  if (!dev_ops.empty()) RETURN_IF_ERROR(dev->Estimate(dev_ops, absl::MakeSpan(dev_costs)));
  // The g attention costs of ops starting at `at` (zero without sequences).
  auto attention_costs = [&](int at, int g, std::vector<Cost>* c) -> const std::vector<Cost>& {
    c->assign(g, Cost{});
    if (at >= 0) std::copy(dev_costs.begin() + at, dev_costs.begin() + at + g, c->begin());
    return *c;
  };

  if (policy != OverlapPolicy::kBatchLevel) {
    const XpuLayer x = XpuLayerFrom(xpu_costs, !pre_seqs.empty());
    const std::vector<Cost>& att = attention_costs(att_at, groups, &att_);
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
    const double ff_block =
        x.ff_norm.time_s + std::max(x.ff.time_s, ff_link + dev_ff.time_s) +
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
    // The transfers (x2g) the rule leaves exposed beside an attention of a.
    auto exposed_x2g = [m](double x2g, double a) {
      return a > x2g ? m * x2g : x2g - (1 - m) * a;
    };
    if (!head_level) {
      // Serially, the authors still hide the transfers behind the
      // attention but for one head's share.
      double send_s = send_t, recv_s = recv_t;
      if (authors && b_dec > 0 && send_t + recv_t > 0) {
        const double x2g = send_t + recv_t;
        const double exposed = exposed_x2g(x2g, att_total);
        send_s = exposed * send_t / x2g;
        recv_s = exposed - send_s;
      }
      const double attn_path = b_dec > 0 ? send_s + att_total + recv_s : 0.0;
      const double post = x.proj.time_s + x.allreduce.time_s + x.residual.time_s;
      layer_time = x.norm.time_s + x.qkv.time_s + x.xattn.time_s + attn_path + post +
                   ff_block + std::max(0.0, kv_copy_time - (post + ff_block));
      xpu_busy = x.norm.time_s + x.qkv.time_s + x.xattn.time_s + post + x.ff_norm.time_s +
                 x.ff.time_s + x.allreduce.time_s + x.residual.time_s;
      if (spans_ != nullptr) {
        for (int32_t l = 0; l < model_.num_layers; ++l) {
          EmitSerialLayer(l, l * layer_time, x, send_s, att_total, recv_s, kv_copy_time, ff_link,
                          dev_ff.time_s);
        }
      }
    } else if (authors) {
      // Head-level pipelining as the authors time it (OverlapRule): QKV and
      // projection (FC) against the device's attention (A) and the link (X).
      const double qkv = x.qkv.time_s, proj = x.proj.time_s, fc = qkv + proj;
      const double a = att_total, x2g = send_t + recv_t;
      double core;  // QKV to the projection's end
      if (a > fc) {
        core = m * fc + exposed_x2g(x2g, a) + a;
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
          EmitPostAndFf(l, c0 + core, x, kv_copy_time, ff_link, dev_ff.time_s);
        }
      }
      xpu_busy = x.norm.time_s + x.qkv.time_s + x.xattn.time_s + x.proj.time_s + post +
                 x.ff_norm.time_s + x.ff.time_s + x.allreduce.time_s + x.residual.time_s;
    } else {
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
      const double attn_path =
          b_dec > 0 ? LinkTime(send) + att_total + LinkTime(recv) : 0.0;
      const double serial_time =
          x.norm.time_s + x.qkv.time_s + x.xattn.time_s + attn_path + x.proj.time_s + post +
          ff_block + std::max(0.0, kv_copy_time - (x.proj.time_s + post + ff_block));
      const bool pipelined = layer_time < serial_time;
      layer_time = std::min(layer_time, serial_time);
      if (spans_ != nullptr) {
        for (int32_t l = 0; l < model_.num_layers; ++l) {
          const double at = l * layer_time;
          if (!pipelined) {
            EmitSerialLayer(l, at, x, b_dec > 0 ? LinkTime(send) : 0, att_total,
                            b_dec > 0 ? LinkTime(recv) : 0, kv_copy_time, ff_link,
                            dev_ff.time_s);
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
          EmitPostAndFf(l, xp, x, kv_copy_time, ff_link, dev_ff.time_s);
        }
      }
      xpu_busy = x.norm.time_s + x.qkv.time_s + x.xattn.time_s + x.proj.time_s + post +
                 x.ff_norm.time_s + x.ff.time_s + x.allreduce.time_s + x.residual.time_s;
    }
    dev_busy = att_total + dev_ff.time_s;
    link_busy = (b_dec > 0 ? LinkTime(send) + LinkTime(recv) : 0.0) + kv_copy_time + ff_link;
    // Energy and traffic.
    for (const Cost* c : {&x.norm, &x.ff_norm, &x.xattn, &x.allreduce, &x.allreduce,
                          &x.residual, &x.residual, &x.ff}) {
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
    stage(Stage::kFf1, x.ff, 1);  // FF1 + activation + FF2 on the xPUs
    stage(Stage::kFf2, dev_ff, 1);  // the device's FF share
  } else {
    // Batch-level pipelining: halves A and B, chained across layers.
    const XpuLayer xa = XpuLayerFrom(absl::MakeConstSpan(xpu_costs).subspan(0, kXpuLayerOps),
                                     false);
    const XpuLayer xb = XpuLayerFrom(
        absl::MakeConstSpan(xpu_costs).subspan(kXpuLayerOps, kXpuLayerOps), false);
    const std::vector<Cost>& att_a = attention_costs(att_at, 1, &att_);
    const std::vector<Cost>& att_b = attention_costs(att_b_at, 1, &att_b_);
    auto pre = [](const XpuLayer& x) { return x.norm.time_s + x.qkv.time_s; };
    auto post = [](const XpuLayer& x) {
      return x.proj.time_s + 2 * (x.allreduce.time_s + x.residual.time_s) +
             x.ff_norm.time_s + x.ff.time_s;
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
      for (const Cost* c : {&x->norm, &x->qkv, &x->proj, &x->allreduce, &x->allreduce,
                            &x->residual, &x->residual, &x->ff_norm, &x->ff}) {
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
  return absl::OkStatus();
}

absl::StatusOr<int64_t> MaxBatchWithinSlo(IterationPlanner& planner, double tbt_s,
                                          int64_t context_tokens, int64_t max_batch, int64_t hint) {
  auto meets = [&](int64_t b) -> absl::StatusOr<bool> {
    ASSIGN_OR_RETURN(IterationCost c, planner.Plan(UniformBatch(b, 1, context_tokens)));
    return c.time_s <= tbt_s;
  };
  int64_t lo = 0, hi = max_batch;  // lo meets the SLO (0 trivially), above hi none does
  if (hint >= 1 && hint <= max_batch) {
    // Gallop from the hint (a neighbouring context's cap: usually the
    // answer or next to it) to a bracket, then bisect it.
    ASSIGN_OR_RETURN(bool ok, meets(hint));
    if (ok) {
      lo = hint;
      for (int64_t step = 1; lo < hi; step *= 2) {
        const int64_t b = std::min(hi, lo + step);
        ASSIGN_OR_RETURN(ok, meets(b));
        if (!ok) {
          hi = b - 1;
          break;
        }
        lo = b;
      }
    } else {
      hi = hint - 1;
      for (int64_t step = 1; lo < hi; step *= 2) {
        const int64_t b = std::max<int64_t>(1, hi - step + 1);
        ASSIGN_OR_RETURN(ok, meets(b));
        if (ok) {
          lo = b;
          break;
        }
        hi = b - 1;
      }
    }
  }
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    ASSIGN_OR_RETURN(bool ok, meets(mid));
    if (ok) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

}  // namespace servesim::scheduler
