#include "devices/gpu/profile.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace servesim::devices {

// ------------------------------------------------------------- curves ----

double ProfileCurve::Eval(double at, bool* beyond) const {
  if (x.empty()) return 0;
  if (at <= x.front()) return t.front();
  if (at >= x.back()) {
    if (at > x.back() && beyond != nullptr) *beyond = true;
    return t.back();
  }
  const size_t hi = static_cast<size_t>(std::upper_bound(x.begin(), x.end(), at) - x.begin());
  const size_t lo = hi - 1;
  const double w = (at - x[lo]) / (x[hi] - x[lo]);
  return t[lo] + w * (t[hi] - t[lo]);
}

struct GpuProfile::Node {
  std::vector<double> keys;
  std::vector<Node> children;  // depth < 3
  ProfileCurve leaf;           // depth 3: time against the decode history
};

namespace {

// ---------------------------------------------------------------- files ----

absl::StatusOr<std::string> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

uint64_t Fnv1a(uint64_t h, absl::string_view bytes) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

// A CSV file of named columns (no quoting), read whole: rows of the wanted
// columns, each with its line number.
struct Csv {
  std::string path;
  std::vector<std::vector<std::string>> rows;
  std::vector<int64_t> lines;
};

absl::StatusOr<Csv> ReadCsv(const std::string& path, const std::string& text,
                            const std::vector<std::string>& columns) {
  Csv csv;
  csv.path = path;
  std::vector<size_t> index;
  size_t width = 0;
  int64_t line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripSuffix(line, "\r");
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    std::vector<absl::string_view> f = absl::StrSplit(line, ',');
    for (auto& v : f) v = absl::StripAsciiWhitespace(v);
    if (index.empty()) {
      for (const std::string& c : columns) {
        const auto it = std::find(f.begin(), f.end(), c);
        if (it == f.end()) {
          return absl::InvalidArgumentError(
              absl::StrCat(path, ":", line_no, ": header has no column ", c, " (expected columns ",
                           absl::StrJoin(columns, ","), ")"));
        }
        index.push_back(static_cast<size_t>(it - f.begin()));
      }
      width = f.size();
      continue;
    }
    if (f.size() != width) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_no, ": ", f.size(), " fields; the header has ", width));
    }
    std::vector<std::string> row;
    for (size_t i : index) row.emplace_back(f[i]);
    csv.rows.push_back(std::move(row));
    csv.lines.push_back(line_no);
  }
  if (index.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": empty"));
  if (csv.rows.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no data rows after the header"));
  }
  return csv;
}

// A finite number >= 0 in `field` of row `r`, named by its column.
absl::StatusOr<double> Number(const Csv& csv, size_t r, size_t field, const std::string& column) {
  const std::string& s = csv.rows[r][field];
  double v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size() || !std::isfinite(v) || v < 0) {
    return absl::InvalidArgumentError(absl::StrCat(csv.path, ":", csv.lines[r], ": column ", column,
                                                   " is \"", s,
                                                   "\"; expected a finite number >= 0"));
  }
  return v;
}

// dense.csv / per_sequence.csv: layer, count, time_us; per layer, counts
// strictly ascending.
absl::Status ReadCurves(const std::string& path, const std::string& text,
                        const std::string& count_column,
                        std::map<std::string, ProfileCurve, std::less<>>* out) {
  ASSIGN_OR_RETURN(Csv csv, ReadCsv(path, text, {"layer", count_column, "time_us"}));
  for (size_t r = 0; r < csv.rows.size(); ++r) {
    ASSIGN_OR_RETURN(const double x, Number(csv, r, 1, count_column));
    ASSIGN_OR_RETURN(const double us, Number(csv, r, 2, "time_us"));
    ProfileCurve& c = (*out)[csv.rows[r][0]];
    if (!c.x.empty() && !(x > c.x.back())) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", csv.lines[r], ": column ", count_column, " is ", csv.rows[r][1],
                       " after ", c.x.back(), " for layer ", csv.rows[r][0],
                       "; expected each layer's grid points ascending and unique"));
    }
    c.x.push_back(x);
    c.t.push_back(us * 1e-6);
  }
  return absl::OkStatus();
}

