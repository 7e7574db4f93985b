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
// Mixture-of-experts layers (docs/moe.md) replace the FF block: shared
// experts as a dense FF of their width, then one kMoe op (router and routed
// experts, with the expected load of devices/moe_routing.h on the busiest
// rank) over the whole data-parallel group's tokens, then the exchange with
// the group (one ring all-reduce's worth: all-gather in, reduce-scatter
// out) when the group has more than one xPU; the first dense_layers layers
// keep the dense FF.
// The layer cost times num_layers, plus once per iteration the embedding
// gather, the final norm and the LM head over the rows that emit a token,
// is the iteration. The xPUs of the group run in lockstep, so time is one
// xPU's time and energy is t times one xPU's.
//
// With an attention device (AttAcc, §4-§6) the decode sequences' attention
// runs on the device, fed over the xPU<->device link (each xPU of the group
// sends the Q/K/V of its heads and receives their outputs), while prefill
// attention stays on the xPUs and the prefilled K/V is copied to the device.
// The layer is then a schedule over three resources, xPU, link and device,
// under the overlap policy (§6):
//  - kSerial: QKV, send, attention, receive, projection, FF: each waits.
//  - kHeadLevel: QKV and projection run as `head_groups` tiles; group j's
//    attention starts once its QKV tile is sent and its projection tile once
//    its outputs are back (a list schedule per resource, §6.1, Fig. 11b).
//  - kHeadLevelFf: kHeadLevel plus feed-forward co-processing (§6.2): a share
//    f = BW_dev / (BW_xpu * BS + BW_dev) of FF1 (columns) and FF2 (rows) runs
//    on the device in parallel with the xPUs' share; f is clamped to the
//    partitions placed for the largest and smallest batch.
//  - kBatchLevel: the decode batch runs as two halves; the device works on
//    one half's attention while the xPUs run the other's layers, layer after
//    layer (§6.1, Fig. 11c). Iterations with prefill run serially.
#ifndef SERVESIM_SCHEDULER_PLANNER_H_
#define SERVESIM_SCHEDULER_PLANNER_H_

#include <algorithm>
#include <array>
#include <limits>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "devices/device.h"
#include "devices/model.h"
#include "devices/moe_routing.h"
#include "devices/ops.h"
#include "scheduler/batching.h"

namespace servesim::scheduler {

enum class OverlapPolicy { kSerial, kHeadLevel, kHeadLevelFf, kBatchLevel };
const char* OverlapPolicyName(OverlapPolicy p);
// How an overlapped iteration is timed (cluster.overlap_rule).
//  - kListSchedule: the xPU, the link each way and the device each run
//    their work in order, as the planner lays it out (servesim's model).
//  - kAttAccSimulator: the AttAcc authors' simulator's rule
//    (scale-snu/attacc_simulator, src/system.py `_pipeline`). With m = 1 /
//    (query heads per xPU), FC = QKV + projection, A = the device's
//    attention and X = the link time both ways:
//      serial:      X' = A > X ? m X : X - (1 - m) A;  layer = FC + X' + A
//      head level:  A > FC:           layer = m FC + X' + A
//                   FC >= A, FC > X:  layer = FC + m A + m X
//                   FC >= A, FC <= X: layer = m FC + X + m A
//    (the hidden time leaves QKV and projection 3:1 in the second case).
//    Their softmax, a layer of its own, is dropped by the rule; servesim's
//    devices include it in A. Not for kBatchLevel, which they do not model.
enum class OverlapRule { kListSchedule, kAttAccSimulator };

struct PlannerConfig {
  int64_t tensor_parallel = 1;
  const devices::Device* xpu = nullptr;        // borrowed
  const devices::Device* attention = nullptr;  // borrowed; null: xPUs only
  OverlapPolicy overlap = OverlapPolicy::kSerial;
  OverlapRule overlap_rule = OverlapRule::kListSchedule;
  int head_groups = 8;
  // xPU <-> attention device link, per xPU of the group (the group uses t).
  double link_bytes_per_s = 0;
  double link_latency_s = 0;
  double link_energy_pj_per_byte = 0;
  // Feed-forward co-processing (§6.2): aggregate xPU memory bandwidth, the
  // device's internal GEMV bandwidth, and the batch sizes the weight
  // partitions were placed for.
  double xpu_bandwidth = 0;
  double device_bandwidth = 0;
  int64_t ff_min_batch = 1;
  int64_t ff_max_batch = 1;
  // Mixture of experts (docs/moe.md): data-parallel ranks stepping with this
  // one (the MoE group is data_parallel x tensor_parallel xPUs), whether the
  // experts are split by expert (else by width), and the routing model
  // (shared, immutable; required for MoE models).
  int64_t data_parallel = 1;
  bool expert_parallel = false;
  std::shared_ptr<const devices::ExpertRouting> routing;
};

struct IterationCost {
  double time_s = 0;
  devices::Cost total;  // whole replica (energy summed over xPUs)
  // The attention device's part of `total` (bytes per level, energy; time_s
  // is its busy time). Zero without an attention device.
  devices::Cost device_total;
  // Per stage, all layers: one xPU's ops, plus the device's attention under
  // kAttention and (with an attention device) the xPUs' whole FF block under
  // kFf1 and the device's FF share under kFf2.
  devices::StageCosts stages;
  // Busy time of each resource over the iteration (all layers), and the
  // part of the xPUs' that is collectives (all-reduces, MoE dispatch),
  // during which their SMs mostly wait on the links (docs/energy.md).
  double xpu_busy_s = 0, device_busy_s = 0, link_busy_s = 0;
  double xpu_collective_s = 0;
  double ff_device_fraction = 0;  // share of FF run on the device
  double device_link_bytes = 0;   // over the xPU <-> device link, whole iteration
};

// One span of an iteration's schedule, for the timeline: what ran on which
// resource of the replica, when (seconds from the iteration's start).
// kKvCopy: the prefill's K/V copy to the device, which the model lets
// overlap the link's other transfers.
enum class Track : uint8_t { kXpu, kLinkOut, kDevice, kLinkBack, kKvCopy };
inline constexpr int kNumTracks = 5;
const char* TrackName(Track t);
struct Span {
  Track track = Track::kXpu;
  std::string_view name;  // static: a stage name, "send", "recv", ...
  int32_t layer = -1;     // -1: once per iteration (embedding, LM head)
  int32_t group = -1;     // head group (head-level pipelining) or batch half
  double start_s = 0, end_s = 0;
};

class IterationPlanner {
 public:
  // `device` is borrowed and must outlive the planner.
  IterationPlanner(const devices::ModelDims& model, int64_t tensor_parallel,
                   const devices::Device* device);
  IterationPlanner(const devices::ModelDims& model, const PlannerConfig& config);

