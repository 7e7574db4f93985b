// Measured steps spread over a device's endpoints (devices whose
// description says measures_steps, served by several agents): Spread asks
// the home once whether to; MeasureSpread places each step's work on the
// endpoints (every endpoint a share of every step's layers where the device
// splits layers, else whole requests by the work they have left) and
// measures the shares concurrently, one thread per endpoint, joined in
// endpoint order, so the home can absorb them. Measuring ahead: a thread
// per endpoint asks its requests' next steps between the calls that ask
// them (AheadLoop), under ahead_mu_ (taken before mu_ where both are). Keeps
// the placement (owner_, next_owner_; under mu_) and the ahead state.
#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agents/convert.h"
#include "agents/remote_device.h"
#include "common/status_macros.h"

namespace servesim::agents {

namespace v1 = servesim::v1;
using devices::Op;

absl::StatusOr<bool> RemoteDevice::Spread() const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (spread_ >= 0) return spread_ == 1;
    if (endpoints_.size() < 2) {
      spread_ = 0;
      return false;
    }
  }
  // The home's description says whether the device measures steps.
  ASSIGN_OR_RETURN(devices::DeviceDescription d, DescribeAt(0));
  std::lock_guard<std::mutex> lock(mu_);
  spread_ = d.measures_steps ? 1 : 0;
  splits_ = d.splits_layers;
  step_base_ = d.step_base_positions;
  first_step_ = d.first_step_positions_per_token;
  return spread_ == 1;
}

namespace {

// The decode steps of `ops`, in order, once each (a pool's units and the
// head groups share their sequences), appended to `steps` and `seen`;
// `final_of` receives each request's final_tokens hint.
void CollectDecodeSteps(absl::Span<const Op> ops, std::vector<devices::StepKey>* steps,
                        absl::flat_hash_set<devices::StepKey>* seen,
                        absl::flat_hash_map<int64_t, int64_t>* final_of) {
  for (const Op& op : ops) {
    if (op.kind != devices::OpKind::kAttention) continue;
    for (const devices::AttentionSeq& s : op.seqs) {
      if (s.new_tokens != 1 || s.request_id < 0) continue;
      const devices::StepKey k{s.request_id, s.past_tokens + 1};
      if (seen->insert(k).second) steps->push_back(k);
      if (s.final_tokens > 0) final_of->try_emplace(s.request_id, s.final_tokens);
    }
  }
}

}  // namespace

absl::Status RemoteDevice::MeasureSpread(absl::Span<const Op> ops,
                                         std::vector<devices::StepMeasurement>* absorb,
                                         std::vector<devices::StepKey>* steps) const {
  // The ops' decode steps, in order, once each (a pool's units and the head
  // groups share their sequences).
  steps->clear();
  absl::flat_hash_set<devices::StepKey> seen;
  absl::flat_hash_map<int64_t, int64_t> final_of;  // request -> final_tokens hint
  CollectDecodeSteps(ops, steps, &seen, &final_of);
  const int n = static_cast<int>(endpoints_.size());
  std::vector<std::vector<devices::StepKey>> share(n);
  bool layers = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    layers = splits_;
  }
  if (layers) {
    // Every endpoint takes its share of every step's layers: endpoint e
    // always share e of n, so each keeps the K rows of its own layers.
    std::lock_guard<std::mutex> lock(mu_);
    for (const devices::StepKey& k : *steps) {
      if (home_holds_.contains(k)) continue;
      for (int e = 0; e < n; ++e) share[e].push_back(k);
    }
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    PlaceRequestsLocked(*steps, final_of, &share);
  }
  if (!layers) StartAheadOnce();
  // One thread per endpoint with steps (the caller's thread takes the last),
  // joined in endpoint order.
  std::vector<std::vector<devices::StepMeasurement>> got(n);
  std::vector<absl::Status> status(n);
  auto measure = [&](int e) { status[e] = MeasureShare(e, share[e], layers, final_of, &got[e]); };
  std::vector<std::thread> threads;
  int last = -1;
  for (int e = 0; e < n; ++e) {
    if (share[e].empty()) continue;
    if (last >= 0) threads.emplace_back(measure, last);
    last = e;
  }
  if (last >= 0) measure(last);
  for (std::thread& t : threads) t.join();
  absorb->clear();
  for (int e = 0; e < n; ++e) {
    RETURN_IF_ERROR(status[e]);
    for (devices::StepMeasurement& m : got[e]) {
      if (!seen.contains(m.step)) {
        seen.insert(m.step);
        steps->push_back(m.step);  // filled in on the way
      }
      absorb->push_back(std::move(m));
    }
  }
  return absl::OkStatus();
}