// meta.yaml, as far as the bundle needs it: `key: value` lines nested by
// indentation, values scalars or inline lists ([a, b, c]). Returns
// "a.b.c" -> raw value.
std::map<std::string, std::string> ReadYamlScalars(const std::string& text) {
  std::map<std::string, std::string> out;
  std::vector<std::pair<size_t, std::string>> stack;  // (indent, key)
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripSuffix(line, "\r");
    const size_t indent = line.find_first_not_of(' ');
    if (indent == absl::string_view::npos) continue;
    absl::string_view body = line.substr(indent);
    if (absl::StartsWith(body, "#") || absl::StartsWith(body, "- ")) continue;
    const size_t colon = body.find(':');
    if (colon == absl::string_view::npos) continue;
    while (!stack.empty() && stack.back().first >= indent) stack.pop_back();
    const std::string key(absl::StripAsciiWhitespace(body.substr(0, colon)));
    const absl::string_view value = absl::StripAsciiWhitespace(body.substr(colon + 1));
    std::string path;
    for (const auto& [unused, k] : stack) absl::StrAppend(&path, k, ".");
    absl::StrAppend(&path, key);
    if (value.empty()) {
      stack.emplace_back(indent, key);
    } else {
      out[path] = std::string(value);
    }
  }
  return out;
}

std::vector<std::string> YamlList(const std::string& raw) {
  absl::string_view v = absl::StripAsciiWhitespace(raw);
  v = absl::StripPrefix(absl::StripSuffix(v, "]"), "[");
  std::vector<std::string> out;
  for (absl::string_view item : absl::StrSplit(v, ',', absl::SkipWhitespace())) {
    out.emplace_back(absl::StripAsciiWhitespace(item));
  }
  return out;
}

}  // namespace

const std::string* GpuProfile::Bins::Label(double v) const {
  // Bin i is (edges[i], edges[i + 1]].
  for (size_t i = 0; i + 1 < edges.size() && i < labels.size(); ++i) {
    if (v > edges[i] && v <= edges[i + 1]) return &labels[i];
  }
  return nullptr;
}

// --------------------------------------------------------------- load ----

absl::StatusOr<std::shared_ptr<const GpuProfile>> GpuProfile::Load(const std::string& tp_dir) {
  namespace fs = std::filesystem;
  auto p = std::make_shared<GpuProfile>();
  p->dir_ = tp_dir;
  const std::string base = fs::path(tp_dir).filename().string();
  if (!absl::StartsWith(base, "tp") || !absl::SimpleAtoi(base.substr(2), &p->tp_) || p->tp_ < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(tp_dir,
                     ": not a profile bundle's tp<N> folder (expected <root>/<gpu>/<org>/<model>/"
                     "<variant>/tp<N>, N >= 1)"));
  }
  // The fingerprint: every file read, name and bytes, in the order read.
  uint64_t h = 0xcbf29ce484222325ULL;
  auto file = [&](const char* name, bool required) -> absl::StatusOr<std::string> {
    const std::string path = (fs::path(tp_dir) / name).string();
    if (!fs::exists(path)) {
      if (!required) return std::string();
      return absl::NotFoundError(absl::StrCat(path,
                                              ": not found (a profile bundle's tp<N> folder "
                                              "holds dense.csv, attention.csv and "
                                              "per_sequence.csv)"));
    }
    ASSIGN_OR_RETURN(std::string text, ReadAll(path));
    h = Fnv1a(Fnv1a(h, name), text);
    return text;
  };
  ASSIGN_OR_RETURN(const std::string dense, file("dense.csv", true));
  RETURN_IF_ERROR(
      ReadCurves((fs::path(tp_dir) / "dense.csv").string(), dense, "tokens", &p->dense_));
  ASSIGN_OR_RETURN(const std::string per_seq, file("per_sequence.csv", true));
  RETURN_IF_ERROR(ReadCurves((fs::path(tp_dir) / "per_sequence.csv").string(), per_seq, "sequences",
                             &p->per_sequence_));
  ASSIGN_OR_RETURN(const std::string att, file("attention.csv", true));
  RETURN_IF_ERROR(p->LoadAttention((fs::path(tp_dir) / "attention.csv").string(), att));
  RETURN_IF_ERROR(p->LoadMoe(tp_dir, &h));

  // Optional: the skew fit and its bins (meta.yaml, one level up).
  ASSIGN_OR_RETURN(const std::string skew, file("skew_fit.csv", false));
  const std::string meta_path = (fs::path(tp_dir).parent_path() / "meta.yaml").string();
  std::string meta;
  if (fs::exists(meta_path)) {
    ASSIGN_OR_RETURN(meta, ReadAll(meta_path));
    h = Fnv1a(Fnv1a(h, "meta.yaml"), meta);
  }
  const auto yaml = ReadYamlScalars(meta);
  if (auto it = yaml.find("gpu"); it != yaml.end()) p->gpu_name_ = it->second;
  RETURN_IF_ERROR(p->LoadSkewFit(tp_dir, skew, meta_path, yaml));
  p->fingerprint_ = absl::StrFormat("%016x", h);
  return std::shared_ptr<const GpuProfile>(std::move(p));
}