  // Costs `batch`. Errors only if the device rejects an op.
  absl::StatusOr<IterationCost> Plan(const Batch& batch);
  // The same into `*out` (overwritten whole; on an error, unspecified): no
  // copy of the cost's ~2 KB of stages, for the engine's every step.
  absl::Status Plan(const Batch& batch, IterationCost* out);
  // MoE models: the tokens of the whole data-parallel group in the coming
  // iteration, which every rank's MoE layers process (0, the default: this
  // rank's tokens times data_parallel, as if every rank were as busy).
  void SetGroupTokens(int64_t tokens) { group_tokens_ = tokens; }
  int64_t group_tokens() const { return group_tokens_; }
  // A rank with no batch while others step (MoE models with
  // data_parallel > 1): it runs the MoE layers for the group's tokens
  // (vLLM's dummy batch; the rank's own part is nothing).
  absl::StatusOr<IterationCost> PlanIdleRank(int64_t group_tokens);
  // The same, and the schedule's spans into `spans` (cleared first): every
  // span of layers below `fold_from_layer`, and those of the layers from it
  // on folded into one span per track (named "layers", layer
  // `fold_from_layer`) from the earliest start to the latest end. Costs
  // exactly what Plan(batch) costs; slower, for sampled iterations.
  absl::StatusOr<IterationCost> Plan(const Batch& batch, std::vector<Span>* spans,
                                     int32_t fold_from_layer = kNoFold);
  static constexpr int32_t kNoFold = std::numeric_limits<int32_t>::max();

  // Per-xPU sizes (exposed for tests and for the memory check).
  int64_t heads_per_xpu() const { return heads_; }
  int64_t kv_heads_per_xpu() const { return kv_heads_; }
  int64_t ff_per_xpu() const { return ff_; }
  // Activation workspace one xPU reserves for an iteration of `tokens`
  // tokens: the largest live set of one layer (the residual stream, the QKV
  // output and the FF intermediate, in the activations' element type),
  // counted twice for producer and consumer buffers.
  double ActivationBytesPerXpu(int64_t tokens) const;
  // vLLM's fused MoE kernel takes at most this many rows per call
  // (VLLM_FUSED_MOE_CHUNK_SIZE's default), so its intermediate is bounded.
  static constexpr double kFusedMoeChunkRows = 32768;
  // KV bytes per token on one xPU.
  int64_t KvBytesPerTokenPerXpu() const;
  // Model weights resident on one xPU (embedding and LM head split too).
  double WeightBytesPerXpu() const;
  // FF co-processing share for a batch of `tokens` (§6.2), clamped to
  // [f(ff_max_batch), f(ff_min_batch)], the partitions placed.
  double FfDeviceFraction(int64_t tokens) const;

