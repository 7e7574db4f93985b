#include "cluster/device_hints.h"

#include <algorithm>

#include "absl/types/span.h"

namespace servesim::cluster {

uint64_t DeviceHints::BatchHash(const scheduler::Batch& b) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ b.entries.size();
  auto mix = [&h](uint64_t x) {
    h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
  };
  for (const scheduler::BatchEntry& e : b.entries) {
    mix(static_cast<uint64_t>(e.request_id));
    mix(static_cast<uint64_t>(e.new_tokens) << 1 | (e.prefill ? 1 : 0));
    mix(static_cast<uint64_t>(e.past_tokens));
  }
  return h;
}

void DeviceHints::Anticipate(Rank& r) {
  const int steps = r.planner.ExpectSteps();
  if (steps <= 0) return;
  if (!r.anticipating) {
    r.anticipating = true;
    if (std::find(sh_->anticipating.begin(), sh_->anticipating.end(), this) ==
        sh_->anticipating.end()) {
      sh_->anticipating.push_back(this);
    }
  }
  const bool hit =
      r.projected_next < r.projected.size() && r.projected[r.projected_next] == BatchHash(*r.batch);
  if (hit) ++r.projected_next;
  // A projection runs `steps` ahead and is renewed a quarter before its
  // end. (On the AttAcc Azure hour 16, 24 and 32 steps cost the same, and
  // sizing projections to how long earlier ones held cost more round
  // trips than it saved.)
  const size_t margin = static_cast<size_t>(std::max(1, steps / 4));
  const size_t told = hit ? r.projected.size() - r.projected_next : 0;
  if (hit && (!r.projected_full || told >= margin)) return;
  ++(hit ? sh_->hints.renewals : sh_->hints.projections);
  Reproject(r, steps, told);
  // What this tells goes to the devices in one message, which can carry
  // the renewals that the other ranks sharing them would soon send in
  // messages of their own: those within twice the margin of their
  // projection's end are renewed now (a rank of an engine that is not
  // stepping has nothing to renew).
  for (DeviceHints* e : sh_->anticipating) {
    if (e->pool_ != pool_ || !*e->stepping_) continue;
    for (const auto& o : *e->ranks_) {
      if (o.get() == &r || !o->anticipating || !o->projected_full || o->batch == nullptr) {
        continue;
      }
      const size_t left = o->projected.size() - std::min(o->projected_next, o->projected.size());
      if (left > 0 && left < 2 * margin) {
        Reproject(*o, steps, left);
        ++sh_->hints.renewals_alongside;
      }
    }
  }
}

void DeviceHints::Reproject(Rank& r, int steps, size_t told) {
  r.scheduler.Project(steps, &r.projection);
  r.planner.Expect(absl::MakeConstSpan(r.projection).subspan(std::min(told, r.projection.size())));
  r.projected.clear();
  for (const scheduler::Batch& b : r.projection) r.projected.push_back(BatchHash(b));
  r.projected_next = 0;
  r.projected_full = static_cast<int>(r.projection.size()) == steps;
}

bool DeviceHints::HintsArrivals(Role role) const {
  return role == Role::kColocated && ranks_->size() == 1 && pool_->pipeline_parallel <= 1 &&
         pool_->batching.policy == scheduler::BatchingPolicy::kPrefillFirst &&
         !pool_->batching.prefix_caching && (*ranks_)[0]->planner.ExpectSteps() > 0;
}

void DeviceHints::HintArrival(const scheduler::RequestSpec& spec) {
  if (spec.input_tokens < 1 ||
      spec.input_tokens + spec.output_tokens > pool_->batching.max_context_tokens) {
    return;
  }
  scheduler::Batch& b = hint_batch_;
  b.Clear();
  b.entries.push_back(scheduler::BatchEntry{
      0, spec.input_tokens, 0, true, true, {}, spec.id, spec.input_tokens + spec.output_tokens});
  b.prefill_tokens = spec.input_tokens;
  b.emitting = 1;
  (*ranks_)[0]->planner.ExpectLater(b);
}

}  // namespace servesim::cluster
