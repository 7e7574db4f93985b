// SpAtten: cascade token and head pruning, local value pruning and
// progressive quantisation (Wang et al., "SpAtten: Efficient Sparse
// Attention Architecture with Cascade Token and Head Pruning", HPCA'21).
//
// WHAT IS MODELLED
// FUNCTIONAL KERNEL (§III, SpattenSession): one request's decode steps,
// layer by layer (layers 0..N-1 of a step in order, then the next step):
//  - Cascade token pruning (§III.A, Alg. 2): a cumulative importance per
//    token, the sum of its attention probabilities over heads, layers and
//    steps. Layer l keeps at most ceil(L (1 - r_t(l))) tokens of the
//    context L: the top-k of the importance among tokens not yet pruned;
//    the rest are pruned for good (they never return, in any later layer or
//    step). DECISIONS: ratios are of the context length (so a step prunes
//    about r new tokens, not r of the survivors again); the current token
//    (the query's own position) is always kept; pruning is per layer (all
//    heads of a layer see the same tokens).
//  - Cascade head pruning (§III.B): a cumulative importance per head index,
//    the sum of |attention_out| over layers and steps; after layer l the
//    next layer runs the top ceil(H (1 - r_h(l+1))) heads of those still
//    alive. DECISION: heads are revived at the start of each step (layer 0
//    has r_h = 0), the importance persists.
//  - Local value pruning (§III.C): per head, only the top ceil(n (1 -
//    value_ratio)) probabilities' V rows are fetched (no renormalisation).
//  - Progressive quantisation (§III.D): Q, K, V in msb_bits + lsb_bits
//    symmetric fixed point (one scale per tensor); scores from the MSBs
//    first; if the max probability < lsb_threshold the LSBs of Q and K are
//    fetched and the scores recomputed; V is fetched at the width the head
//    ended with.
//  - Per-layer ratios (§V.A): the first round(token_front_unpruned x N)
//    layers prune no tokens, the rest interpolate linearly from
//    token_ratio_start to token_ratio_end (heads: head_front_unpruned,
//    head_ratio_start/end).
//  - Top-k (§IV.B, Alg. 3): quick-select with pivots drawn from a
//    deterministic stream, returning the k-th largest value and how many
//    equal to it to keep; the filter keeps elements above it and the first
//    num_eq equal ones in input order (the engine keeps the input order).
//    It reports the elements it pushed through the comparator arrays.
// Execute() runs one layer of a fresh session at the last layer index
// (where the deepest pruning applies).
//
// CYCLE MODEL (§IV, Table I; Estimate), per head and decode step, from the
// per-head counts n_k (tokens whose K is fetched), n_v (V rows fetched), the
// LSB fraction f (heads that refetch LSBs) and the top-k work w:
//   K bytes = n_k d (msb + f lsb) / 8, V bytes = n_v d (msb + f lsb) / 8;
//   stages (fully pipelined across heads, §IV.A): fetch (K+V bytes / B),
//   Q x K (n_k (1 + f) / min(qk_multipliers / d, adder_tree_outputs)),
//   softmax (n_k (1 + f) / softmax_lanes), token top-k (w_t /
//   topk_comparators), value top-k (w_v / topk_comparators), prob x V
//   (n_v / (pv_multipliers / d)); a head takes its slowest stage; heads of
//   the op run back to back; one DRAM latency per op. B = hbm_channels x
//   channel_bandwidth / clock. Energy: (logic + SRAM power, Table II) x time
//   + bytes x dram_pj_per_bit. Heads pruned by cascade head pruning cost
//   nothing (the fraction of heads kept scales the op). Prefill sequences
//   are costed densely at msb + lsb bits.
//
// FIDELITY: ANALYTIC (preset table from the paper's reported ratios),
// CALIBRATED (sessions of min(8, layers) layers x min(4, heads) heads, two
// steps at each calibration length, the second step measured; each
// instance's fixed-point rows are extended from one step and length to the
// next rather than regenerated (FullKvCache), 0.11 s in Release for the
// default lengths; with 4 heads head pruning never binds, so the calibrated
// head fraction is 1), FULL (a session per request over every layer and
// head of `model`, advanced step by step to each L asked, memoised per
// (request_id, L); thread-safe). A FULL request's session starts at the
// first L asked; asking a smaller L later restarts it there. Its
// fixed-point K and V rows are kept between steps and grown by one row per
// step (prune_common.h, FullKvCache: exact, LRU under full_cache_bytes,
// 2 GiB by default; 4 x d_head bytes per position per head, 96 KiB per
// position at GPT-2 medium); the session state itself (9 bytes per token
// plus the memo) is kept per request. About 18 ms per decode step at GPT-2
// medium and L = 1024 in Release on one core (bench/prune_full_bench.cc).
#ifndef SERVESIM_DEVICES_SPATTEN_SPATTEN_DEVICE_H_
#define SERVESIM_DEVICES_SPATTEN_SPATTEN_DEVICE_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "devices/device.h"
#include "devices/prune_common.h"
#include "servesim/v1/hardware.pb.h"

