// The iteration planner's xPU-only path, and what both paths share: the
// per-xPU sizes, the layer's ops (BuildLayerOps, MoeOps), their sum over the
// layers (AddUp), and Plan, which re-costs only what changed since the last
// batch and hands a batch for a replica with an attention device to
// PlanWithDevice (planner_offload.cc lowers it, planner_overlap.cc times it).
// The contract is planner.h's.
#include "scheduler/planner.h"

#include <algorithm>
#include <array>

#include "common/same_key.h"
#include "common/status_macros.h"

namespace servesim::scheduler {

using devices::Op;
using devices::OpKind;
using devices::Stage;

const char* OverlapPolicyName(OverlapPolicy p) {
  switch (p) {
    case OverlapPolicy::kSerial:
      return "serial";
    case OverlapPolicy::kHeadLevel:
      return "head_level";
    case OverlapPolicy::kHeadLevelFf:
      return "head_level_ff";
    case OverlapPolicy::kBatchLevel:
      return "batch_level";
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

// BuildLayerOps' builders: one op appended to `ops`.
void PushElementwise(Stage s, int64_t elements, double bytes_per_element, double flops_per_element,
                     std::vector<Op>* ops) {
  Op op;
  op.kind = OpKind::kElementwise;
  op.stage = s;
  op.elements = elements;
  op.bytes_per_element = bytes_per_element;
  op.flops_per_element = flops_per_element;
  ops->push_back(op);
}

void PushGemm(Stage s, int64_t m, int64_t n, int64_t k, std::vector<Op>* ops) {
  Op op;
  op.kind = OpKind::kGemm;
  op.stage = s;
  op.m = m;
  op.n = n;
  op.k = k;
  ops->push_back(op);
}
}  // namespace

IterationPlanner::IterationPlanner(const devices::ModelDims& model, int64_t tensor_parallel,
                                   const devices::Device* device)
    : IterationPlanner(model, XpuOnly(tensor_parallel, device)) {}

IterationPlanner::IterationPlanner(const devices::ModelDims& model, const PlannerConfig& config)
    : model_(model), config_(config), tp_(config.tensor_parallel), device_(config.xpu) {
  heads_ = model_.num_heads / tp_;
  kv_heads_ = std::max<int64_t>(1, model_.num_kv_heads / tp_);
  ff_ = model_.d_ff / tp_;
  dp_ = std::max<int64_t>(1, config_.data_parallel);
  routing_ = config_.routing.get();
}

int64_t IterationPlanner::MoeGroup() const { return dp_ * tp_; }

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
  AttentionBlockOps(t, batch);
  FfBlockOps(t);
  layer_ops_ = ops_.size();

  // Once per iteration.
  PushElementwise(Stage::kEmbedding, t * d, 2 * elem, 0, &ops_);  // gather rows
  PushElementwise(Stage::kFinalNorm, batch.emitting * d, 2 * elem, 5, &ops_);
  PushGemm(Stage::kLmHead, batch.emitting, (model_.vocab_size + tp_ - 1) / tp_, d, &ops_);
  op_layers_.resize(ops_.size(), LayerSet::kOnce);
  SetCounts(t, static_cast<int64_t>(batch.entries.size()), &ops_, 0);
}

void IterationPlanner::AttentionBlockOps(int64_t t, const Batch& batch) {
  const int64_t d = model_.d_model;
  const double elem = model_.act_bytes_per_element;
  // LayerNorm/RMSNorm: read x, write y; ~5 FLOPs per element (mean,
  // variance, scale, shift).
  PushElementwise(Stage::kNorm, t * d, 2 * elem, 5, &ops_);
  const MlaRows rows = MlaRowsOf(batch);
  if (!model_.mla()) {
    PushGemm(Stage::kQkv, t, (heads_ + 2 * kv_heads_) * model_.d_head, d, &ops_);
  } else {
    // MLA the way vLLM runs it (DeepSeek-V3's absorbed decode): the query
    // and KV down-projections (replicated over TP) and their norms, the
    // query up-projection; decode tokens fold W_UK into the query
    // ([t_dec x dh] x [dh x c] per head) and attend over the latent;
    // prefill tokens up-project their whole context's latents to per-head
    // keys and values (kv_b_proj) and attend as ordinary heads.
    const int64_t c = model_.kv_lora_rank, r = model_.rope_head_dim;
    const int64_t q_lora = model_.q_lora_rank;
    PushGemm(Stage::kQkv, t, q_lora + c + r, d, &ops_);
    PushElementwise(Stage::kNorm, t * (q_lora + c), 2 * elem, 5, &ops_);
    if (q_lora > 0) {
      PushGemm(Stage::kQkv, t, heads_ * (model_.d_head + r), q_lora, &ops_);
    } else {
      PushGemm(Stage::kQkv, t, heads_ * (model_.d_head + r), d, &ops_);
    }
    PushGemm(Stage::kQkv, rows.decode, heads_ * c, model_.d_head, &ops_);
    PushGemm(Stage::kQkv, rows.prefill_context, heads_ * (model_.d_head + model_.dv()), c, &ops_);
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
    PushGemm(Stage::kProjection, rows.decode, heads_ * model_.dv(), model_.kv_lora_rank, &ops_);
  }
  PushGemm(Stage::kProjection, t, d, heads_ * model_.dv(), &ops_);
  PushAllReduce(t, &ops_);
  PushElementwise(Stage::kResidual, t * d, 3 * elem, 1, &ops_);  // a + b -> c
  PushElementwise(Stage::kNorm, t * d, 2 * elem, 5, &ops_);
  op_layers_.assign(ops_.size(), LayerSet::kEvery);
  if (window_at_ >= 0) {
    op_layers_[attention_at_] = LayerSet::kFullAttention;
    op_layers_[static_cast<size_t>(window_at_)] = LayerSet::kSlidingAttention;
  }
}

void IterationPlanner::FfBlockOps(int64_t t) {
  const int64_t d = model_.d_model;
  const double elem = model_.act_bytes_per_element;
  if (!model_.moe()) {
    DenseFfOps(t, ff_);
    PushAllReduce(t, &ops_);
    PushElementwise(Stage::kResidual, t * d, 3 * elem, 1, &ops_);
    op_layers_.resize(ops_.size(), LayerSet::kEvery);
  } else {
    // MoE layers: shared experts (a dense FF on the rank's own tokens,
    // split by TP), the routed experts, the exchange with the group.
    if (model_.shared_experts > 0 && t > 0) {
      DenseFfOps(t, model_.shared_experts * model_.expert_d_ff / tp_);
    }
    moe_at_ = static_cast<int>(ops_.size());
    moe_group_tokens_ = group_tokens_ > 0 ? group_tokens_ : t * dp_;
    MoeOps(moe_group_tokens_, &ops_);
    PushElementwise(Stage::kResidual, t * d, 3 * elem, 1, &ops_);
    op_layers_.resize(ops_.size(), LayerSet::kMoe);
    if (model_.DenseFfLayers() > 0) {
      DenseFfOps(t, ff_);
      PushAllReduce(t, &ops_);
      PushElementwise(Stage::kResidual, t * d, 3 * elem, 1, &ops_);
      op_layers_.resize(ops_.size(), LayerSet::kDenseFf);
    }
  }
}

void IterationPlanner::DenseFfOps(int64_t t, int64_t width) {
  const int64_t d = model_.d_model;
  const double elem = model_.act_bytes_per_element;
  PushGemm(Stage::kFf1, t, model_.FfInputMatrices() * width, d, &ops_);
  if (model_.ff_kind == devices::FfKind::kSwiGlu) {
    // silu(gate) * up: read two, write one; ~6 FLOPs.
    PushElementwise(Stage::kActivation, t * width, 3 * elem, 6, &ops_);
  } else {
    // GELU (tanh form): read, write; ~8 FLOPs.
    PushElementwise(Stage::kActivation, t * width, 2 * elem, 8, &ops_);
  }
  PushGemm(Stage::kFf2, t, d, width, &ops_);
}

void IterationPlanner::PushAllReduce(int64_t t, std::vector<Op>* ops) const {
  const int64_t d = model_.d_model;
  const double elem = model_.act_bytes_per_element;
  const double act_bytes = static_cast<double>(t) * d * elem;
  Op op;
  op.kind = OpKind::kAllReduce;
  op.stage = Stage::kAllReduce;
  op.bytes = act_bytes;
  op.participants = static_cast<int>(tp_);
  ops->push_back(op);
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

}  // namespace servesim::scheduler
