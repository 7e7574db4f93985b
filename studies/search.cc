#include "studies/search.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "studies/sweep.h"

namespace servesim::studies {

absl::StatusOr<std::vector<SloLimit>> ParseSlo(const std::string& spec) {
  static const std::map<std::string, std::string> kMetrics = {
      {"ttft", "ttft_s"}, {"tbt", "tbt_s"}, {"tpot", "tpot_s"}, {"e2e", "e2e_s"}};
  static const std::set<std::string> kStats = {"mean", "p50", "p90", "p99", "max"};
  std::vector<SloLimit> out;
  std::set<std::string> names;
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    const std::string it(absl::StripAsciiWhitespace(item));
    const size_t eq = it.find('=');
    const size_t us = it.find('_');
    if (eq == std::string::npos || us == std::string::npos || us > eq) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--slo ", it, ": expected METRIC_STAT=LIMIT, e.g. ttft_p99=2s or tbt_p99=50ms"));
    }
    SloLimit l;
    l.name = it.substr(0, eq);
    const std::string metric = it.substr(0, us), stat = it.substr(us + 1, eq - us - 1);
    auto m = kMetrics.find(metric);
    if (m == kMetrics.end()) {
      return absl::InvalidArgumentError(absl::StrCat("--slo ", it, ": unknown metric '", metric,
                                                     "'; expected ttft, tbt, tpot or e2e"));
    }
    if (kStats.count(stat) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--slo ", it, ": unknown statistic '", stat, "'; expected mean, p50, p90, p99 or max"));
    }
    l.key = m->second;
    l.field = stat;
    std::string v = it.substr(eq + 1);
    double scale = 1;
    if (absl::EndsWith(v, "ms")) {
      scale = 1e-3, v.resize(v.size() - 2);
    } else if (absl::EndsWith(v, "us")) {
      scale = 1e-6, v.resize(v.size() - 2);
    } else if (absl::EndsWith(v, "s")) {
      v.resize(v.size() - 1);
    }
    double x = 0;
    if (!absl::SimpleAtod(v, &x) || !(x > 0) || !std::isfinite(x)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--slo ", it, ": the limit must be a time > 0 in s, ms or us (e.g. 2s, 50ms)"));
    }
    l.limit_s = x * scale;
    if (!names.insert(l.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("--slo ", l.name, " given twice"));
    }
    out.push_back(l);
  }
  if (out.empty()) {
    return absl::InvalidArgumentError("--slo needs at least one limit, e.g. ttft_p99=2s,tbt_p99=50ms");
  }
  return out;
}

absl::StatusOr<bool> ProbePasses(const std::map<std::string, std::string>& figures,
                                 const std::vector<SloLimit>& slo, double attainment,
                                 std::string* reason) {
  reason->clear();
  auto number = [&](const std::string& key) -> absl::StatusOr<double> {
    double v = 0;
    auto it = figures.find(key);
    if (it == figures.end() || !absl::SimpleAtod(it->second, &v)) {
      return absl::InvalidArgumentError(absl::StrCat("summary.json has no number for ", key));
    }
    return v;
  };
  for (const SloLimit& l : slo) {
    // A run that completed nothing has null statistics: no limit is met.
    if (auto it = figures.find(absl::StrCat(l.key, ".", l.field));
        it != figures.end() && it->second == "null") {
      *reason = absl::StrCat(l.name, " undefined: no request completed");
      return false;
    }
    auto v = number(absl::StrCat(l.key, ".", l.field));
    if (!v.ok()) return v.status();
    if (*v > l.limit_s) {
      *reason = absl::StrFormat("%s %.6g s > %.6g s", l.name, *v, l.limit_s);
      return false;
    }
  }
  auto a = number("slo_attainment");
  if (!a.ok()) return a.status();
  if (*a < attainment) {
    *reason = absl::StrFormat("slo_attainment %.6g < %.6g", *a, attainment);
    return false;
  }
  return true;
}