namespace servesim::devices {

// Alg. 3: the k-th largest of `values` and how many elements equal to it
// belong to the top k (so that exactly k are selected); `work` (if not
// null) receives the elements pushed through the comparator arrays.
struct TopK {
  double kth = 0;
  int64_t num_eq = 0;
};
TopK QuickSelect(const std::vector<double>& values, int64_t k, uint64_t seed, int64_t* work);
// The top-k engine: indices of the selected elements, in input order.
std::vector<int64_t> TopKIndices(const std::vector<double>& values, int64_t k, uint64_t seed,
                                 int64_t* work);

// Counts of one layer or step, summed over heads.
struct SpattenCounts {
  int64_t heads = 0;       // heads of the model processed (pruned ones included)
  int64_t heads_run = 0;   // heads not pruned
  int64_t context = 0;     // sum of L over heads
  int64_t k_tokens = 0;    // K rows fetched (sum over run heads)
  int64_t v_rows = 0;      // V rows fetched
  int64_t lsb_heads = 0;   // heads that fetched LSBs
  int64_t topk_token_work = 0, topk_value_work = 0;
  double k_bytes = 0, v_bytes = 0;
  SpattenCounts& operator+=(const SpattenCounts& o);
};

class SpattenDevice;

class SpattenSession {
 public:
  SpattenSession(const SpattenDevice& device, int layers, int heads);
  // One layer of the current step: q [heads, 1, d], k, v [kv_heads, L, d].
  // Layers run 0..layers-1 per step; a step's L must not be below the last
  // step's.
  absl::StatusOr<AttentionResult> RunLayer(int layer, const AttentionCall& call,
                                           SpattenCounts* counts);
  // The same on fixed-point K/V (T int16_t or int32_t): q_in holds heads x
  // d floats, kv[g] KV head g's L rows; out (heads x d, or null when only
  // the counts and the cascade state are wanted) receives the output.
  // RunLayer quantises its call and comes here.
  template <typename T>
  absl::Status RunLayerFixed(int layer, const float* q_in, int64_t heads, int64_t kv_heads,
                             int64_t l, int64_t d, double call_scale, const FixedKvHead<T>* kv,
                             float* out, SpattenCounts* counts);
  const std::vector<double>& token_importance() const { return token_importance_; }
  const std::vector<uint8_t>& token_pruned() const { return token_pruned_; }
  const std::vector<uint8_t>& head_alive() const { return head_alive_; }

