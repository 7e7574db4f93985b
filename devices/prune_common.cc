#include "devices/prune_common.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "google/protobuf/text_format.h"

namespace servesim::devices {

std::vector<double> KeepProfile::Eval(double context_len) const {
  if (lengths.empty()) return {};
  if (context_len <= lengths.front()) return rows.front();
  if (context_len >= lengths.back()) return rows.back();
  const size_t hi = static_cast<size_t>(
      std::upper_bound(lengths.begin(), lengths.end(), context_len) - lengths.begin());
  const size_t lo = hi - 1;
  const double w = (std::log(context_len) - std::log(lengths[lo])) /
                   (std::log(lengths[hi]) - std::log(lengths[lo]));
  std::vector<double> out(rows[lo].size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = rows[lo][i] + w * (rows[hi][i] - rows[lo][i]);
  return out;
}

void KeepProfile::Tabulate() {
  table_.clear();
  table_len_ = 0;
  width_ = rows.empty() ? 0 : rows.front().size();
  if (lengths.empty()) return;
  // Past the last length every row is the last one: the table stops there.
  table_len_ = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(lengths.back())), 1, 65536);
  table_.resize(static_cast<size_t>(table_len_) * width_);
  for (int64_t l = 1; l <= table_len_; ++l) {
    const std::vector<double> r = Eval(static_cast<double>(l));
    std::copy(r.begin(), r.end(), table_.begin() + static_cast<size_t>(l - 1) * width_);
  }
}

const double* KeepProfile::Row(int64_t l, std::vector<double>* scratch) const {
  if (l >= 1 && l <= table_len_) return table_.data() + static_cast<size_t>(l - 1) * width_;
  if (!rows.empty() && static_cast<double>(l) >= lengths.back()) return rows.back().data();
  *scratch = Eval(static_cast<double>(l));
  return scratch->data();
}

AttentionDataParams DataParamsFromProto(const servesim::v1::AttentionDataSpec& s, int64_t d_head) {
  AttentionDataParams p;
  p.d_head = d_head;
  if (s.has_seed()) p.seed = s.seed();
  if (s.has_sink_logit()) p.sink_logit = s.sink_logit();
  if (s.has_recency_logit()) p.recency_logit = s.recency_logit();
  if (s.has_recency_tokens()) p.recency_tokens = s.recency_tokens();
  if (s.has_spread_min()) p.spread_min = s.spread_min();
  if (s.has_spread_max()) p.spread_max = s.spread_max();
  if (s.has_tail_dof()) p.tail_dof = s.tail_dof();
  if (s.has_query_drift_rad_per_step()) p.query_drift_rad_per_step = s.query_drift_rad_per_step();
  return p;
}

absl::StatusOr<std::unique_ptr<AttentionSource>> MakeAttentionSource(
    const servesim::v1::AttentionDataSpec& spec, int64_t d_head) {
  if (!spec.npy_dir().empty()) {
    ASSIGN_OR_RETURN(NpyAttentionSource src, NpyAttentionSource::Create(spec.npy_dir()));
    return std::unique_ptr<AttentionSource>(new NpyAttentionSource(std::move(src)));
  }
  ASSIGN_OR_RETURN(AttentionDataGenerator gen,
                   AttentionDataGenerator::Create(DataParamsFromProto(spec, d_head)));
  return std::unique_ptr<AttentionSource>(new AttentionDataGenerator(std::move(gen)));
}

const char* FidelityName(servesim::v1::PruneFidelity f) {
  switch (f) {
    case servesim::v1::PRUNE_FIDELITY_CALIBRATED:
      return "calibrated";
    case servesim::v1::PRUNE_FIDELITY_FULL:
      return "full";
    default:
      return "analytic";
  }
}

const char* RatioSource(servesim::v1::PruneFidelity f, const char* analytic_source) {
  switch (f) {
    case servesim::v1::PRUNE_FIDELITY_CALIBRATED:
      return "calibrated";
    case servesim::v1::PRUNE_FIDELITY_FULL:
      return "measured";
    default:
      return analytic_source;
  }
}

const char* RatioSourceOf(const servesim::v1::DeviceSpec& d) {
  if (d.has_topick()) return RatioSource(d.topick().fidelity(), "paper");
  if (d.has_spatten()) return RatioSource(d.spatten().fidelity(), "paper");
  if (d.has_cta()) return RatioSource(d.cta().fidelity(), "paper");
  if (d.has_lad()) return RatioSource(d.lad().fidelity(), "assumption");
  return nullptr;
}

