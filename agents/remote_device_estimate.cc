// RemoteDevice::Estimate: answers what the memo holds, and asks the agent
// for the rest in one blocking call that also asks the lookahead steps and
// carries the expected ops waiting (the header's PARAMETERS AND
// BEHAVIOUR). In order: the ops a run or the memo holds (a hit near its
// prediction's end asks for more, asynchronously); a wait for an answer in
// flight that probably holds the rest; the spread steps measured
// (MeasureSpread); the request, on the estimate stream where the device has
// one endpoint, else a plain call with retries; the answer memoised. mu_ is
// held only between calls, never across one.
#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "agents/convert.h"
#include "agents/remote_device.h"
#include "agents/remote_device_internal.h"
#include "common/status_macros.h"

namespace servesim::agents {

namespace v1 = servesim::v1;
using devices::Cost;
using devices::Op;
using internal::CopyOwned;
using internal::ExpectedCosts;
using internal::kLookaheadStart;
using internal::kPrefetchMargin;
using internal::OwnedBytes;

absl::Status RemoteDevice::Estimate(absl::Span<const Op> ops, absl::Span<Cost> costs) const {
  if (ops.size() != costs.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(label_, ": ", ops.size(), " ops but ", costs.size(), " cost slots"));
  }
  thread_local std::vector<MemoKey> keys;
  thread_local std::vector<size_t> missed;
  thread_local std::vector<Op> missed_ops;
  missed.clear();
  missed_ops.clear();
  const int lookahead_asked = std::min(kLookaheadStart, std::max(0, options_.lookahead_max));
  uint64_t epoch = 0;
  bool rekey = false;
  std::shared_ptr<Prefetch> prefetch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.estimate_calls;
    prefetch = LookUpLocked(ops, costs, &keys, &missed, &missed_ops);
    // Every op hit: the expected ops waiting go now, asynchronously, if
    // some are due.
    if (missed.empty() && prefetch == nullptr && pending_.due) prefetch = SendExpectedLocked();
    epoch = memo_epoch_;
    if (!missed.empty() && (expecting_ || prepared_) && inflight_ > 0) {
      // The answer in flight probably holds these ops: wait for it.
      ++stats_.expect_waits;
      mu_.unlock();  // re-taken below; `lock` releases it at the scope's end
      if (prefetch != nullptr) StartPrefetch(std::exchange(prefetch, nullptr));
      PollAnswers(/*until_idle=*/true);
      mu_.lock();
      LookUpMissedLocked(costs, &keys, &missed, &missed_ops);
      rekey = true;  // keys now hold the missed ops'; recomputed for `ops` below
    }
  }
  // Started with mu_ released: its callback takes mu_.
  if (prefetch != nullptr) StartPrefetch(prefetch);
  if (missed.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(const bool spread, Spread());
  std::vector<devices::StepMeasurement> absorb;
  std::vector<devices::StepKey> held;
  if (spread) RETURN_IF_ERROR(MeasureSpread(missed_ops, &absorb, &held));
  // The expected ops waiting ride along.
  OwnedOps extra;
  bool expecting = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    extra = std::move(pending_);
    pending_ = OwnedOps{};
    expecting = expecting_;
    DropAskedLocked(missed_ops, &extra);
  }
  const int lookahead = expecting ? 0 : lookahead_asked;
  v1::EstimateRequest req;
  EncodeMissed(missed_ops, extra, lookahead, absorb, &req);
  v1::EstimateResponse resp;
  // The answer as DecodeCostTable gives it: its costs once apiece, and per
  // cost its position among them.
  std::vector<Cost> unique;
  std::vector<uint32_t> index;
  size_t predictable = 0;
  for (const Op& op : missed_ops) predictable += Predictable(op) ? 1 : 0;
  int used = 0;
  // The home costs the ops: its thread measuring ahead waits meanwhile.
  bool whole = false;
  if (spread) {
    std::lock_guard<std::mutex> lock(mu_);
    whole = !splits_;
  }
  if (whole) Busy(0, +1);
  // Decodes and checks an answer to `req`.
  auto take = [&]() -> grpc::Status {
    return TakeAnswer(resp, lookahead, extra, missed.size(), predictable, &unique, &index);
  };
  // A device with one endpoint asks on its estimate stream (opened if need
  // be), as its prefetches do: no call to set up, and the agent answers on
  // its stream thread. Answers come in order, so this one comes after those
  // in flight. If the stream fails, or answers amiss, the plain call below
  // asks again, with retries. (Several endpoints take plain calls, round
  // robin, as the header says.)
  bool streamed = false;
  if (!spread && endpoints_.size() == 1) streamed = AskOnStream(&req, &resp, &used, take);
  const absl::Status called =
      streamed
          ? absl::OkStatus()
          : Call(
                "Estimate",
                [&](v1::DeviceAgent::Stub* stub, const std::string& key, grpc::ClientContext* ctx) {
                  req.set_device_key(key);
                  resp.Clear();
                  grpc::Status st = stub->Estimate(ctx, req, &resp);
                  if (!st.ok()) return st;
                  return take();
                },
                spread ? 0 : -1, &used);
  if (whole) Busy(0, -1);
  if (!called.ok()) {
    // The expected ops were not answered: forget them (a later hint may
    // name them again).
    std::lock_guard<std::mutex> lock(mu_);
    InsertExpectedLocked(extra, 0, {}, {}, 0);
    return called;
  }
  const int answered = resp.lookahead_answered();
  // The asked ops' costs and their lookahead steps, in full.
  std::vector<Cost> answer;
  const size_t own = missed.size() + predictable * static_cast<size_t>(answered);
  answer.reserve(own);
  for (size_t j = 0; j < own; ++j) answer.push_back(unique[index[j]]);
  for (size_t j = 0; j < missed.size(); ++j) {
    costs[missed[j]] = answer[j];
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (spread && used == 0) home_holds_.insert(held.begin(), held.end());
  last_endpoint_ = used;
  ++stats_.estimate_rpcs;
  stats_.ops_memo_misses += static_cast<int64_t>(missed.size());
  TrimLocked();
  // The keys name lists by id; ids from before an emptying are void.
  if (rekey || memo_epoch_ != epoch) KeysLocked(ops, &keys);
  MemoiseAnswerLocked(missed_ops, missed, keys, costs, answer, answered, predictable);
  if (!extra.ops.empty()) {
    InsertExpectedLocked(extra, resp.expected_answered(), unique, index, own);
  }
  return absl::OkStatus();
}

