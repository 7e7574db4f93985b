// RemoteDevice's asynchronous Estimates: a prediction's extension
// (ExtendLocked), the expected ops waiting (SendExpectedLocked) and, for a
// device with one endpoint, a blocking Estimate's own request go out as a
// Prefetch, on the endpoint's estimate stream (opened on first use) or, where
// the endpoint refused streams, as a call of its own (StartPrefetch). Their
// completions land on cq_, which no thread of gRPC's drains: the threads
// that need an answer take them (PollAnswers) and memoise them
// (OnExtended). A stream whose oldest answer is later than deadline_s is
// cancelled. Owns the streams, the prefetches in flight and cq_'s tags;
// mu_ guards them, never held while waiting on cq_.
#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>
#include <vector>

#include "agents/convert.h"
#include "agents/remote_device.h"
#include "agents/remote_device_internal.h"

namespace servesim::agents {

using devices::Cost;
using internal::ExpectedCosts;
using internal::kPrefetchSteps;

void RemoteDevice::StreamSendLocked(Stream* s) const {
  if (!s->started || s->broken) return;
  if (!s->writing && !s->to_write.empty()) {
    std::shared_ptr<Prefetch> p = std::move(s->to_write.front());
    s->to_write.pop_front();
    s->writing = true;
    ++s->pending;
    p->sent = std::chrono::steady_clock::now();
    s->rw->Write(p->req, &s->write);
    s->waiting.push_back(std::move(p));
  }
  if (!s->reading && !s->waiting.empty()) {
    s->reading = true;
    ++s->pending;
    s->rw->Read(&s->resp, &s->read);
  }
}

void RemoteDevice::OnStreamEventLocked(CqTag* t, bool ok,
                                       std::vector<std::shared_ptr<Prefetch>>* done) const {
  Stream* s = t->stream;
  --s->pending;
  if (t->kind == kStreamWrite) s->writing = false;
  if (t->kind == kStreamRead) s->reading = false;
  if (!ok && !s->broken) {
    // The agent ended the call (restarted, idle, refused the stream or a
    // request) or it was cancelled: what waits on it fails now and is asked
    // again by blocking calls; the next prefetch opens another stream, unless
    // this one never answered (the endpoint then takes unary calls).
    s->broken = true;
    s->ctx.TryCancel();
    if (!s->answered) s->ep->no_stream = true;
  }
  if (s->broken) {
    for (auto* q : {&s->waiting, &s->to_write}) {
      for (std::shared_ptr<Prefetch>& p : *q) {
        p->status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "estimate stream ended");
        done->push_back(std::move(p));
      }
      q->clear();
    }
    if (s->pending == 0) {  // nothing of it left on cq_
      streams_.erase(std::find_if(streams_.begin(), streams_.end(),
                                  [s](const std::unique_ptr<Stream>& e) { return e.get() == s; }));
    }
    return;
  }
  if (t->kind == kStreamStart) s->started = true;
  if (t->kind == kStreamRead) {
    std::shared_ptr<Prefetch> p = std::move(s->waiting.front());
    s->waiting.pop_front();
    p->resp.Swap(&s->resp);
    p->status = grpc::Status::OK;
    s->answered = true;
    done->push_back(std::move(p));
  }
  StreamSendLocked(s);
}

void RemoteDevice::CancelHungStreamsLocked() const {
  const auto now = std::chrono::steady_clock::now();
  const auto limit = std::chrono::duration<double>(options_.deadline_s);
  for (const std::unique_ptr<Stream>& s : streams_) {
    if (!s->broken && !s->waiting.empty() && now - s->waiting.front()->sent > limit) {
      s->ctx.TryCancel();  // its operations fail on cq_, failing what waits
    }
  }
}

void RemoteDevice::WaitForPrefetches() const { PollAnswers(/*until_idle=*/true); }

void RemoteDevice::PollAnswers(bool until_idle, const Prefetch* until) const {
  if (until != nullptr) until_idle = true;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (inflight_ == 0 || (until != nullptr && until->finished)) return;
    }
    // A bounded wait: another thread may take the last answer.
    const auto deadline = until_idle
                              ? std::chrono::system_clock::now() + std::chrono::milliseconds(50)
                              : std::chrono::system_clock::time_point{};
    void* tag = nullptr;
    bool ok = false;
    switch (cq_.AsyncNext(&tag, &ok, deadline)) {
      case grpc::CompletionQueue::GOT_EVENT: {
        auto* t = static_cast<CqTag*>(tag);
        if (t->kind != kUnary) {
          std::vector<std::shared_ptr<Prefetch>> done;
          {
            std::lock_guard<std::mutex> lock(mu_);
            OnStreamEventLocked(t, ok, &done);
          }
          for (const auto& d : done) OnExtended(d, d->status);
          break;
        }
        auto* p = static_cast<Prefetch*>(t);
        const std::shared_ptr<Prefetch> keep = std::move(p->self);
        OnExtended(keep, ok ? keep->status
                            : grpc::Status(grpc::StatusCode::CANCELLED, "call not completed"));
        break;
      }
      case grpc::CompletionQueue::TIMEOUT: {
        if (!until_idle) return;
        // A stream's answer later than the call deadline: the agent hangs.
        std::lock_guard<std::mutex> lock(mu_);
        CancelHungStreamsLocked();
        break;
      }
      case grpc::CompletionQueue::SHUTDOWN:
        return;
    }
  }
}

void RemoteDevice::LaunchLocked(Endpoint* ep, Prefetch* p) const {
  p->req.set_device_key(ep->device_key);
  ++inflight_;
  ++stats_.estimate_rpcs;
  if (!p->blocking) ++stats_.prefetch_rpcs;
  p->stub = ep->stub.get();
  p->ep = ep;
  prefetches_.insert(p);
}