namespace {

// A scalar field's value as text (TextFormat's form), for messages.
std::string FieldText(const google::protobuf::Message& m,
                      const google::protobuf::FieldDescriptor* f) {
  std::string text;
  google::protobuf::TextFormat::PrintFieldValueToString(m, f, -1, &text);
  return text;
}

}  // namespace

absl::Status CheckAnalyticKnobs(absl::string_view device, const google::protobuf::Message& spec,
                                const google::protobuf::Message& preset,
                                std::initializer_list<absl::string_view> knobs) {
  const google::protobuf::Descriptor* d = spec.GetDescriptor();
  for (absl::string_view knob : knobs) {
    const google::protobuf::FieldDescriptor* f = d->FindFieldByName(std::string(knob));
    if (f == nullptr || f->is_repeated()) {
      return absl::InternalError(absl::StrCat(device, ": no scalar field ", knob));
    }
    const std::string mine = FieldText(spec, f), theirs = FieldText(preset, f);
    if (mine == theirs) continue;
    const std::string preset_name = FieldText(preset, d->FindFieldByName("preset"));
    return absl::InvalidArgumentError(absl::StrCat(
        device, " device: ", knob, " = ", mine, " differs from preset ", preset_name, "'s ", theirs,
        ", and fidelity ANALYTIC charges that preset's table of ratios, which holds only for ",
        theirs, "; set fidelity: PRUNE_FIDELITY_CALIBRATED or PRUNE_FIDELITY_FULL to model ", knob,
        " = ", mine, " (the functional kernel then measures the ratios), or use a preset whose ",
        knob, " is ", mine));
  }
  return absl::OkStatus();
}

absl::Status CheckAnalyticUnused(absl::string_view device, const google::protobuf::Message& part,
                                 absl::string_view field) {
  if (part.ByteSizeLong() == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      device, " device: ", field, " is set, but fidelity ANALYTIC charges the preset's table and "
      "runs no kernel on data; set fidelity: PRUNE_FIDELITY_CALIBRATED or PRUNE_FIDELITY_FULL to "
      "use it, or remove it"));
}

int64_t OpHeadCount(const Op& op) {
  const int64_t end = op.head_end < 0 ? op.heads : std::min(op.head_end, op.heads);
  return std::max<int64_t>(0, end - std::max<int64_t>(0, op.head_begin));
}

