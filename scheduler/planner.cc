#include "scheduler/planner.h"

#include <algorithm>

#include "common/status_macros.h"

namespace servesim::scheduler {

using devices::Op;
using devices::OpKind;
using devices::Stage;

IterationPlanner::IterationPlanner(const devices::ModelDims& model,
                                   int64_t tensor_parallel,
                                   const devices::Device* device)
    : model_(model), tp_(tensor_parallel), device_(device) {
  heads_ = model_.num_heads / tp_;
  kv_heads_ = std::max<int64_t>(1, model_.num_kv_heads / tp_);
  ff_ = model_.d_ff / tp_;
}

int64_t IterationPlanner::KvBytesPerTokenPerXpu() const {
  return 2 * model_.num_layers * kv_heads_ * model_.d_head *
         model_.bytes_per_element;
}

double IterationPlanner::WeightBytesPerXpu() const {
  return model_.WeightBytes() / static_cast<double>(tp_);
}

double IterationPlanner::ActivationBytesPerXpu(int64_t tokens) const {
  const double per_token =
      model_.d_model +
      static_cast<double>(heads_ + 2 * kv_heads_) * model_.d_head +
      static_cast<double>(model_.FfInputMatrices() * ff_);
  return 2.0 * per_token * static_cast<double>(tokens) * model_.bytes_per_element;
}

void IterationPlanner::BuildLayerOps(const Batch& batch) {
  ops_.clear();
  seqs_.clear();
  for (const BatchEntry& e : batch.entries) {
    seqs_.push_back({e.new_tokens, e.past_tokens});
  }
  const int64_t t = batch.prefill_tokens + batch.decode_tokens;
  const int64_t d = model_.d_model;
  const double elem = model_.bytes_per_element;
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
  gemm(Stage::kQkv, t, (heads_ + 2 * kv_heads_) * model_.d_head, d);
  {
    Op op;
    op.kind = OpKind::kAttention;
    op.stage = Stage::kAttention;
    op.heads = heads_;
    op.kv_heads = kv_heads_;
    op.d_head = model_.d_head;
    op.seqs = seqs_;
    ops_.push_back(op);
  }
  gemm(Stage::kProjection, t, d, heads_ * model_.d_head);
  allreduce();
  elementwise(Stage::kResidual, t * d, 3 * elem, 1);  // a + b -> c
  elementwise(Stage::kNorm, t * d, 2 * elem, 5);
  gemm(Stage::kFf1, t, model_.FfInputMatrices() * ff_, d);
  if (model_.ff_kind == devices::FfKind::kSwiGlu) {
    // silu(gate) * up: read two, write one; ~6 FLOPs.
    elementwise(Stage::kActivation, t * ff_, 3 * elem, 6);
  } else {
    // GELU (tanh form): read, write; ~8 FLOPs.
    elementwise(Stage::kActivation, t * ff_, 2 * elem, 8);
  }
  gemm(Stage::kFf2, t, d, ff_);
  allreduce();
  elementwise(Stage::kResidual, t * d, 3 * elem, 1);
  layer_ops_ = ops_.size();

  // Once per iteration.
  elementwise(Stage::kEmbedding, t * d, 2 * elem, 0);  // gather rows
  elementwise(Stage::kNorm, batch.emitting * d, 2 * elem, 5);
  gemm(Stage::kLmHead, batch.emitting, (model_.vocab_size + tp_ - 1) / tp_, d);
}

absl::StatusOr<IterationCost> IterationPlanner::Plan(const Batch& batch) {
  IterationCost out;
  if (batch.empty()) return out;
  BuildLayerOps(batch);
  costs_.assign(ops_.size(), devices::Cost{});
  RETURN_IF_ERROR(device_->Estimate(ops_, absl::MakeSpan(costs_)));
  const double layers = static_cast<double>(model_.num_layers);
  for (size_t i = 0; i < ops_.size(); ++i) {
    const devices::Cost c =
        i < layer_ops_ ? costs_[i].Scaled(layers) : costs_[i];
    out.stages[static_cast<int>(ops_[i].stage)] += c;
    out.total += c;
  }
  out.time_s = out.total.time_s;
  // Energy and traffic of the whole group; time is one xPU's.
  const double tp = static_cast<double>(tp_);
  out.total = out.total.Scaled(tp);
  out.total.time_s = out.time_s;
  return out;
}

}  // namespace servesim::scheduler
