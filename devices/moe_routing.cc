#include "devices/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace servesim::devices {
namespace {

// SplitMix64 (Steele et al. 2014): a portable generator, so the permutation
// is the same on every platform and standard library.
uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

absl::StatusOr<ExpertRouting> ExpertRouting::Create(int64_t experts, int64_t top_k, double skew,
                                                    uint64_t seed, int64_t ranks) {
  if (experts < 1 || experts > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("moe routing: num_experts = ", experts, "; allowed 1..1048576"));
  }
  if (top_k < 1 || top_k > experts) {
    return absl::InvalidArgumentError(absl::StrCat("moe routing: experts_per_token = ", top_k,
                                                   "; allowed 1..num_experts (", experts, ")"));
  }
  if (!(skew >= 0 && skew <= 16)) {
    return absl::InvalidArgumentError(
        absl::StrCat("moe routing: routing_skew = ", skew, "; allowed [0, 16]"));
  }
  if (ranks < 1 || experts % ranks != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "moe routing: ", experts, " experts do not split evenly over ", ranks, " ranks"));
  }
  ExpertRouting r;
  r.ranks_ = ranks;
  const size_t n = static_cast<size_t>(experts);
  const double k = static_cast<double>(top_k);
  r.q_.assign(n, k / static_cast<double>(experts));
  if (skew > 0) {
    // Popularity rank of each expert: a Fisher-Yates shuffle of 0..E-1.
    std::vector<int64_t> perm(n);
    std::iota(perm.begin(), perm.end(), 0);
    uint64_t state = seed ^ 0x6d6f652d726f7574ull;  // "moe-rout"
    for (size_t i = n - 1; i > 0; --i) {
      const size_t j = static_cast<size_t>(SplitMix64(&state) % (i + 1));
      std::swap(perm[i], perm[j]);
    }
    std::vector<double> p(n);
    for (size_t i = 0; i < n; ++i) {
      p[i] = std::pow(1.0 + static_cast<double>(perm[i]), -skew);
    }
    // Water-filling: cap at 1 and spread the rest over the uncapped experts
    // in proportion to p until sum q = k. At most E rounds.
    std::vector<bool> capped(n, false);
    for (size_t round = 0; round <= n; ++round) {
      double rest = k, mass = 0;
      for (size_t i = 0; i < n; ++i) {
        if (capped[i]) {
          rest -= 1;
        } else {
          mass += p[i];
        }
      }
      bool changed = false;
      for (size_t i = 0; i < n; ++i) {
        if (capped[i]) {
          r.q_[i] = 1;
          continue;
        }
        r.q_[i] = rest * p[i] / mass;
        if (r.q_[i] > 1) {
          capped[i] = true;
          changed = true;
        }
      }
      if (!changed) break;
    }
  }
  r.log_miss_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    r.log_miss_[i] = r.q_[i] >= 1 ? -INFINITY : std::log1p(-r.q_[i]);
  }
  r.uniform_ = skew == 0;
  const int64_t per = experts / ranks;
  double best = -1;
  for (int64_t rank = 0; rank < ranks; ++rank) {
    double a = 0;
    for (int64_t i = rank * per; i < (rank + 1) * per; ++i) a += r.q_[static_cast<size_t>(i)];
    if (a > best * (1 + 1e-12)) {
      best = a;
      r.busiest_ = rank;
    }
  }
  return r;
}

int64_t ExpertRouting::MostTouched(double tokens) const {
  if (uniform_) return busiest_;  // every rank alike
  int64_t best = 0;
  double most = -1;
  for (int64_t r = 0; r < ranks_; ++r) {
    const double x = Rank(r, tokens).experts_touched;
    if (x > most * (1 + 1e-12)) {
      most = x;
      best = r;
    }
  }
  return best;
}

ExpertLoad ExpertRouting::Rank(int64_t r, double tokens) const {
  ExpertLoad load;
  if (!(tokens > 0)) return load;
  const int64_t per = experts() / ranks_;
  if (uniform_) {
    // Every expert alike: the same sums as below with one exp (added up
    // term by term, so the results are the same to the bit).
    const double a = tokens * q_[0], x = 1 - std::exp(tokens * log_miss_[0]);
    for (int64_t i = 0; i < per; ++i) {
      load.assignments += a;
      load.experts_touched += x;
    }
    return load;
  }
  for (int64_t i = r * per; i < (r + 1) * per; ++i) {
    const size_t e = static_cast<size_t>(i);
    load.assignments += tokens * q_[e];
    load.experts_touched += 1 - std::exp(tokens * log_miss_[e]);
  }
  return load;
}

}  // namespace servesim::devices
