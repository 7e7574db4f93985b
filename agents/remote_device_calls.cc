// RemoteDevice's calls to its agents: every call goes through Call, which
// binds the device on an endpoint (Describe with the spec) where it is not
// bound yet, retries UNAVAILABLE and DEADLINE_EXCEEDED with backoff, marks an
// endpoint down and fails over to the next, and goes round them all again
// until retry_s have passed (the header's PARAMETERS AND BEHAVIOUR). Owns
// no state of its own: the endpoints' (bound, key, down_until) and the stats
// are RemoteDevice's, under mu_. ConnectHint asks what listens at a failed
// endpoint (agents/endpoint_probe.h) and reads its error for the flag to
// check.
#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agents/agent_service.h"
#include "agents/convert.h"
#include "agents/endpoint_probe.h"
#include "agents/remote_device.h"

namespace servesim::agents {

namespace v1 = servesim::v1;

namespace {

bool Retryable(const grpc::Status& st) {
  return st.error_code() == grpc::StatusCode::UNAVAILABLE ||
         st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

}  // namespace

void RemoteDevice::PrepareContext(grpc::ClientContext* ctx, double deadline_s) const {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::duration_cast<std::chrono::system_clock::duration>(
                        std::chrono::duration<double>(deadline_s)));
  if (!options_.token.empty()) ctx->AddMetadata("authorization", "Bearer " + options_.token);
}

absl::Status RemoteDevice::BindLocked(Endpoint* ep, grpc::ClientContext* ctx) const {
  // Called without mu_ held (the RPC may take long); the result is stored
  // under it.
  v1::DescribeRequest req;
  *req.mutable_spec() = spec_;
  v1::DescribeResponse resp;
  grpc::ClientContext own;
  if (ctx == nullptr) ctx = &own;
  PrepareContext(ctx, options_.bind_deadline_s);
  grpc::Status st = ep->stub->Describe(ctx, req, &resp);
  if (!st.ok()) return FromGrpcStatus(st);
  // An agent of another protocol would answer in a form this client
  // misreads (version 1 sent costs one message each).
  const std::vector<absl::string_view> version = absl::StrSplit(resp.model_version(), "; ");
  if (version.back() != kAgentProtocolVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("the agent speaks \"", resp.model_version(), "\" and this client ",
                     kAgentProtocolVersion, ": run servesim-agent of the same servesim version"));
  }
  auto desc = DecodeDescription(resp);
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.other_rpcs;
  ep->device_key = resp.device_key();
  ep->bound = true;
  if (desc.ok()) last_description_ = *desc;
  return absl::OkStatus();
}

void RemoteDevice::BindAllOnce() const {
  std::call_once(bind_all_, [this] {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& e : endpoints_) {
      Endpoint* ep = e.get();
      if (ep->bound) continue;
      ep->binding = true;
      grpc::ClientContext* ctx = &bind_contexts_.emplace_back();
      binders_.emplace_back([this, ep, ctx] {
        // A failure is left to the call that needs the endpoint: it binds
        // again, with its retries.
        (void)BindLocked(ep, ctx);
        std::lock_guard<std::mutex> done(mu_);
        ep->binding = false;
        bound_.notify_all();
      });
    }
  });
}

void RemoteDevice::WaitForBinds() const {
  std::unique_lock<std::mutex> lock(mu_);
  bound_.wait(lock, [this] {
    return std::none_of(endpoints_.begin(), endpoints_.end(),
                        [](const std::unique_ptr<Endpoint>& e) { return e->binding; });
  });
}

std::vector<int> RemoteDevice::CallOrder(int preferred,
                                         std::chrono::steady_clock::time_point now) const {
  const int n = static_cast<int>(endpoints_.size());
  // Order: the preferred (or next round-robin) endpoint, the others that
  // are up, then those marked down (a last chance).
  std::vector<int> order;
  std::lock_guard<std::mutex> lock(mu_);
  int start = preferred;
  if (start < 0) {
    start = static_cast<int>(next_ % n);
    for (int i = 0; i < n; ++i) {
      const int c = static_cast<int>((next_ + i) % n);
      if (endpoints_[c]->down_until <= now) {
        start = c;
        break;
      }
    }
    next_ = start + 1;
  }
  std::vector<int> down;
  for (int i = 0; i < n; ++i) {
    const int c = (start + i) % n;
    (i == 0 || endpoints_[c]->down_until <= now ? order : down).push_back(c);
  }
  order.insert(order.end(), down.begin(), down.end());
  return order;
}

