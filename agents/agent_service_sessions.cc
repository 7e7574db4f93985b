// AgentService's sessions: one request's KV cache each ([kv_heads, len,
// d_head], appended by AppendKv), over which Step runs the device's kernel
// naming the session (so a stateful kernel keeps its state per session).
// Ids are 128 random bits; a session belongs to the caller that opened it
// (any other gets NOT_FOUND), a caller holds at most max_sessions_per_client,
// all sessions' K and V together at most max_kv_bytes, and a session unused
// for session_idle_s is closed (ExpireLocked, at most once a second). mu_
// guards the sessions and the per-caller counts; a session's own mu its KV.
#include <sys/random.h>

#include <algorithm>
#include <iterator>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "agents/agent_service.h"
#include "agents/agent_service_internal.h"
#include "agents/convert.h"
#include "devices/reference_attention.h"

namespace servesim::agents {

namespace v1 = servesim::v1;
using internal::AttentionMacs;
using internal::SteadyNs;
using internal::TooMuchWork;

namespace {

// 128 bits from the kernel's generator, as 32 hex digits.
std::string RandomSessionId() {
  uint64_t r[2] = {0, 0};
  size_t got = 0;
  while (got < sizeof r) {
    const ssize_t n = getrandom(reinterpret_cast<char*>(r) + got, sizeof r - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  return absl::StrFormat("%016x%016x", r[0], r[1]);
}

}  // namespace

void AgentService::EraseLocked(std::map<std::string, std::shared_ptr<Session>>::iterator it) {
  auto owner = sessions_per_caller_.find(it->second->owner);
  if (owner != sessions_per_caller_.end() && --owner->second <= 0) {
    sessions_per_caller_.erase(owner);
  }
  sessions_.erase(it);
}

void AgentService::ExpireLocked(int64_t now_ns) {
  if (now_ns - last_expiry_ns_ < 1'000'000'000) return;
  last_expiry_ns_ = now_ns;
  const int64_t idle_ns = static_cast<int64_t>(std::min(options_.session_idle_s, 1e9) * 1e9);
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    auto next = std::next(it);
    if (now_ns - it->second->last_used_ns.load() > idle_ns) EraseLocked(it);
    it = next;
  }
}

absl::StatusOr<std::shared_ptr<AgentService::Session>> AgentService::FindSession(
    const std::string& id, const std::string& caller) {
  const int64_t now = SteadyNs();
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLocked(now);
  auto it = sessions_.find(id);
  // Another caller's session reads as absent: its id tells nothing.
  if (it == sessions_.end() || it->second->owner != caller) {
    return absl::NotFoundError(
        absl::StrCat("session_id ", id,
                     " is not open on this agent for this caller (closed, idle for more than ",
                     options_.session_idle_s,
                     " s, or the agent restarted); open a new session and append the "
                     "KV history"));
  }
  it->second->last_used_ns.store(now);
  return it->second;
}

grpc::Status AgentService::OpenSession(grpc::ServerContext* ctx, const v1::OpenSessionRequest* req,
                                       v1::OpenSessionResponse* resp) {
  if (auto st = Authorize(ctx); !st.ok()) return st;
  auto h = Find(req->device_key());
  if (!h.ok()) return ToGrpcStatus(h.status());
  // A model's ranges (num_kv_heads <= num_heads <= 4096, d_head <= 4096):
  // the session holds one K and one V list per KV head (2^40 heads made
  // the agent's vector resize throw and terminate it).
  if (req->kv_heads() < 1 || req->kv_heads() > 4096 || req->d_head() < 1 ||
      req->d_head() > devices::kMaxAttentionDHead) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("kv_heads = ", req->kv_heads(), ", d_head = ", req->d_head(),
                                     "; expected both in [1, 4096]"));
  }
  if (req->type() != v1::ELEMENT_TYPE_FP16 && req->type() != v1::ELEMENT_TYPE_FP32) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "type: expected ELEMENT_TYPE_FP16 (1) or ELEMENT_TYPE_FP32 (2)");
  }
  auto s = std::make_shared<Session>();
  s->device = *h;
  s->kv_heads = req->kv_heads();
  s->d_head = req->d_head();
  s->type = req->type() == v1::ELEMENT_TYPE_FP16 ? devices::ElementType::kFp16
                                                 : devices::ElementType::kFp32;
  s->k.resize(s->kv_heads);
  s->v.resize(s->kv_heads);
  s->held = &kv_bytes_held_;
  s->number = next_session_.fetch_add(1);
  s->owner = CallerOf(ctx);
  const int64_t now = SteadyNs();
  s->last_used_ns.store(now);
  const std::string id = RandomSessionId();
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLocked(now);
  if (static_cast<int>(sessions_.size()) >= options_.max_sessions) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat("this agent holds ", sessions_.size(),
                                     " sessions, its limit; close some first"));
  }
  int& mine = sessions_per_caller_[s->owner];
  if (mine >= options_.max_sessions_per_client) {
    return grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("this caller (", s->owner, ") holds ", mine,
                     " sessions, its limit (servesim-agent --sessions-per-client); close some "
                     "first"));
  }
  ++mine;
  sessions_.emplace(id, std::move(s));
  resp->set_session_id(id);
  return grpc::Status::OK;
}

