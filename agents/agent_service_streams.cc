// AgentService's estimate streams: EstimateStream is served by gRPC's
// asynchronous API on a completion queue of its own, drained by
// ServeStreams' thread, which reads a stream's request, answers it
// (EstimateAuthorized) and writes the answer itself (StreamCall, one per
// stream). A stream is admitted under the per-caller and total caps
// (AdmitStream) and cancelled by the idle watch (WatchStreams, a thread
// started with the first stream) when it brings no request for
// estimate_stream_idle_s; EndStreams ends them all before a shutdown.
// streams_mu_ guards the open streams and the watch's stop.
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "agents/agent_service.h"
#include "agents/agent_service_internal.h"
#include "agents/convert.h"

namespace servesim::agents {

namespace v1 = servesim::v1;
using internal::SteadyNs;

absl::StatusOr<std::shared_ptr<AgentService::OpenStream>> AgentService::AdmitStream(
    grpc::ServerContextBase* ctx, const std::string& caller) {
  std::lock_guard<std::mutex> lock(streams_mu_);
  if (streams_ended_) return absl::UnavailableError("this agent is shutting down");
  const int mine = static_cast<int>(
      std::count_if(streams_.begin(), streams_.end(),
                    [&](const std::shared_ptr<OpenStream>& s) { return s->caller == caller; }));
  if (mine >= options_.estimate_streams_per_client) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this caller holds ", mine,
                     " estimate streams, the most one caller may "
                     "(servesim-agent --estimate-streams-per-client); call Estimate instead"));
  }
  if (static_cast<int>(streams_.size()) >= options_.max_estimate_streams) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this agent holds ", streams_.size(),
                     " estimate streams, its most (a quarter of --max-threads); call "
                     "Estimate instead"));
  }
  auto s = std::make_shared<OpenStream>();
  s->ctx = ctx;
  s->caller = caller;
  s->last_ns = SteadyNs();
  streams_.push_back(s);
  if (!watch_.joinable()) watch_ = std::thread([this] { WatchStreams(); });
  return s;
}

void AgentService::EndStreams() {
  std::lock_guard<std::mutex> lock(streams_mu_);
  streams_ended_ = true;
  for (const std::shared_ptr<OpenStream>& s : streams_) s->ctx->TryCancel();
}

void AgentService::ForgetStream(const std::shared_ptr<OpenStream>& s) {
  std::lock_guard<std::mutex> lock(streams_mu_);
  streams_.erase(std::remove(streams_.begin(), streams_.end(), s), streams_.end());
}

void AgentService::WatchStreams() {
  const int64_t idle_ns = static_cast<int64_t>(options_.estimate_stream_idle_s * 1e9);
  // Looks at most ten times per idle period, and at least once a second.
  const auto period = std::chrono::nanoseconds(std::clamp<int64_t>(idle_ns / 10, 1, 1000000000));
  std::unique_lock<std::mutex> lock(streams_mu_);
  while (!streams_cv_.wait_for(lock, period, [this] { return stop_watch_; })) {
    const int64_t now = SteadyNs();
    for (const std::shared_ptr<OpenStream>& s : streams_) {
      // Its handler waits in Read: cancelling the call ends the wait, and
      // the handler forgets the stream.
      if (now - s->last_ns.load() > idle_ns) s->ctx->TryCancel();
    }
  }
}

// One estimate stream on ServeStreams' queue: reads a request, answers it,
// writes the answer, reads the next. A request Estimate refuses ends the
// stream with its status; a cancelled stream (its client, the idle watch,
// EndStreams) ends when its read fails. Each call, once it starts, asks for
// the next stream. It is deleted when both its own operations and the
// call's end (AsyncNotifyWhenDone) have come back.
class AgentService::StreamCall {
 public:
  // The next stream's call, waiting for a client; none once the queues
  // are closed.
  static void Await(AgentService* service, grpc::ServerCompletionQueue* cq) {
    std::lock_guard<std::mutex> lock(service->stream_ops_mu_);
    if (service->stream_queues_closed_) return;
    new StreamCall(service, cq);
  }

