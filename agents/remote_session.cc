// RemoteSession: one request's KV cache on an agent (the session API).
// Keeps the KV it appended, so when its agent restarts (NOT_FOUND) or the
// call fails over, it opens a new session and appends the history again
// before going on (WithSession, Rebuild). Calls go through its device's
// Call (binding, retries, fail-over), preferring the session's agent.
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agents/convert.h"
#include "agents/remote_device.h"
#include "common/status_macros.h"

namespace servesim::agents {

namespace v1 = servesim::v1;

absl::StatusOr<std::unique_ptr<RemoteSession>> RemoteDevice::OpenSession(
    int64_t request_id, int64_t kv_heads, int64_t d_head, devices::ElementType type) const {
  std::unique_ptr<RemoteSession> s(new RemoteSession(this, request_id, kv_heads, d_head, type));
  RETURN_IF_ERROR(s->Rebuild(-1));
  return s;
}

absl::Status RemoteSession::Rebuild(int endpoint) {
  session_id_.clear();
  v1::OpenSessionResponse resp;
  int used = -1;
  RETURN_IF_ERROR(device_->Call(
      "OpenSession",
      [&](v1::DeviceAgent::Stub* stub, const std::string& key, grpc::ClientContext* ctx) {
        v1::OpenSessionRequest req;
        req.set_device_key(key);
        req.set_request_id(request_id_);
        req.set_kv_heads(kv_heads_);
        req.set_d_head(d_head_);
        req.set_type(type_ == devices::ElementType::kFp16 ? v1::ELEMENT_TYPE_FP16
                                                          : v1::ELEMENT_TYPE_FP32);
        return stub->OpenSession(ctx, req, &resp);
      },
      endpoint, &used));
  endpoint_ = used;
  session_id_ = resp.session_id();
  // The history, in order, on the same agent.
  int64_t len = 0;
  for (const auto& [k, v] : history_) {
    v1::AppendKvRequest req;
    req.set_session_id(session_id_);
    EncodeTensor(k, req.mutable_k());
    EncodeTensor(v, req.mutable_v());
    req.set_expected_kv_len(len);
    v1::AppendKvResponse r;
    grpc::ClientContext ctx;
    device_->PrepareContext(&ctx, device_->options_.deadline_s);
    grpc::Status st = device_->endpoints_[endpoint_]->stub->AppendKv(&ctx, req, &r);
    if (!st.ok()) {
      session_id_.clear();
      return absl::Status(
          static_cast<absl::StatusCode>(st.error_code()),
          absl::StrCat(device_->label_, ": agent ", device_->endpoints_[endpoint_]->address,
                       ": rebuilding session: ", st.error_message()));
    }
    len = r.kv_len();
  }
  return absl::OkStatus();
}

absl::Status RemoteSession::WithSession(
    const std::function<grpc::Status(v1::DeviceAgent::Stub*, grpc::ClientContext*)>& rpc) {
  absl::Status last;
  for (int round = 0; round < 3; ++round) {
    if (session_id_.empty()) {
      {
        std::lock_guard<std::mutex> lock(device_->mu_);
        ++device_->stats_.session_rebuilds;
      }
      RETURN_IF_ERROR(Rebuild(endpoint_));
    }
    int used = -1;
    last = device_->Call(
        "session",
        [&](v1::DeviceAgent::Stub* stub, const std::string&, grpc::ClientContext* ctx) {
          return rpc(stub, ctx);
        },
        endpoint_, &used);
    if (last.ok()) return last;
    if (last.code() == absl::StatusCode::kNotFound &&
        absl::StrContains(last.message(), "session_id")) {
      // Its agent restarted, or the call failed over to another agent.
      session_id_.clear();
      endpoint_ = used;
      continue;
    }
    return last;
  }
  return last;
}

absl::Status RemoteSession::AppendKv(const devices::Tensor& k, const devices::Tensor& v) {
  if (k.shape.size() != 3) {
    return absl::InvalidArgumentError("AppendKv: k must be [kv_heads, n, d_head]");
  }
  v1::AppendKvResponse resp;
  RETURN_IF_ERROR(WithSession([&](v1::DeviceAgent::Stub* stub, grpc::ClientContext* ctx) {
    v1::AppendKvRequest req;
    req.set_session_id(session_id_);
    EncodeTensor(k, req.mutable_k());
    EncodeTensor(v, req.mutable_v());
    req.set_expected_kv_len(kv_len_);
    return stub->AppendKv(ctx, req, &resp);
  }));
  history_.emplace_back(k, v);
  kv_len_ = resp.kv_len();
  return absl::OkStatus();
}

absl::StatusOr<devices::AttentionResult> RemoteSession::Step(const devices::Tensor& q,
                                                             float scale) {
  v1::StepResponse resp;
  RETURN_IF_ERROR(WithSession([&](v1::DeviceAgent::Stub* stub, grpc::ClientContext* ctx) {
    v1::StepRequest req;
    req.set_session_id(session_id_);
    EncodeTensor(q, req.mutable_q());
    req.set_scale(scale);
    req.set_expected_kv_len(kv_len_);
    return stub->Step(ctx, req, &resp);
  }));
  devices::AttentionResult r;
  ASSIGN_OR_RETURN(r.out, DecodeTensor(resp.out(), device_->options_.max_message_bytes, "out"));
  r.stats = DecodeStats(resp.stats());
  return r;
}

RemoteSession::~RemoteSession() {
  if (session_id_.empty() || endpoint_ < 0) return;
  v1::CloseSessionRequest req;
  req.set_session_id(session_id_);
  v1::CloseSessionResponse resp;
  grpc::ClientContext ctx;
  device_->PrepareContext(&ctx, 2.0);
  (void)device_->endpoints_[endpoint_]->stub->CloseSession(&ctx, req, &resp);
}

}  // namespace servesim::agents
