// Expected expert load of a mixture-of-experts layer (docs/moe.md,
// "Routing model").
//
// Each token picks `top_k` distinct experts of E. Expert i is picked by a
// token with probability q_i, sum q_i = top_k:
//  - uniform (skew 0): q_i = k / E;
//  - skewed (skew s > 0): popularity p_i proportional to 1 / (1 + pi(i))^s,
//    pi a permutation of the experts drawn from the seed (so hot experts do
//    not all sit on the first rank), and q_i = min(1, c p_i) with c chosen
//    so that sum q_i = k (water-filling: no expert is picked twice by one
//    token).
// Tokens route independently, so for T tokens expert i receives T q_i
// assignments on average and is touched (receives at least one) with
// probability 1 - (1 - q_i)^T. Experts are placed on ranks in contiguous
// blocks (vLLM's linear expert placement). The load a rank serves is these
// expectations summed over its experts: costs use expectations, not draws,
// so an iteration's cost is a smooth, exact function of its token count.
// With skew the ranks differ; the lockstep group waits for the slowest,
// which is the rank with the most assignments when compute-bound and the
// one touching the most experts when weight-bound: the planner costs both
// and keeps the slower.
//
// Pure and immutable after Create; safe to share across threads.
#ifndef SERVESIM_DEVICES_MOE_ROUTING_H_
#define SERVESIM_DEVICES_MOE_ROUTING_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace servesim::devices {

struct ExpertLoad {
  double assignments = 0;      // (token, expert) pairs routed to the rank
  double experts_touched = 0;  // distinct experts with at least one
};

class ExpertRouting {
 public:
  // experts >= 1, 1 <= top_k <= experts, skew in [0, 16], ranks >= 1
  // dividing experts; INVALID_ARGUMENT names the bad value.
  static absl::StatusOr<ExpertRouting> Create(int64_t experts, int64_t top_k, double skew,
                                              uint64_t seed, int64_t ranks);

  // Expected load of rank r (experts [r E/R, (r+1) E/R)) for `tokens` tokens.
  ExpertLoad Rank(int64_t r, double tokens) const;
  // The rank with the most expected assignments (the lockstep group's
  // critical path; rank 0 when uniform) and its load for `tokens`.
  int64_t busiest_rank() const { return busiest_; }
  ExpertLoad Busiest(double tokens) const { return Rank(busiest_, tokens); }
  // The rank that touches the most distinct experts for `tokens` tokens
  // (the one reading the most weights; with skew, not always the busiest).
  int64_t MostTouched(double tokens) const;

  // q_i per expert (sums to top_k).
  const std::vector<double>& pick_probability() const { return q_; }
  int64_t experts() const { return static_cast<int64_t>(q_.size()); }
  int64_t ranks() const { return ranks_; }
  bool uniform() const { return uniform_; }  // skew 0

 private:
  ExpertRouting() = default;
  std::vector<double> q_;
  std::vector<double> log_miss_;  // log(1 - q_i); -inf when q_i == 1
  int64_t ranks_ = 1;
  int64_t busiest_ = 0;
  bool uniform_ = true;  // skew 0: every q_i = k / E
};

}  // namespace servesim::devices

#endif  // SERVESIM_DEVICES_MOE_ROUTING_H_
