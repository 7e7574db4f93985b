// LAD, Locality Aware Decoding: piecewise-linear exp, mode intervals and
// intermediate caches so that only the "active" positions' K/V leave DRAM
// ("LAD: Efficient Accelerator for Generative Inference of LLM with Locality
// Aware Decoding", Wang et al.).
//
// WHAT IS MODELLED
// FUNCTIONAL KERNEL (§III; LadHeadState::Step), decode attention of one
// (request, layer, head), its state persisting across decode steps:
//  - exp on (-inf, 0] is piecewise linear (LadPwl, §III-A): I intervals,
//    interval 0 = (-inf, pwl_min) with a = b = 0, interval k (1..I-1) from
//    pwl_min ((I - k) / (I - 1))^gamma to the next bound (the last ends at
//    0): shorter near 0. a, b minimise the continuous L2 error to exp over
//    each interval (closed-form normal equations). Scores above 0 (possible
//    when the maximum comes from an approximation) use interval I - 1.
//  - per position: interval counters cnt[i, 0..I) (uint16, saturating;
//    DECISION: the paper's G stores only the mode's uint12 count, MD loads
//    the rest), the mode interval mode[i], the Alg. 1 centre data cid[i],
//    dnorm[i], norm[i], and the K/V rows (fp32, the source's values).
//  - intermediate caches A (d x d), B, C, D (d), E, F (Eq. 5: d^2 + 3d + 2
//    numbers, kept in double; DECISION: the hardware keeps fp16 with wider
//    accumulation; double makes the model's output the algorithm's, and a
//    2,000-step decode shows no drift, tested).
//  - one step (context L, the new key/value appended first):
//    1. Alg. 1 on the new key against the centres (|cos| > centre_cos).
//    2. positions older than the latest recent_exact (16) enter the caches
//       with their mode (argmax of their counters; ties to the larger
//       interval): Eq. 5 terms, counted in |U| (the AC's update FIFO).
//    3. approximate scores s~_i = (q . k_cid[i]) dnorm[i] / sqrt(d) (EAS.1-2),
//       exact for M: the cached positions with mode >=
//       large_mode_min_interval (§III-F, EAS.3) and the latest recent_exact
//       positions (DECISION: they often hold the maximum); m = max s~.
//    4. J: cached positions with interval(s~_i - m) != mode[i] (APID) plus
//       the latest recent_exact positions (mode 0, always in J); the others'
//       cnt[i, mode[i]] += 1.
//    5. Eq. 4: numerator q A - m B + C, denominator q D - m E + F, plus for
//       j in J the correction cf_j = alpha_j (s_j - m) + beta_j with the
//       exact score s_j (MD), added as cf_j v_j and cf_j; cnt[j, id_j] += 1,
//       and a cached j whose increased counter exceeds its mode's changes
//       mode and joins U; Eq. 6 updates A-F with U after the output.
//    6. prefetch (§IV-D): hits = |J ∩ J'| with J' the previous step's J.
//  - the first step of a request (context L0) starts from the prompt: its
//    L0 - 1 keys go through Alg. 1 in order, and the last recent_exact
//    prompt queries' exact scores seed the counters (Warmup; DECISION: the
//    paper does not say how prompt positions get a history; the prefill
//    computes these scores anyway).
//  - options: exact_scores (every score exact: Eq. 4 is then an identity
//    and the output equals piecewise-linear-exp attention, tested at every
//    step of a long decode); measure (exact intervals of every position:
//    false negatives = cached positions outside M judged in-mode whose true
//    interval differs, false positives, and the reference outputs).
// It reports the output and the counts |C| (centres), |M|, |J|, |U|, hits.
//
// CYCLE MODEL (§IV; Estimate, HeadCost), per head-sample (one head of one
// sequence) with n = L and w = ceil(d / vpu_width):
//   compute stages (Eq. 7) = max((2|C| w + n / vpu_width + |M| w) / eas_par,
//                                n / apid_par, |J| w / md_par,
//                                (d + |J| + |U| d + 3|U|) w / ac_par)
//   stage 1 bytes = G read 8n (n x 4 x 16 bit) + G (mode, cnt) written 2n
//                   + 8 for the new row + centre and large-mode keys
//                   (|C| + |M|) d e + caches written (d^2 + 3d + 2) e when
//                   |U| > 0 + active counters |J| I 1.5 read and written
//   stage 4 bytes = caches (d^2 + 3d + 2) e + (|J| - hits) 2 d e
//   prefetch bytes = hits 2 d e, read during the preceding QKV period (the
//                   pool is idle then: not on the attention's time, counted
//                   in DRAM bytes and energy); hits are capped by the SRAM:
//                   prefetch_sram_fraction x sram / (ceil(b / tiles) 2 d e)
//                   rows per head-sample, b the op's decode sequences (a
//                   period prefetches its b head-samples, Fig. 6).
// with e = element_bytes (fp16). |M| includes the latest recent_exact
// positions (read in stage 1 for EAS.3 and again with J in stage 4;
// DECISION: counted twice, 16 rows), so from fractions |M| and |J| are at
// least min(n, recent_exact) and |U| at least 1 once n > recent_exact.
// An op's head-samples go round-robin over
// the tiles (Fig. 6), which share the HBM: cycles = max(sum of stage-1 + 4
// bytes / (bandwidth / clock), sum of compute stages / tiles) + 5 x the
// largest head-sample stage (filling the 6-stage pipeline). Energy: Table
// III tile power x tiles x time + all bytes x dram_pj_per_bit. The `ideal`
// preset (locality false) is the paper's ideal accelerator: every K/V row
// read, 2nd MACs on tiles x vpus x vpu_width multipliers. Prefill
// sequences are costed densely the same way (K and V of the context read
// once, 2 x causal pairs x d MACs on all VPUs).
//
// FIDELITY (LadDeviceSpec.fidelity): the fractions {|C|/n, |M|/n, |J|/n,
// |U|/n, hits/|J|} come from
//  - ANALYTIC: the preset's table (presets.cc; ASSUMPTIONS from the paper's
//    reported figures), constant in L;
//  - CALIBRATED: at Create(), `instances` heads of the attention data each
//    decode step by step from min(lengths) / 2 to max(lengths); the fractions
//    are averaged over the 8 steps ending at each calibration length and
//    interpolated log-linearly (KeepProfile). The same run measures false
//    negatives (Describe: false_negative_fraction).
//  - FULL: every head of every layer of `model` runs the kernel at every
//    decode step of each request (request_id), the state kept per request
//    between steps (bounded by full_cache_bytes: least-recently-used
//    requests dropped and rebuilt by replaying from their first step);
//    fractions memoised per (request, L).
#ifndef SERVESIM_DEVICES_LAD_LAD_DEVICE_H_
#define SERVESIM_DEVICES_LAD_LAD_DEVICE_H_