namespace {

double Round10(double v) {
  double r = 0;
  (void)absl::SimpleAtod(FormatValue(v), &r);
  return r;
}

// One run of the sequential algorithm over known outcomes: either the
// result, or the first value it needs.
struct StepOutcome {
  absl::Status status;
  bool done = false;
  double need = 0;
  SearchResult result;
};

using StepFn = std::function<StepOutcome(const std::map<double, bool>&)>;

// Asks `known` for v; records it in the path. nullopt: unknown (need it).
struct Oracle {
  const std::map<double, bool>& known;
  StepOutcome& out;
  std::optional<bool> operator()(double v, const char* phase) {
    auto it = known.find(v);
    if (it == known.end()) {
      out.need = v;
      return std::nullopt;
    }
    out.result.path.push_back({phase, v, it->second});
    return it->second;
  }
};

StepOutcome RateStep(double start, double tolerance, const std::map<double, bool>& known) {
  StepOutcome out;
  Oracle q{known, out};
  double lo = 0, hi = 0;
  double v = Round10(start);
  auto r = q(v, "bracket");
  if (!r) return out;
  if (*r) {
    lo = v;
    for (int k = 0;; ++k) {
      if (k == 40) {
        out.status = absl::FailedPreconditionError(absl::StrCat(
            "--vary-rate: the SLO is still met at ", FormatValue(lo),
            " (2^40 x the scenario's rate); it does not bind"));
        return out;
      }
      v = Round10(lo * 2);
      r = q(v, "bracket");
      if (!r) return out;
      if (*r) {
        lo = v;
      } else {
        hi = v;
        break;
      }
    }
  } else {
    hi = v;
    for (int k = 0;; ++k) {
      if (k == 40) {
        out.status = absl::FailedPreconditionError(absl::StrCat(
            "--vary-rate: the SLO is missed even at ", FormatValue(hi),
            " (2^-40 x the scenario's rate): the limits are below the unloaded latency, or "
            "too many requests are rejected (too long or over KV capacity: they count as "
            "misses) for --attainment; see the probes' summary.json"));
        return out;
      }
      v = Round10(hi / 2);
      r = q(v, "bracket");
      if (!r) return out;
      if (*r) {
        lo = v;
        break;
      }
      hi = v;
    }
  }
  while (hi - lo > tolerance * lo) {
    const double mid = Round10((lo + hi) / 2);
    if (!(mid > lo && mid < hi)) break;
    r = q(mid, "bisect");
    if (!r) return out;
    (*r ? lo : hi) = mid;
  }
  out.done = true;
  out.result.answer = lo;
  out.result.lo = lo;
  out.result.hi = hi;
  return out;
}

StepOutcome ReplicaStep(int64_t start, int64_t max_replicas, const std::map<double, bool>& known) {
  StepOutcome out;
  Oracle q{known, out};
  int64_t lo = 0, hi = 0;  // lo fails (0: none tried), hi passes
  int64_t v = std::clamp<int64_t>(start, 1, max_replicas);
  auto r = q(static_cast<double>(v), "bracket");
  if (!r) return out;
  if (*r) {
    hi = v;
    while (hi > 1) {
      v = std::max<int64_t>(1, hi / 2);
      r = q(static_cast<double>(v), "bracket");
      if (!r) return out;
      if (*r) {
        hi = v;
      } else {
        lo = v;
        break;
      }
    }
    if (hi == 1) lo = 0;
  } else {
    lo = v;
    while (true) {
      if (lo >= max_replicas) {
        out.status = absl::FailedPreconditionError(absl::StrCat(
            "--vary-replicas: no replica count up to --max-replicas ", max_replicas,
            " meets the SLO"));
        return out;
      }
      v = std::min(max_replicas, lo * 2);
      r = q(static_cast<double>(v), "bracket");
      if (!r) return out;
      if (*r) {
        hi = v;
        break;
      }
      lo = v;
    }
  }
  while (lo > 0 && hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    r = q(static_cast<double>(mid), "bisect");
    if (!r) return out;
    (*r ? hi : lo) = mid;
  }
  out.done = true;
  out.result.answer = static_cast<double>(hi);
  out.result.lo = static_cast<double>(lo);
  out.result.hi = static_cast<double>(hi);
  return out;
}

// Runs the sequential algorithm; each round evaluates the value it needs
// plus (speculatively, breadth first) the values it would need next under
// either outcome, up to `parallel` values.
absl::StatusOr<SearchResult> Drive(const StepFn& step, int parallel, const Evaluate& evaluate,
                                   const OnStep& on_step, int max_probes) {
  std::map<double, bool> known;
  size_t seen = 0;  // of the sequential path, given to on_step
  while (true) {
    StepOutcome o = step(known);
    // Each step replays the algorithm from the start, so the path only
    // grows: its new probes, in order.
    for (; seen < o.result.path.size(); ++seen) {
      if (on_step) {
        if (absl::Status st = on_step(o.result.path[seen]); !st.ok()) return st;
      }
    }
    if (!o.status.ok()) return o.status;
    if (o.done) return o.result;
    if (max_probes > 0 && seen >= static_cast<size_t>(max_probes)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "stopped after ", seen, " probes (--max-probes ", max_probes, ") without an answer"));
    }
    std::vector<double> want = {o.need};
    std::deque<std::map<double, bool>> frontier;
    auto expand = [&](const std::map<double, bool>& base, double v) {
      for (bool b : {true, false}) {
        auto c = base;
        c[v] = b;
        frontier.push_back(std::move(c));
      }
    };
    expand(known, o.need);
    // Speculation stops at the probe cap: past it nothing would be used.
    const size_t most =
        max_probes > 0 ? static_cast<size_t>(max_probes) - seen : static_cast<size_t>(parallel);
    while (want.size() < std::min(static_cast<size_t>(parallel), most) && !frontier.empty()) {
      const auto c = std::move(frontier.front());
      frontier.pop_front();
      StepOutcome h = step(c);
      if (!h.status.ok() || h.done) continue;
      if (std::find(want.begin(), want.end(), h.need) != want.end()) continue;
      want.push_back(h.need);
      expand(c, h.need);
    }
    auto passes = evaluate(want);
    if (!passes.ok()) return passes.status();
    for (size_t i = 0; i < want.size(); ++i) known[want[i]] = (*passes)[i];
  }
}

}  // namespace

absl::StatusOr<SearchResult> SearchMaxRate(double start, double tolerance, int parallel,
                                           const Evaluate& evaluate, const OnStep& on_step,
                                           int max_probes) {
  return Drive([&](const std::map<double, bool>& k) { return RateStep(start, tolerance, k); },
               parallel, evaluate, on_step, max_probes);
}

absl::StatusOr<SearchResult> SearchMinReplicas(int64_t start, int64_t max_replicas, int parallel,
                                               const Evaluate& evaluate, const OnStep& on_step,
                                               int max_probes) {
  return Drive([&](const std::map<double, bool>& k) { return ReplicaStep(start, max_replicas, k); },
               parallel, evaluate, on_step, max_probes);
}

}  // namespace servesim::studies