std::shared_ptr<RemoteDevice::Prefetch> RemoteDevice::LookUpLocked(
    absl::Span<const Op> ops, absl::Span<Cost> costs, std::vector<MemoKey>* keys,
    std::vector<size_t>* missed, std::vector<Op>* missed_ops) const {
  std::shared_ptr<Prefetch> prefetch;
  thread_local std::vector<MemoKey> run_keys;
  thread_local std::vector<int64_t> offsets;
  thread_local std::vector<Op> exact;
  thread_local std::vector<size_t> exact_at;
  thread_local std::vector<MemoKey> exact_keys;
  // Ops a run holds are answered from it; only the others are keyed
  // exactly (their lists interned).
  thread_local std::vector<char> from_run;
  from_run.assign(ops.size(), 0);
  size_t run_hits = 0;
  if (!runs_.empty()) {
    RunKeysLocked(ops, /*add=*/false, &run_keys, &offsets);
    for (size_t i = 0; i < ops.size(); ++i) {
      if (const Cost* c = FindRunLocked(run_keys[i], offsets[i]); c != nullptr) {
        costs[i] = *c;
        from_run[i] = 1;
        ++run_hits;
        ++stats_.ops_memo_hits;
        ++stats_.expected_hits;
      }
    }
  }
  if (run_hits == 0) {
    KeysLocked(ops, keys);
  } else if (run_hits < ops.size()) {
    exact.clear();
    exact_at.clear();
    for (size_t i = 0; i < ops.size(); ++i) {
      if (from_run[i]) continue;
      exact.push_back(ops[i]);
      exact_at.push_back(i);
    }
    KeysLocked(exact, &exact_keys);
    keys->resize(ops.size());
    for (size_t j = 0; j < exact.size(); ++j) (*keys)[exact_at[j]] = exact_keys[j];
  }
  bool extended = false;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (from_run[i]) continue;
    auto it = memo_.find((*keys)[i]);
    if (it != memo_.end()) {
      costs[i] = it->second.cost;
      ++stats_.ops_memo_hits;
      // Near the end of its prediction: ask for the steps after it.
      const MemoEntry& e = it->second;
      if (e.step < 0) ++stats_.expected_hits;
      if (!extended && e.window != 0 && e.step > 0) {
        extended = true;
        auto w = windows_.find(e.window);
        if (w != windows_.end() && !w->second->extending &&
            e.step >= w->second->horizon - kPrefetchMargin) {
          prefetch = ExtendLocked(e.window, w->second);
        }
      }
    } else {
      missed->push_back(i);
      missed_ops->push_back(ops[i]);  // spans still shared: one list on the wire
    }
  }
  return prefetch;
}