void RemoteDevice::PlaceRequestsLocked(absl::Span<const devices::StepKey> steps,
                                       const absl::flat_hash_map<int64_t, int64_t>& final_of,
                                       std::vector<std::vector<devices::StepKey>>* share) const {
  const int n = static_cast<int>(endpoints_.size());
  // A step at context L takes L + base of kernel time (the device's
  // profile, DeviceDescription), so a request's work left is that summed
  // over its remaining steps, where the scheduler hinted its final length
  // (else this step alone); a request new here also builds its state from
  // its prompt first. A request seen before stays where its kernel state
  // is; each endpoint's load is the work left of its requests in this
  // call. New requests go, largest first, to the least-loaded endpoint
  // (ties round the endpoints): the longest-processing-time rule, so that
  // requests of different prompt and output lengths still split the run's
  // work evenly.
  auto work_left = [&](const devices::StepKey& k) {
    const auto it = final_of.find(k.request_id);
    const double l = static_cast<double>(k.l);
    if (it == final_of.end() || it->second <= k.l) return l + step_base_;
    const double f = static_cast<double>(it->second);
    return (f * (f + 1) - (l - 1) * l) / 2 + (f - l + 1) * step_base_;
  };
  std::vector<double> load(n, 0);
  std::vector<std::pair<double, int64_t>> fresh;  // (work left, request), first step's order
  absl::flat_hash_set<int64_t> counted;
  for (const devices::StepKey& k : steps) {
    if (home_holds_.contains(k) || !counted.insert(k.request_id).second) continue;
    auto it = owner_.find(k.request_id);
    if (it != owner_.end()) {
      load[it->second] += work_left(k);
    } else {
      fresh.push_back({work_left(k) + first_step_ * static_cast<double>(k.l), k.request_id});
    }
  }
  std::stable_sort(fresh.begin(), fresh.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [work, request] : fresh) {
    int best = next_owner_ % n;
    for (int i = 1; i < n; ++i) {
      const int e = (next_owner_ + i) % n;
      if (load[e] < load[best]) best = e;
    }
    next_owner_ = best + 1;
    owner_[request] = best;
    load[best] += work;
  }
  for (const devices::StepKey& k : steps) {
    if (home_holds_.contains(k)) continue;
    (*share)[owner_.at(k.request_id)].push_back(k);
  }
}

absl::Status RemoteDevice::MeasureShare(int e, absl::Span<const devices::StepKey> share,
                                        bool layers,
                                        const absl::flat_hash_map<int64_t, int64_t>& final_of,
                                        std::vector<devices::StepMeasurement>* got) const {
  const int n = static_cast<int>(endpoints_.size());
  for (size_t at = 0; at < share.size(); at += kMaxMeasureSteps) {
    v1::MeasureRequest req;
    const size_t end = std::min(share.size(), at + kMaxMeasureSteps);
    for (size_t i = at; i < end; ++i) EncodeStepKey(share[i], req.add_steps());
    if (layers) {
      req.set_part(e);
      req.set_parts(n);
    }
    v1::MeasureResponse resp;
    // An endpoint marked down is tried last, not first: its share goes to
    // the next one up (any endpoint measures any share exactly; a
    // request whose state was on it starts afresh where it lands).
    int start = e;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto now = std::chrono::steady_clock::now();
      for (int i = 0; i < n && endpoints_[start]->down_until > now; ++i) start = (e + i + 1) % n;
      if (endpoints_[start]->down_until > now) start = e;
    }
    int u = -1;
    if (!layers) Busy(e, +1);
    const absl::Status status = Call(
        "Measure",
        [&](v1::DeviceAgent::Stub* stub, const std::string& key, grpc::ClientContext* ctx) {
          req.set_device_key(key);
          resp.Clear();
          return stub->Measure(ctx, req, &resp);
        },
        start, &u);
    if (!layers) {
      Busy(e, -1);
      // Its endpoint goes on with these requests' next steps meanwhile.
      if (status.ok()) Hold(u, share.subspan(at, end - at), final_of);
    }
    if (!status.ok()) return status;
    auto m = DecodeMeasurements(resp.measured(), kMaxMeasuredSteps, "measured");
    if (!m.ok()) {
      return absl::InternalError(absl::StrCat(label_, ": agent ", endpoints_[u]->address,
                                              ": Measure answered ", m.status().message()));
    }
    if (m->size() < end - at) {
      return absl::InternalError(absl::StrCat(label_, ": agent ", endpoints_[u]->address,
                                              ": Measure answered ", m->size(), " steps for ",
                                              end - at));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.measure_rpcs;
      stats_.measured_steps[u] += static_cast<int64_t>(m->size());
    }
    if (!layers && u != e) {
      // Its requests' state is on `u` now: keep them there.
      std::lock_guard<std::mutex> lock(mu_);
      for (const devices::StepKey& k : share) owner_[k.request_id] = u;
    }
    // What the home measured whole is in its memo already; shares are
    // only counts until the home sums them.
    if (u != 0 || layers) got->insert(got->end(), m->begin(), m->end());
  }
  return absl::OkStatus();
}

