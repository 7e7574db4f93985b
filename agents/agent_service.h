// The DeviceAgent gRPC service (proto/servesim/v1/agent.proto): an adapter
// from the protocol to a devices::Device. No model logic lives here: every
// answer is the device's own Describe / Estimate / Execute.
//
// PARAMETERS AND BEHAVIOUR
//  - spec: the agent's own device (servesim-agent --preset / --config).
//    Describe with a spec of the same kind creates (once) and keeps a device
//    of that spec, named by a stable key (FNV-1a of the spec's deterministic
//    serialisation); at most `max_devices` are kept (the oldest is dropped;
//    a caller naming it gets NOT_FOUND and binds again).
//  - token: when set, every call must carry `authorization: Bearer <token>`
//    (UNAUTHENTICATED otherwise). The standard health service and server
//    reflection are not ours and stay open, so orchestrators can probe. A
//    token is 1-4,096 printable ASCII characters without spaces
//    (CheckToken); an empty or blank one is refused, never read as "none".
//  - call_budget_s: Execute and Step stop (RESOURCE_EXHAUSTED) once they
//    have run this long, and stop (CANCELLED / DEADLINE_EXCEEDED) as soon as
//    their caller cancels or its deadline passes: the kernels poll
//    (devices/interrupt.h), so a client that gives up frees the core.
//  - max_tensor_bytes: tensors larger than this (by their shape) are
//    RESOURCE_EXHAUSTED before anything is copied; max_execute_macs bounds
//    the work of one Execute / Step the same way. EstimateRequests are held
//    to agents/convert.h's limits (kMaxOps ...), and lookahead steps stop
//    (lookahead_answered < lookahead) once they would cost more than
//    kMaxOpSequences sequences in all.
//  - Sessions hold one request's KV cache ([kv_heads, len, d_head], appended
//    by AppendKv); Step runs the device's kernel over it, naming the session
//    (AttentionCall::session) so a stateful kernel (LAD) keeps its state
//    per session. Ids are 128 random bits (unguessable) and die with the
//    agent instance, so after a restart the caller gets NOT_FOUND and
//    rebuilds the session from its history (agents::RemoteSession).
//    A session belongs to the caller that opened it: its TLS client
//    certificate's identity when there is one, else its network address
//    without the port. Any other caller gets NOT_FOUND for it, as for an id
//    that does not exist, and cannot close it. A caller holds at most
//    max_sessions_per_client sessions; a session unused for session_idle_s
//    is closed by the agent (its caller rebuilds it if it comes back).
//    Each session's K and V are held to max_tensor_bytes apiece, and all
//    sessions' together to max_kv_bytes; a session's bytes are returned when
//    it closes (when its last in-flight call ends).
//  - EstimateStream is served asynchronously (ServeStreams, on the
//    server's stream threads, agents/agent_server.h): a caller may hold
//    estimate_streams_per_client streams, all callers max_estimate_streams
//    (RESOURCE_EXHAUSTED past either), and a stream bringing no request for
//    estimate_stream_idle_s is cancelled by a watch thread (started with the
//    first stream). EndStreams ends them all before a shutdown.
// Thread-safe: gRPC calls handlers from many threads.
// The definitions are split by job: agents/agent_service.cc (the core),
// agent_service_streams.cc and agent_service_sessions.cc.
#ifndef SERVESIM_AGENTS_AGENT_SERVICE_H_
#define SERVESIM_AGENTS_AGENT_SERVICE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "agents/client_options.h"
#include "devices/device.h"
#include "servesim/v1/agent.grpc.pb.h"
#include "servesim/v1/hardware.pb.h"