void RemoteDevice::LookUpMissedLocked(absl::Span<Cost> costs, std::vector<MemoKey>* keys,
                                      std::vector<size_t>* missed,
                                      std::vector<Op>* missed_ops) const {
  thread_local std::vector<MemoKey> run_keys;
  thread_local std::vector<int64_t> offsets;
  KeysLocked(*missed_ops, keys);
  RunKeysLocked(*missed_ops, /*add=*/false, &run_keys, &offsets);
  size_t kept = 0;
  for (size_t j = 0; j < missed->size(); ++j) {
    auto it = memo_.find((*keys)[j]);
    if (it != memo_.end()) {
      costs[(*missed)[j]] = it->second.cost;
      ++stats_.ops_memo_hits;
    } else if (const Cost* c = FindRunLocked(run_keys[j], offsets[j]); c != nullptr) {
      costs[(*missed)[j]] = *c;
      ++stats_.ops_memo_hits;
      ++stats_.expected_hits;
    } else {
      (*missed)[kept] = (*missed)[j];
      (*missed_ops)[kept++] = (*missed_ops)[j];
    }
  }
  missed->resize(kept);
  missed_ops->resize(kept);
}

void RemoteDevice::DropAskedLocked(absl::Span<const Op> missed_ops, OwnedOps* extra) const {
  if (extra->ops.empty() || extra->epoch != memo_epoch_) return;
  // Hints this call asks anyway are not sent twice.
  thread_local std::vector<MemoKey> asked;
  KeysLocked(missed_ops, &asked);
  const absl::flat_hash_set<MemoKey> asking(asked.begin(), asked.end());
  size_t kept = 0;
  for (size_t i = 0; i < extra->ops.size(); ++i) {
    if (asking.contains(extra->keys[i]) && extra->steps[i] == 0) {
      pending_keys_.erase(extra->keys[i]);
      continue;
    }
    extra->ops[kept] = extra->ops[i];
    extra->steps[kept] = extra->steps[i];
    extra->keys[kept++] = extra->keys[i];
  }
  extra->ops.resize(kept);
  extra->steps.resize(kept);
  extra->keys.resize(kept);
}

