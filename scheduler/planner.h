// The iteration planner: lowers one batched iteration of a tensor-parallel
// replica to device ops and adds up their costs.
//
// Contract: pure (no clock, no state across calls besides reused buffers),
// deterministic, not thread-safe (one planner per replica engine).
//
// One decoder layer on ONE xPU of a TP group of t (Megatron-LM partitioning,
// Shoeybi et al. 2019): QKV and FF1 split by columns, projection and FF2 by
// rows, so each layer ends its attention and FF blocks with an all-reduce of
// the [tokens x d_model] activations. Heads split evenly (num_heads % t ==
// 0); KV heads are split, or replicated when there are fewer than t (GQA).
//   norm -> QKV -> attention (each sequence with its own KV length) ->
//   projection -> all-reduce -> residual -> norm -> FF1 (gate+up for SwiGLU)
//   -> activation -> FF2 -> all-reduce -> residual
// The layer cost times num_layers, plus once per iteration the embedding
// gather, the final norm and the LM head over the rows that emit a token,
// is the iteration. Ops run one after another (serial overlap policy); the
// xPUs of the group run in lockstep, so time is one xPU's time and energy is
// t times one xPU's.
#ifndef SERVESIM_SCHEDULER_PLANNER_H_
#define SERVESIM_SCHEDULER_PLANNER_H_

#include <vector>

#include "absl/status/statusor.h"
#include "devices/device.h"
#include "devices/model.h"
#include "devices/ops.h"
#include "scheduler/batching.h"

namespace servesim::scheduler {

struct IterationCost {
  double time_s = 0;
  devices::Cost total;          // whole replica (energy summed over xPUs)
  devices::StageCosts stages;   // per stage, one xPU, all layers
};

class IterationPlanner {
 public:
  // `device` is borrowed and must outlive the planner.
  IterationPlanner(const devices::ModelDims& model, int64_t tensor_parallel,
                   const devices::Device* device);

  // Costs `batch`. Errors only if the device rejects an op.
  absl::StatusOr<IterationCost> Plan(const Batch& batch);

  // Per-xPU sizes (exposed for tests and for the memory check).
  int64_t heads_per_xpu() const { return heads_; }
  int64_t kv_heads_per_xpu() const { return kv_heads_; }
  int64_t ff_per_xpu() const { return ff_; }
  // Activation workspace one xPU reserves for an iteration of `tokens`
  // tokens: the largest live set of one layer (the residual stream, the QKV
  // output and the FF intermediate, in the model's element type), counted
  // twice for producer and consumer buffers.
  double ActivationBytesPerXpu(int64_t tokens) const;
  // KV bytes per token on one xPU.
  int64_t KvBytesPerTokenPerXpu() const;
  // Model weights resident on one xPU (embedding and LM head split too).
  double WeightBytesPerXpu() const;

  const std::vector<devices::Op>& last_ops() const { return ops_; }

 private:
  void BuildLayerOps(const Batch& batch);

  devices::ModelDims model_;
  int64_t tp_;
  const devices::Device* device_;
  int64_t heads_, kv_heads_, ff_;
  std::vector<devices::AttentionSeq> seqs_;
  std::vector<devices::Op> ops_;
  std::vector<devices::Cost> costs_;
  size_t layer_ops_ = 0;  // ops_[0, layer_ops_) repeat per layer
};

}  // namespace servesim::scheduler

#endif  // SERVESIM_SCHEDULER_PLANNER_H_