grpc::Status AgentService::AppendKv(grpc::ServerContext* ctx, const v1::AppendKvRequest* req,
                                    v1::AppendKvResponse* resp) {
  if (auto st = Authorize(ctx); !st.ok()) return st;
  auto s = FindSession(req->session_id(), CallerOf(ctx));
  if (!s.ok()) return ToGrpcStatus(s.status());
  Session& ss = **s;
  auto k = DecodeTensor(req->k(), options_.max_tensor_bytes, "k");
  if (!k.ok()) return ToGrpcStatus(k.status());
  auto v = DecodeTensor(req->v(), options_.max_tensor_bytes, "v");
  if (!v.ok()) return ToGrpcStatus(v.status());
  std::lock_guard<std::mutex> lock(ss.mu);
  if (k->type != ss.type || v->type != ss.type || k->shape != v->shape || k->shape.size() != 3 ||
      k->shape[0] != ss.kv_heads || k->shape[2] != ss.d_head) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("k and v must both be [kv_heads = ", ss.kv_heads, ", n, d_head = ", ss.d_head,
                     "] of the session's type; got [", absl::StrJoin(k->shape, ", "), "] and [",
                     absl::StrJoin(v->shape, ", "), "]"));
  }
  if (req->expected_kv_len() != ss.len) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("expected_kv_len = ", req->expected_kv_len(),
                                     " but the session holds ", ss.len, " positions"));
  }
  const int64_t n = k->shape[1];
  const size_t row = static_cast<size_t>(ss.d_head * devices::Tensor::ElementSize(ss.type));
  if (static_cast<int64_t>((ss.len + n) * row * ss.kv_heads) > options_.max_tensor_bytes) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat("the session's KV would exceed ", options_.max_tensor_bytes,
                                     " bytes per tensor (servesim-agent --max-tensor-bytes)"));
  }
  // The agent's budget over all sessions: reserved before copying.
  const int64_t add = 2 * n * static_cast<int64_t>(row) * ss.kv_heads;
  int64_t held = kv_bytes_held_.load();
  do {
    if (held + add > options_.max_kv_bytes) {
      return grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat("this agent's sessions hold ", held, " bytes of K and V; ", add,
                       " more would pass its budget of ", options_.max_kv_bytes,
                       " bytes (servesim-agent --max-kv-bytes); close sessions first"));
    }
  } while (!kv_bytes_held_.compare_exchange_weak(held, held + add));
  ss.bytes += add;
  for (int64_t h = 0; h < ss.kv_heads; ++h) {
    const uint8_t* kb = k->bytes.data() + h * n * row;
    const uint8_t* vb = v->bytes.data() + h * n * row;
    ss.k[h].insert(ss.k[h].end(), kb, kb + n * row);
    ss.v[h].insert(ss.v[h].end(), vb, vb + n * row);
  }
  ss.len += n;
  resp->set_kv_len(ss.len);
  return grpc::Status::OK;
}

grpc::Status AgentService::Step(grpc::ServerContext* ctx, const v1::StepRequest* req,
                                v1::StepResponse* resp) {
  if (auto st = Authorize(ctx); !st.ok()) return st;
  auto s = FindSession(req->session_id(), CallerOf(ctx));
  if (!s.ok()) return ToGrpcStatus(s.status());
  Session& ss = **s;
  auto q = DecodeTensor(req->q(), options_.max_tensor_bytes, "q");
  if (!q.ok()) return ToGrpcStatus(q.status());
  devices::AttentionCall call;
  call.q = std::move(*q);
  call.scale = req->scale();
  call.session = ss.number;
  {
    std::lock_guard<std::mutex> lock(ss.mu);
    if (req->expected_kv_len() != ss.len) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("expected_kv_len = ", req->expected_kv_len(),
                                       " but the session holds ", ss.len, " positions"));
    }
    if (const int64_t macs = AttentionMacs(call.q.shape, ss.len);
        macs > options_.max_execute_macs) {
      return TooMuchWork(macs, options_.max_execute_macs);
    }
    for (auto [src, dst] : {std::pair{&ss.k, &call.k}, std::pair{&ss.v, &call.v}}) {
      dst->type = ss.type;
      dst->shape = {ss.kv_heads, ss.len, ss.d_head};
      dst->bytes.clear();
      for (const auto& head : *src) dst->bytes.insert(dst->bytes.end(), head.begin(), head.end());
    }
  }
  auto r = RunKernel(ctx, *ss.device->device, call);
  if (!r.ok()) return ToGrpcStatus(r.status());
  EncodeTensor(r->out, resp->mutable_out());
  EncodeStats(r->stats, resp->mutable_stats());
  return grpc::Status::OK;
}

grpc::Status AgentService::CloseSession(grpc::ServerContext* ctx,
                                        const v1::CloseSessionRequest* req,
                                        v1::CloseSessionResponse* resp) {
  if (auto st = Authorize(ctx); !st.ok()) return st;
  const std::string caller = CallerOf(ctx);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(req->session_id());
  if (it == sessions_.end() || it->second->owner != caller) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("session_id ", req->session_id(),
                                     " is not open on this agent for this caller"));
  }
  EraseLocked(it);
  return grpc::Status::OK;
}

}  // namespace servesim::agents