  // Hints for devices that answer from far away (devices::Device::
  // ExpectSteps): how many iterations ahead they want to hear of (0: none,
  // as for every in-process device), and Expect(batches), which tells them
  // the ops Plan would ask for each batch (attention-device path only).
  // Neither changes any cost.
  int ExpectSteps();
  void Expect(absl::Span<const Batch> batches);
  // The same for one batch a later step may run (an arriving request's
  // prefill), which remote devices send with their next round trip
  // (devices::Device::ExpectLater).
  void ExpectLater(const Batch& batch);

  const std::vector<devices::Op>& last_ops() const { return ops_; }
  const PlannerConfig& config() const { return config_; }

 private:
  // Expect's lowering; `later`: ExpectLater's (one batch).
  void Tell(absl::Span<const Batch> batches, bool later);
  // Lowers `batch` into ops_ (the layer's ops, then the once-per-iteration
  // ones) with op_layers_, layer_ops_ and the indices below.
  void BuildLayerOps(const Batch& batch);
  // Its pieces, appended to ops_ for `t` tokens: the attention block (norm
  // to the FF's norm; sets attention_at_, window_at_ and op_layers_ for the
  // block), the FF block (dense or MoE, with its all-reduce and residual;
  // sets moe_at_, moe_group_tokens_ and op_layers_ for the block), a dense
  // FF of `width` columns per xPU, and the TP all-reduce of t tokens'
  // activations.
  void AttentionBlockOps(int64_t t, const Batch& batch);
  void FfBlockOps(int64_t t);
  void DenseFfOps(int64_t t, int64_t width);
  void PushAllReduce(int64_t t, std::vector<devices::Op>* ops) const;
  // MLA models: the batch's decode rows (one new token) and its prefill
  // chunks' context rows (past + new), which MLA's up-projections run over;
  // zeros for other models.
  struct MlaRows {
    int64_t decode = 0, prefill_context = 0;
  };
  MlaRows MlaRowsOf(const Batch& batch) const;
  // Which layers an op of ops_[0, layer_ops_) runs in.
  // kFullAttention / kSlidingAttention: a model with both kinds of
  // attention layers (ModelDims::FullAttentionLayers).
  enum class LayerSet : uint8_t {
    kEvery,
    kMoe,
    kDenseFf,
    kOnce,
    kFullAttention,
    kSlidingAttention
  };
  double LayersOf(LayerSet set) const;
  bool InLayer(LayerSet set, int32_t layer) const;
  int64_t MoeGroup() const;
  // Adds up ops' costs, each once per layer of its set (kOnce: once), into
  // `out`: stages and total, time one xPU's, energy and traffic the TP
  // group's.
  void AddUp(absl::Span<const devices::Op> ops, absl::Span<const devices::Cost> costs,
             absl::Span<const LayerSet> sets, IterationCost* out) const;
  // Appends an MoE layer's expert block for `group_tokens` tokens of the
  // group: the kMoe op and, with more than one xPU, the exchange.
  void MoeOps(int64_t group_tokens, std::vector<devices::Op>* out) const;
  // Stamps ops [from, end) with the iteration's tokens and sequences.
  static void SetCounts(int64_t tokens, int64_t sequences, std::vector<devices::Op>* ops,
                        size_t from);
  // The attention-device path of Plan (planner_overlap.cc).
  absl::Status PlanWithDevice(const Batch& batch, IterationCost* out);
  // How PlanWithDevice runs a batch, and the lists its ops point into.
  struct DeviceShape {
    OverlapPolicy policy = OverlapPolicy::kSerial;
    int groups = 1;
    double f = 0;  // FF share on the device
    int64_t t = 0, b_dec = 0, half = 0, prefill_tokens = 0;
  };
  struct DeviceScratch {
    std::vector<devices::AttentionSeq> dec_seqs, pre_seqs, seqs_a, seqs_b;
    std::vector<int32_t> dec_stacks, st_a, st_b;
    // dec_stacks' Op::kv_head_stack_id (0: unknown), and what it was built
    // from: the batch's stacks_generation and its decode entries' slots.
    uint64_t dec_stacks_id = 0, dec_generation = 0;
    std::vector<int32_t> dec_slots;
  };
  // Splits `batch` into s's lists (decode sequences to the device, prefill
  // ones to the xPUs; the halves under batch-level pipelining).
  DeviceShape ShapeWithDevice(const Batch& batch, DeviceScratch* s) const;
  // Appends the xPU ops (the layer pieces, both halves under batch-level
  // pipelining, and the tail).
  void XpuOpsWithDevice(const DeviceShape& sh, const Batch& batch, const DeviceScratch& s,
                        std::vector<devices::Op>* out) const;
  // Appends the device ops (each head group's or half's attention, the FF
  // share); *att_at, *att_b_at, *ff_at: where they start (-1: none).
  void DeviceOpsOf(const DeviceShape& sh, const DeviceScratch& s, std::vector<devices::Op>* out,
                   int* att_at, int* att_b_at, int* ff_at) const;
  // xPU cost of the layer pieces for `tokens` tokens with the given FF
  // share kept on the xPUs and `xpu_seqs` attended on the xPUs.
  struct XpuLayer {
    devices::Cost norm, qkv, xattn, proj, allreduce, residual, ff, ff_norm;
    devices::Cost qkv_tile, proj_tile;  // one of head_groups tiles
  };
  // Appends the kXpuLayerOps ops of those pieces (xpu_seqs is borrowed),
  // and reads the pieces back from their costs.
  static constexpr size_t kXpuLayerOps = 11;
  void XpuLayerOps(int64_t tokens, absl::Span<const devices::AttentionSeq> xpu_seqs,
                   double ff_xpu_share, int groups, std::vector<devices::Op>* out) const;
  static XpuLayer XpuLayerFrom(absl::Span<const devices::Cost> costs, bool has_xattn);
  // Appends the once-per-iteration xPU ops: embedding, final norm, LM head.
  static constexpr size_t kTailOps = 3;
  void TailOps(int64_t tokens, int64_t emitting, std::vector<devices::Op>* out) const;
  double LinkTime(double bytes) const;
  // PlanWithDevice's steps. EstimateWithDevice lowers the shaped batch
  // (reusing the last ops where the shape allows) and asks both devices
  // into xpu_costs_ and dev_costs_; AttentionCosts copies the g attention
  // costs of dev_costs_ from `at` into *c (zeros when at < 0).
  absl::Status EstimateWithDevice(const Batch& batch, const DeviceShape& sh);
  const std::vector<devices::Cost>& AttentionCosts(int at, int g,
                                                   std::vector<devices::Cost>* c) const;
  // What the timings add up for one layer (one xPU's and the device's
  // costs, link bytes over the group) and, under kBatchLevel, the chain of
  // all layers (-1: none).
  struct OffloadSums {
    devices::Cost xpu_energy, dev_energy;
    double link_bytes = 0;
    double layer_time = 0, xpu_busy = 0, dev_busy = 0, link_busy = 0;
    double batch_level_time = -1;
  };
  // One layer under kSerial or a head-level policy, as their timings read
  // it: the xPU pieces, each head group's attention on the device, the
  // decode Q/K/V out and outputs back (bytes, and link times: 0 without
  // decode sequences), the prefill's K/V copy, and the FF block with the
  // device's share beside the xPUs'.
  struct OffloadedLayer {
    const XpuLayer* x = nullptr;
    absl::Span<const devices::Cost> att;  // per head group
    int64_t b_dec = 0;
    int groups = 1;
    double send = 0, recv = 0, send_t = 0, recv_t = 0;
    double att_total = 0;  // the head groups' attention, back to back
    double kv_copy_time = 0;
    double ff_link = 0, dev_ff_s = 0;  // the device's FF share: link, compute
    double ff_block = 0;               // FF norm to residual
    double m = 0;                      // one head's share (OverlapRule::kAttAccSimulator)
  };
  // Builds the OffloadedLayer, times it under the policy, and adds the
  // layer's busy times, energy and stages; kBatchLevel does all of that
  // for its two halves.
  void TimeOffloadedLayer(const DeviceShape& sh, OffloadSums* sum, IterationCost* out);
  // The policies' timings: layer_time and xpu_busy, and the spans while
  // recording.
  void TimeSerial(const OffloadedLayer& in, bool authors, OffloadSums* sum);
  void TimeHeadLevelAsAuthors(const OffloadedLayer& in, OffloadSums* sum);
  void TimeHeadLevelListSchedule(const OffloadedLayer& in, OffloadSums* sum);
  void TimeBatchLevel(const DeviceShape& sh, OffloadSums* sum, IterationCost* out);
  // Adds the tail (embedding, final norm, LM head) and turns the layer
  // sums into the iteration's times, energy and traffic.
  void FinishWithDevice(OffloadSums* sum, IterationCost* out);
  // Span recording of one layer of the device schedules (see Plan).
  void EmitSerialLayer(int32_t l, double at, const XpuLayer& x, double send_s, double attention_s,
                       double recv_s, double kv_copy_s, double ff_link_s, double dev_ff_s);
  void EmitPostAndFf(int32_t l, double at, const XpuLayer& x, double kv_copy_s, double ff_link_s,
                     double dev_ff_s);

