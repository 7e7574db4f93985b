// Shared by the token-pruning and compression devices (topick, spatten,
// cta, lad): the keep/prune profile their fidelity modes feed the cycle
// model with, the attention data their kernels run on in CALIBRATED and
// FULL modes, and what ANALYTIC mode can honour.
#ifndef SERVESIM_DEVICES_PRUNE_COMMON_H_
#define SERVESIM_DEVICES_PRUNE_COMMON_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "devices/attention_data.h"
#include "devices/device.h"
#include "devices/interrupt.h"
#include "devices/ops.h"
#include "devices/tensor.h"
#include "google/protobuf/message.h"
#include "servesim/v1/hardware.pb.h"

namespace servesim::devices {

// A profile: for each context length lengths[i] (ascending), a row of
// per-token fractions (what each device means by them is in its header).
// Eval(L) interpolates linearly in log L between the two nearest lengths
// and holds the end rows beyond the ends.
struct KeepProfile {
  std::vector<double> lengths;
  std::vector<std::vector<double>> rows;
  std::vector<double> Eval(double context_len) const;
  // The hot path: Eval(l) for an integer length, from a table built once by
  // Tabulate() (bit-identical to Eval; no allocation). Beyond the table
  // (lengths past 65,536) it falls back to Eval into `scratch`.
  const double* Row(int64_t l, std::vector<double>* scratch) const;
  void Tabulate();  // after lengths/rows are final

