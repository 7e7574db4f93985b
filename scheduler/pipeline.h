// Pipeline parallelism inside a replica (docs/models.md, "Pipeline
// parallelism").
//
// vLLM splits the decoder's layers into S stages, one tensor-parallel group
// each, and keeps S batches in flight (its virtual engines: one scheduler
// step per free slot of the batch queue); a batch's requests are in no
// other in-flight batch. Stage j of batch v takes t_j(v): its layers' share
// of the batch's layer time, plus the embedding on the first stage and the
// final norm and LM head on the last; between stages the hidden states and
// the residual (2 x tokens x d_model activations, split over the TP ranks,
// which send in parallel) cross the link between the two groups, x(v).
//
// Steady state, every slot busy: a cycle serves each in-flight batch once
// through every stage. It lasts as long as the longer of
//  - the busiest stage's work, max_j sum_v t_j(v) (throughput bound), and
//  - the slowest batch's round trip, max_v (sum_j t_j(v) + (S-1) x(v)),
//    since a virtual engine schedules its next step only when its batch is
//    back (dependency bound).
// The filling of an empty pipeline is a one-time transient and not part of
// the cycle; a stage's idle share of the cycle is the bubble (uneven
// stages, idle virtual engines, transfers).
#ifndef SERVESIM_SCHEDULER_PIPELINE_H_
#define SERVESIM_SCHEDULER_PIPELINE_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "scheduler/planner.h"

namespace servesim::scheduler {

// Layers per stage as vLLM splits them (get_pp_indices): L / S each, the
// remainder one more each to the stages just before the last (which holds
// the LM head). stages in 1..layers.
std::vector<int64_t> PipelineLayers(int64_t layers, int64_t stages);

// One in-flight batch: its time on each stage and per stage boundary.
struct PipelineStep {
  std::vector<double> stage_s;
  double transfer_s = 0;
};

struct PipelineCycle {
  double time_s = 0;
  double busiest_stage_s = 0;  // max_j sum_v t_j(v)
  double round_trip_s = 0;     // max_v (sum_j t_j(v) + (S-1) x(v))
  double bubble = 0;           // 1 - sum_jv t_j(v) / (S x time_s)
};

// The steady-state cycle of `steps` (the in-flight batches) over `stages`
// stages; every step has `stages` stage times.
PipelineCycle SteadyCycle(absl::Span<const PipelineStep> steps, int64_t stages);

// What a replica's pipeline needs to cut a batch's cost into stages.
struct PipelineConfig {
  std::vector<int64_t> layers;  // per stage; empty: no pipeline
  int64_t num_layers = 0;
  int64_t tensor_parallel = 1;
  double d_model = 0;
  double act_bytes = 2;
  // The link between consecutive stages' xPUs (per xPU): NVLink within a
  // node, the NIC when the stages sit on different nodes.
  double link_bytes_per_s = 0, link_latency_s = 0, link_energy_pj_per_byte = 0;
  bool across_nodes = false;  // the hand-offs leave through the NICs
};

// Stage times of a batch of `tokens` tokens whose whole-model cost on one
// TP group is `cost` (IterationPlanner::Plan), and the per-boundary
// transfer: the layers' time split by each stage's share of the layers,
// the embedding on the first stage, the final norm and LM head on the last.
PipelineStep StepOf(const PipelineConfig& config, const IterationCost& cost, int64_t tokens);
// Bytes one boundary carries for `tokens` tokens (all TP ranks together).
double StageTransferBytes(const PipelineConfig& config, int64_t tokens);

}  // namespace servesim::scheduler

#endif  // SERVESIM_SCHEDULER_PIPELINE_H_