absl::Status CheckAttentionShape(absl::string_view device,
                                 const servesim::v1::AttentionShape& model) {
  for (auto [has, v, name, hi] :
       {std::tuple<bool, int64_t, const char*, int64_t>{model.has_layers(), model.layers(),
                                                        "model.layers", 1024},
        {model.has_heads(), model.heads(), "model.heads", 4096},
        {model.has_d_head(), model.d_head(), "model.d_head", 4096}}) {
    if (has && (v < 1 || v > hi)) {
      return absl::InvalidArgumentError(
          absl::StrCat(device, " device: ", name, " = ", v, "; expected in [1, ", hi, "]"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckAttentionOps(absl::string_view device, absl::Span<const Op> ops,
                               size_t cost_slots) {
  if (cost_slots != ops.size()) {
    return absl::InvalidArgumentError(absl::StrCat(device, " device: ", ops.size(), " ops but ",
                                                   cost_slots, " cost slots"));
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (op.kind != OpKind::kAttention) {
      return absl::InvalidArgumentError(absl::StrCat(
          device, " device: op ", i, " is not attention; the device runs attention only"));
    }
    if (op.heads < 1 || op.kv_heads < 1 || op.d_head < 1 || op.heads % op.kv_heads != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(device, " device: op ", i, " has heads ", op.heads, ", kv_heads ",
                       op.kv_heads, ", d_head ", op.d_head,
                       "; expected >= 1 and heads a multiple of kv_heads"));
    }
    for (const AttentionSeq& s : op.seqs) {
      if (s.new_tokens < 1 || s.past_tokens < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            device, " device: sequence with new_tokens ", s.new_tokens, ", past_tokens ",
            s.past_tokens, "; expected new_tokens >= 1 and past_tokens >= 0"));
      }
    }
  }
  return absl::OkStatus();
}

std::vector<int64_t> CalibrationLengths(const servesim::v1::PruneCalibrationSpec& c) {
  if (c.lengths_size() == 0) return {128, 256, 512, 1024, 2048};
  std::vector<int64_t> v(c.lengths().begin(), c.lengths().end());
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

int CalibrationInstances(const servesim::v1::PruneCalibrationSpec& c) {
  return c.has_instances() ? c.instances() : 4;
}


// ------------------------------------------------------------ fixed point --

double FixedScale(float max_abs, int bits) {
  const int32_t qmax = (int32_t{1} << (bits - 1)) - 1;
  return max_abs > 0 ? static_cast<double>(max_abs) / qmax : 1.0;
}

template <typename T>
void QuantiseAtScale(const float* x, int64_t n, int bits, double scale, T* out) {
  const double qmax = static_cast<double>((int32_t{1} << (bits - 1)) - 1);
  // Round half to even as std::nearbyint in the default rounding mode, by
  // the add-and-subtract of 1.5 x 2^52 (exact for |r| < 2^51; here |r| <=
  // qmax x (1 + 2^-52)), which unlike nearbyint compiles to vector code on
  // baseline x86-64 (no SSE4.1 round instruction).
  constexpr double kMagic = 0x1.8p52;
  for (int64_t i = 0; i < n; ++i) {
    const double r = (static_cast<double>(x[i]) / scale + kMagic) - kMagic;
    // NaN (a NaN or infinite input: scores of huge q and k overflow) gives
    // 0, as converting NaN to an integer is undefined.
    const double c = r > qmax ? qmax : (r < -qmax ? -qmax : r);
    out[i] = static_cast<T>(c == c ? c : 0.0);
  }
}

template <typename T>
double QuantiseFixed(const float* x, int64_t n, int bits, T* out) {
  float mx = 0;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, std::fabs(x[i]));
  const double scale = FixedScale(mx, bits);
  QuantiseAtScale(x, n, bits, scale, out);
  return scale;
}

template void QuantiseAtScale<int16_t>(const float*, int64_t, int, double, int16_t*);
template void QuantiseAtScale<int32_t>(const float*, int64_t, int, double, int32_t*);
template double QuantiseFixed<int16_t>(const float*, int64_t, int, int16_t*);
template double QuantiseFixed<int32_t>(const float*, int64_t, int, int32_t*);

const float* AsFloats(const Tensor& t, std::vector<float>* storage) {
  if (t.type == ElementType::kFp32) return reinterpret_cast<const float*>(t.bytes.data());
  const int64_t n = t.NumElements();
  storage->resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) (*storage)[static_cast<size_t>(i)] = t.At(i);
  return storage->data();
}

// ---------------------------------------------------------- FULL K/V cache --

namespace {

// The largest |x| among the first l rows, from the records of its rises.
float PrefixMax(const std::vector<std::pair<int64_t, float>>& records, int64_t l) {
  float m = 0;
  for (const auto& [row, v] : records) {
    if (row >= l) break;
    m = v;
  }
  return m;
}

// Scans rows [first, first + n) (row-major floats x) for rises of the
// running maximum; true if it rose.
bool ScanMax(const float* x, int64_t first, int64_t n, int64_t d, float* max_abs,
             std::vector<std::pair<int64_t, float>>* records) {
  bool rose = false;
  for (int64_t r = 0; r < n; ++r) {
    float m = 0;
    for (int64_t c = 0; c < d; ++c) m = std::max(m, std::fabs(x[r * d + c]));
    if (m > *max_abs) {
      *max_abs = m;
      records->push_back({first + r, m});
      rose = true;
    }
  }
  return rose;
}

}  // namespace

int64_t FullCacheCap(int64_t spec_bytes) {
  return spec_bytes > 0 ? spec_bytes : FullKvCache::kDefaultCapBytes;
}

FullKvCache::FullKvCache(const AttentionSource* source, int layers, int heads, int bits,
                         bool keep_v, int64_t cap_bytes)
    : source_(source), layers_(layers), heads_(heads), bits_(bits), keep_v_(keep_v),
      d_(source->d_head()), cap_bytes_(cap_bytes) {}

int64_t FullKvCache::bytes_per_position() const {
  return int64_t{layers_} * heads_ * d_ * static_cast<int64_t>(sizeof(int16_t)) * (keep_v_ ? 2 : 1);
}

int64_t FullKvCache::BytesOf(const Entry& e) {
  int64_t b = 0;
  for (const Head& h : e.heads) {
    b += static_cast<int64_t>((h.k.capacity() + h.v.capacity()) * sizeof(int16_t) +
                              (h.k_records.capacity() + h.v_records.capacity()) *
                                  sizeof(std::pair<int64_t, float>));
  }
  return b;
}

FullKvCache::Lease FullKvCache::Acquire(int64_t request) {
  std::shared_ptr<Entry> e;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto& slot = entries_[request];
    if (slot == nullptr) {
      slot = std::make_shared<Entry>();
      slot->request = request;
    }
    e = slot;
  }
  return Lease(this, std::move(e));
}