 private:
  std::vector<double> table_;  // row of length l at [(l - 1) * width_]
  int64_t table_len_ = 0;
  size_t width_ = 0;
};

// Generator parameters from the spec's data message (unset fields keep the
// AttentionDataParams defaults).
AttentionDataParams DataParamsFromProto(const servesim::v1::AttentionDataSpec& spec,
                                        int64_t d_head);
// The generator, or the .npy directory when data.npy_dir is set (d_head
// then comes from the files).
absl::StatusOr<std::unique_ptr<AttentionSource>> MakeAttentionSource(
    const servesim::v1::AttentionDataSpec& spec, int64_t d_head);

const char* FidelityName(servesim::v1::PruneFidelity f);

// Where a fidelity mode's keep/prune ratios come from, as the outputs label
// them: ANALYTIC, the preset's table (`analytic_source`: "paper" for the
// papers' reported averages, "assumption" where the paper gives none);
// CALIBRATED, the functional kernel run on the attention data at start-up
// ("calibrated"); FULL, the mean over the steps the kernel ran
// ("measured").
const char* RatioSource(servesim::v1::PruneFidelity f, const char* analytic_source);

// RatioSource of a pruning or compression device's spec (topick, spatten,
// cta: the papers' figures; lad: assumptions, as its presets.cc says);
// nullptr for other devices.
const char* RatioSourceOf(const servesim::v1::DeviceSpec& spec);

// ANALYTIC fidelity charges the ratios of the preset's table, and those
// hold only for the preset's algorithm knobs (a threshold, pruning ratios,
// hash widths). Refuses `spec` when one of `knobs` (field names of the
// spec message) differs from `preset`'s value, naming the knob, both values
// and the modes that model it; hardware knobs (clocks, widths, bandwidth)
// are honoured by the cycle model in every mode and are not listed.
absl::Status CheckAnalyticKnobs(absl::string_view device, const google::protobuf::Message& spec,
                                const google::protobuf::Message& preset,
                                std::initializer_list<absl::string_view> knobs);
// The same for a part of a device spec that describes what the kernel
// measures (the attention data, CTA's token data): set under ANALYTIC,
// which measures nothing, it is refused rather than ignored. (The
// calibration lengths are a setting of CALIBRATED and FULL, not of the
// device, and are accepted in any mode, so one scenario can sweep the
// fidelity.)
absl::Status CheckAnalyticUnused(absl::string_view device, const google::protobuf::Message& part,
                                 absl::string_view field);

// The query heads an attention op covers on this device: [head_begin,
// head_end) or all of them.
int64_t OpHeadCount(const Op& op);

// The checks every attention-only device's Estimate opens with, op by op:
// one cost slot per op, attention ops only, heads / kv_heads / d_head >= 1
// with heads a multiple of kv_heads, and every sequence with new_tokens >= 1
// and past_tokens >= 0. `device` names the device in the messages.
absl::Status CheckAttentionOps(absl::string_view device, absl::Span<const Op> ops,
                               size_t cost_slots);

// The model shape a pruning device's spec may carry (`model`): each field
// that is set within the scenario's ranges for its model (layers [1, 1024],
// heads [1, 4096], d_head [1, 4096]). An agent's client sends the spec, and
// the shape sizes per-head tables and hash planes (CTA's heads x d_head
// projections overflowed past 2^63).
absl::Status CheckAttentionShape(absl::string_view device,
                                 const servesim::v1::AttentionShape& model);

// Calibration lengths and instances with defaults (128 .. 2048; 4).
std::vector<int64_t> CalibrationLengths(const servesim::v1::PruneCalibrationSpec& c);
int CalibrationInstances(const servesim::v1::PruneCalibrationSpec& c);

// Symmetric fixed point with `bits` bits, one scale for the n floats:
// integers in [-(2^(bits-1) - 1), 2^(bits-1) - 1], scale = max |x| / that
// bound (1 for all zeros), x rounded to nearest-even of x / scale. The rule
// both kernels apply to each head's Q and each KV head's K and V. T is
// int16_t (bits <= 16) or int32_t. Returns the scale.
template <typename T>
double QuantiseFixed(const float* x, int64_t n, int bits, T* out);
// The scale QuantiseFixed picks for a maximum |x| of `max_abs`, and its
// rounding of n floats at a given scale.
double FixedScale(float max_abs, int bits);
template <typename T>
void QuantiseAtScale(const float* x, int64_t n, int bits, double scale, T* out);

// One KV head's fixed-point rows: k and v point at L x d_head integers (v
// null where a kernel does not read V), with their QuantiseFixed scales.
template <typename T>
struct FixedKvHead {
  const T* k = nullptr;
  const T* v = nullptr;
  double k_scale = 1, v_scale = 1;
};

// The elements of t as floats: t's own bytes when fp32, else widened (fp16,
// exactly) into *storage.
const float* AsFloats(const Tensor& t, std::vector<float>* storage);

// ------------------------------------------------------ FULL-mode K/V cache --
//
// WHAT IS CACHED AND WHY
// FULL fidelity runs a kernel on every head of every layer at each decode
// step of a request. A position's K and V never change from step to step
// (AttentionSource::KeyValueRows), so rather than regenerating and
// re-quantising the L rows of every head at every step, a request's rows are
// kept in the kernels' own fixed-point form (int16: operand widths up to 16
// bits) and grown by one row per step.
//
// EXACTNESS: the kernels quantise a head's K (and V) with one scale, max |x|
// over rows 0..L-1 (QuantiseFixed). The cache keeps the running maximum and
// where it rose (one record per rise); a step whose new row raises it
// re-quantises the head's rows from the source (the floats are not kept), so
// the integers and the scale are exactly those QuantiseFixed gives on
// DecodeStep(instance, L). A call at a smaller L than the cache holds uses
// the prefix when the prefix's maximum is the same, and otherwise rebuilds
// the head at that L. So results never depend on what the cache holds or
// drops (tested: cache hits, rebuilds after eviction and the uncached kernel
// agree bit for bit).
//
// MEMORY (bytes per cached position of a request): layers x heads x d_head x
// 2 for K, as much again for V when kept (keep_v), plus 16 bytes per
// maximum record (O(log L) per head: a new maximum of L draws is rare);
// rows grow by 1/8 at a time, so up to 12.5% more is reserved. At
// GPT-2 medium (24 x 16 heads, d 64): 48 KiB per position with K only
// (topick: its counts never read V), 96 KiB with K and V (spatten); 52 MB /
// 104 MB per request at L = 1088. A total cap bounds it: after each call the
// least-recently-used requests' rows are dropped (the request just used
// last) until the total is within the cap, and rebuilt from the source if
// asked again. So the cap holds between calls; during a call the request in
// use can exceed it alone. Requests that finish are never asked again and
// fall to the end of the LRU order, so no per-request release hook is needed.
//
// THREADS: each request's rows are used under its own lock (a Lease); the
// LRU list and byte count under the cache's lock; eviction skips requests
// whose lease another thread holds.
class FullKvCache {
 public:
  // The fixed-point rows of one KV head for one context length: k (and v, or
  // null) point at l x d_head integers; the scales as QuantiseFixed's.
  using View = FixedKvHead<int16_t>;
  static constexpr int64_t kDefaultCapBytes = int64_t{2} << 30;
  // Whether operands of `bits` bits fit the cache's int16 form.
  static bool Fits(int bits) { return bits >= 2 && bits <= 16; }