#include <array>
#include <cstdint>
#include <list>
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

inline constexpr int kLadMaxIntervals = 16;  // mode is uint4 (§IV-C)

// The piecewise-linear exp of §III-A.
struct LadPwl {
  std::vector<double> lower;  // lower[k]: lower bound of interval k; lower[0] = -inf
  std::vector<double> a, b;   // a[0] = b[0] = 0
  static LadPwl Fit(int intervals, double pwl_min, double gamma);
  int intervals() const { return static_cast<int>(a.size()); }
  // The interval x falls in (x >= 0: the last one).
  int Interval(double x) const;
  double Eval(double x) const {
    const int k = Interval(x);
    return a[k] * x + b[k];
  }
};

// Counts of one or more head-steps.
struct LadCounts {
  int64_t head_steps = 0;
  int64_t positions = 0;  // sum of n
  int64_t centres = 0, large_mode = 0, active = 0, updates = 0, hits = 0;
  // measure only: cached positions checked, false negatives / positives.
  int64_t checked = 0, false_negatives = 0, false_positives = 0;
  LadCounts& operator+=(const LadCounts& o);
};

struct LadParams {
  int64_t d = 128;
  int recent = 16;
  double centre_cos = 0.98;
  int large_mode_min = 10;
  bool exact_scores = false;
  bool measure = false;
};

