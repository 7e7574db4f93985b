// Token-Picker (ToPick): probability estimation with 4-bit K chunks and
// out-of-order on-demand DRAM access (Park et al., "Token-Picker:
// Accelerating Attention in Text Generation with Minimized Memory Transfer
// via Probability Estimation", DAC'24).
//
// WHAT IS MODELLED
// FUNCTIONAL KERNEL (§3, RunKernel / Execute), decode attention per query
// head:
//  - Q, K and V in `operand_bits` (12) signed fixed point, symmetric, one
//    scale per tensor (Q: the head's query; K, V: the KV head's rows;
//    DECISION: the paper does not say how scales are chosen). K is split
//    into operand_bits / chunk_bits (three) chunks, MSB chunk first.
//  - Margins from Q alone (Eq. 4, 2's complement, Fig. 4b): with u bits of
//    k still unknown, k lies in [known, known + 2^u - 1], so the score lies
//    in [ps + M_min, ps + M_max] with M_max = (2^u - 1) sum_{q_i > 0} q_i and
//    M_min = (2^u - 1) sum_{q_i < 0} q_i.
//  - Visit order: the first token, then the most recent first (§3.1);
//    token n of that order goes to PE lane n mod pe_lanes.
//  - Running denominator D = sum over unpruned tokens seen so far of
//    exp(s_min at their latest chunk) (DAG, §4: the PEC sends the change
//    exp(s_min^b) - exp(s_min^(b-1)); a pruned token's term is removed, so
//    after step 0 D is the exponentiated sum of the unpruned scores).
//  - Prune when p'' = exp(s_max^b) / D < threshold (Eq. 5); else request the
//    next chunk. D is updated once per cycle from all lanes (decisions in a
//    cycle see D as of the end of the previous cycle).
//  - Out-of-order arrivals (§3.2): a cycle-stepped simulation of the lanes
//    and the memory: first chunks are requested in visit order while a
//    lane has fewer than scoreboard_entries tokens in flight; requests are
//    served FIFO at the HBM bandwidth and arrive dram_latency later; each
//    lane processes one arrived chunk per ceil(d_head / multipliers)
//    cycles, in arrival order. So decisions depend on the arrival order, as
//    in the hardware.
//  - Step 1: the kept tokens' exact 12-bit scores are normalised by D
//    (softmax over kept tokens) and their V rows fetched and accumulated.
//  - baseline (estimation off): every K row at 12 bits, every V row, exact
//    softmax. estimation without on_demand_k: whole K rows streamed,
//    decisions on full scores, V pruned (the paper's intermediate design).
// It reports the output, the chunk after which each token was pruned, the
// K chunks and V rows fetched, and the simulated cycles.
//
// CYCLE MODEL (§4-5, Estimate), per query head and decode step, from the
// counts n_b (tokens that fetched chunk b) and kept (V rows fetched):
//   bytes_K = sum_b n_b * d * chunk_bits / 8   (baseline: L * d * 12 / 8)
//   bytes_V = kept * d * operand_bits / 8      (baseline: L rows)
//   K cycles = max(bytes_K / B, sum_b n_b * c / lanes, scoreboard bound)
//              + depth * latency
//   V cycles = max(bytes_V / B, kept * c / lanes) + latency
// with B = hbm_channels * channel_bandwidth / clock bytes per cycle, c =
// ceil(d / multipliers_per_lane), depth = chunks of the deepest token
// (1 for streamed K), and the scoreboard bound (L / lanes) * (sum_b n_b / L)
// * latency / scoreboard_entries (latency hidden up to the scoreboard's
// depth). It bounds the cycle-stepped simulation from above (it charges the
// whole dependent-chunk tail; within 20% on the generator's data, tested).
// Heads run one after another on all lanes. Energy: Table 2 power
// of the modules present x time, plus bytes x dram_pj_per_bit. Prefill
// sequences are costed densely (K/V loaded once into the on-chip buffers,
// §4: max(bytes / B, MACs / (lanes x multipliers)) + latency).
//
// FIDELITY (TopickDeviceSpec.fidelity): the counts come from
//  - ANALYTIC: the preset's table (presets.cc: the paper's reported V and K
//    reductions), constant in L;
//  - CALIBRATED: RunKernel at Create() on the attention data at each
//    calibration length (instances x 4 heads), fractions of L interpolated
//    log-linearly;
//  - FULL: the kernel on every head of every layer of `model` for each
//    (request_id, L), mean per head; memoised (thread-safe). The request's
//    fixed-point K rows are kept between steps and grown by one row per
//    step (prune_common.h, FullKvCache: exact, LRU under
//    full_cache_bytes, 2 GiB by default; 2 x d_head bytes per position per
//    head, 48 KiB per position at GPT-2 medium); V is not kept or read, as
//    the counts do not depend on it (the kernel's output is not needed).
//    About 31 ms per decode step at GPT-2 medium and L = 1024 in Release on
//    one core (bench/prune_full_bench.cc), 64% of it in the cycle-stepped
//    simulation and the exp of its running denominator.
#ifndef SERVESIM_DEVICES_TOPICK_TOPICK_DEVICE_H_
#define SERVESIM_DEVICES_TOPICK_TOPICK_DEVICE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "devices/device.h"
#include "devices/prune_common.h"
#include "servesim/v1/hardware.pb.h"

