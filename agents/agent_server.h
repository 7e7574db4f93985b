// Starts a gRPC server for an AgentService: listening address, TLS (server
// certificate, optionally required client certificates), an explicit
// maximum message size, the standard health service (HealthService below)
// and server reflection.
//
// What a client can hold is bounded (servesim-agent sets these from its
// flags; the cap on connections themselves is services/accept_guard.h):
//  - the port is bound exclusively (no SO_REUSEPORT): a second agent on a
//    port in use is refused instead of sharing its connections at random;
//  - a connection that has not finished its TLS handshake within
//    handshake_timeout_s is closed;
//  - one with no call in flight for idle_connection_s is closed, whether it
//    never sent a byte or its calls ended (GOAWAY; a gRPC client reconnects
//    on its next call);
//  - at most max_streams_per_connection calls in flight per connection;
//  - at most max_threads handler threads: a call that finds none free is
//    answered RESOURCE_EXHAUSTED at once rather than queued (estimate
//    streams are served apart, by stream_threads threads).
#ifndef SERVESIM_AGENTS_AGENT_SERVER_H_
#define SERVESIM_AGENTS_AGENT_SERVER_H_

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "agents/agent_service.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"

namespace servesim::agents {

// The gRPC health-checking protocol (grpc.health.v1): "" (the server) and
// "servesim.v1.DeviceAgent" are SERVING until Shutdown, NOT_SERVING after;
// Check answers NOT_FOUND for any other name, Watch SERVICE_UNKNOWN. A
// synchronous service, unlike gRPC's built-in one: a callback service
// gives the server a completion queue that takes every other connection,
// and each of their messages then costs a hand-over between threads
// (docs/agents.md, "Cost"). A Watch holds a handler thread until its
// client cancels or Shutdown.
class HealthService final : public grpc::health::v1::Health::Service {
 public:
  grpc::Status Check(grpc::ServerContext* ctx, const grpc::health::v1::HealthCheckRequest* req,
                     grpc::health::v1::HealthCheckResponse* resp) override;
  grpc::Status Watch(grpc::ServerContext* ctx, const grpc::health::v1::HealthCheckRequest* req,
                     grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>* writer) override;
  // From now on every name is NOT_SERVING; each Watch says so and ends.
  void Shutdown();

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  bool serving_ = true;
};

struct AgentServerOptions {
  std::string listen = "127.0.0.1:0";  // HOST:PORT; port 0 picks a free one
  std::string tls_cert_file;           // with tls_key_file: TLS
  std::string tls_key_file;
  std::string tls_client_ca_file;      // set: clients must present a cert it signed
  int max_message_bytes = 256 << 20;
  double handshake_timeout_s = 10;
  double idle_connection_s = 300;
  int max_streams_per_connection = 100;
  int max_threads = 64;
  // Threads serving the estimate streams, each draining a completion queue
  // of its own (a stream is served wholly by the thread whose queue took
  // it): 1 answers one stream at a time, with no hand-off between threads
  // per message; more serve several clients' streams on several cores.
  int stream_threads = 1;
};

// The server, and the threads that serve its estimate streams
// (AgentService::ServeStreams), each on a completion queue of its own.
// Destroying it shuts the health service and the server down (if not
// already: shut them down first, the server with a deadline to bound the
// wait for calls in flight), then the queues, and joins the threads.
struct RunningAgent {
  RunningAgent() = default;
  RunningAgent(RunningAgent&&) = default;
  RunningAgent& operator=(RunningAgent&&) = default;  // onto an empty one only
  ~RunningAgent();

  AgentService* service = nullptr;  // closes the stream queues
  std::unique_ptr<HealthService> health;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> stream_queues;
  std::unique_ptr<grpc::Server> server;  // after the queues and health: destroyed before them
  int port = 0;
  std::vector<std::thread> stream_threads;
};

// `service` must outlive the server.
absl::StatusOr<RunningAgent> StartAgentServer(AgentService* service,
                                              const AgentServerOptions& options);

}  // namespace servesim::agents

#endif  // SERVESIM_AGENTS_AGENT_SERVER_H_