  // `source` must outlive the cache; layers x heads KV heads per request.
  FullKvCache(const AttentionSource* source, int layers, int heads, int bits, bool keep_v,
              int64_t cap_bytes);

 private:
  struct Head {
    int64_t rows = 0;
    std::vector<int16_t> k, v;
    float k_max = 0, v_max = 0;
    // (rows after which the maximum rose, the new maximum), ascending.
    std::vector<std::pair<int64_t, float>> k_records, v_records;
  };
  struct Entry {
    std::mutex mu;
    int64_t request = 0;
    std::vector<Head> heads;  // layer * heads + head
    int64_t bytes = 0;        // as last accounted under the cache's lock
    bool listed = false;
    std::list<Entry*>::iterator lru;
  };

 public:
  // One request's rows, locked while the lease lives; on destruction the
  // cache accounts the request's bytes and evicts down to the cap.
  class Lease {
   public:
    Lease(Lease&& o) noexcept;
    Lease& operator=(Lease&&) = delete;
    ~Lease();
    // The rows of (layer, head) for context length l >= 1, extended,
    // truncated or rebuilt as needed. Valid until the next Rows() of the
    // same (layer, head) or the end of the lease.
    absl::StatusOr<View> Rows(int layer, int head, int64_t l);

   private:
    friend class FullKvCache;
    Lease(FullKvCache* cache, std::shared_ptr<Entry> entry);
    FullKvCache* cache_;
    std::shared_ptr<Entry> entry_;
    std::unique_lock<std::mutex> lock_;
    std::vector<float> scratch_k_, scratch_v_;
  };
  Lease Acquire(int64_t request);

  // Bytes held by all requests / by one (as of the last lease's end).
  int64_t bytes() const;
  int64_t bytes_of(int64_t request) const;
  // Heads built (or rebuilt) from row 0 so far, over all requests.
  int64_t head_builds() const;
  int64_t cap_bytes() const { return cap_bytes_; }
  // Bytes per cached position of one request.
  int64_t bytes_per_position() const;

 private:
  void Finish(Entry* e);
  static int64_t BytesOf(const Entry& e);

  const AttentionSource* source_;
  int layers_, heads_, bits_;
  bool keep_v_;
  int64_t d_, cap_bytes_;
  mutable std::mutex mu_;
  absl::flat_hash_map<int64_t, std::shared_ptr<Entry>> entries_;
  std::list<Entry*> lru_;  // front: least recently used
  int64_t total_bytes_ = 0;
  std::atomic<int64_t> head_builds_{0};
};

// The cap from a spec's full_cache_bytes (0 or unset: the default).
int64_t FullCacheCap(int64_t spec_bytes);

// ------------------------------------------- FULL steps spread over agents --
// Device::Measure and Absorb for the FULL modes (device.h). FreshSteps keeps,
// per request, the steps a device memoised that no Measure has returned yet;
// it is off until the first Measure, so a run that never calls it keeps
// nothing. Not thread-safe: used under the device's memo lock.
class FreshSteps {
 public:
  void Enable() { on_ = true; }
  void Add(int64_t request_id, int64_t l) {
    if (on_) fresh_[request_id].push_back(l);
  }
  std::vector<int64_t> Take(int64_t request_id);

 private:
  bool on_ = false;
  absl::flat_hash_map<int64_t, std::vector<int64_t>> fresh_;
};

// Counts the calls that wait for a device's memo lock while they live, so
// that work done ahead (Device::MeasureAhead) yields to them between steps.
class AskingScope {
 public:
  explicit AskingScope(std::atomic<int>& asking) : asking_(asking) { asking_.fetch_add(1); }
  ~AskingScope() { asking_.fetch_sub(1); }
  AskingScope(const AskingScope&) = delete;
  AskingScope& operator=(const AskingScope&) = delete;