std::shared_ptr<RemoteDevice::Prefetch> RemoteDevice::ExtendLocked(
    uint64_t id, const std::shared_ptr<Window>& window) const {
  Endpoint* ep = endpoints_[last_endpoint_].get();
  if (!ep->bound || ep->down_until > std::chrono::steady_clock::now()) return nullptr;
  auto p = std::make_shared<Prefetch>();
  p->id = id;
  p->window = window;
  p->from = window->horizon;
  p->steps = std::min(kPrefetchSteps, options_.lookahead_max);
  p->epoch = memo_epoch_;
  LookaheadStep(window->ops, p->from, &p->ops, &p->lists);
  if (p->ops.empty() || p->steps <= 0) return nullptr;
  EncodeOps(p->ops, &p->req);
  p->req.set_lookahead(p->steps);
  window->extending = true;
  LaunchLocked(ep, p.get());
  return p;
}

void RemoteDevice::StartPrefetch(const std::shared_ptr<Prefetch>& p) const {
  // Answers already in take no wait; taking them keeps few in flight.
  PollAnswers(/*until_idle=*/false);
  {
    // On the endpoint's estimate stream, opened if there is none.
    std::lock_guard<std::mutex> lock(mu_);
    if (!p->ep->no_stream) {
      Stream* s = nullptr;
      for (const std::unique_ptr<Stream>& e : streams_) {
        if (e->ep == p->ep && !e->broken) s = e.get();
      }
      if (s == nullptr) {
        s = streams_.emplace_back(std::make_unique<Stream>()).get();
        s->ep = p->ep;
        s->start = CqTag{kStreamStart, s};
        s->write = CqTag{kStreamWrite, s};
        s->read = CqTag{kStreamRead, s};
        // No deadline: CancelHungStreamsLocked holds each answer to one.
        if (!options_.token.empty()) {
          s->ctx.AddMetadata("authorization", "Bearer " + options_.token);
        }
        s->pending = 1;
        s->rw = p->ep->stub->AsyncEstimateStream(&s->ctx, &cq_, &s->start);
      }
      s->to_write.push_back(p);
      StreamSendLocked(s);
      return;
    }
  }
  // A call of its own: its deadline and token (a stream's request has its
  // stream's).
  PrepareContext(&p->ctx, options_.deadline_s);
  p->self = p;
  p->reader = p->stub->AsyncEstimate(&p->ctx, p->req, &cq_);
  p->reader->Finish(&p->resp, &p->status, static_cast<CqTag*>(p.get()));
}

std::shared_ptr<RemoteDevice::Prefetch> RemoteDevice::SendExpectedLocked() const {
  Endpoint* ep = endpoints_[last_endpoint_].get();
  if (pending_.ops.empty() || !ep->bound || ep->down_until > std::chrono::steady_clock::now()) {
    return nullptr;
  }
  auto p = std::make_shared<Prefetch>();
  p->expected = std::move(pending_);
  pending_ = OwnedOps{};
  EncodeOps(p->expected.ops, &p->req);
  p->req.set_expected(static_cast<int>(p->expected.ops.size()));
  if (std::any_of(p->expected.steps.begin(), p->expected.steps.end(),
                  [](int32_t k) { return k > 0; })) {
    p->req.mutable_expected_steps()->Add(p->expected.steps.begin(), p->expected.steps.end());
  }
  LaunchLocked(ep, p.get());
  return p;
}

void RemoteDevice::OnExtended(const std::shared_ptr<Prefetch>& p, const grpc::Status& st) const {
  if (p->blocking) {  // its caller takes the answer
    std::lock_guard<std::mutex> lock(mu_);
    p->status = st;
    p->finished = true;
    prefetches_.erase(p.get());
    --inflight_;
    return;
  }
  thread_local std::vector<Cost> costs;
  thread_local std::vector<uint32_t> index;
  costs.clear();
  index.clear();
  if (p->window == nullptr) {
    // Expected ops: an answer is memoised whenever it comes (keys are
    // computed now). Their costs stay unique, as the table sent them.
    const bool decoded = st.ok() && DecodeCostTable(p->resp.cost_table(), &costs, &index).ok();
    std::lock_guard<std::mutex> lock(mu_);
    const int n = static_cast<int>(p->expected.ops.size());
    const int answered = p->resp.expected_answered();
    const bool valid = decoded && answered >= 0 && answered <= n &&
                       index.size() == ExpectedCosts(p->expected.ops, p->expected.steps,
                                                     static_cast<size_t>(answered));
    if (!valid) ++stats_.prefetch_failures;
    InsertExpectedLocked(p->expected, valid ? answered : 0, costs, index, 0);
    TrimLocked();
    prefetches_.erase(p.get());
    --inflight_;
    return;
  }
  const bool decoded = st.ok() && DecodeCosts(p->resp.cost_table(), &costs).ok();
  std::lock_guard<std::mutex> lock(mu_);
  p->window->extending = false;
  const int n = static_cast<int>(p->ops.size());
  const int answered = p->resp.lookahead_answered();
  if (!decoded || answered < 0 || answered > p->steps ||
      costs.size() != static_cast<size_t>(n + n * answered)) {
    ++stats_.prefetch_failures;
  } else if (p->epoch == memo_epoch_) {
    // The request's own ops (step `from`) are in the memo already.
    InsertStepsLocked(p->id, *p->window, p->from + 1, answered, costs, static_cast<size_t>(n));
    p->window->horizon += answered;
    TrimLocked();
  }
  prefetches_.erase(p.get());
  --inflight_;
}

}  // namespace servesim::agents