// attention.csv: rows strictly ascending in (prefill_chunk, kv_prefill,
// n_decode, kv_decode), as the profiler writes them.
absl::Status GpuProfile::LoadAttention(const std::string& att_path, const std::string& att) {
  const std::vector<std::string> cols = {"prefill_chunk", "kv_prefill", "n_decode", "kv_decode",
                                         "time_us"};
  ASSIGN_OR_RETURN(Csv csv, ReadCsv(att_path, att, cols));
  // (pc, nd, kvp) -> kvd curve, then the tree.
  std::map<std::tuple<double, double, double>, ProfileCurve> leaves;
  std::tuple<double, double, double, double> last{-1, -1, -1, -1};
  for (size_t r = 0; r < csv.rows.size(); ++r) {
    double v[5];
    for (size_t i = 0; i < 5; ++i) {
      ASSIGN_OR_RETURN(v[i], Number(csv, r, i, cols[i]));
    }
    const auto key = std::make_tuple(v[0], v[1], v[2], v[3]);
    if (!(key > last)) {
      return absl::InvalidArgumentError(
          absl::StrCat(att_path, ":", csv.lines[r], ": grid point (", csv.rows[r][0], ", ",
                       csv.rows[r][1], ", ", csv.rows[r][2], ", ", csv.rows[r][3],
                       ") is not after the previous row's; expected rows ascending and unique in "
                       "(prefill_chunk, kv_prefill, n_decode, kv_decode)"));
    }
    last = key;
    attention_points_.push_back({v[0], v[1], v[2], v[3], v[4] * 1e-6});
    ProfileCurve& c = leaves[{v[0], v[2], v[1]}];
    c.x.push_back(v[3]);
    c.t.push_back(v[4] * 1e-6);
  }
  attention_ = std::make_shared<Node>();
  for (auto& [k, curve] : leaves) {
    const auto [pc, nd, kvp] = k;
    Node* n = attention_.get();
    for (double key : {pc, nd, kvp}) {
      if (n->keys.empty() || n->keys.back() != key) {
        n->keys.push_back(key);
        n->children.emplace_back();
      }
      n = &n->children.back();
    }
    n->leaf = std::move(curve);
  }
  return absl::OkStatus();
}

// Optional: the MoE block, measured at TP 1 (a tp<N> folder without one
// takes its sibling tp1's; docs/profiles.md).
absl::Status GpuProfile::LoadMoe(const std::string& tp_dir, uint64_t* h) {
  namespace fs = std::filesystem;
  std::string moe_path = (fs::path(tp_dir) / "moe.csv").string();
  if (!fs::exists(moe_path))
    moe_path = (fs::path(tp_dir).parent_path() / "tp1" / "moe.csv").string();
  if (!fs::exists(moe_path)) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::string moe, ReadAll(moe_path));
  *h = Fnv1a(Fnv1a(*h, "moe.csv"), moe);
  const std::vector<std::string> mcols = {"tokens", "activated_experts", "time_us"};
  ASSIGN_OR_RETURN(Csv mcsv, ReadCsv(moe_path, moe, mcols));
  std::pair<double, double> prev{-1, -1};
  for (size_t r = 0; r < mcsv.rows.size(); ++r) {
    double v[3];
    for (size_t i = 0; i < 3; ++i) {
      ASSIGN_OR_RETURN(v[i], Number(mcsv, r, i, mcols[i]));
    }
    if (!(std::make_pair(v[0], v[1]) > prev) || v[0] < 1 || v[1] < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          moe_path, ":", mcsv.lines[r], ": grid point (", mcsv.rows[r][0], ", ", mcsv.rows[r][1],
          ") is not after the previous row's or below 1; expected rows ascending and "
          "unique in (tokens, activated_experts), both >= 1"));
    }
    prev = {v[0], v[1]};
    ProfileCurve& c = moe_[v[0]];
    c.x.push_back(v[1]);
    c.t.push_back(v[2] * 1e-6);
    moe_max_experts_ = std::max(moe_max_experts_, v[1]);
  }
  return absl::OkStatus();
}

