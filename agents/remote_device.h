// A device served by remote agents (servesim-agent, agents/agent_service.h),
// behind the same devices::Device interface as an in-process one, so nothing
// else in the simulator changes.
//
// PARAMETERS AND BEHAVIOUR
//  - spec: the device wanted; it is bound on each agent with Describe (the
//    agent creates it once and returns its key). An agent that forgot the
//    key (restarted) answers NOT_FOUND and the client binds again.
//  - endpoints: agents serving the same device kind. Calls go round-robin
//    over the endpoints that are up. A call that ends UNAVAILABLE or
//    DEADLINE_EXCEEDED is retried on the same endpoint with exponential
//    backoff (attempts_per_endpoint times), then the endpoint is marked down
//    for down_s wall seconds and the call fails over to the next one. When
//    none is left the call is UNAVAILABLE, naming the device and the
//    endpoints tried. Other codes are the agent's answer and are returned.
//  - deadline_s: per call (bind_deadline_s for Describe, which may create a
//    calibrated device).
//  - Estimate answers are memoised per op, keyed by the op's exact inputs
//    (every field, the sequences and the stack placement, doubles by their
//    bits): the cycle model is pure, so a hit is the answer the agent would
//    give. Only the ops that miss go to the agent, in one call. Sequence and
//    stack lists are interned (stored once, by content) and an op's key
//    names them by id, so a call hashes each list once, not once per op.
//    The memo and the lists are cleared together when they pass memo_bytes.
//    Hits and misses are counted.
//  - Lookahead: a call that misses also asks the agent for the next decode
//    steps of its decode-attention ops (EstimateRequest.lookahead: each
//    sequence's past_tokens + j), which go into the memo. While the batch
//    does not change, iteration i + j sends exactly those ops, so it hits
//    and makes no round trip. Each entry remembers its step and its
//    request's depth. A miss whose previous step (past_tokens - 1) was the
//    last step of a prediction (it ran out unbroken) asks twice as deep, up
//    to lookahead_max; any other miss (the batch changed) asks 8 deep. This
//    holds per batch, however the callers (replicas sharing the device)
//    interleave. It changes how many round trips a run makes, never a cost.
//    lookahead_max 0 turns it off.
//  - TLS: with tls_ca_file set the channel is TLS (the agent's certificate
//    must chain to that CA); tls_cert_file/tls_key_file add a client
//    certificate. token adds `authorization: Bearer <token>` to every call.
// Thread-safe.
#ifndef SERVESIM_AGENTS_REMOTE_DEVICE_H_
#define SERVESIM_AGENTS_REMOTE_DEVICE_H_

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "agents/client_options.h"
#include "devices/device.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "servesim/v1/agent.grpc.pb.h"
#include "servesim/v1/hardware.pb.h"

namespace servesim::agents {


struct RemoteStats {
  std::vector<std::string> endpoints;
  int64_t estimate_calls = 0;  // Estimate() calls made by the simulator
  int64_t estimate_rpcs = 0;   // of them, how many went to an agent
  int64_t ops_memo_hits = 0;
  int64_t ops_memo_misses = 0;
  int64_t predicted_ops = 0;  // costs received ahead (lookahead) into the memo
  int64_t other_rpcs = 0;  // Describe (binds), Execute, sessions
  int64_t retries = 0;     // re-sent after UNAVAILABLE / DEADLINE_EXCEEDED
  int64_t failovers = 0;   // moved to another endpoint
  int64_t rebinds = 0;     // agent had forgotten the device (restart)
  int64_t session_rebuilds = 0;
};

class RemoteSession;

class RemoteDevice : public devices::Device {
 public:
  // `label` names the device in errors, e.g. "attention device (attacc)".
  // Validates the endpoints and reads the TLS files; does not connect.
  static absl::StatusOr<std::unique_ptr<RemoteDevice>> Create(
      servesim::v1::DeviceSpec spec, std::vector<std::string> endpoints, ClientOptions options,
      std::string label);

  // Asks an agent; if none answers, the last description seen (or the kind
  // alone), as the contract says Describe never fails.
  devices::DeviceDescription Describe() const override;
  absl::Status Estimate(absl::Span<const devices::Op> ops,
                        absl::Span<devices::Cost> costs) const override;
  absl::StatusOr<devices::AttentionResult> Execute(
      const devices::AttentionCall& call) const override;

  // Describe, with its status (connectivity checks, tests).
  absl::StatusOr<devices::DeviceDescription> DescribeOrError() const;
  // A session for one request on whichever agent is up.
  absl::StatusOr<std::unique_ptr<RemoteSession>> OpenSession(int64_t request_id, int64_t kv_heads,
                                                             int64_t d_head,
                                                             devices::ElementType type) const;

  RemoteStats Stats() const;
  const std::string& label() const { return label_; }

 private:
  friend class RemoteSession;
  struct Endpoint {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<servesim::v1::DeviceAgent::Stub> stub;
    // Guarded by mu_.
    std::string device_key;
    bool bound = false;
    std::chrono::steady_clock::time_point down_until{};
  };
  using Rpc = std::function<grpc::Status(servesim::v1::DeviceAgent::Stub* stub,
                                         const std::string& device_key,
                                         grpc::ClientContext* ctx)>;