  // What the queue hands back: this call's next operation, or its end.
  struct Tag {
    StreamCall* call;
    bool done;
  };
  void Proceed(bool done, bool ok) {
    if (done) {
      ended_ = true;
    } else {
      Step(ok);
    }
    if (ended_ && state_ == State::kFinished) delete this;
  }

 private:
  enum class State { kWaiting, kReading, kWriting, kFinishing, kFinished };

  void Step(bool ok) {
    switch (state_) {
      case State::kWaiting: {
        if (!ok) {  // the server is shutting down: no call came
          state_ = State::kFinished;
          ended_ = true;  // no call, so no end to wait for
          return;
        }
        Await(service_, cq_);
        if (grpc::Status st = service_->Authorize(&ctx_); !st.ok()) {
          Finish(st);
          return;
        }
        auto admitted = service_->AdmitStream(&ctx_, CallerOf(&ctx_));
        if (!admitted.ok()) {
          Finish(ToGrpcStatus(admitted.status()));
          return;
        }
        stream_ = *std::move(admitted);
        Read();
        return;
      }
      case State::kReading: {
        if (!ok) {  // the client is done writing, or the call was cancelled
          Finish(grpc::Status::OK);
          return;
        }
        stream_->last_ns = SteadyNs();
        service_->calls_.fetch_add(1);
        resp_.Clear();
        if (grpc::Status st = service_->EstimateAuthorized(&req_, &resp_); !st.ok()) {
          Finish(st);
          return;
        }
        Issue(State::kWriting, [this] { rw_.Write(resp_, &op_tag_); });
        return;
      }
      case State::kWriting:
        if (!ok) {
          Finish(grpc::Status::OK);
          return;
        }
        Read();
        return;
      case State::kFinishing:
        state_ = State::kFinished;
        return;
      case State::kFinished:
        return;
    }
  }
  StreamCall(AgentService* service, grpc::ServerCompletionQueue* cq)
      : service_(service), cq_(cq), rw_(&ctx_) {
    ctx_.AsyncNotifyWhenDone(&done_tag_);
    service_->RequestEstimateStream(&ctx_, &rw_, cq_, cq_, &op_tag_);
  }
  // Issues an operation and moves to `next`; once the queues are closed
  // issues nothing and is finished (the call's end still comes back as the
  // queue drains, and deletes it).
  template <typename Op>
  void Issue(State next, Op op) {
    std::lock_guard<std::mutex> lock(service_->stream_ops_mu_);
    if (service_->stream_queues_closed_) {
      if (stream_ != nullptr) {
        service_->ForgetStream(stream_);
        stream_ = nullptr;
      }
      state_ = State::kFinished;
      return;
    }
    state_ = next;
    op();
  }
  void Read() {
    Issue(State::kReading, [this] { rw_.Read(&req_, &op_tag_); });
  }
  void Finish(const grpc::Status& st) {
    if (stream_ != nullptr) {
      service_->ForgetStream(stream_);
      stream_ = nullptr;
    }
    Issue(State::kFinishing, [this, &st] { rw_.Finish(st, &op_tag_); });
  }

  AgentService* service_;
  grpc::ServerCompletionQueue* cq_;
  grpc::ServerContext ctx_;
  grpc::ServerAsyncReaderWriter<v1::EstimateResponse, v1::EstimateRequest> rw_;
  Tag op_tag_{this, false}, done_tag_{this, true};
  State state_ = State::kWaiting;
  bool ended_ = false;
  std::shared_ptr<OpenStream> stream_;
  v1::EstimateRequest req_;
  v1::EstimateResponse resp_;
};

void AgentService::CloseStreamQueues(
    const std::vector<std::unique_ptr<grpc::ServerCompletionQueue>>& queues) {
  std::lock_guard<std::mutex> lock(stream_ops_mu_);
  stream_queues_closed_ = true;
  for (const auto& q : queues) q->Shutdown();
}

void AgentService::ServeStreams(grpc::ServerCompletionQueue* cq) {
  StreamCall::Await(this, cq);
  void* tag = nullptr;
  bool ok = false;
  while (cq->Next(&tag, &ok)) {
    auto* t = static_cast<StreamCall::Tag*>(tag);
    t->call->Proceed(t->done, ok);
  }
}

}  // namespace servesim::agents