struct LadStepResult {
  std::vector<float> out;  // d
  LadCounts counts;
  double m = 0;            // the maximum score used
  // measure: piecewise-linear-exp attention with every interval exact and
  // the same m (what LAD gives without false negatives), and exact softmax.
  std::vector<double> pwl_out, exact_out;
  // measure: the false negatives' misassigned weight sum_FN |cf_i| (cf_i =
  // pwl(s_i - m) - a*(s_i - m) - b*, exact s_i) over pwl_out's denominator,
  // and their largest |v_i| element. Then (Eq. 4 with the missed
  // corrections) |out - pwl_out|_inf <= (fn_vmax + |pwl_out|_inf) fn_mass /
  // (1 - fn_mass).
  double fn_mass = 0, fn_vmax = 0;
};

// The state of one (request, layer, head).
class LadHeadState {
 public:
  LadHeadState(const LadParams& p, const LadPwl* pwl);
  // Appends prompt positions (Alg. 1 on each key); rows are n x d.
  void AppendPrompt(const float* k, const float* v, int64_t n);
  // Seeds the counters with the exact scores of a prompt query whose
  // context is the first `context` positions (scale: 1/sqrt(d) or the op's).
  void Warmup(const float* q, int64_t context, double scale);
  // One decode step: appends (k_new, v_new), then attends q over all n.
  LadStepResult Step(const float* q, const float* k_new, const float* v_new, double scale);
  int64_t n() const { return n_; }
  int64_t cached() const { return cached_; }
  int64_t centres() const { return static_cast<int64_t>(centres_.size()); }
  int mode(int64_t i) const { return mode_[i]; }
  // The caches A-F recomputed from scratch (Eq. 5 over the cached
  // positions and their current modes) against the incrementally updated
  // ones: the largest difference relative to the largest recomputed
  // magnitude of that cache. 0 means no drift.
  double CacheDrift() const;
  int64_t bytes() const;

 private:
  void Append(const float* k, const float* v);
  void Insert(int64_t i);
  double Dot(const float* qs, int64_t i) const;

  LadParams p_;
  const LadPwl* pwl_;
  int ni_;
  int64_t n_ = 0, cached_ = 0;
  std::vector<float> k_, v_;
  std::vector<uint16_t> cnt_;  // n x ni_
  std::vector<uint8_t> mode_;
  std::vector<int32_t> cid_;
  std::vector<float> norm_, dnorm_;
  std::vector<int32_t> centres_;
  std::vector<double> A_, B_, C_, D_;  // A row-major [r][p] = sum a k_r v_p
  double E_ = 0, F_ = 0;
  std::vector<int32_t> prev_active_;
  std::vector<uint8_t> in_prev_;
};

// The cycle model's output for one head-sample.
struct LadHeadCost {
  double compute_cycles = 0;              // Eq. 7
  double eq7_terms[4] = {0, 0, 0, 0};     // EAS, APID, MD, AC
  double stage1_bytes = 0, stage4_bytes = 0, prefetch_bytes = 0;
  double macs = 0;
};

// Per-head fractions of n: centres, large-mode, active, updated; and the
// prefetch hit ratio hits / |J|.
using LadFractions = std::array<double, 5>;

class LadDevice : public Device {
 public:
  static absl::StatusOr<std::unique_ptr<Device>> Create(const servesim::v1::DeviceSpec& spec);

  DeviceDescription Describe() const override;
  absl::Status Estimate(absl::Span<const Op> ops, absl::Span<Cost> costs) const override;
  // Decode attention. Without a session (call.session < 0) the call has no
  // history: its first L - 1 positions are the prompt (Alg. 1 on each key),
  // its own query seeds their counters once, then one LAD step per head.
  // With a session (an agent session's Step) the per-head state is kept
  // between calls: a call whose context is one longer than the last steps
  // the kept state with the new row; any other length starts the session's
  // state afresh as above. At most kLadMaxSessions sessions are kept (least
  // recently used dropped). Stats: positions whose K (centres, M, J) and V
  // (J) were read.
  absl::StatusOr<AttentionResult> Execute(const AttentionCall& call) const override;
  // FULL fidelity: the steps' fractions, measured here or elsewhere (device.h).
  absl::StatusOr<std::vector<StepMeasurement>> Measure(
      absl::Span<const StepKey> steps) const override;
  absl::Status Absorb(absl::Span<const StepMeasurement> measured) const override;