  RemoteDevice(servesim::v1::DeviceSpec spec, ClientOptions options, std::string label);
  // Runs `rpc` with binding, retries and fail-over; `preferred` >= 0 starts
  // there (sessions stay on their agent). Sets *used to the endpoint that
  // answered.
  absl::Status Call(const char* method, const Rpc& rpc, int preferred = -1,
                    int* used = nullptr) const;
  absl::Status BindLocked(Endpoint* ep) const;
  void PrepareContext(grpc::ClientContext* ctx, double deadline_s) const;

  servesim::v1::DeviceSpec spec_;
  ClientOptions options_;
  std::string label_;
  std::string kind_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  // An op's inputs with its sequence and stack lists by interned id (0:
  // none).
  struct MemoKey {
    std::array<int64_t, 9> ints{};   // m, n, k, heads, kv_heads, d_head, head range, elements
    std::array<uint64_t, 3> bits{};  // bytes_per_element, flops_per_element, bytes
    int32_t participants = 0;
    uint32_t seq_list = 0, stack_list = 0;
    uint8_t kind = 0, stage = 0;
    bool operator==(const MemoKey& o) const {
      return ints == o.ints && bits == o.bits && participants == o.participants &&
             seq_list == o.seq_list && stack_list == o.stack_list && kind == o.kind &&
             stage == o.stage;
    }
    template <typename H>
    friend H AbslHashValue(H h, const MemoKey& k) {
      return H::combine(std::move(h), k.ints, k.bits, k.participants, k.seq_list,
                        k.stack_list, k.kind, k.stage);
    }
  };
  struct MemoEntry {
    devices::Cost cost;
    int32_t step = 0;   // lookahead step it was answered at; 0: asked for
    int32_t depth = 0;  // the lookahead its request asked for
  };
  // The interned id of a list's content (bytes), adding it if new (`add`)
  // or kNoList if it is not there. mu_ held.
  static constexpr uint32_t kNoList = ~uint32_t{0};
  uint32_t InternLocked(const std::string& content, bool add) const;
  // Keys of `ops`, interning their lists (`add`; else a list not seen gives
  // a key no entry has). mu_ held.
  void KeysLocked(absl::Span<const devices::Op> ops, std::vector<MemoKey>* keys,
                  bool add = true) const;
  // The lookahead depth for a call whose ops `missed`. mu_ held.
  int LookaheadLocked(absl::Span<const devices::Op> missed) const;
  // Empties the memo and the lists if they hold more than memo_bytes. mu_
  // held.
  void TrimLocked() const;

  mutable std::mutex mu_;  // endpoint state, memo, stats, last description
  mutable size_t next_ = 0;
  mutable absl::flat_hash_map<MemoKey, MemoEntry> memo_;
  mutable absl::flat_hash_map<std::string, uint32_t> lists_;  // content -> id
  mutable size_t memo_bytes_ = 0;       // lists' content plus entries
  mutable uint64_t memo_epoch_ = 0;     // bumped when the memo is emptied
  mutable RemoteStats stats_;
  mutable devices::DeviceDescription last_description_;
};

// One request's KV cache on an agent (the session API). Keeps the KV it
// appended, so when its agent restarts (NOT_FOUND) or fails over, it opens
// a new session and appends the history again before going on.
class RemoteSession {
 public:
  ~RemoteSession();  // closes the session (best effort)
  // k, v [kv_heads, n, d_head].
  absl::Status AppendKv(const devices::Tensor& k, const devices::Tensor& v);
  // Attention of q [heads, q_len, d_head] over everything appended.
  absl::StatusOr<devices::AttentionResult> Step(const devices::Tensor& q, float scale = 0);
  int64_t kv_len() const { return kv_len_; }
  const std::string& session_id() const { return session_id_; }

 private:
  friend class RemoteDevice;
  RemoteSession(const RemoteDevice* device, int64_t request_id, int64_t kv_heads, int64_t d_head,
                devices::ElementType type)
      : device_(device), request_id_(request_id), kv_heads_(kv_heads), d_head_(d_head),
        type_(type) {}
  // Opens a session and replays the history (on `endpoint` if >= 0).
  absl::Status Rebuild(int endpoint);
  // Runs `rpc` on the session's agent, rebuilding the session once if the
  // agent lost it or the call failed over.
  absl::Status WithSession(const std::function<grpc::Status(servesim::v1::DeviceAgent::Stub*,
                                                            grpc::ClientContext*)>& rpc);

  const RemoteDevice* device_;
  int64_t request_id_, kv_heads_, d_head_;
  devices::ElementType type_;
  std::vector<std::pair<devices::Tensor, devices::Tensor>> history_;
  int64_t kv_len_ = 0;
  int endpoint_ = -1;
  std::string session_id_;
};

}  // namespace servesim::agents

#endif  // SERVESIM_AGENTS_REMOTE_DEVICE_H_