// A bundle whose meta.yaml says the skew fit is off keeps alpha 0 even if a
// skew_fit.csv lies in the folder.
absl::Status GpuProfile::LoadSkewFit(const std::string& tp_dir, const std::string& skew,
                                     const std::string& meta_path,
                                     const std::map<std::string, std::string>& yaml) {
  namespace fs = std::filesystem;
  const auto enabled = yaml.find("skew_fit.enabled");
  if (skew.empty() || (enabled != yaml.end() && enabled->second == "false")) {
    return absl::OkStatus();
  }
  const std::string skew_path = (fs::path(tp_dir) / "skew_fit.csv").string();
  auto bins = [&](const char* edges, const char* labels, Bins* out) -> absl::Status {
    const std::string e = absl::StrCat("skew_fit.bucket_axes.", edges);
    const std::string l = absl::StrCat("skew_fit.bucket_axes.", labels);
    if (yaml.count(e) == 0 || yaml.count(l) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(meta_path, ": no ", e, " and ", l, " (skew_fit.csv's buckets need them)"));
    }
    for (const std::string& s : YamlList(yaml.at(e))) {
      double v = 0;
      if (!absl::SimpleAtod(s, &v)) {
        return absl::InvalidArgumentError(
            absl::StrCat(meta_path, ": ", e, " has \"", s, "\"; expected numbers"));
      }
      out->edges.push_back(v);
    }
    out->labels = YamlList(yaml.at(l));
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(bins("n_bins", "n_labels", &n_bins_));
  RETURN_IF_ERROR(bins("skew_rate_bins", "skew_rate_labels", &sr_bins_));
  RETURN_IF_ERROR(bins("kv_big_bins", "kv_big_labels", &kvb_bins_));
  RETURN_IF_ERROR(bins("kp_bins", "kp_labels", &kp_bins_));
  if (auto it = yaml.find(absl::StrCat("skew_fit.per_tp.", tp_, ".alpha_default"));
      it != yaml.end() && !absl::SimpleAtod(it->second, &alpha_default_)) {
    return absl::InvalidArgumentError(
        absl::StrCat(meta_path, ": alpha_default \"", it->second, "\" is not a number"));
  }
  ASSIGN_OR_RETURN(
      Csv fit, ReadCsv(skew_path, skew,
                       {"pc", "n_label", "skew_rate_label", "kv_big_label", "kp_label", "alpha"}));
  for (size_t r = 0; r < fit.rows.size(); ++r) {
    double alpha = 0;
    const std::string& a = fit.rows[r][5];
    if (!absl::SimpleAtod(a, &alpha) || !std::isfinite(alpha)) {
      return absl::InvalidArgumentError(absl::StrCat(
          skew_path, ":", fit.lines[r], ": column alpha is \"", a, "\"; expected a finite number"));
    }
    alpha_[absl::StrJoin(fit.rows[r].begin(), fit.rows[r].begin() + 5, "|")] = alpha;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const GpuProfile>> GpuProfile::Get(const std::string& tp_dir) {
  static std::mutex mu;
  static auto* cache = new std::map<std::string, std::shared_ptr<const GpuProfile>>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(tp_dir);
  if (it != cache->end()) return it->second;
  ASSIGN_OR_RETURN(auto p, Load(tp_dir));
  cache->emplace(tp_dir, p);
  return p;
}

// ------------------------------------------------------------ lookups ----

const ProfileCurve* GpuProfile::Dense(absl::string_view name) const {
  auto it = dense_.find(name);
  return it == dense_.end() ? nullptr : &it->second;
}

const ProfileCurve* GpuProfile::PerSequence(absl::string_view name) const {
  auto it = per_sequence_.find(name);
  return it == per_sequence_.end() ? nullptr : &it->second;
}

double GpuProfile::Interp(const Node& node, int depth, const double* q, double* clamped) const {
  if (depth == 3) {
    bool beyond = false;
    const double t = node.leaf.Eval(q[3], &beyond);
    if (beyond) clamped[3] = std::min(clamped[3], node.leaf.max_x());
    return t;
  }
  const std::vector<double>& k = node.keys;
  const double v = q[depth];
  if (v <= k.front()) return Interp(node.children.front(), depth + 1, q, clamped);
  if (v >= k.back()) {
    if (v > k.back()) clamped[depth] = std::min(clamped[depth], k.back());
    return Interp(node.children.back(), depth + 1, q, clamped);
  }
  const size_t hi = static_cast<size_t>(std::upper_bound(k.begin(), k.end(), v) - k.begin());
  const size_t lo = hi - 1;
  const double w = (v - k[lo]) / (k[hi] - k[lo]);
  const double a = Interp(node.children[lo], depth + 1, q, clamped);
  const double b = Interp(node.children[hi], depth + 1, q, clamped);
  return a + w * (b - a);
}

double GpuProfile::SkewAlpha(const AttentionShapeQuery& q) const {
  if (q.n_decode <= 1 || !(q.kv_decode_max > q.kv_decode_mean)) return 0;
  if (alpha_.empty() && alpha_default_ == 0) return 0;
  const double span = q.kv_decode_max - q.kv_decode_min;
  const double rate =
      span > 0 ? std::clamp((q.kv_decode_mean - q.kv_decode_min) / span, 0.0, 1.0) : 0.0;
  const std::string* n = n_bins_.Label(q.n_decode);
  const std::string* sr = sr_bins_.Label(rate);
  const std::string* kvb = kvb_bins_.Label(q.kv_decode_max);
  const std::string* kp = kp_bins_.Label(q.kv_prefill);
  if (n != nullptr && sr != nullptr && kvb != nullptr && kp != nullptr) {
    const std::string key = absl::StrCat(absl::StrFormat("%.0f", q.prefill_chunk), "|", *n, "|",
                                         *sr, "|", *kvb, "|", *kp);
    if (auto it = alpha_.find(key); it != alpha_.end()) return it->second;
  }
  return alpha_default_;
}

double GpuProfile::Attention(const AttentionShapeQuery& q, AttentionShapeQuery* clamped) const {
  const double mean[4] = {q.prefill_chunk, q.n_decode, q.kv_prefill, q.kv_decode_mean};
  double c[4] = {mean[0], mean[1], mean[2], mean[3]};
  double t = Interp(*attention_, 0, mean, c);
  const double alpha = SkewAlpha(q);
  if (alpha != 0) {
    const double max[4] = {q.prefill_chunk, q.n_decode, q.kv_prefill, q.kv_decode_max};
    double cm[4] = {max[0], max[1], max[2], max[3]};
    const double t_max = Interp(*attention_, 0, max, cm);
    if (t_max > t) t += alpha * (t_max - t);
  }
  if (clamped != nullptr) {
    *clamped = q;
    clamped->prefill_chunk = c[0];
    clamped->n_decode = c[1];
    clamped->kv_prefill = c[2];
    if (c[3] < q.kv_decode_mean) {
      // Hold the decodes' histories to the grid by the mean's factor.
      const double f = c[3] / q.kv_decode_mean;
      clamped->kv_decode_mean = c[3];
      clamped->kv_decode_min *= f;
      clamped->kv_decode_max *= f;
    }
  }
  return t;
}

GpuProfile::Counts GpuProfile::counts() const {
  return {lookups_.load(std::memory_order_relaxed), beyond_.load(std::memory_order_relaxed),
          missing_.load(std::memory_order_relaxed)};
}

void GpuProfile::Count(bool beyond) const {
  lookups_.fetch_add(1, std::memory_order_relaxed);
  if (beyond) beyond_.fetch_add(1, std::memory_order_relaxed);
}

double GpuProfile::Moe(double tokens, double experts, bool* beyond, double* clamped_tokens,
                       double* clamped_experts) const {
  if (moe_.empty()) return 0;
  const double max_tokens = moe_.rbegin()->first;
  if (tokens > max_tokens || experts > moe_max_experts_) *beyond = true;
  tokens = std::clamp(tokens, moe_.begin()->first, max_tokens);
  experts = std::min(experts, moe_max_experts_);
  *clamped_tokens = tokens;
  *clamped_experts = experts;
  auto hi = moe_.lower_bound(tokens);
  if (hi->first == tokens || hi == moe_.begin()) return hi->second.Eval(experts, nullptr);
  auto lo = std::prev(hi);
  const double w = (tokens - lo->first) / (hi->first - lo->first);
  return (1 - w) * lo->second.Eval(experts, nullptr) + w * hi->second.Eval(experts, nullptr);
}

}  // namespace servesim::devices
