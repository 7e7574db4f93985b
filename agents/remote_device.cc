// RemoteDevice's construction and its plain calls: Create checks the
// options, reads the TLS files and opens a channel per endpoint (nothing
// connects until the first call); the destructor stops the threads measuring
// ahead, cancels what is in flight and drains the completion queue;
// Describe, Execute and Stats. The rest of the class lives in the files
// agents/remote_device_internal.h lists.
#include "agents/remote_device.h"

#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agents/agent_service.h"
#include "agents/convert.h"
#include "agents/remote_device_internal.h"
#include "common/status_macros.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace servesim::agents {

namespace v1 = servesim::v1;

namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(what, " ", path, ": cannot read"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

RemoteDevice::RemoteDevice(v1::DeviceSpec spec, ClientOptions options, std::string label)
    : spec_(std::move(spec)), options_(std::move(options)), label_(std::move(label)) {
  kind_ = SpecKindName(spec_);
  last_description_.kind = kind_;
}

absl::StatusOr<std::unique_ptr<RemoteDevice>> RemoteDevice::Create(
    v1::DeviceSpec spec, std::vector<std::string> endpoints, ClientOptions options,
    std::string label) {
  if (endpoints.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": no agent endpoints given"));
  }
  if (options.deadline_s <= 0 || options.attempts_per_endpoint < 1 ||
      !(options.retry_s >= 0 && options.retry_s <= 86400)) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": agent deadline_s = ", options.deadline_s, ", attempts_per_endpoint = ",
        options.attempts_per_endpoint, ", retry_s = ", options.retry_s,
        "; expected deadline_s > 0, attempts >= 1 and retry_s in [0, 86400]"));
  }
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (!options.tls_ca_file.empty()) {
    grpc::SslCredentialsOptions ssl;
    ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPem(options.tls_ca_file, "--agent-tls-ca"));
    if (!options.tls_cert_file.empty() || !options.tls_key_file.empty()) {
      if (options.tls_cert_file.empty() || options.tls_key_file.empty()) {
        return absl::InvalidArgumentError(
            "--agent-tls-cert and --agent-tls-key go together (the client certificate and its "
            "key)");
      }
      ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadPem(options.tls_cert_file, "--agent-tls-cert"));
      ASSIGN_OR_RETURN(ssl.pem_private_key, ReadPem(options.tls_key_file, "--agent-tls-key"));
    }
    creds = grpc::SslCredentials(ssl);
  } else {
    if (!options.tls_cert_file.empty()) {
      return absl::InvalidArgumentError("--agent-tls-cert needs --agent-tls-ca (TLS)");
    }
    creds = grpc::InsecureChannelCredentials();
  }
  std::unique_ptr<RemoteDevice> d(new RemoteDevice(std::move(spec), options, std::move(label)));
  for (const std::string& address : endpoints) {
    const size_t colon = address.rfind(':');
    if (address.empty() || colon == std::string::npos || colon + 1 == address.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(d->label_, ": agent endpoint '", address, "'; expected HOST:PORT"));
    }
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(options.max_message_bytes);
    args.SetMaxSendMessageSize(options.max_message_bytes);
    // Reconnect soon after an agent comes back.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
    auto ep = std::make_unique<Endpoint>();
    ep->address = address;
    ep->channel = grpc::CreateCustomChannel(address, creds, args);
    ep->stub = v1::DeviceAgent::NewStub(ep->channel);
    d->endpoints_.push_back(std::move(ep));
    d->stats_.endpoints.push_back(address);
    d->stats_.measured_steps.push_back(0);
  }
  return d;
}

RemoteDevice::~RemoteDevice() {
  {
    std::lock_guard<std::mutex> lock(ahead_mu_);
    ahead_stop_ = true;
    for (AheadWork& w : ahead_) {
      if (w.inflight != nullptr) w.inflight->TryCancel();
    }
  }
  ahead_cv_.notify_all();
  for (std::thread& t : ahead_threads_) t.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Prefetch* p : prefetches_) p->ctx.TryCancel();  // nobody waits for their answers
    for (auto& st : streams_) st->ctx.TryCancel();
    for (grpc::ClientContext& ctx : bind_contexts_) ctx.TryCancel();
  }
  WaitForPrefetches();
  cq_.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq_.Next(&tag, &ok)) {
  }
  for (std::thread& t : binders_) t.join();
}

devices::DeviceDescription RemoteDevice::Describe() const {
  auto d = DescribeOrError();
  if (d.ok()) return *d;
  std::lock_guard<std::mutex> lock(mu_);
  return last_description_;
}

absl::StatusOr<devices::DeviceDescription> RemoteDevice::DescribeAt(int preferred) const {
  v1::DescribeResponse resp;
  RETURN_IF_ERROR(Call(
      "Describe",
      [&](v1::DeviceAgent::Stub* stub, const std::string&, grpc::ClientContext* ctx) {
        v1::DescribeRequest req;
        *req.mutable_spec() = spec_;
        resp.Clear();
        return stub->Describe(ctx, req, &resp);
      },
      preferred));
  ASSIGN_OR_RETURN(devices::DeviceDescription d, DecodeDescription(resp));
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.other_rpcs;
  last_description_ = d;
  lookahead_ok_ = d.lookahead_ok ? 1 : 0;
  return d;
}

absl::StatusOr<devices::DeviceDescription> RemoteDevice::DescribeOrError() const {
  int preferred = -1;
  {
    // A device whose steps are spread is described by its home, whose memo
    // holds them all.
    std::lock_guard<std::mutex> lock(mu_);
    if (spread_ == 1) preferred = 0;
  }
  return DescribeAt(preferred);
}

absl::StatusOr<devices::AttentionResult> RemoteDevice::Execute(
    const devices::AttentionCall& call) const {
  v1::ExecuteRequest req;
  EncodeTensor(call.q, req.mutable_q());
  EncodeTensor(call.k, req.mutable_k());
  EncodeTensor(call.v, req.mutable_v());
  req.set_scale(call.scale);
  v1::ExecuteResponse resp;
  RETURN_IF_ERROR(Call("Execute", [&](v1::DeviceAgent::Stub* stub, const std::string& key,
                                      grpc::ClientContext* ctx) {
    req.set_device_key(key);
    resp.Clear();
    return stub->Execute(ctx, req, &resp);
  }));
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.other_rpcs;
  }
  devices::AttentionResult r;
  ASSIGN_OR_RETURN(r.out, DecodeTensor(resp.out(), options_.max_message_bytes, "out"));
  r.stats = DecodeStats(resp.stats());
  return r;
}

RemoteStats RemoteDevice::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace servesim::agents