FullKvCache::Lease::Lease(FullKvCache* cache, std::shared_ptr<Entry> entry)
    : cache_(cache), entry_(std::move(entry)), lock_(entry_->mu) {
  if (entry_->heads.empty()) entry_->heads.resize(static_cast<size_t>(cache_->layers_) * cache_->heads_);
}

FullKvCache::Lease::Lease(Lease&& o) noexcept
    : cache_(o.cache_), entry_(std::move(o.entry_)), lock_(std::move(o.lock_)),
      scratch_k_(std::move(o.scratch_k_)), scratch_v_(std::move(o.scratch_v_)) {}

FullKvCache::Lease::~Lease() {
  if (entry_ == nullptr) return;
  cache_->Finish(entry_.get());
  lock_.unlock();
}

absl::StatusOr<FullKvCache::View> FullKvCache::Lease::Rows(int layer, int head, int64_t l) {
  FullKvCache& c = *cache_;
  if (layer < 0 || layer >= c.layers_ || head < 0 || head >= c.heads_ || l < 1) {
    return absl::InvalidArgumentError(absl::StrCat("K/V cache: layer ", layer, " head ", head,
                                                   " context ", l, "; expected layer in [0, ",
                                                   c.layers_, "), head in [0, ", c.heads_,
                                                   ") and context >= 1"));
  }
  Head& h = entry_->heads[static_cast<size_t>(layer) * c.heads_ + head];
  const int64_t d = c.d_;
  const bool kv = c.keep_v_;
  if (l < h.rows && (PrefixMax(h.k_records, l) != h.k_max ||
                     (kv && PrefixMax(h.v_records, l) != h.v_max))) {
    h = Head{};  // the prefix has its own scale: rebuild at l
  }
  if (l > h.rows) {
    const AttentionInstance in{entry_->request, layer, head};
    const int64_t old = h.rows, n = l - old;
    if (old == 0) c.head_builds_.fetch_add(1, std::memory_order_relaxed);
    scratch_k_.resize(static_cast<size_t>(n * d));
    scratch_v_.resize(kv ? static_cast<size_t>(n * d) : 0);
    RETURN_IF_ERROR(c.source_->KeyValueRows(in, old, l, scratch_k_.data(),
                                            kv ? scratch_v_.data() : nullptr));
    const bool k_rose = ScanMax(scratch_k_.data(), old, n, d, &h.k_max, &h.k_records);
    const bool v_rose = kv && ScanMax(scratch_v_.data(), old, n, d, &h.v_max, &h.v_records);
    // Growth by 1/8 (at least 64 rows) past the first build: at most 12.5%
    // slack, and a step rarely reallocates.
    if (old > 0 && h.k.capacity() < static_cast<size_t>(l * d)) {
      const size_t want = static_cast<size_t>(std::max(l + 64, l + l / 8) * d);
      h.k.reserve(want);
      if (kv) h.v.reserve(want);
    }
    h.k.resize(static_cast<size_t>(l * d));
    if (kv) h.v.resize(static_cast<size_t>(l * d));
    if (old > 0 && (k_rose || v_rose)) {
      // The scale changed: the old rows again from the source.
      std::vector<float> ok(static_cast<size_t>(old * d)), ov(v_rose ? ok.size() : 0);
      RETURN_IF_ERROR(c.source_->KeyValueRows(in, 0, old, ok.data(), v_rose ? ov.data() : nullptr));
      if (k_rose) QuantiseAtScale(ok.data(), old * d, c.bits_, FixedScale(h.k_max, c.bits_), h.k.data());
      if (v_rose) QuantiseAtScale(ov.data(), old * d, c.bits_, FixedScale(h.v_max, c.bits_), h.v.data());
    }
    QuantiseAtScale(scratch_k_.data(), n * d, c.bits_, FixedScale(h.k_max, c.bits_),
                    h.k.data() + old * d);
    if (kv) {
      QuantiseAtScale(scratch_v_.data(), n * d, c.bits_, FixedScale(h.v_max, c.bits_),
                      h.v.data() + old * d);
    }
    h.rows = l;
  }
  View v;
  v.k = h.k.data();
  v.v = kv ? h.v.data() : nullptr;
  v.k_scale = FixedScale(h.k_max, c.bits_);
  v.v_scale = FixedScale(h.v_max, c.bits_);
  return v;
}