 private:
  const SpattenDevice& dev_;
  int layers_, heads_;
  int64_t last_l_ = 0;
  std::vector<double> token_importance_, head_importance_;
  std::vector<uint8_t> token_pruned_, head_alive_;
  // Scratch reused across layers.
  std::vector<int64_t> alive_;
  std::vector<double> s_, p_;
};

class SpattenDevice : public Device {
 public:
  static absl::StatusOr<std::unique_ptr<Device>> Create(const servesim::v1::DeviceSpec& spec);
  DeviceDescription Describe() const override;
  absl::Status Estimate(absl::Span<const Op> ops, absl::Span<Cost> costs) const override;
  absl::StatusOr<AttentionResult> Execute(const AttentionCall& call) const override;
  // FULL fidelity: the steps' fractions, measured here or elsewhere (device.h).
  absl::StatusOr<std::vector<StepMeasurement>> Measure(
      absl::Span<const StepKey> steps) const override;
  absl::Status Absorb(absl::Span<const StepMeasurement> measured) const override;
  absl::Status MeasureAhead(absl::Span<const StepKey> steps) const override;

  // Per-layer ratios of a model with `layers` layers.
  double TokenRatio(int layer, int layers) const;
  double HeadRatio(int layer, int layers) const;
  // Profile row per head: {heads kept, K rows / L, V rows / L, LSB
  // fraction, token top-k work / L, value top-k work / L}.
  using Row = std::array<double, 6>;
  absl::StatusOr<Row> Fractions(int64_t request_id, int64_t l) const;
  static Row RowOf(const SpattenCounts& c);
  // Cycles, bytes of one head (not scaled by heads kept) from a row.
  struct HeadCost {
    double cycles = 0, k_bytes = 0, v_bytes = 0, macs = 0;
  };
  HeadCost HeadCostOf(int64_t l, int64_t d_head, const Row& row) const;
  double BytesPerCycle() const;
  const servesim::v1::SpattenSpec& spec() const { return spec_.spatten(); }
  double calibration_s() const { return calibration_s_; }
  // FULL mode's K/V cache (null in other modes).
  const FullKvCache* full_cache() const { return cache_.get(); }

 private:
  explicit SpattenDevice(const servesim::v1::SpattenDeviceSpec& spec) : spec_(spec) {}
  absl::Status Calibrate();
  absl::StatusOr<Row> FullFractions(int64_t request_id, int64_t l) const;

  servesim::v1::SpattenDeviceSpec spec_;
  KeepProfile profile_;
  double calibration_s_ = 0;
  std::unique_ptr<AttentionSource> source_;
  struct RequestState {
    std::unique_ptr<SpattenSession> session;
    int64_t first_l = 0, last_l = 0;
    std::map<int64_t, Row> memo;
    // Steps measured ahead (MeasureAhead), after the memo's, up to last_l:
    // they join the memo when a step at or after them is asked.
    std::map<int64_t, Row> ahead;
  };
  // Runs the session of `st` from last_l + 1 to l into `into` (under mu_):
  // asked steps are fresh; `ahead` ones are not, and stop (OK, the session
  // as it was before the step) when a call waits.
  absl::Status RunStepsLocked(int64_t request_id, RequestState& st, int64_t l,
                              std::map<int64_t, Row>& into, bool ahead) const;
  mutable std::mutex mu_;
  mutable std::atomic<int> asking_{0};  // calls waiting for mu_ (AskingScope)
  mutable std::map<int64_t, RequestState> requests_;
  mutable FreshSteps fresh_;  // guarded by mu_
  // FULL: the requests' fixed-point K and V rows between steps (msb + lsb
  // <= 16 bits; wider operands regenerate each step).
  std::unique_ptr<FullKvCache> cache_;
};

// Builds the multi-head call of one layer from a source (q [heads,1,d],
// k, v [heads, L, d]).
absl::StatusOr<AttentionCall> LayerCall(const AttentionSource& src, int64_t request, int layer,
                                        int heads, int64_t l);

// Presets: spatten (default), spatten_8+4, spatten_1/8, dense.
absl::StatusOr<servesim::v1::SpattenSpec> SpattenPreset(absl::string_view name);
std::vector<std::string> SpattenPresetNames();
absl::StatusOr<SpattenDevice::Row> SpattenAnalyticRow(absl::string_view preset);

}  // namespace servesim::devices

#endif  // SERVESIM_DEVICES_SPATTEN_SPATTEN_DEVICE_H_