namespace servesim::devices {

inline constexpr int kTopickMaxChunks = 4;

// Per-token-count statistics of one or more query heads.
struct TopickCounts {
  int64_t heads = 0;
  int64_t tokens = 0;                                 // sum of L over heads
  std::array<int64_t, kTopickMaxChunks> chunk_fetched{};  // tokens that fetched chunk b
  std::array<int64_t, kTopickMaxChunks> pruned_after{};   // tokens pruned after chunk b
  int64_t v_fetched = 0;                              // V rows fetched (= kept tokens)
  double k_bytes = 0, v_bytes = 0;
  double sim_cycles = 0;                              // cycle-stepped simulation
  TopickCounts& operator+=(const TopickCounts& o);
};

struct TopickKernelResult {
  Tensor out;  // fp32 [heads, 1, d_head]
  // [head * L + token]: the chunk index after which the token was pruned,
  // or -1 if kept.
  std::vector<int8_t> pruned_after_chunk;
  TopickCounts counts;
  KernelStats stats;
};

// The cycle model's output for one head.
struct TopickHeadCost {
  double k_cycles = 0, v_cycles = 0;
  double k_bytes = 0, v_bytes = 0;
  double macs = 0;
};

class TopickDevice : public Device {
 public:
  static absl::StatusOr<std::unique_ptr<Device>> Create(const servesim::v1::DeviceSpec& spec);

  DeviceDescription Describe() const override;
  absl::Status Estimate(absl::Span<const Op> ops, absl::Span<Cost> costs) const override;
  absl::StatusOr<AttentionResult> Execute(const AttentionCall& call) const override;
  // FULL fidelity: the steps' fractions, measured here or elsewhere (device.h).
  absl::StatusOr<std::vector<StepMeasurement>> Measure(
      absl::Span<const StepKey> steps) const override;
  absl::Status Absorb(absl::Span<const StepMeasurement> measured) const override;
  // FULL: the counts {tokens, chunk 2 fetched, chunk 3 fetched, V fetched}
  // of a share of every step's layers.
  absl::StatusOr<std::vector<StepMeasurement>> MeasureLayers(absl::Span<const StepKey> steps,
                                                             int part, int parts) const override;

  // The kernel with everything it measured. Decode only (q_len 1).
  absl::StatusOr<TopickKernelResult> RunKernel(const AttentionCall& call) const;
  // Cycle model of one head of context length l from its counts (fractions
  // of the tokens as in TopickCounts, for one head).
  TopickHeadCost HeadCost(int64_t l, int64_t d_head, double chunk2_fraction,
                          double chunk3_fraction, double v_fraction) const;
  // Per-head fractions {fetched chunk 2, fetched chunk 3, kept} the current
  // fidelity mode gives for (request_id, l); FULL runs the kernel (memo).
  absl::StatusOr<std::array<double, 3>> Fractions(int64_t request_id, int64_t l,
                                                  int64_t d_head) const;
  // Total power of the modules the configuration has, W.
  double PowerW() const;
  double BytesPerCycle() const;
  const servesim::v1::TopickSpec& spec() const { return spec_.topick(); }
  const KeepProfile& profile() const { return profile_; }
  // Seconds Create() spent calibrating (0 unless CALIBRATED).
  double calibration_s() const { return calibration_s_; }
  // FULL mode's K cache (null in other modes).
  const FullKvCache* full_cache() const { return cache_.get(); }

 private:
  explicit TopickDevice(const servesim::v1::TopickDeviceSpec& spec);
  absl::Status Calibrate();
  absl::StatusOr<std::array<double, 3>> FullFractions(int64_t request_id, int64_t l) const;
  // FULL: the kernel's counts over layers [layer_begin, layer_end), all heads.
  absl::StatusOr<TopickCounts> FullCounts(int64_t request_id, int64_t l, int32_t layer_begin,
                                          int32_t layer_end) const;
  static std::array<double, 3> FractionsOfCounts(const std::array<double, 4>& counts);
  Cost HeadCostToCost(const TopickHeadCost& h, double heads) const;

  servesim::v1::TopickDeviceSpec spec_;
  KeepProfile profile_;
  double calibration_s_ = 0;
  std::unique_ptr<AttentionSource> source_;  // CALIBRATED and FULL
  // FULL: the requests' fixed-point K rows between steps (operand_bits <=
  // 16; wider operands regenerate each step).
  std::unique_ptr<FullKvCache> cache_;
  mutable std::mutex memo_mu_;
  mutable absl::flat_hash_map<std::pair<int64_t, int64_t>, std::array<double, 3>> memo_;
  mutable FreshSteps fresh_;  // guarded by memo_mu_
};

// Named presets: topick (default), topick_0.3, baseline.
absl::StatusOr<servesim::v1::TopickSpec> TopickPreset(absl::string_view name);
std::vector<std::string> TopickPresetNames();
// The ANALYTIC table of a preset: per-head fractions of the context {fetched
// chunk 2, fetched chunk 3, kept}; NOT_FOUND for a preset without one.
absl::StatusOr<std::array<double, 3>> TopickAnalyticFractions(absl::string_view preset);

}  // namespace servesim::devices

#endif  // SERVESIM_DEVICES_TOPICK_TOPICK_DEVICE_H_