void FullKvCache::Finish(Entry* e) {
  std::vector<std::shared_ptr<Entry>> dropped;  // destroyed after the lock
  std::lock_guard<std::mutex> g(mu_);
  const int64_t now = BytesOf(*e);
  total_bytes_ += now - e->bytes;
  e->bytes = now;
  if (e->listed) lru_.erase(e->lru);
  lru_.push_back(e);
  e->lru = std::prev(lru_.end());
  e->listed = true;
  auto drop = [&](Entry* v) {
    total_bytes_ -= v->bytes;
    v->bytes = 0;
    v->heads.clear();
    v->heads.shrink_to_fit();
    lru_.erase(v->lru);
    v->listed = false;
    if (auto it = entries_.find(v->request); it != entries_.end() && it->second.get() == v) {
      dropped.push_back(std::move(it->second));
      entries_.erase(it);
    }
  };
  for (auto it = lru_.begin(); total_bytes_ > cap_bytes_ && it != lru_.end();) {
    Entry* v = *it++;
    if (v == e) continue;
    std::unique_lock<std::mutex> vl(v->mu, std::try_to_lock);
    if (!vl.owns_lock()) continue;  // in use by another thread
    drop(v);
  }
  if (total_bytes_ > cap_bytes_) drop(e);  // alone above the cap
}

int64_t FullKvCache::bytes() const {
  std::lock_guard<std::mutex> g(mu_);
  return total_bytes_;
}

int64_t FullKvCache::bytes_of(int64_t request) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = entries_.find(request);
  return it == entries_.end() ? 0 : it->second->bytes;
}

int64_t FullKvCache::head_builds() const { return head_builds_.load(std::memory_order_relaxed); }

std::vector<int64_t> FreshSteps::Take(int64_t request_id) {
  auto it = fresh_.find(request_id);
  if (it == fresh_.end()) return {};
  std::vector<int64_t> out = std::move(it->second);
  fresh_.erase(it);
  return out;
}

absl::Status CheckStepKey(const char* device, const char* what, size_t i, const StepKey& k) {
  if (k.request_id < 0 || k.l < 1) {
    return absl::InvalidArgumentError(absl::StrCat(device, " device: ", what, "[", i,
                                                   "] is (request ", k.request_id, ", L ", k.l,
                                                   "); expected a request id >= 0 and L >= 1"));
  }
  return absl::OkStatus();
}

absl::Status CheckLayerShare(const char* device, int part, int parts) {
  if (parts < 1 || parts > kMaxLayerParts || part < 0 || part >= parts) {
    return absl::InvalidArgumentError(absl::StrCat(device, " device: layer share ", part, " of ",
                                                   parts, "; expected parts in [1, ",
                                                   kMaxLayerParts, "] and part in [0, parts)"));
  }
  return absl::OkStatus();
}

absl::Status CheckMeasurements(const char* device, size_t n,
                               absl::Span<const StepMeasurement> measured) {
  for (size_t i = 0; i < measured.size(); ++i) {
    if (measured[i].parts != 1 || measured[i].part != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(device, " device: measured[", i, "] is layer share ", measured[i].part,
                       " of ", measured[i].parts, "; this device takes whole steps"));
    }
    RETURN_IF_ERROR(CheckMeasurement(device, i, n, measured[i]));
  }
  return absl::OkStatus();
}

absl::Status CheckMeasurement(const char* device, size_t i, size_t n, const StepMeasurement& m) {
  RETURN_IF_ERROR(CheckStepKey(device, "measured", i, m.step));
  if (m.values.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(device, " device: measured[", i, "] has ",
                                                   m.values.size(), " values; expected ", n));
  }
  for (size_t j = 0; j < n; ++j) {
    if (!std::isfinite(m.values[j])) {
      return absl::InvalidArgumentError(
          absl::StrCat(device, " device: measured[", i, "].values[", j, "] is not finite"));
    }
  }
  return absl::OkStatus();
}

}  // namespace servesim::devices