namespace servesim::agents {

// The protocol agent.proto describes, last in DescribeResponse.model_version
// ("servesim 0.1.0; servesim.v1.DeviceAgent/4"); a client binds only to an
// agent that speaks its own. 2: costs travel as a CostTable. 3: Measure may
// ask ahead (an agent of 2 would take it for a Measure). 4: EstimateStream.
inline constexpr char kAgentProtocolVersion[] = "servesim.v1.DeviceAgent/4";

struct AgentServiceOptions {
  servesim::v1::DeviceSpec spec;
  std::string token;                             // empty: no token required
  int64_t max_tensor_bytes = int64_t{64} << 20;  // per tensor
  int max_devices = 16;
  int max_sessions = 4096;
  int max_sessions_per_client = 1024;
  double session_idle_s = 600;
  double call_budget_s = 60;
  // EstimateStream: a caller may hold at most estimate_streams_per_client
  // streams open and all callers together max_estimate_streams
  // (RESOURCE_EXHAUSTED past either; its client then calls Estimate
  // instead), and a stream that brings no request for
  // estimate_stream_idle_s is ended (CANCELLED; its client opens another).
  int max_estimate_streams = 16;
  int estimate_streams_per_client = 4;
  double estimate_stream_idle_s = 60;
  // All open sessions' K and V together; an AppendKv that would pass it is
  // RESOURCE_EXHAUSTED (max_sessions x max_tensor_bytes alone would allow
  // 512 GiB).
  int64_t max_kv_bytes = int64_t{4} << 30;
  // Execute / Step: at most this many multiply-accumulates of the reference
  // attention (heads x q_len x kv_len x d_head); RESOURCE_EXHAUSTED above.
  // 2^37 (1.4e11) admits a 2,048-token prefill of 96 heads of 128 over a
  // 4,096-token context (1.0e11), about a minute of one core.
  int64_t max_execute_macs = int64_t{1} << 37;
};

// FNV-1a 64 of the spec's deterministic serialisation, as 16 hex digits.
std::string DeviceKey(const servesim::v1::DeviceSpec& spec);
// "gpu", "attacc", ... for the spec's oneof case ("" if unset).
std::string SpecKindName(const servesim::v1::DeviceSpec& spec);
// The spec `servesim-agent --device KIND [--preset NAME]` serves: the kind's
// hardware preset (its default when `preset` is empty), fp16, and ANALYTIC
// fidelity for the pruning devices. INVALID_ARGUMENT for an unknown kind;
// the preset table's error for an unknown preset. (The preset tables live
// in the device kinds' object libraries: link servesim_all_devices.)
absl::StatusOr<servesim::v1::DeviceSpec> AgentPresetSpec(const std::string& kind,
                                                         std::string preset);

// EstimateStream is served by gRPC's asynchronous API on a completion
// queue of its own, which one thread (ServeStreams) drains: it reads a
// stream's request, answers it and writes the answer itself, with no
// hand-off to a handler thread per message (docs/agents.md#cost). The other
// methods are synchronous.
class AgentService final : public servesim::v1::DeviceAgent::WithAsyncMethod_EstimateStream<
                               servesim::v1::DeviceAgent::Service> {
 public:
  // Creates the agent's own device; its status if the spec is invalid.
  static absl::StatusOr<std::unique_ptr<AgentService>> Create(AgentServiceOptions options);

  grpc::Status Describe(grpc::ServerContext* ctx, const servesim::v1::DescribeRequest* req,
                        servesim::v1::DescribeResponse* resp) override;
  // Estimate, one answer per request in order, on one call: the same
  // answers without a call's set-up each time. A request Estimate refuses
  // ends the stream with its status.
  // Serves the estimate streams of `cq` (registered with the server that
  // serves this service) on the calling thread until `cq` is shut down
  // (after the server) and drained.
  void ServeStreams(grpc::ServerCompletionQueue* cq);
  grpc::Status Estimate(grpc::ServerContext* ctx, const servesim::v1::EstimateRequest* req,
                        servesim::v1::EstimateResponse* resp) override;
  grpc::Status Execute(grpc::ServerContext* ctx, const servesim::v1::ExecuteRequest* req,
                       servesim::v1::ExecuteResponse* resp) override;
  grpc::Status Measure(grpc::ServerContext* ctx, const servesim::v1::MeasureRequest* req,
                       servesim::v1::MeasureResponse* resp) override;
  grpc::Status OpenSession(grpc::ServerContext* ctx, const servesim::v1::OpenSessionRequest* req,
                           servesim::v1::OpenSessionResponse* resp) override;
  grpc::Status AppendKv(grpc::ServerContext* ctx, const servesim::v1::AppendKvRequest* req,
                        servesim::v1::AppendKvResponse* resp) override;
  grpc::Status Step(grpc::ServerContext* ctx, const servesim::v1::StepRequest* req,
                    servesim::v1::StepResponse* resp) override;
  grpc::Status CloseSession(grpc::ServerContext* ctx, const servesim::v1::CloseSessionRequest* req,
                            servesim::v1::CloseSessionResponse* resp) override;

  ~AgentService() override;
  // Ends every open estimate stream (CANCELLED) and admits none after:
  // before a shutdown, whose grace would otherwise wait for their clients.
  void EndStreams();
  // Shuts the stream queues down (the server's own shutdown first). A
  // stream handler issues each operation under the same lock and issues
  // none once the queues are closed: gRPC aborts the process when an
  // operation is started on a queue already shut down, which a handler
  // acting on an event taken just before could otherwise do.
  void CloseStreamQueues(const std::vector<std::unique_ptr<grpc::ServerCompletionQueue>>& queues);

  int64_t calls() const { return calls_.load(); }
  // Execute / Step kernels stopped by a cancellation, deadline or the budget.
  int64_t interrupted_calls() const { return interrupted_.load(); }
  const std::string& kind() const { return kind_; }

 private:
  struct Hosted {
    std::string key;
    servesim::v1::DeviceSpec spec;
    std::shared_ptr<const devices::Device> device;
    std::vector<devices::OpKind> accepts;
    bool lookahead_ok = false;
  };
  struct Session {
    std::mutex mu;
    std::shared_ptr<const Hosted> device;
    int64_t kv_heads = 0, d_head = 0, len = 0;
    int64_t number = 0;  // unique in this process: AttentionCall::session
    devices::ElementType type = devices::ElementType::kFp16;
    std::vector<std::vector<uint8_t>> k, v;  // per KV head, [len, d_head]
    // Its K and V bytes, counted in the agent's total (`held`) until the
    // session is gone: an AppendKv still running when the session closes
    // is returned too.
    std::atomic<int64_t>* held = nullptr;
    int64_t bytes = 0;
    std::string owner;                     // the caller that opened it (CallerOf)
    std::atomic<int64_t> last_used_ns{0};  // steady clock
    ~Session() {
      if (held != nullptr) held->fetch_sub(bytes);
    }
  };

  struct OpenStream {
    grpc::ServerContextBase* ctx = nullptr;
    std::string caller;
    std::atomic<int64_t> last_ns{0};  // steady clock: the last request's arrival
  };

  explicit AgentService(AgentServiceOptions options);
  class StreamCall;
  grpc::Status Authorize(grpc::ServerContextBase* ctx);
  // Estimate of an authorized caller.
  grpc::Status EstimateAuthorized(const servesim::v1::EstimateRequest* req,
                                  servesim::v1::EstimateResponse* resp);
  // Admits a stream of `caller` under the caps (registering it; the idle
  // watch starts with the first), or RESOURCE_EXHAUSTED naming the cap.
  absl::StatusOr<std::shared_ptr<OpenStream>> AdmitStream(grpc::ServerContextBase* ctx,
                                                          const std::string& caller);
  void ForgetStream(const std::shared_ptr<OpenStream>& s);
  // The idle watch's thread: ends streams idle for stream_idle_s.
  void WatchStreams();
  // The caller a session is bound to: "cert:<identity>" for a TLS client
  // certificate, else the peer's address without its port.
  static std::string CallerOf(const grpc::ServerContextBase* ctx);
  // Runs `device.Execute(call)` with the kernel polling the call's
  // cancellation, deadline and call_budget_s.
  absl::StatusOr<devices::AttentionResult> RunKernel(grpc::ServerContext* ctx,
                                                     const devices::Device& device,
                                                     const devices::AttentionCall& call);
  // The poll a kernel of this call runs under: PollCall at most once a
  // millisecond; sets *stopped when it stops the kernel.
  std::function<absl::Status()> CallPoll(grpc::ServerContext* ctx, bool* stopped) const;
  // The kernel's poll: the caller's cancellation, its deadline, the budget.
  absl::Status PollCall(grpc::ServerContext* ctx, std::chrono::system_clock::time_point deadline,
                        int64_t start_ns, int64_t budget_ns) const;
  // Closes sessions idle for session_idle_s (at most once a second). mu_ held.
  void ExpireLocked(int64_t now_ns);
  void EraseLocked(std::map<std::string, std::shared_ptr<Session>>::iterator it);
  absl::StatusOr<std::shared_ptr<const Hosted>> Find(const std::string& key);
  absl::StatusOr<std::shared_ptr<const Hosted>> Bind(const servesim::v1::DeviceSpec& spec);
  absl::StatusOr<std::shared_ptr<Session>> FindSession(const std::string& id,
                                                       const std::string& caller);

  AgentServiceOptions options_;
  std::string kind_;
  std::shared_ptr<const Hosted> own_;
  // Every open session's K and V; declared before sessions_, whose
  // sessions give their bytes back when destroyed.
  std::atomic<int64_t> kv_bytes_held_{0};
  std::mutex mu_;  // devices_, sessions_
  std::deque<std::shared_ptr<const Hosted>> devices_;
  std::map<std::string, std::shared_ptr<Session>> sessions_;
  std::map<std::string, int> sessions_per_caller_;
  int64_t last_expiry_ns_ = 0;
  std::atomic<int64_t> next_session_{1};
  std::mutex streams_mu_;  // streams_, stop_watch_
  std::mutex stream_ops_mu_;  // each stream operation issued; stream_queues_closed_
  bool stream_queues_closed_ = false;
  std::condition_variable streams_cv_;
  std::vector<std::shared_ptr<OpenStream>> streams_;
  bool stop_watch_ = false;
  bool streams_ended_ = false;
  std::thread watch_;
  std::atomic<int64_t> calls_{0};
  std::atomic<int64_t> interrupted_{0};
};

}  // namespace servesim::agents

#endif  // SERVESIM_AGENTS_AGENT_SERVICE_H_