absl::Status RemoteDevice::Call(const char* method, const Rpc& rpc, int preferred,
                                int* used) const {
  const int n = static_cast<int>(endpoints_.size());
  if (n > 1) BindAllOnce();
  const auto now = std::chrono::steady_clock::now();
  const auto give_up = now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                 std::chrono::duration<double>(options_.retry_s));
  const std::vector<int> order = CallOrder(preferred, now);
  std::vector<std::string> tried;
  std::string last_error, last_address;
  grpc::Status last_status;
  double round_backoff = options_.backoff_initial_s;
  int rounds = 0;
  for (size_t j = 0;; ++j) {
    if (j == order.size()) {
      // Every endpoint failed this round: again, all of them, while the
      // retry budget lasts.
      ++rounds;
      if (std::chrono::steady_clock::now() +
              std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                  std::chrono::duration<double>(round_backoff)) >
          give_up) {
        break;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.retries;
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(round_backoff));
      round_backoff = std::min(2 * round_backoff, options_.backoff_max_s);
      j = 0;
    }
    Endpoint* ep = endpoints_[order[j]].get();
    double backoff = options_.backoff_initial_s;
    for (int attempt = 0; attempt < options_.attempts_per_endpoint; ++attempt) {
      std::string key;
      bool bound;
      {
        std::unique_lock<std::mutex> lock(mu_);
        bound_.wait(lock, [ep] { return !ep->binding; });
        bound = ep->bound;
        key = ep->device_key;
      }
      grpc::Status st;
      if (!bound) {
        absl::Status b = BindLocked(ep);
        st = ToGrpcStatus(b);
        if (b.ok()) {
          std::lock_guard<std::mutex> lock(mu_);
          key = ep->device_key;
        }
      }
      if (st.ok()) {
        grpc::ClientContext ctx;
        PrepareContext(&ctx, options_.deadline_s);
        st = rpc(ep->stub.get(), key, &ctx);
      }
      if (st.ok()) {
        std::lock_guard<std::mutex> lock(mu_);
        ep->down_until = {};
        if (used != nullptr) *used = order[j];
        return absl::OkStatus();
      }
      if (st.error_code() == grpc::StatusCode::NOT_FOUND &&
          absl::StrContains(st.error_message(), "device_key")) {
        std::lock_guard<std::mutex> lock(mu_);
        ep->bound = false;  // the agent restarted: bind again
        ++stats_.rebinds;
        if (order[j] == 0) home_holds_.clear();
        continue;
      }
      if (!Retryable(st)) {
        if (used != nullptr) *used = order[j];
        return absl::Status(
            static_cast<absl::StatusCode>(st.error_code()),
            absl::StrCat(label_, ": agent ", ep->address, ": ", method, ": ", st.error_message()));
      }
      last_status = st;
      last_address = ep->address;
      last_error = absl::StrCat(
          ep->address, ": ",
          st.error_code() == grpc::StatusCode::UNAVAILABLE ? "UNAVAILABLE" : "DEADLINE_EXCEEDED",
          ": ", st.error_message());
      if (attempt + 1 < options_.attempts_per_endpoint) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          ++stats_.retries;
        }
        std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
        backoff = std::min(2 * backoff, options_.backoff_max_s);
      }
    }
    if (std::find(tried.begin(), tried.end(), ep->address) == tried.end()) {
      tried.push_back(ep->address);
    }
    std::lock_guard<std::mutex> lock(mu_);
    ep->down_until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(options_.down_s));
    ep->bound = false;
    if (order[j] == 0) home_holds_.clear();
    if (n > 1) ++stats_.failovers;
  }
  return absl::UnavailableError(
      absl::StrCat(label_, ": ", method, ": no agent endpoint answered in ", rounds,
                   rounds == 1 ? " round" : " rounds", " over ", options_.retry_s,
                   " s (--agent-retry-s; tried ", absl::StrJoin(tried, ", "), "); last error from ",
                   last_error, ConnectHint(last_status, last_address)));
}

std::string RemoteDevice::ConnectHint(const grpc::Status& st, const std::string& address) const {
  const bool tls = !options_.tls_ca_file.empty();
  // gRPC's words read alike for several causes: ask the other end first.
  switch (ProbeEndpoint(address, 1.0)) {
    case Listener::kNothing:
      return ". Nothing accepts connections there: is the agent running, and on that HOST:PORT?";
    case Listener::kHttp1:
      return ". Something answers HTTP/1 there (a web server, or a servesim --metrics "
             "dashboard), not a servesim agent: check HOST:PORT";
    case Listener::kTls:
      return tls ? ". The agent serves TLS but the handshake failed: it may require a client "
                   "certificate (--agent-tls-cert and --agent-tls-key) signed by its "
                   "--tls-client-ca, or present a certificate that does not chain to "
                   "--agent-tls-ca or does not name this HOST"
                 : ". The agent serves TLS: give --agent-tls-ca (and a client certificate if it "
                   "asks for one)";
    case Listener::kPlaintext:
      if (tls) {
        return ". The agent serves plaintext, not TLS: drop --agent-tls-ca (and "
               "--agent-tls-cert, --agent-tls-key), or start it with --tls-cert and --tls-key";
      }
      break;
    case Listener::kUnknown:
      break;
  }
  const std::string m = absl::AsciiStrToLower(st.error_message());
  // A TCP connect still pending when its attempt ends (no thread took its
  // refusal yet, or nothing answered) is no TLS matter.
  const bool connecting = absl::StrContains(m, "tcp handshaker shutdown");
  if (!connecting && (absl::StrContains(m, "ssl") || absl::StrContains(m, "handshake") ||
                      absl::StrContains(m, "certificate") || absl::StrContains(m, "tls"))) {
    return tls ? ". The TLS handshake failed: the agent may serve plaintext (drop "
                 "--agent-tls-ca), require a client certificate (--agent-tls-cert and "
                 "--agent-tls-key), or present a certificate that does not chain to "
                 "--agent-tls-ca or name this HOST"
               : ". The agent seems to serve TLS: give --agent-tls-ca (and a client certificate "
                 "if it asks for one)";
  }
  if (absl::StrContains(m, "socket closed") || absl::StrContains(m, "connection reset") ||
      absl::StrContains(m, "end of tcp stream") || absl::StrContains(m, "broken pipe")) {
    return tls ? ". The agent closed the connection during the TLS handshake: it may want a "
                 "client certificate (--agent-tls-cert and --agent-tls-key) signed by its "
                 "--tls-client-ca, or serve plaintext (drop --agent-tls-ca)"
               : ". The agent closed the connection at once: it probably serves TLS (give "
                 "--agent-tls-ca), or it is over its --max-connections";
  }
  if (connecting || absl::StrContains(m, "connection refused") ||
      absl::StrContains(m, "failed to connect")) {
    return ". Nothing accepts connections there: is the agent running, and on that HOST:PORT?";
  }
  return "";
}

}  // namespace servesim::agents