void RemoteDevice::StartAheadOnce() const {
  std::call_once(ahead_once_, [this] {
    std::lock_guard<std::mutex> lock(ahead_mu_);
    ahead_.resize(endpoints_.size());
    for (int e = 0; e < static_cast<int>(endpoints_.size()); ++e) {
      ahead_threads_.emplace_back([this, e] { AheadLoop(e); });
    }
  });
}

void RemoteDevice::Busy(int e, int delta) const {
  {
    std::lock_guard<std::mutex> lock(ahead_mu_);
    if (e >= static_cast<int>(ahead_.size())) return;
    ahead_[e].busy += delta;
  }
  if (delta < 0) ahead_cv_.notify_all();
}

void RemoteDevice::Hold(int e, absl::Span<const devices::StepKey> asked,
                        const absl::flat_hash_map<int64_t, int64_t>& final_of) const {
  {
    std::lock_guard<std::mutex> lock(ahead_mu_);
    if (e >= static_cast<int>(ahead_.size())) return;
    for (const devices::StepKey& k : asked) {
      // A request that moved (its endpoint down) goes on where it landed.
      for (int o = 0; o < static_cast<int>(ahead_.size()); ++o) {
        if (o != e) ahead_[o].requests.erase(k.request_id);
      }
      const auto f = final_of.find(k.request_id);
      // Its last decode step has context final_tokens - 1 (the last token
      // is the output, not attended).
      const int64_t last = f == final_of.end() ? 0 : f->second - 1;
      AheadStep& st = ahead_[e].requests[k.request_id];
      st.asked = std::max(st.asked, k.l);
      st.next = std::max(st.next, k.l + 1);
      st.last = std::max(st.last, last);
    }
  }
  ahead_cv_.notify_all();
}

void RemoteDevice::AheadLoop(int e) const {
  std::unique_lock<std::mutex> lock(ahead_mu_);
  while (!ahead_stop_) {
    AheadWork& w = ahead_[e];
    // The request least far ahead of its last asked step; a request is
    // forgotten once its last step was asked (until then it is kept, so that
    // a call does not set it back to the step after the one it asked).
    int64_t pick = -1, lead = 0;
    for (auto it = w.requests.begin(); it != w.requests.end();) {
      const AheadStep& st = it->second;
      if (st.asked >= st.last) {
        w.requests.erase(it++);
        continue;
      }
      if (st.next > st.last) {
        ++it;
        continue;
      }
      if (pick < 0 || st.next - st.asked < lead) {
        pick = it->first;
        lead = st.next - st.asked;
      }
      ++it;
    }
    if (ahead_refused_ || w.busy > 0 || pick < 0) {
      ahead_cv_.wait(lock);
      continue;
    }
    const devices::StepKey k{pick, w.requests.at(pick).next};
    Endpoint* ep = endpoints_[e].get();
    v1::MeasureRequest req;
    {
      std::lock_guard<std::mutex> state(mu_);
      if (!ep->bound || ep->down_until > std::chrono::steady_clock::now()) {
        // Asked again once a call has reached it.
        w.requests.clear();
        continue;
      }
      req.set_device_key(ep->device_key);
    }
    EncodeStepKey(k, req.add_steps());
    req.set_ahead(true);
    grpc::ClientContext ctx;
    PrepareContext(&ctx, options_.deadline_s);
    w.inflight = &ctx;
    lock.unlock();
    v1::MeasureResponse resp;
    const grpc::Status st = ep->stub->Measure(&ctx, req, &resp);
    lock.lock();
    w.inflight = nullptr;
    {
      std::lock_guard<std::mutex> state(mu_);
      ++(st.ok() ? stats_.ahead_rpcs : stats_.ahead_failures);
    }
    if (st.ok()) {
      // Asked, whether measured or passed over (a call waited): the next
      // ask goes on from where the kernel stands.
      if (auto it = w.requests.find(k.request_id); it != w.requests.end()) {
        it->second.next = std::max(it->second.next, k.l + 1);
      }
    } else if (st.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      ahead_refused_ = true;
    } else {
      w.requests.clear();
    }
  }
}

}  // namespace servesim::agents
