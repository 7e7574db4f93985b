// RemoteDevice's hints, ahead of the Estimates that ask for them: Expect
// (the planner's projection of the running batch, due at the next call) and
// ExpectLater (an arriving request's prefill, riding along a call made
// anyway) add the ops the memo lacks to the expected ops waiting
// (AddPendingLocked); Prepare sends what waits at once, asynchronously, for
// the Estimate that follows. Only for devices whose description says
// lookahead_ok (ExpectSteps), so FULL-fidelity devices are never asked
// ahead. Waiting ops are bounded; past the bounds hints are dropped.
#include <algorithm>
#include <memory>
#include <vector>

#include "agents/convert.h"
#include "agents/remote_device.h"
#include "agents/remote_device_internal.h"

namespace servesim::agents {

using devices::Op;
using internal::CopyOwned;

int RemoteDevice::ExpectSteps() const {
  if (options_.lookahead_max <= 0) return 0;
  int ok = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ok = lookahead_ok_;
  }
  if (ok < 0) {
    if (!DescribeOrError().ok()) return 0;  // no hints until an agent answers
    std::lock_guard<std::mutex> lock(mu_);
    ok = lookahead_ok_;
  }
  return ok == 1 ? std::min(kExpectSteps, options_.lookahead_max) : 0;
}

void RemoteDevice::Expect(absl::Span<const Op> ops, absl::Span<const int32_t> steps) const {
  if (ops.empty() || ExpectSteps() <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  expecting_ = true;
  const size_t before = pending_.ops.size();
  AddPendingLocked(ops, steps);
  if (pending_.ops.size() > before) pending_.due = true;
}

void RemoteDevice::ExpectLater(absl::Span<const Op> ops) const {
  if (ops.empty() || ExpectSteps() <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  expecting_ = true;
  AddPendingLocked(ops, {});
}

void RemoteDevice::AddPendingLocked(absl::Span<const Op> ops,
                                    absl::Span<const int32_t> steps) const {
  // Bounds on what waits: beyond them hints are dropped (the next call
  // that misses asks anyway).
  constexpr size_t kMaxPendingOps = 8192;
  constexpr int64_t kMaxPendingSequences = int64_t{1} << 18;
  thread_local std::vector<MemoKey> keys;
  if (pending_.ops.empty()) pending_.epoch = memo_epoch_;
  if (pending_.epoch != memo_epoch_) {  // emptied since: start the list again
    pending_ = OwnedOps{};
    pending_.epoch = memo_epoch_;
  }
  // Lists the ops share are interned once (KeysLocked) and copied once
  // (CopyOwned), and only for the ops kept.
  KeysLocked(ops, &keys);
  thread_local std::vector<MemoKey> run_keys;
  thread_local std::vector<int64_t> offsets;
  if (!runs_.empty()) RunKeysLocked(ops, /*add=*/false, &run_keys, &offsets);
  thread_local std::vector<Op> fresh;
  fresh.clear();
  int64_t sequences = pending_.sequences;
  for (size_t i = 0; i < ops.size(); ++i) {
    const int32_t k =
        steps.size() == ops.size() ? std::clamp<int32_t>(steps[i], 0, kMaxLookahead) : 0;
    const int64_t weight = static_cast<int64_t>(ops[i].seqs.size()) * (1 + k);
    if (pending_.ops.size() + fresh.size() >= kMaxPendingOps ||
        sequences + weight > kMaxPendingSequences) {
      break;
    }
    if (memo_.contains(keys[i]) ||
        (!runs_.empty() && FindRunLocked(run_keys[i], offsets[i]) != nullptr) ||
        !pending_keys_.insert(keys[i]).second) {
      continue;
    }
    fresh.push_back(ops[i]);
    pending_.keys.push_back(keys[i]);
    pending_.steps.push_back(k);
    sequences += weight;
  }
  CopyOwned(fresh, &pending_.ops, &pending_.seqs, &pending_.stacks);
  pending_.sequences = sequences;
}

void RemoteDevice::Prepare(absl::Span<const Op> ops) const {
  if (ops.empty()) return;
  std::shared_ptr<Prefetch> p;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Only where asking ahead is safe (an agent answers expected ops for
    // those devices only), and never for steps spread over endpoints.
    if (lookahead_ok_ != 1 || spread_ == 1 || (spread_ < 0 && endpoints_.size() > 1)) return;
    const size_t before = pending_.ops.size();
    AddPendingLocked(ops, {});
    if (pending_.ops.size() == before) return;  // all answered, waiting or in flight
    const size_t asked = pending_.ops.size();
    p = SendExpectedLocked();
    if (p == nullptr) return;  // not bound yet: the Estimate asks itself
    prepared_ = true;
    ++stats_.prepare_rpcs;
    stats_.prepared_ops += static_cast<int64_t>(asked - before);
  }
  StartPrefetch(p);
}

}  // namespace servesim::agents