  // The cycle model from counts (absolute, one head-sample).
  LadHeadCost HeadCostCounts(int64_t n, int64_t d, double centres, double large, double active,
                             double updates, double hits, double prefetch_rows_cap) const;
  LadHeadCost HeadCost(int64_t n, int64_t d, const LadFractions& f, double prefetch_rows_cap) const;
  // Rows of prefetched K/V one head-sample may hold when `seqs` head-samples
  // share a period.
  double PrefetchRowsCap(int64_t d, int64_t seqs) const;
  absl::StatusOr<LadFractions> Fractions(int64_t request_id, int64_t l) const;
  double PowerW() const;  // all tiles
  double BytesPerCycle() const;
  LadParams KernelParams(int64_t d) const;
  const LadPwl& pwl() const { return pwl_; }
  const servesim::v1::LadSpec& spec() const { return spec_.lad(); }
  const KeepProfile& profile() const { return profile_; }
  double calibration_s() const { return calibration_s_; }
  // Calibration's measured false-negative fraction of checked positions.
  double false_negative_fraction() const { return fn_fraction_; }
  int64_t full_state_bytes() const;
  static constexpr size_t kLadMaxSessions = 64;

 private:
  explicit LadDevice(const servesim::v1::LadDeviceSpec& spec);
  absl::Status Calibrate();
  absl::StatusOr<LadFractions> FullFractions(int64_t request_id, int64_t l) const;
  Cost HeadCostToCost(double bytes_crit, double prefetch_bytes, double comp_cycles,
                      double stage_cycles, double macs) const;

  struct RequestState {
    std::mutex mu;
    int64_t first_l = 0, last_l = 0;  // last_l 0: no state
    std::vector<LadHeadState> heads;  // layer * heads + head
    int64_t bytes = 0;
    bool listed = false;
    std::list<int64_t>::iterator lru;
  };
  absl::Status Advance(int64_t request_id, RequestState* st, int64_t l) const;

  struct SessionState {
    int64_t l = 0, heads = 0, d = 0;
    std::vector<LadHeadState> state;  // per query head
    std::list<int64_t>::iterator lru;
  };

  servesim::v1::LadDeviceSpec spec_;
  LadPwl pwl_;
  // Agent sessions' state (Execute with call.session >= 0), under sess_mu_
  // for the whole call.
  mutable std::mutex sess_mu_;
  mutable absl::flat_hash_map<int64_t, std::unique_ptr<SessionState>> sessions_;
  mutable std::list<int64_t> sess_lru_;
  KeepProfile profile_;
  double calibration_s_ = 0, fn_fraction_ = 0;
  std::unique_ptr<AttentionSource> source_;  // CALIBRATED and FULL
  int64_t cap_bytes_ = 0;
  mutable std::mutex memo_mu_;
  mutable absl::flat_hash_map<std::pair<int64_t, int64_t>, LadFractions> memo_;
  mutable FreshSteps fresh_;  // guarded by memo_mu_
  mutable absl::flat_hash_map<int64_t, std::shared_ptr<RequestState>> states_;
  mutable std::list<int64_t> lru_;  // front: least recently used
  mutable int64_t state_bytes_ = 0;
};

// Named presets: lad_1.5 (default), lad_2.5, lad_3.5, ideal.
absl::StatusOr<servesim::v1::LadSpec> LadPreset(absl::string_view name);
std::vector<std::string> LadPresetNames();
// The ANALYTIC fractions of a preset; NOT_FOUND for one without a table.
absl::StatusOr<LadFractions> LadAnalyticFractions(absl::string_view preset);

}  // namespace servesim::devices

#endif  // SERVESIM_DEVICES_LAD_LAD_DEVICE_H_
