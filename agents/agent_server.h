// Starts a gRPC server for an AgentService: listening address, TLS (server
// certificate, optionally required client certificates), an explicit
// maximum message size, the standard health service (grpc.health.v1,
// "servesim.v1.DeviceAgent" and "" SERVING) and server reflection.
#ifndef SERVESIM_AGENTS_AGENT_SERVER_H_
#define SERVESIM_AGENTS_AGENT_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "agents/agent_service.h"
#include "grpcpp/server.h"

namespace servesim::agents {

struct AgentServerOptions {
  std::string listen = "127.0.0.1:0";  // HOST:PORT; port 0 picks a free one
  std::string tls_cert_file;           // with tls_key_file: TLS
  std::string tls_key_file;
  std::string tls_client_ca_file;      // set: clients must present a cert it signed
  int max_message_bytes = 256 << 20;
};

struct RunningAgent {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

// `service` must outlive the server.
absl::StatusOr<RunningAgent> StartAgentServer(AgentService* service,
                                              const AgentServerOptions& options);

}  // namespace servesim::agents

#endif  // SERVESIM_AGENTS_AGENT_SERVER_H_