  devices::ModelDims model_;
  PlannerConfig config_;
  int64_t tp_;
  const devices::Device* device_;
  int64_t heads_, kv_heads_, ff_;
  int64_t dp_ = 1;
  const devices::ExpertRouting* routing_ = nullptr;  // config_.routing's
  int64_t group_tokens_ = 0;
  std::vector<LayerSet> op_layers_;  // per op of ops_
  std::vector<devices::Op> idle_ops_;
  // Skewed expert parallelism: the slower of the two candidate ranks' loads
  // per group token count (MoeOps).
  mutable std::unordered_map<int64_t, devices::ExpertLoad> slowest_load_;
  std::vector<devices::Cost> idle_costs_;
  std::vector<LayerSet> idle_sets_;
  std::vector<devices::AttentionSeq> seqs_;
  std::vector<devices::Op> ops_;
  std::vector<devices::Cost> costs_;
  // ops_ and costs_ answer the token counts ops_key_ (see Plan).
  size_t attention_at_ = 2;  // the attention op's index in ops_
  int window_at_ = -1;       // the sliding layers' attention op's; -1: none
  bool ops_valid_ = false;
  std::array<int64_t, 6> ops_key_{};
  // ops_[moe_at_] is the MoE block (-1: a dense model), built for
  // moe_group_tokens_ tokens of the group.
  int moe_at_ = -1;
  int64_t moe_group_tokens_ = 0;
  // PlanWithDevice's scratch, reused: no allocation per iteration.
  DeviceScratch scratch_;
  int expect_steps_ = -1;  // ExpectSteps(), once asked
  std::vector<devices::Op> xpu_ops_, dev_ops_;
  std::vector<devices::Cost> xpu_costs_, dev_costs_, att_, att_b_;
  std::vector<double> back_done_;
  // The last xPU question and its answer (xpu_ops_, xpu_costs_): see
  // PlanWithDevice.
  bool xpu_valid_ = false;
  std::array<int64_t, 7> xpu_key_{};
  std::vector<devices::AttentionSeq> xpu_pre_;
  // The last device ops' shape (see PlanWithDevice) and where their
  // attention and FF ops start in dev_ops_ (-1: none).
  bool dev_ops_valid_ = false;
  std::array<int64_t, 16> dev_key_{};
  int att_at_ = -1, att_b_at_ = -1, ff_at_ = -1;
  size_t layer_ops_ = 0;                // ops_[0, layer_ops_) repeat per layer
  std::vector<Span>* spans_ = nullptr;  // recording, during Plan(batch, spans)
  int32_t fold_from_ = kNoFold;
  std::array<double, kNumTracks> fold_lo_{}, fold_hi_{};  // per track, while recording
  void Emit(Track track, std::string_view name, int32_t layer, int32_t group, double start,
            double end) {
    if (spans_ == nullptr || !(end > start)) return;
    if (layer >= fold_from_) {
      const auto t = static_cast<size_t>(track);
      fold_lo_[t] = std::min(fold_lo_[t], start);
      fold_hi_[t] = std::max(fold_hi_[t], end);
      return;
    }
    spans_->push_back({track, name, layer, group, start, end});
  }
};

// SLO-limited batching (AttAcc §3.2, §7.3): the largest decode batch, in
// 1..max_batch, of requests with `context_tokens` cached tokens each whose
// predicted iteration time meets `tbt_s`; 0 if even one request misses it.
// Iteration time grows with the batch, so the answer is found by a binary
// search; with a `hint` in 1..max_batch (the cap of a nearby context) it
// gallops from the hint first, which finds the same answer in about two
// plans where the cap barely moves instead of log2(max_batch).
absl::StatusOr<int64_t> MaxBatchWithinSlo(IterationPlanner& planner, double tbt_s,
                                          int64_t context_tokens, int64_t max_batch,
                                          int64_t hint = 0);

}  // namespace servesim::scheduler

#endif  // SERVESIM_SCHEDULER_PLANNER_H_