void RemoteDevice::EncodeMissed(absl::Span<const Op> missed_ops, const OwnedOps& extra,
                                int lookahead, absl::Span<const devices::StepMeasurement> absorb,
                                v1::EstimateRequest* req) {
  if (extra.ops.empty()) {
    EncodeOps(missed_ops, req);
  } else {
    std::vector<Op> all(missed_ops.begin(), missed_ops.end());
    all.insert(all.end(), extra.ops.begin(), extra.ops.end());
    EncodeOps(all, req);
    req->set_expected(static_cast<int>(extra.ops.size()));
    if (std::any_of(extra.steps.begin(), extra.steps.end(), [](int32_t k) { return k > 0; })) {
      req->mutable_expected_steps()->Add(extra.steps.begin(), extra.steps.end());
    }
  }
  req->set_lookahead(lookahead);
  req->mutable_measured()->Reserve(static_cast<int>(absorb.size()));
  for (const devices::StepMeasurement& m : absorb) EncodeMeasurement(m, req->add_measured());
}

grpc::Status RemoteDevice::TakeAnswer(const v1::EstimateResponse& resp, int lookahead,
                                      const OwnedOps& extra, size_t missed, size_t predictable,
                                      std::vector<Cost>* unique, std::vector<uint32_t>* index) {
  unique->clear();
  index->clear();
  if (absl::Status d = DecodeCostTable(resp.cost_table(), unique, index); !d.ok()) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        absl::StrCat("answered a malformed cost table: ", d.message()));
  }
  const int answered = resp.lookahead_answered();
  const int expected = resp.expected_answered();
  if (answered < 0 || answered > lookahead || expected < 0 ||
      static_cast<size_t>(expected) > extra.ops.size() ||
      index->size() != missed + predictable * answered +
                           ExpectedCosts(extra.ops, extra.steps, static_cast<size_t>(expected))) {
    return grpc::Status(
        grpc::StatusCode::INTERNAL,
        absl::StrCat("answered ", index->size(), " costs (", answered, " lookahead steps, ",
                     expected, " expected ops) for ", missed, " ops, ", predictable,
                     " of them predictable, and ", extra.ops.size(), " expected"));
  }
  return grpc::Status::OK;
}

bool RemoteDevice::AskOnStream(v1::EstimateRequest* req, v1::EstimateResponse* resp, int* used,
                               absl::FunctionRef<grpc::Status()> take) const {
  bool streamed = false;
  std::shared_ptr<Prefetch> p;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Endpoint* ep = endpoints_[last_endpoint_].get();
    if (!ep->no_stream && ep->bound && ep->down_until <= std::chrono::steady_clock::now()) {
      p = std::make_shared<Prefetch>();
      p->blocking = true;
      p->req = std::move(*req);
      LaunchLocked(ep, p.get());
      *used = last_endpoint_;
    }
  }
  if (p != nullptr) {
    StartPrefetch(p);
    PollAnswers(/*until_idle=*/true, p.get());
    if (p->status.ok()) {
      *resp = std::move(p->resp);
      streamed = take().ok();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      --stats_.estimate_rpcs;  // counted once it is answered, below
    }
    *req = std::move(p->req);
  }
  return streamed;
}

void RemoteDevice::MemoiseAnswerLocked(absl::Span<const Op> missed_ops,
                                       absl::Span<const size_t> missed,
                                       absl::Span<const MemoKey> keys, absl::Span<const Cost> costs,
                                       absl::Span<const Cost> answer, int answered,
                                       size_t predictable) const {
  uint64_t id = 0;
  std::shared_ptr<Window> window;
  if (answered > 0 && predictable > 0) {
    id = next_window_++;
    window = std::make_shared<Window>();
    CopyOwned(missed_ops, &window->ops, &window->seqs, &window->stacks);
    window->horizon = answered;
    memo_bytes_ += OwnedBytes(window->seqs, window->stacks, window->ops.size());
    windows_.emplace(id, window);
  }
  for (size_t j = 0; j < missed.size(); ++j) {
    memo_.emplace(keys[missed[j]], MemoEntry{costs[missed[j]], 0, id});
  }
  if (window != nullptr) {
    InsertStepsLocked(id, *window, 1, answered, answer, missed.size());
  }
}

}  // namespace servesim::agents
