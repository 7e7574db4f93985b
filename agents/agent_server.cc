#include "agents/agent_server.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace servesim::agents {

namespace {

// Reads a PEM file and checks that it holds what `flag` needs (a
// certificate, or a private key) before gRPC sees it: gRPC reports a bad
// one only as a failure to listen.
absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag, bool key) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(flag, " ", path, ": cannot read"));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  const bool ok =
      key ? (absl::StrContains(text, "-----BEGIN ") && absl::StrContains(text, "PRIVATE KEY-----"))
          : (absl::StrContains(text, "-----BEGIN CERTIFICATE-----") &&
             absl::StrContains(text, "-----END CERTIFICATE-----"));
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": not a PEM ",
                     key ? "private key (-----BEGIN ... PRIVATE KEY-----)"
                         : "certificate (-----BEGIN CERTIFICATE-----)"));
  }
  return text;
}

// The names the agent reports on.
bool KnownService(const std::string& name) {
  return name.empty() || name == "servesim.v1.DeviceAgent";
}

}  // namespace

grpc::Status HealthService::Check(grpc::ServerContext*,
                                  const grpc::health::v1::HealthCheckRequest* req,
                                  grpc::health::v1::HealthCheckResponse* resp) {
  if (!KnownService(req->service())) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("no service '", req->service(), "' here"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  resp->set_status(serving_ ? grpc::health::v1::HealthCheckResponse::SERVING
                            : grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  return grpc::Status::OK;
}

grpc::Status HealthService::Watch(
    grpc::ServerContext* ctx, const grpc::health::v1::HealthCheckRequest* req,
    grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>* writer) {
  grpc::health::v1::HealthCheckResponse resp;
  if (!KnownService(req->service())) {
    // The protocol's answer for a name the server may learn later; this
    // one never does, so the call ends here.
    resp.set_status(grpc::health::v1::HealthCheckResponse::SERVICE_UNKNOWN);
    writer->Write(resp);
    return grpc::Status::OK;
  }
  std::unique_lock<std::mutex> lock(mu_);
  resp.set_status(serving_ ? grpc::health::v1::HealthCheckResponse::SERVING
                           : grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  if (!writer->Write(resp) || !serving_) return grpc::Status::OK;
  // The status changes once, at Shutdown; a cancelled call is noticed
  // within the wait.
  while (serving_ && !ctx->IsCancelled()) changed_.wait_for(lock, std::chrono::milliseconds(200));
  if (serving_) return grpc::Status::CANCELLED;
  resp.set_status(grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  writer->Write(resp);
  return grpc::Status::OK;
}

void HealthService::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    serving_ = false;
  }
  changed_.notify_all();
}

absl::StatusOr<RunningAgent> StartAgentServer(AgentService* service,
                                              const AgentServerOptions& options) {
  if (options.max_message_bytes < 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-message-bytes ", options.max_message_bytes, "; expected >= 1024"));
  }
  if (!(options.handshake_timeout_s > 0 && options.handshake_timeout_s <= 3600) ||
      !(options.idle_connection_s > 0 && options.idle_connection_s <= 86400) ||
      options.max_streams_per_connection < 1 || options.max_threads < 2 ||
      options.stream_threads < 1 || options.stream_threads > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "handshake timeout ", options.handshake_timeout_s, " s, idle connections ",
        options.idle_connection_s, " s, ", options.max_streams_per_connection,
        " streams per connection, ", options.max_threads, " threads, ", options.stream_threads,
        " stream threads; expected (0, 3600] s, (0, 86400] s, >= 1, >= 2 and [1, 64]"));
  }
  std::shared_ptr<grpc::ServerCredentials> creds;
  if (!options.tls_cert_file.empty() || !options.tls_key_file.empty()) {
    if (options.tls_cert_file.empty() || options.tls_key_file.empty()) {
      return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
    }
    grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
    ASSIGN_OR_RETURN(pair.cert_chain, ReadPem(options.tls_cert_file, "--tls-cert", false));
    ASSIGN_OR_RETURN(pair.private_key, ReadPem(options.tls_key_file, "--tls-key", true));
    ssl.pem_key_cert_pairs.push_back(pair);
    if (!options.tls_client_ca_file.empty()) {
      ASSIGN_OR_RETURN(ssl.pem_root_certs,
                       ReadPem(options.tls_client_ca_file, "--tls-client-ca", false));
      ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    creds = grpc::SslServerCredentials(ssl);
  } else {
    if (!options.tls_client_ca_file.empty()) {
      return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
    }
    creds = grpc::InsecureServerCredentials();
  }
  // The health service is the agent's own (HealthService): gRPC's is off.
  grpc::EnableDefaultHealthCheckService(false);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  RunningAgent running;
  running.health = std::make_unique<HealthService>();
  builder.AddListeningPort(options.listen, creds, &running.port);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             static_cast<int>(options.handshake_timeout_s * 1000));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                             static_cast<int>(options.idle_connection_s * 1000));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_streams_per_connection);
  grpc::ResourceQuota quota("servesim-agent");
  quota.SetMaxThreads(options.max_threads);
  builder.SetResourceQuota(quota);
  builder.RegisterService(service);
  builder.RegisterService(running.health.get());
  for (int i = 0; i < options.stream_threads; ++i) {
    running.stream_queues.push_back(builder.AddCompletionQueue());
  }
  running.server = builder.BuildAndStart();
  if (running.server == nullptr || running.port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "--listen ", options.listen,
        ": cannot listen there (bad HOST:PORT, port in use, "
        "port outside [0, 65535]",
        options.tls_cert_file.empty()
            ? ""
            : ", or a certificate and key that do not belong together (--log-level error "
              "shows gRPC's reason)",
        ")"));
  }
  running.service = service;
  for (const auto& q : running.stream_queues) {
    running.stream_threads.emplace_back(
        [service, queue = q.get()] { service->ServeStreams(queue); });
  }
  return running;
}

RunningAgent::~RunningAgent() {
  if (health != nullptr) health->Shutdown();  // ends its watches, which Shutdown waits for
  if (server != nullptr) server->Shutdown();  // no-op if already shut down
  if (service != nullptr && !stream_queues.empty()) {  // (a moved-from one has none)
    service->CloseStreamQueues(stream_queues);
  } else {
    for (const auto& q : stream_queues) q->Shutdown();
  }
  for (std::thread& t : stream_threads) t.join();
  if (stream_threads.empty()) {  // the server never started: drain the queues here
    for (const auto& q : stream_queues) {
      void* tag = nullptr;
      bool ok = false;
      while (q->Next(&tag, &ok)) {
      }
    }
  }
}

}  // namespace servesim::agents