 private:
  std::atomic<int>& asking_;
};

// A step's key is a request id >= 0 and a context length >= 1 (INVALID_ARGUMENT
// naming `what`[i] otherwise).
absl::Status CheckStepKey(const char* device, const char* what, size_t i, const StepKey& k);

// Measure() of a FULL device: `measure(key)` runs or finds the step
// (memoising it, and telling `fresh` of every step it memoises);
// `lookup(key, out)`, called with `mu` held, copies a memoised step's values
// (false if it has none). Returns the steps asked for, then the fresh steps
// of their requests not among them.
template <size_t N, typename MeasureFn, typename LookupFn>
absl::StatusOr<std::vector<StepMeasurement>> MeasureSteps(const char* device,
                                                          absl::Span<const StepKey> steps,
                                                          std::mutex& mu, FreshSteps& fresh,
                                                          MeasureFn measure, LookupFn lookup) {
  for (size_t i = 0; i < steps.size(); ++i) {
    if (absl::Status st = CheckStepKey(device, "steps", i, steps[i]); !st.ok()) return st;
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    fresh.Enable();
  }
  std::vector<StepMeasurement> out;
  out.reserve(steps.size());
  for (const StepKey& k : steps) {
    // A step is one kernel run over every head of every layer: the agent's
    // caller may stop the call between steps (interrupt.h).
    if (absl::Status st = PollInterrupt(); !st.ok()) return st;
    absl::StatusOr<std::array<double, N>> v = measure(k);
    if (!v.ok()) return v.status();
    out.push_back({k, std::vector<double>(v->begin(), v->end())});
  }
  std::lock_guard<std::mutex> lock(mu);
  std::vector<int64_t> requests;
  for (const StepKey& k : steps) {
    if (std::find(requests.begin(), requests.end(), k.request_id) == requests.end()) {
      requests.push_back(k.request_id);
    }
  }
  std::array<double, N> v;
  for (int64_t r : requests) {
    for (int64_t l : fresh.Take(r)) {
      const StepKey k{r, l};
      if (std::find(steps.begin(), steps.end(), k) != steps.end()) continue;
      if (lookup(k, &v)) out.push_back({k, std::vector<double>(v.begin(), v.end())});
    }
  }
  return out;
}

// Absorb()'s checks: N finite values per step, keys as CheckStepKey.
absl::Status CheckMeasurements(const char* device, size_t n,
                               absl::Span<const StepMeasurement> measured);
// One of them, whole or a share: key, n values, finite.
absl::Status CheckMeasurement(const char* device, size_t i, size_t n, const StepMeasurement& m);
template <size_t N>
std::array<double, N> StepValues(const StepMeasurement& m) {
  std::array<double, N> v;
  std::copy(m.values.begin(), m.values.end(), v.begin());
  return v;
}

// Layer shares (Device::MeasureLayers): the first layer of share `part` of
// `parts` over `layers` layers (the share ends where part + 1 begins).
inline int32_t LayerShareBegin(int32_t layers, int part, int parts) {
  return static_cast<int32_t>(static_cast<int64_t>(layers) * part / parts);
}
// Checks part in [0, parts) and parts in [1, kMaxLayerParts].
absl::Status CheckLayerShare(const char* device, int part, int parts);
// MeasureLayers() of a FULL device: `counts(key, layer_begin, layer_end)`
// gives the C additive counts of those layers of a step (memoising nothing).
template <size_t C, typename CountsFn>
absl::StatusOr<std::vector<StepMeasurement>> MeasureShares(const char* device,
                                                           absl::Span<const StepKey> steps,
                                                           int part, int parts, int32_t layers,
                                                           CountsFn counts) {
  if (absl::Status st = CheckLayerShare(device, part, parts); !st.ok()) return st;
  const int32_t begin = LayerShareBegin(layers, part, parts);
  const int32_t end = LayerShareBegin(layers, part + 1, parts);
  std::vector<StepMeasurement> out;
  out.reserve(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    if (absl::Status st = CheckStepKey(device, "steps", i, steps[i]); !st.ok()) return st;
    if (absl::Status st = PollInterrupt(); !st.ok()) return st;
    absl::StatusOr<std::array<double, C>> c = counts(steps[i], begin, end);
    if (!c.ok()) return c.status();
    out.push_back({steps[i], std::vector<double>(c->begin(), c->end()), part, parts});
  }
  return out;
}

// Absorb's measurements with the shares of each step summed (share order,
// exact for integer counts below 2^53) into one whole measurement of C
// counts per step; whole measurements (parts 1) are left out. Every share
// of a step must come exactly once and with the same `parts`.
template <size_t C>
absl::StatusOr<std::vector<std::pair<StepKey, std::array<double, C>>>> SumLayerShares(
    const char* device, absl::Span<const StepMeasurement> measured);

// The two for a device whose memo maps (request, L) to its N values under
// `mu`, and whose `full(request, l)` runs or finds a step.
template <size_t N, typename Memo, typename FullFn>
absl::StatusOr<std::vector<StepMeasurement>> MeasureMemo(const char* device,
                                                         absl::Span<const StepKey> steps,
                                                         std::mutex& mu, FreshSteps& fresh,
                                                         const Memo& memo, FullFn full) {
  return MeasureSteps<N>(
      device, steps, mu, fresh, [&](const StepKey& k) { return full(k.request_id, k.l); },
      [&](const StepKey& k, std::array<double, N>* v) {
        auto it = memo.find({k.request_id, k.l});
        if (it == memo.end()) return false;
        *v = it->second;
        return true;
      });
}
// Whole measurements of N values; with `sum_to_values`, shares of C counts
// too (converted by sum_to_values(step, counts) -> N values).
template <size_t N, typename Memo>
absl::Status AbsorbMemo(const char* device, absl::Span<const StepMeasurement> measured,
                        std::mutex& mu, Memo& memo) {
  if (absl::Status st = CheckMeasurements(device, N, measured); !st.ok()) return st;
  std::lock_guard<std::mutex> lock(mu);
  for (const StepMeasurement& m : measured) {
    memo.emplace(std::make_pair(m.step.request_id, m.step.l), StepValues<N>(m));
  }
  return absl::OkStatus();
}
template <size_t N, size_t C, typename Memo, typename SumToValues>
absl::Status AbsorbMemoWithShares(const char* device, absl::Span<const StepMeasurement> measured,
                                  std::mutex& mu, Memo& memo, SumToValues sum_to_values) {
  std::vector<StepMeasurement> whole;
  for (size_t i = 0; i < measured.size(); ++i) {
    if (measured[i].parts > 1) continue;
    if (absl::Status st = CheckMeasurement(device, i, N, measured[i]); !st.ok()) return st;
    whole.push_back(measured[i]);
  }
  absl::StatusOr<std::vector<std::pair<StepKey, std::array<double, C>>>> shares =
      SumLayerShares<C>(device, measured);
  if (!shares.ok()) return shares.status();
  std::lock_guard<std::mutex> lock(mu);
  for (const StepMeasurement& m : whole) {
    memo.emplace(std::make_pair(m.step.request_id, m.step.l), StepValues<N>(m));
  }
  for (const auto& [k, counts] : *shares) {
    memo.emplace(std::make_pair(k.request_id, k.l), sum_to_values(k, counts));
  }
  return absl::OkStatus();
}

template <size_t C>
absl::StatusOr<std::vector<std::pair<StepKey, std::array<double, C>>>> SumLayerShares(
    const char* device, absl::Span<const StepMeasurement> measured) {
  struct Acc {
    int parts = 0;
    std::vector<const StepMeasurement*> by_part;
  };
  absl::flat_hash_map<StepKey, Acc> acc;
  std::vector<StepKey> order;
  for (size_t i = 0; i < measured.size(); ++i) {
    const StepMeasurement& m = measured[i];
    if (m.parts <= 1) continue;
    if (absl::Status st = CheckLayerShare(device, m.part, m.parts); !st.ok()) return st;
    if (absl::Status st = CheckMeasurement(device, i, C, m); !st.ok()) return st;
    auto [it, added] = acc.try_emplace(m.step);
    if (added) {
      it->second.parts = m.parts;
      it->second.by_part.assign(m.parts, nullptr);
      order.push_back(m.step);
    }
    if (it->second.parts != m.parts || it->second.by_part[m.part] != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(device, " device: measured[", i, "] is share ", m.part, " of ", m.parts,
                       " of (request ", m.step.request_id, ", L ", m.step.l,
                       "), which came already or with another number of shares"));
    }
    it->second.by_part[m.part] = &m;
  }
  std::vector<std::pair<StepKey, std::array<double, C>>> out;
  for (const StepKey& k : order) {
    std::array<double, C> sum{};
    for (const StepMeasurement* m : acc[k].by_part) {
      if (m == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(device, " device: (request ", k.request_id,
                                                       ", L ", k.l, ") is missing a share of ",
                                                       acc[k].parts));
      }
      for (size_t c = 0; c < C; ++c) sum[c] += m->values[c];
    }
    out.emplace_back(k, sum);
  }
  return out;
}

}  // namespace servesim::devices

#endif  // SERVESIM_DEVICES_PRUNE_COMMON_H_
