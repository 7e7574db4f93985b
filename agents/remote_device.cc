#include "agents/remote_device.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <fstream>
#include <sstream>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/base/casts.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agents/agent_service.h"
#include "agents/convert.h"
#include "common/status_macros.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace servesim::agents {

namespace v1 = servesim::v1;
using devices::Cost;
using devices::Op;

namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(what, " ", path, ": cannot read"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool Retryable(const grpc::Status& st) {
  return st.error_code() == grpc::StatusCode::UNAVAILABLE ||
         st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

template <typename T>
void AppendRaw(std::string* key, const T& v) {
  key->append(reinterpret_cast<const char*>(&v), sizeof v);
}

// A sequence list's content, for interning.
void SeqListBytes(absl::Span<const devices::AttentionSeq> seqs, std::string* out) {
  out->clear();
  out->push_back('s');
  for (const devices::AttentionSeq& q : seqs) {
    AppendRaw(out, q.new_tokens);
    AppendRaw(out, q.past_tokens);
    AppendRaw(out, q.request_id);
  }
}

// The lists one call has seen: (address, length, id). The ops of a call
// share lists (head groups), so each is filled in and looked up once.
using SeenLists = std::vector<std::tuple<const void*, size_t, uint32_t>>;
// The id of the list at (data, n): 0 if empty, else the one `seen` holds,
// else `lookup()` after `fill()` (which writes its content).
template <typename Fill, typename Lookup>
uint32_t CallListId(SeenLists* seen, const void* data, size_t n, Fill&& fill, Lookup&& lookup) {
  if (n == 0) return 0;
  for (const auto& [p, size, id] : *seen) {
    if (p == data && size == n) return id;
  }
  fill();
  const uint32_t id = lookup();
  seen->emplace_back(data, n, id);
  return id;
}

void StackListBytes(absl::Span<const int32_t> stacks, std::string* out) {
  out->assign(1, 'k');
  out->append(reinterpret_cast<const char*>(stacks.data()), stacks.size() * sizeof(int32_t));
}

// A missed call asks this many steps ahead; a hit within kPrefetchMargin
// steps of its prediction's end asks for kPrefetchSteps more,
// asynchronously. Batches change every 10-30 iterations in the Azure
// traces, so longer predictions mostly go to waste (measured: doubling them
// cost the agent 2x the work for 30% fewer blocking calls).
constexpr int kLookaheadStart = 8;
constexpr int kPrefetchSteps = 16;
constexpr int kPrefetchMargin = 6;

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
      return absl::InvalidArgumentError(absl::StrCat(
          d->label_, ": agent endpoint '", address, "'; expected HOST:PORT"));
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

absl::Status RemoteDevice::Call(const char* method, const Rpc& rpc, int preferred,
                                int* used) const {
  const int n = static_cast<int>(endpoints_.size());
  if (n > 1) BindAllOnce();
  const auto now = std::chrono::steady_clock::now();
  const auto give_up = now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                 std::chrono::duration<double>(options_.retry_s));
  // Order: the preferred (or next round-robin) endpoint, the others that
  // are up, then those marked down (a last chance).
  std::vector<int> order;
  {
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
  }
  std::vector<std::string> tried;
  std::string last_error;
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
        return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                            absl::StrCat(label_, ": agent ", ep->address, ": ", method, ": ",
                                         st.error_message()));
      }
      last_status = st;
      last_error = absl::StrCat(ep->address, ": ", st.error_code() == grpc::StatusCode::UNAVAILABLE
                                                       ? "UNAVAILABLE"
                                                       : "DEADLINE_EXCEEDED",
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
  return absl::UnavailableError(absl::StrCat(
      label_, ": ", method, ": no agent endpoint answered in ", rounds,
      rounds == 1 ? " round" : " rounds", " over ", options_.retry_s, " s (--agent-retry-s; tried ",
      absl::StrJoin(tried, ", "), "); last error from ", last_error, ConnectHint(last_status)));
}

std::string RemoteDevice::ConnectHint(const grpc::Status& st) const {
  const std::string m = absl::AsciiStrToLower(st.error_message());
  const bool tls = !options_.tls_ca_file.empty();
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

absl::StatusOr<bool> RemoteDevice::Spread() const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (spread_ >= 0) return spread_ == 1;
    if (endpoints_.size() < 2) {
      spread_ = 0;
      return false;
    }
  }
  // The home's description says whether the device measures steps.
  ASSIGN_OR_RETURN(devices::DeviceDescription d, DescribeAt(0));
  std::lock_guard<std::mutex> lock(mu_);
  spread_ = d.measures_steps ? 1 : 0;
  splits_ = d.splits_layers;
  step_base_ = d.step_base_positions;
  first_step_ = d.first_step_positions_per_token;
  return spread_ == 1;
}

absl::Status RemoteDevice::MeasureSpread(absl::Span<const Op> ops,
                                         std::vector<devices::StepMeasurement>* absorb,
                                         std::vector<devices::StepKey>* steps) const {
  // The ops' decode steps, in order, once each (a pool's units and the head
  // groups share their sequences).
  steps->clear();
  absl::flat_hash_set<devices::StepKey> seen;
  absl::flat_hash_map<int64_t, int64_t> final_of;  // request -> final_tokens hint
  for (const Op& op : ops) {
    if (op.kind != devices::OpKind::kAttention) continue;
    for (const devices::AttentionSeq& s : op.seqs) {
      if (s.new_tokens != 1 || s.request_id < 0) continue;
      const devices::StepKey k{s.request_id, s.past_tokens + 1};
      if (seen.insert(k).second) steps->push_back(k);
      if (s.final_tokens > 0) final_of.try_emplace(s.request_id, s.final_tokens);
    }
  }
  const int n = static_cast<int>(endpoints_.size());
  std::vector<std::vector<devices::StepKey>> share(n);
  bool layers = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    layers = splits_;
  }
  if (layers) {
    // Every endpoint takes its share of every step's layers: endpoint e
    // always share e of n, so each keeps the K rows of its own layers.
    std::lock_guard<std::mutex> lock(mu_);
    for (const devices::StepKey& k : *steps) {
      if (home_holds_.contains(k)) continue;
      for (int e = 0; e < n; ++e) share[e].push_back(k);
    }
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    // A step at context L takes L + base of kernel time (the device's
    // profile, DeviceDescription), so a request's work left is that summed
    // over its remaining steps, where the scheduler hinted its final length
    // (else this step alone); a request new here also builds its state from
    // its prompt first. A request seen before stays where its kernel state
    // is; each endpoint's load is the work left of its requests in this
    // call. New requests go, largest first, to the least-loaded endpoint
    // (ties round the endpoints): the longest-processing-time rule, so that
    // requests of different prompt and output lengths still split the run's
    // work evenly.
    auto work_left = [&](const devices::StepKey& k) {
      const auto it = final_of.find(k.request_id);
      const double l = static_cast<double>(k.l);
      if (it == final_of.end() || it->second <= k.l) return l + step_base_;
      const double f = static_cast<double>(it->second);
      return (f * (f + 1) - (l - 1) * l) / 2 + (f - l + 1) * step_base_;
    };
    std::vector<double> load(n, 0);
    std::vector<std::pair<double, int64_t>> fresh;  // (work left, request), first step's order
    absl::flat_hash_set<int64_t> counted;
    for (const devices::StepKey& k : *steps) {
      if (home_holds_.contains(k) || !counted.insert(k.request_id).second) continue;
      auto it = owner_.find(k.request_id);
      if (it != owner_.end()) {
        load[it->second] += work_left(k);
      } else {
        fresh.push_back({work_left(k) + first_step_ * static_cast<double>(k.l), k.request_id});
      }
    }
    std::stable_sort(fresh.begin(), fresh.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    for (const auto& [work, request] : fresh) {
      int best = next_owner_ % n;
      for (int i = 1; i < n; ++i) {
        const int e = (next_owner_ + i) % n;
        if (load[e] < load[best]) best = e;
      }
      next_owner_ = best + 1;
      owner_[request] = best;
      load[best] += work;
    }
    for (const devices::StepKey& k : *steps) {
      if (home_holds_.contains(k)) continue;
      share[owner_.at(k.request_id)].push_back(k);
    }
  }
  if (!layers) StartAheadOnce();
  // One thread per endpoint with steps (the caller's thread takes the last),
  // joined in endpoint order.
  std::vector<std::vector<devices::StepMeasurement>> got(n);
  std::vector<absl::Status> status(n);
  auto measure = [&](int e) {
    for (size_t at = 0; at < share[e].size(); at += kMaxMeasureSteps) {
      v1::MeasureRequest req;
      const size_t end = std::min(share[e].size(), at + kMaxMeasureSteps);
      for (size_t i = at; i < end; ++i) EncodeStepKey(share[e][i], req.add_steps());
      if (layers) {
        req.set_part(e);
        req.set_parts(n);
      }
      v1::MeasureResponse resp;
      // An endpoint marked down is tried last, not first: its share goes to
      // the next one up (any endpoint measures any share exactly; a
      // request whose state was on it starts afresh where it lands).
      int start = e;
      {
        std::lock_guard<std::mutex> lock(mu_);
        const auto now = std::chrono::steady_clock::now();
        for (int i = 0; i < n && endpoints_[start]->down_until > now; ++i) start = (e + i + 1) % n;
        if (endpoints_[start]->down_until > now) start = e;
      }
      int u = -1;
      if (!layers) Busy(e, +1);
      status[e] = Call(
          "Measure",
          [&](v1::DeviceAgent::Stub* stub, const std::string& key, grpc::ClientContext* ctx) {
            req.set_device_key(key);
            resp.Clear();
            return stub->Measure(ctx, req, &resp);
          },
          start, &u);
      if (!layers) {
        Busy(e, -1);
        // Its endpoint goes on with these requests' next steps meanwhile.
        if (status[e].ok()) Hold(u, absl::MakeConstSpan(share[e]).subspan(at, end - at), final_of);
      }
      if (!status[e].ok()) return;
      auto m = DecodeMeasurements(resp.measured(), kMaxMeasuredSteps, "measured");
      if (!m.ok()) {
        status[e] = absl::InternalError(absl::StrCat(label_, ": agent ", endpoints_[u]->address,
                                                     ": Measure answered ", m.status().message()));
        return;
      }
      if (m->size() < end - at) {
        status[e] = absl::InternalError(absl::StrCat(label_, ": agent ", endpoints_[u]->address,
                                                     ": Measure answered ", m->size(),
                                                     " steps for ", end - at));
        return;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.measure_rpcs;
        stats_.measured_steps[u] += static_cast<int64_t>(m->size());
      }
      if (!layers && u != e) {
        // Its requests' state is on `u` now: keep them there.
        std::lock_guard<std::mutex> lock(mu_);
        for (const devices::StepKey& k : share[e]) owner_[k.request_id] = u;
      }
      // What the home measured whole is in its memo already; shares are
      // only counts until the home sums them.
      if (u != 0 || layers) got[e].insert(got[e].end(), m->begin(), m->end());
    }
  };
  std::vector<std::thread> threads;
  int last = -1;
  for (int e = 0; e < n; ++e) {
    if (share[e].empty()) continue;
    if (last >= 0) threads.emplace_back(measure, last);
    last = e;
  }
  if (last >= 0) measure(last);
  for (std::thread& t : threads) t.join();
  absorb->clear();
  for (int e = 0; e < n; ++e) {
    RETURN_IF_ERROR(status[e]);
    for (devices::StepMeasurement& m : got[e]) {
      if (!seen.contains(m.step)) {
        seen.insert(m.step);
        steps->push_back(m.step);  // filled in on the way
      }
      absorb->push_back(std::move(m));
    }
  }
  return absl::OkStatus();
}

void RemoteDevice::StartAheadOnce() const {
  std::call_once(ahead_once_, [this] {
    std::lock_guard<std::mutex> lock(ahead_mu_);
    ahead_.resize(endpoints_.size());
    for (int e = 0; e < static_cast<int>(endpoints_.size()); ++e) {
      ahead_threads_.emplace_back([this, e] { AheadLoop(e); });
    }
  });
}

void RemoteDevice::Busy(int e, int delta) const {
  {
    std::lock_guard<std::mutex> lock(ahead_mu_);
    if (e >= static_cast<int>(ahead_.size())) return;
    ahead_[e].busy += delta;
  }
  if (delta < 0) ahead_cv_.notify_all();
}

void RemoteDevice::Hold(int e, absl::Span<const devices::StepKey> asked,
                        const absl::flat_hash_map<int64_t, int64_t>& final_of) const {
  {
    std::lock_guard<std::mutex> lock(ahead_mu_);
    if (e >= static_cast<int>(ahead_.size())) return;
    for (const devices::StepKey& k : asked) {
      // A request that moved (its endpoint down) goes on where it landed.
      for (int o = 0; o < static_cast<int>(ahead_.size()); ++o) {
        if (o != e) ahead_[o].requests.erase(k.request_id);
      }
      const auto f = final_of.find(k.request_id);
      // Its last decode step has context final_tokens - 1 (the last token
      // is the output, not attended).
      const int64_t last = f == final_of.end() ? 0 : f->second - 1;
      AheadStep& st = ahead_[e].requests[k.request_id];
      st.asked = std::max(st.asked, k.l);
      st.next = std::max(st.next, k.l + 1);
      st.last = std::max(st.last, last);
    }
  }
  ahead_cv_.notify_all();
}

void RemoteDevice::AheadLoop(int e) const {
  std::unique_lock<std::mutex> lock(ahead_mu_);
  while (!ahead_stop_) {
    AheadWork& w = ahead_[e];
    // The request least far ahead of its last asked step; a request is
    // forgotten once its last step was asked (until then it is kept, so that
    // a call does not set it back to the step after the one it asked).
    int64_t pick = -1, lead = 0;
    for (auto it = w.requests.begin(); it != w.requests.end();) {
      const AheadStep& st = it->second;
      if (st.asked >= st.last) {
        w.requests.erase(it++);
        continue;
      }
      if (st.next > st.last) {
        ++it;
        continue;
      }
      if (pick < 0 || st.next - st.asked < lead) {
        pick = it->first;
        lead = st.next - st.asked;
      }
      ++it;
    }
    if (ahead_refused_ || w.busy > 0 || pick < 0) {
      ahead_cv_.wait(lock);
      continue;
    }
    const devices::StepKey k{pick, w.requests.at(pick).next};
    Endpoint* ep = endpoints_[e].get();
    v1::MeasureRequest req;
    {
      std::lock_guard<std::mutex> state(mu_);
      if (!ep->bound || ep->down_until > std::chrono::steady_clock::now()) {
        // Asked again once a call has reached it.
        w.requests.clear();
        continue;
      }
      req.set_device_key(ep->device_key);
    }
    EncodeStepKey(k, req.add_steps());
    req.set_ahead(true);
    grpc::ClientContext ctx;
    PrepareContext(&ctx, options_.deadline_s);
    w.inflight = &ctx;
    lock.unlock();
    v1::MeasureResponse resp;
    const grpc::Status st = ep->stub->Measure(&ctx, req, &resp);
    lock.lock();
    w.inflight = nullptr;
    {
      std::lock_guard<std::mutex> state(mu_);
      ++(st.ok() ? stats_.ahead_rpcs : stats_.ahead_failures);
    }
    if (st.ok()) {
      // Asked, whether measured or passed over (a call waited): the next
      // ask goes on from where the kernel stands.
      if (auto it = w.requests.find(k.request_id); it != w.requests.end()) {
        it->second.next = std::max(it->second.next, k.l + 1);
      }
    } else if (st.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      ahead_refused_ = true;
    } else {
      w.requests.clear();
    }
  }
}

devices::DeviceDescription RemoteDevice::Describe() const {
  auto d = DescribeOrError();
  if (d.ok()) return *d;
  std::lock_guard<std::mutex> lock(mu_);
  return last_description_;
}

uint32_t RemoteDevice::InternLocked(const std::string& content) const {
  auto [it, added] = lists_.try_emplace(content, static_cast<uint32_t>(lists_.size() + 1));
  if (added) memo_bytes_ += content.size() + 64;
  return it->second;
}

uint32_t RemoteDevice::ShapeIdLocked(const Op& op) const {
  ShapeKey sk;
  sk.kind = static_cast<uint8_t>(op.kind);
  sk.stage = static_cast<uint8_t>(op.stage);
  // clang-format off
  sk.ints = {op.m,         op.n,          op.k,        op.heads,    op.kv_heads,
             op.d_head,    op.head_begin, op.head_end, op.elements, op.tokens,
             op.sequences, op.kv_latent,  op.d_rope,   op.d_value,  op.experts_total,
             op.top_k,     op.expert_matrices, op.window};
  // clang-format on
  sk.bits = {absl::bit_cast<uint64_t>(op.bytes_per_element),
             absl::bit_cast<uint64_t>(op.flops_per_element), absl::bit_cast<uint64_t>(op.bytes),
             absl::bit_cast<uint64_t>(op.routed), absl::bit_cast<uint64_t>(op.experts_touched)};
  sk.participants = op.participants;
  // A run asks few shapes, over and over: a slot of recent_shapes_, chosen
  // by a cheap mix of the fields that tell a run's shapes apart, holds the
  // last shape found there, compared whole before the table is hashed.
  uint64_t mix = (static_cast<uint64_t>(sk.kind) << 8 | sk.stage) * 0x9e3779b97f4a7c15ull;
  for (int64_t v : {op.m, op.n, op.k, op.head_begin, op.head_end, op.elements, op.tokens}) {
    mix = (mix ^ static_cast<uint64_t>(v)) * 0xff51afd7ed558ccdull;
  }
  RecentShape& recent = recent_shapes_[(mix >> 32) % recent_shapes_.size()];
  if (recent.id != 0 && recent.epoch == memo_epoch_ && recent.key == sk) return recent.id;
  auto [shape, added] = shapes_.try_emplace(sk, static_cast<uint32_t>(shapes_.size() + 1));
  if (added) memo_bytes_ += sizeof(ShapeKey) + 16;
  recent = RecentShape{sk, shape->second, memo_epoch_};
  return shape->second;
}

void RemoteDevice::RunKeysLocked(absl::Span<const Op> ops, bool add, std::vector<MemoKey>* keys,
                                 std::vector<int64_t>* offsets) const {
  thread_local std::string bytes;
  thread_local SeenLists seen;
  seen.clear();
  keys->assign(ops.size(), MemoKey{});
  offsets->assign(ops.size(), 0);
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (!Predictable(op)) continue;
    const int64_t base = op.seqs.front().past_tokens;
    const uint32_t seqs = CallListId(
        &seen, op.seqs.data(), op.seqs.size(), [] {},
        [&]() -> uint32_t {
          // A decode batch asks the same relative list step after step: one
          // of the last few found is compared with the op's sequences, and
          // only a list not among them is built and hashed.
          const size_t n = op.seqs.size();
          RecentList& recent =
              recent_lists_[(static_cast<uint64_t>(n) * 0x9e3779b97f4a7c15ull ^
                             static_cast<uint64_t>(op.seqs.front().request_id)) %
                            recent_lists_.size()];
          if (recent.id != 0 && recent.epoch == memo_epoch_ &&
              recent.bytes.size() == 1 + n * 2 * sizeof(int64_t)) {
            const char* at = recent.bytes.data() + 1;
            bool same = true;
            for (const devices::AttentionSeq& q : op.seqs) {
              int64_t rel = 0, request = 0;
              std::memcpy(&rel, at, sizeof rel);
              std::memcpy(&request, at + sizeof rel, sizeof request);
              at += 2 * sizeof(int64_t);
              if (rel != q.past_tokens - base || request != q.request_id) {
                same = false;
                break;
              }
            }
            if (same) return recent.id;
          }
          // 'r': relative lists, apart from the exact ones ('s').
          bytes.assign(1, 'r');
          for (const devices::AttentionSeq& q : op.seqs) {
            AppendRaw(&bytes, q.past_tokens - base);
            AppendRaw(&bytes, q.request_id);
          }
          uint32_t id = 0;
          if (add) {
            id = InternLocked(bytes);
          } else if (auto it = lists_.find(bytes); it != lists_.end()) {
            id = it->second;
          }
          if (id != 0) {
            recent.bytes = bytes;
            recent.id = id;
            recent.epoch = memo_epoch_;
          }
          return id;
        });
    const uint32_t stacks =
        CallListId(&seen, op.kv_head_stack.data(), op.kv_head_stack.size(), [] {},
                   [&] { return StackListIdLocked(op.kv_head_stack, add); });
    if (seqs == 0 || (!op.kv_head_stack.empty() && stacks == 0)) continue;  // not interned
    MemoKey& k = (*keys)[i];
    k.shape = ShapeIdLocked(op);
    k.seq_list = seqs;
    k.stack_list = stacks;
    (*offsets)[i] = base;
  }
}

const devices::Cost* RemoteDevice::FindRunLocked(const MemoKey& key, int64_t offset) const {
  if (key.shape == 0) return nullptr;
  auto it = runs_.find(key);
  if (it == runs_.end()) return nullptr;
  // The newest first: the run the simulation is in.
  for (uint32_t at = it->second + 1; at != 0;) {
    const Run& r = run_list_[at - 1];
    if (offset >= r.base && offset <= r.base + r.steps) {
      return &cost_pool_[run_steps_[r.first + static_cast<size_t>(offset - r.base)]];
    }
    at = r.older;
  }
  return nullptr;
}

void RemoteDevice::KeysLocked(absl::Span<const Op> ops, std::vector<MemoKey>* keys,
                              bool seqs_only) const {
  thread_local std::string bytes;
  thread_local SeenLists seen;
  seen.clear();
  auto id_of = [&](const void* data, size_t n, auto&& fill) {
    return CallListId(&seen, data, n, fill, [&] { return InternLocked(bytes); });
  };
  if (!seqs_only) keys->resize(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    MemoKey& k = (*keys)[i];
    if (seqs_only) {
      k.seq_list = id_of(op.seqs.data(), op.seqs.size(), [&] { SeqListBytes(op.seqs, &bytes); });
      continue;
    }
    k.shape = ShapeIdLocked(op);
    // A list's length is part of its content, so lists of different lengths
    // at one address are told apart by the content, not the address.
    k.seq_list = id_of(op.seqs.data(), op.seqs.size(), [&] { SeqListBytes(op.seqs, &bytes); });
    k.stack_list = CallListId(&seen, op.kv_head_stack.data(), op.kv_head_stack.size(), [] {},
                              [&] { return StackListIdLocked(op.kv_head_stack, /*add=*/true); });
  }
}

uint32_t RemoteDevice::StackListIdLocked(absl::Span<const int32_t> stacks, bool add) const {
  // Every op of a run asks one of a few placements: the last found in a
  // slot chosen by the list's length and ends is compared first.
  const uint64_t mix = (static_cast<uint64_t>(stacks.size()) * 0x9e3779b97f4a7c15ull ^
                        static_cast<uint64_t>(static_cast<uint32_t>(stacks.front())) << 32 ^
                        static_cast<uint32_t>(stacks.back())) *
                       0xff51afd7ed558ccdull;
  RecentList& recent = recent_stacks_[(mix >> 32) % recent_stacks_.size()];
  const size_t bytes = stacks.size() * sizeof(int32_t);
  if (recent.id != 0 && recent.epoch == memo_epoch_ && recent.bytes.size() == 1 + bytes &&
      std::memcmp(recent.bytes.data() + 1, stacks.data(), bytes) == 0) {
    return recent.id;
  }
  thread_local std::string content;
  StackListBytes(stacks, &content);
  uint32_t id = 0;
  if (add) {
    id = InternLocked(content);
  } else if (auto it = lists_.find(content); it != lists_.end()) {
    id = it->second;
  }
  if (id != 0) recent = RecentList{content, id, memo_epoch_};
  return id;
}

void RemoteDevice::TrimLocked() const {
  // An entry's share: its slot (a flat map keeps ~1/0.875 slots per entry)
  // and control byte.
  constexpr size_t kEntryBytes = sizeof(std::pair<const MemoKey, MemoEntry>) * 8 / 7 + 1;
  if (memo_bytes_ + memo_.size() * kEntryBytes <= options_.memo_bytes) return;
  // Emptied in place: the tables keep their capacity, so refilling them
  // does not grow and fault their pages in again.
  memo_.erase(memo_.begin(), memo_.end());
  runs_.erase(runs_.begin(), runs_.end());
  run_list_.clear();
  run_steps_.clear();
  cost_pool_.clear();
  lists_.erase(lists_.begin(), lists_.end());
  shapes_.erase(shapes_.begin(), shapes_.end());
  windows_.clear();  // prefetches in flight keep theirs; their answers are dropped
  pending_keys_.clear();  // their ids are void; a duplicate hint costs only its answer
  memo_bytes_ = 0;
  ++memo_epoch_;
}

// An asynchronous extension of a prediction (window set), or expected ops
// (window null), in flight.
struct RemoteDevice::Prefetch : RemoteDevice::CqTag {
  Endpoint* ep = nullptr;
  std::chrono::steady_clock::time_point sent;  // written on a stream
  uint64_t id = 0;
  std::shared_ptr<Window> window;
  OwnedOps expected;  // window null: the expected ops asked
  int from = 0;   // the request's ops are the window's at this step
  int steps = 0;  // asked for
  uint64_t epoch = 0;
  std::vector<Op> ops;
  std::deque<std::vector<devices::AttentionSeq>> lists;
  v1::DeviceAgent::Stub* stub = nullptr;
  grpc::ClientContext ctx;
  v1::EstimateRequest req;
  v1::EstimateResponse resp;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::EstimateResponse>> reader;
  grpc::Status status;
  std::shared_ptr<Prefetch> self;  // held while in flight (cq_'s tag is `this`)
  // A blocking Estimate's own request, sent as a prefetch is: its answer is
  // left to the caller (finished, status, resp), not memoised here.
  bool blocking = false;
  bool finished = false;
};

// One EstimateStream call to an endpoint: asynchronous Estimates written in
// order, one write at a time, answered in the same order. Every operation on
// it completes on cq_ with one of the three tags, and the taker handles it
// (OnStreamEventLocked).
struct RemoteDevice::Stream {
  Endpoint* ep = nullptr;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientAsyncReaderWriter<v1::EstimateRequest, v1::EstimateResponse>> rw;
  bool started = false, writing = false, reading = false;
  bool broken = false;   // an operation failed or the call was cancelled: no more writes
  bool answered = false; // it has answered at least once
  int pending = 0;       // operations on cq_ not yet taken
  std::deque<std::shared_ptr<Prefetch>> to_write, waiting;
  v1::EstimateResponse resp;
  CqTag start, write, read;
};

void RemoteDevice::StreamSendLocked(Stream* s) const {
  if (!s->started || s->broken) return;
  if (!s->writing && !s->to_write.empty()) {
    std::shared_ptr<Prefetch> p = std::move(s->to_write.front());
    s->to_write.pop_front();
    s->writing = true;
    ++s->pending;
    p->sent = std::chrono::steady_clock::now();
    s->rw->Write(p->req, &s->write);
    s->waiting.push_back(std::move(p));
  }
  if (!s->reading && !s->waiting.empty()) {
    s->reading = true;
    ++s->pending;
    s->rw->Read(&s->resp, &s->read);
  }
}

void RemoteDevice::OnStreamEventLocked(CqTag* t, bool ok,
                                       std::vector<std::shared_ptr<Prefetch>>* done) const {
  Stream* s = t->stream;
  --s->pending;
  if (t->kind == kStreamWrite) s->writing = false;
  if (t->kind == kStreamRead) s->reading = false;
  if (!ok && !s->broken) {
    // The agent ended the call (restarted, idle, refused the stream or a
    // request) or it was cancelled: what waits on it fails now and is asked
    // again by blocking calls; the next prefetch opens another stream, unless
    // this one never answered (the endpoint then takes unary calls).
    s->broken = true;
    s->ctx.TryCancel();
    if (!s->answered) s->ep->no_stream = true;
  }
  if (s->broken) {
    for (auto* q : {&s->waiting, &s->to_write}) {
      for (std::shared_ptr<Prefetch>& p : *q) {
        p->status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "estimate stream ended");
        done->push_back(std::move(p));
      }
      q->clear();
    }
    if (s->pending == 0) {  // nothing of it left on cq_
      streams_.erase(std::find_if(streams_.begin(), streams_.end(),
                                  [s](const std::unique_ptr<Stream>& e) { return e.get() == s; }));
    }
    return;
  }
  if (t->kind == kStreamStart) s->started = true;
  if (t->kind == kStreamRead) {
    std::shared_ptr<Prefetch> p = std::move(s->waiting.front());
    s->waiting.pop_front();
    p->resp.Swap(&s->resp);
    p->status = grpc::Status::OK;
    s->answered = true;
    done->push_back(std::move(p));
  }
  StreamSendLocked(s);
}

void RemoteDevice::CancelHungStreamsLocked() const {
  const auto now = std::chrono::steady_clock::now();
  const auto limit = std::chrono::duration<double>(options_.deadline_s);
  for (const std::unique_ptr<Stream>& s : streams_) {
    if (!s->broken && !s->waiting.empty() && now - s->waiting.front()->sent > limit) {
      s->ctx.TryCancel();  // its operations fail on cq_, failing what waits
    }
  }
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

void RemoteDevice::WaitForBinds() const {
  std::unique_lock<std::mutex> lock(mu_);
  bound_.wait(lock, [this] {
    return std::none_of(endpoints_.begin(), endpoints_.end(),
                        [](const std::unique_ptr<Endpoint>& e) { return e->binding; });
  });
}

void RemoteDevice::WaitForPrefetches() const { PollAnswers(/*until_idle=*/true); }

void RemoteDevice::PollAnswers(bool until_idle, const Prefetch* until) const {
  if (until != nullptr) until_idle = true;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (inflight_ == 0 || (until != nullptr && until->finished)) return;
    }
    // A bounded wait: another thread may take the last answer.
    const auto deadline = until_idle
                              ? std::chrono::system_clock::now() + std::chrono::milliseconds(50)
                              : std::chrono::system_clock::time_point{};
    void* tag = nullptr;
    bool ok = false;
    switch (cq_.AsyncNext(&tag, &ok, deadline)) {
      case grpc::CompletionQueue::GOT_EVENT: {
        auto* t = static_cast<CqTag*>(tag);
        if (t->kind != kUnary) {
          std::vector<std::shared_ptr<Prefetch>> done;
          {
            std::lock_guard<std::mutex> lock(mu_);
            OnStreamEventLocked(t, ok, &done);
          }
          for (const auto& d : done) OnExtended(d, d->status);
          break;
        }
        auto* p = static_cast<Prefetch*>(t);
        const std::shared_ptr<Prefetch> keep = std::move(p->self);
        OnExtended(keep, ok ? keep->status
                            : grpc::Status(grpc::StatusCode::CANCELLED, "call not completed"));
        break;
      }
      case grpc::CompletionQueue::TIMEOUT: {
        if (!until_idle) return;
        // A stream's answer later than the call deadline: the agent hangs.
        std::lock_guard<std::mutex> lock(mu_);
        CancelHungStreamsLocked();
        break;
      }
      case grpc::CompletionQueue::SHUTDOWN:
        return;
    }
  }
}

namespace {

// `ops` with their sequence and stack lists copied into `seqs` and
// `stacks` (lists shared in `ops` stay shared).
void CopyOwned(absl::Span<const Op> ops, std::vector<Op>* out,
               std::deque<std::vector<devices::AttentionSeq>>* seqs,
               std::deque<std::vector<int32_t>>* stacks) {
  // (list address, length) -> index of its copy.
  std::vector<std::tuple<const void*, size_t, size_t>> seen_seqs, seen_stacks;
  for (const Op& op : ops) {
    Op o = op;
    if (!op.seqs.empty()) {
      auto it = std::find_if(seen_seqs.begin(), seen_seqs.end(), [&](const auto& e) {
        return std::get<0>(e) == op.seqs.data() && std::get<1>(e) == op.seqs.size();
      });
      if (it == seen_seqs.end()) {
        seqs->emplace_back(op.seqs.begin(), op.seqs.end());
        seen_seqs.emplace_back(op.seqs.data(), op.seqs.size(), seqs->size() - 1);
        it = seen_seqs.end() - 1;
      }
      o.seqs = (*seqs)[std::get<2>(*it)];
    }
    if (!op.kv_head_stack.empty()) {
      auto it = std::find_if(seen_stacks.begin(), seen_stacks.end(), [&](const auto& e) {
        return std::get<0>(e) == op.kv_head_stack.data() &&
               std::get<1>(e) == op.kv_head_stack.size();
      });
      if (it == seen_stacks.end()) {
        stacks->emplace_back(op.kv_head_stack.begin(), op.kv_head_stack.end());
        seen_stacks.emplace_back(op.kv_head_stack.data(), op.kv_head_stack.size(),
                                 stacks->size() - 1);
        it = seen_stacks.end() - 1;
      }
      o.kv_head_stack = (*stacks)[std::get<2>(*it)];
    }
    out->push_back(o);
  }
}

// The costs an answer to the first `answered` of `ops` holds (by blocks,
// with their steps).
size_t ExpectedCosts(absl::Span<const Op> ops, absl::Span<const int32_t> steps, size_t answered) {
  size_t n = 0;
  ForEachExpectedBlock(answered, steps.first(std::min(steps.size(), answered)),
                       [&](size_t b, size_t e, int32_t k) {
                         size_t predictable = 0;
                         for (size_t i = b; i < e; ++i) predictable += Predictable(ops[i]) ? 1 : 0;
                         n += (e - b) + static_cast<size_t>(k) * predictable;
                       });
  return n;
}

size_t OwnedBytes(const std::deque<std::vector<devices::AttentionSeq>>& seqs,
                  const std::deque<std::vector<int32_t>>& stacks, size_t ops) {
  size_t n = ops * sizeof(Op);
  for (const auto& v : seqs) n += v.size() * sizeof(devices::AttentionSeq) + 32;
  for (const auto& v : stacks) n += v.size() * sizeof(int32_t) + 32;
  return n;
}

}  // namespace

void RemoteDevice::InsertStepsLocked(uint64_t id, const Window& window, int from, int steps,
                                     absl::Span<const Cost> costs, size_t at) const {
  thread_local std::vector<Op> step;
  thread_local std::deque<std::vector<devices::AttentionSeq>> shifted;
  thread_local std::vector<MemoKey> step_keys;
  for (int j = from; j < from + steps; ++j) {
    LookaheadStep(window.ops, j, &step, &shifted);
    // The steps differ only in their sequence lists.
    KeysLocked(step, &step_keys, /*seqs_only=*/j > from);
    for (size_t i = 0; i < step.size(); ++i) {
      memo_.emplace(step_keys[i], MemoEntry{costs[at++], j, id});
    }
    stats_.predicted_ops += static_cast<int64_t>(step.size());
  }
}

void RemoteDevice::LaunchLocked(Endpoint* ep, Prefetch* p) const {
  p->req.set_device_key(ep->device_key);
  ++inflight_;
  ++stats_.estimate_rpcs;
  if (!p->blocking) ++stats_.prefetch_rpcs;
  p->stub = ep->stub.get();
  p->ep = ep;
  prefetches_.insert(p);
}

std::shared_ptr<RemoteDevice::Prefetch> RemoteDevice::ExtendLocked(
    uint64_t id, const std::shared_ptr<Window>& window) const {
  Endpoint* ep = endpoints_[last_endpoint_].get();
  if (!ep->bound || ep->down_until > std::chrono::steady_clock::now()) return nullptr;
  auto p = std::make_shared<Prefetch>();
  p->id = id;
  p->window = window;
  p->from = window->horizon;
  p->steps = std::min(kPrefetchSteps, options_.lookahead_max);
  p->epoch = memo_epoch_;
  LookaheadStep(window->ops, p->from, &p->ops, &p->lists);
  if (p->ops.empty() || p->steps <= 0) return nullptr;
  EncodeOps(p->ops, &p->req);
  p->req.set_lookahead(p->steps);
  window->extending = true;
  LaunchLocked(ep, p.get());
  return p;
}

void RemoteDevice::StartPrefetch(const std::shared_ptr<Prefetch>& p) const {
  // Answers already in take no wait; taking them keeps few in flight.
  PollAnswers(/*until_idle=*/false);
  {
    // On the endpoint's estimate stream, opened if there is none.
    std::lock_guard<std::mutex> lock(mu_);
    if (!p->ep->no_stream) {
      Stream* s = nullptr;
      for (const std::unique_ptr<Stream>& e : streams_) {
        if (e->ep == p->ep && !e->broken) s = e.get();
      }
      if (s == nullptr) {
        s = streams_.emplace_back(std::make_unique<Stream>()).get();
        s->ep = p->ep;
        s->start = CqTag{kStreamStart, s};
        s->write = CqTag{kStreamWrite, s};
        s->read = CqTag{kStreamRead, s};
        // No deadline: CancelHungStreamsLocked holds each answer to one.
        if (!options_.token.empty()) {
          s->ctx.AddMetadata("authorization", "Bearer " + options_.token);
        }
        s->pending = 1;
        s->rw = p->ep->stub->AsyncEstimateStream(&s->ctx, &cq_, &s->start);
      }
      s->to_write.push_back(p);
      StreamSendLocked(s);
      return;
    }
  }
  // A call of its own: its deadline and token (a stream's request has its
  // stream's).
  PrepareContext(&p->ctx, options_.deadline_s);
  p->self = p;
  p->reader = p->stub->AsyncEstimate(&p->ctx, p->req, &cq_);
  p->reader->Finish(&p->resp, &p->status, static_cast<CqTag*>(p.get()));
}

std::shared_ptr<RemoteDevice::Prefetch> RemoteDevice::SendExpectedLocked() const {
  Endpoint* ep = endpoints_[last_endpoint_].get();
  if (pending_.ops.empty() || !ep->bound || ep->down_until > std::chrono::steady_clock::now()) {
    return nullptr;
  }
  auto p = std::make_shared<Prefetch>();
  p->expected = std::move(pending_);
  pending_ = OwnedOps{};
  EncodeOps(p->expected.ops, &p->req);
  p->req.set_expected(static_cast<int>(p->expected.ops.size()));
  if (std::any_of(p->expected.steps.begin(), p->expected.steps.end(),
                  [](int32_t k) { return k > 0; })) {
    p->req.mutable_expected_steps()->Add(p->expected.steps.begin(), p->expected.steps.end());
  }
  LaunchLocked(ep, p.get());
  return p;
}

void RemoteDevice::InsertExpectedLocked(const OwnedOps& expected, int answered,
                                        absl::Span<const Cost> unique,
                                        absl::Span<const uint32_t> index, size_t at) const {
  thread_local std::vector<MemoKey> fresh, run_keys;
  thread_local std::vector<int64_t> offsets;
  const std::vector<MemoKey>* keys = &expected.keys;
  if (expected.epoch != memo_epoch_) {  // the memo was emptied: list ids are void
    KeysLocked(expected.ops, &fresh);
    keys = &fresh;
  }
  for (const MemoKey& k : *keys) pending_keys_.erase(k);
  const absl::Span<const Op> ops = expected.ops;
  const absl::Span<const int32_t> steps = expected.steps;
  const size_t n = static_cast<size_t>(answered);
  if (n == 0) return;
  // The answer's costs join the pool once; the runs' steps name them.
  const auto pool_base = static_cast<uint32_t>(cost_pool_.size());
  cost_pool_.insert(cost_pool_.end(), unique.begin(), unique.end());
  memo_bytes_ += unique.size() * sizeof(Cost);
  ForEachExpectedBlock(
      n, steps.first(std::min(steps.size(), n)), [&](size_t b, size_t e, int32_t k) {
        // The block's costs at step 0, then, for j = 1..k, those of its
        // predictable ops at step j (agent.proto's order).
        const size_t block = at;
        const size_t size = e - b;
        size_t predictable = 0;
        if (k > 0) {
          RunKeysLocked(ops.subspan(b, size), /*add=*/true, &run_keys, &offsets);
          for (size_t i = b; i < e; ++i) predictable += Predictable(ops[i]) ? 1 : 0;
        }
        size_t rank = 0;
        for (size_t i = b; i < e; ++i) {
          const size_t now = block + (i - b);
          if (k == 0 || !Predictable(ops[i])) {
            memo_.emplace((*keys)[i], MemoEntry{unique[index[now]], -1, 0});
            continue;
          }
          const size_t r = rank++;
          const MemoKey& key = run_keys[i - b];
          if (key.shape == 0) continue;
          Run run{offsets[i - b], k, static_cast<uint32_t>(run_steps_.size()), 0};
          run_steps_.push_back(pool_base + index[now]);
          for (int32_t j = 1; j <= k; ++j) {
            run_steps_.push_back(
                pool_base + index[block + size + static_cast<size_t>(j - 1) * predictable + r]);
          }
          const auto newest = static_cast<uint32_t>(run_list_.size());
          auto [slot, added] = runs_.try_emplace(key, newest);
          if (!added) {
            run.older = slot->second + 1;
            slot->second = newest;
          }
          run_list_.push_back(run);
          // Its steps, itself, and a new key's slot and control byte.
          memo_bytes_ += (static_cast<size_t>(k) + 1) * sizeof(uint32_t) + sizeof(Run) +
                         (added ? sizeof(std::pair<const MemoKey, uint32_t>) * 8 / 7 + 1 : 0);
        }
        at = block + size + static_cast<size_t>(k) * predictable;
        stats_.expected_ops += static_cast<int64_t>(size + static_cast<size_t>(k) * predictable);
      });
}

void RemoteDevice::OnExtended(const std::shared_ptr<Prefetch>& p, const grpc::Status& st) const {
  if (p->blocking) {  // its caller takes the answer
    std::lock_guard<std::mutex> lock(mu_);
    p->status = st;
    p->finished = true;
    prefetches_.erase(p.get());
    --inflight_;
    return;
  }
  thread_local std::vector<Cost> costs;
  thread_local std::vector<uint32_t> index;
  costs.clear();
  index.clear();
  if (p->window == nullptr) {
    // Expected ops: an answer is memoised whenever it comes (keys are
    // computed now). Their costs stay unique, as the table sent them.
    const bool decoded = st.ok() && DecodeCostTable(p->resp.cost_table(), &costs, &index).ok();
    std::lock_guard<std::mutex> lock(mu_);
    const int n = static_cast<int>(p->expected.ops.size());
    const int answered = p->resp.expected_answered();
    const bool valid = decoded && answered >= 0 && answered <= n &&
                       index.size() == ExpectedCosts(p->expected.ops, p->expected.steps,
                                                     static_cast<size_t>(answered));
    if (!valid) ++stats_.prefetch_failures;
    InsertExpectedLocked(p->expected, valid ? answered : 0, costs, index, 0);
    TrimLocked();
    prefetches_.erase(p.get());
    --inflight_;
    return;
  }
  const bool decoded = st.ok() && DecodeCosts(p->resp.cost_table(), &costs).ok();
  std::lock_guard<std::mutex> lock(mu_);
  p->window->extending = false;
  const int n = static_cast<int>(p->ops.size());
  const int answered = p->resp.lookahead_answered();
  if (!decoded || answered < 0 || answered > p->steps ||
      costs.size() != static_cast<size_t>(n + n * answered)) {
    ++stats_.prefetch_failures;
  } else if (p->epoch == memo_epoch_) {
    // The request's own ops (step `from`) are in the memo already.
    InsertStepsLocked(p->id, *p->window, p->from + 1, answered, costs, static_cast<size_t>(n));
    p->window->horizon += answered;
    TrimLocked();
  }
  prefetches_.erase(p.get());
  --inflight_;
}

absl::Status RemoteDevice::Estimate(absl::Span<const Op> ops, absl::Span<Cost> costs) const {
  if (ops.size() != costs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(label_, ": ", ops.size(), " ops but ",
                                                   costs.size(), " cost slots"));
  }
  thread_local std::vector<MemoKey> keys;
  thread_local std::vector<size_t> missed;
  thread_local std::vector<Op> missed_ops;
  missed.clear();
  missed_ops.clear();
  const int lookahead_asked = std::min(kLookaheadStart, std::max(0, options_.lookahead_max));
  uint64_t epoch = 0;
  bool rekey = false;
  std::shared_ptr<Prefetch> prefetch;
  thread_local std::vector<MemoKey> run_keys;
  thread_local std::vector<int64_t> offsets;
  thread_local std::vector<Op> exact;
  thread_local std::vector<size_t> exact_at;
  thread_local std::vector<MemoKey> exact_keys;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.estimate_calls;
    // Ops a run holds are answered from it; only the others are keyed
    // exactly (their lists interned).
    thread_local std::vector<char> from_run;
    from_run.assign(ops.size(), 0);
    size_t run_hits = 0;
    if (!runs_.empty()) {
      RunKeysLocked(ops, /*add=*/false, &run_keys, &offsets);
      for (size_t i = 0; i < ops.size(); ++i) {
        if (const Cost* c = FindRunLocked(run_keys[i], offsets[i]); c != nullptr) {
          costs[i] = *c;
          from_run[i] = 1;
          ++run_hits;
          ++stats_.ops_memo_hits;
          ++stats_.expected_hits;
        }
      }
    }
    if (run_hits == 0) {
      KeysLocked(ops, &keys);
    } else if (run_hits < ops.size()) {
      exact.clear();
      exact_at.clear();
      for (size_t i = 0; i < ops.size(); ++i) {
        if (from_run[i]) continue;
        exact.push_back(ops[i]);
        exact_at.push_back(i);
      }
      KeysLocked(exact, &exact_keys);
      keys.resize(ops.size());
      for (size_t j = 0; j < exact.size(); ++j) keys[exact_at[j]] = exact_keys[j];
    }
    bool extended = false;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (from_run[i]) continue;
      auto it = memo_.find(keys[i]);
      if (it != memo_.end()) {
        costs[i] = it->second.cost;
        ++stats_.ops_memo_hits;
        // Near the end of its prediction: ask for the steps after it.
        const MemoEntry& e = it->second;
        if (e.step < 0) ++stats_.expected_hits;
        if (!extended && e.window != 0 && e.step > 0) {
          extended = true;
          auto w = windows_.find(e.window);
          if (w != windows_.end() && !w->second->extending &&
              e.step >= w->second->horizon - kPrefetchMargin) {
            prefetch = ExtendLocked(e.window, w->second);
          }
        }
      } else {
        missed.push_back(i);
        missed_ops.push_back(ops[i]);  // spans still shared: one list on the wire
      }
    }
    // Every op hit: the expected ops waiting go now, asynchronously, if
    // some are due.
    if (missed.empty() && prefetch == nullptr && pending_.due) prefetch = SendExpectedLocked();
    epoch = memo_epoch_;
    if (!missed.empty() && (expecting_ || prepared_) && inflight_ > 0) {
      // The answer in flight probably holds these ops: wait for it.
      ++stats_.expect_waits;
      mu_.unlock();  // re-taken below; `lock` releases it at the scope's end
      if (prefetch != nullptr) StartPrefetch(std::exchange(prefetch, nullptr));
      PollAnswers(/*until_idle=*/true);
      mu_.lock();
      KeysLocked(missed_ops, &keys);
      RunKeysLocked(missed_ops, /*add=*/false, &run_keys, &offsets);
      size_t kept = 0;
      for (size_t j = 0; j < missed.size(); ++j) {
        auto it = memo_.find(keys[j]);
        if (it != memo_.end()) {
          costs[missed[j]] = it->second.cost;
          ++stats_.ops_memo_hits;
        } else if (const Cost* c = FindRunLocked(run_keys[j], offsets[j]); c != nullptr) {
          costs[missed[j]] = *c;
          ++stats_.ops_memo_hits;
          ++stats_.expected_hits;
        } else {
          missed[kept] = missed[j];
          missed_ops[kept++] = missed_ops[j];
        }
      }
      missed.resize(kept);
      missed_ops.resize(kept);
      rekey = true;  // keys now hold the missed ops'; recomputed for `ops` below
    }
  }
  // Started with mu_ released: its callback takes mu_.
  if (prefetch != nullptr) StartPrefetch(prefetch);
  if (missed.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(const bool spread, Spread());
  std::vector<devices::StepMeasurement> absorb;
  std::vector<devices::StepKey> held;
  if (spread) RETURN_IF_ERROR(MeasureSpread(missed_ops, &absorb, &held));
  // The expected ops waiting ride along.
  OwnedOps extra;
  bool expecting = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    extra = std::move(pending_);
    pending_ = OwnedOps{};
    expecting = expecting_;
    if (!extra.ops.empty() && extra.epoch == memo_epoch_) {
      // Hints this call asks anyway are not sent twice.
      thread_local std::vector<MemoKey> asked;
      KeysLocked(missed_ops, &asked);
      const absl::flat_hash_set<MemoKey> asking(asked.begin(), asked.end());
      size_t kept = 0;
      for (size_t i = 0; i < extra.ops.size(); ++i) {
        if (asking.contains(extra.keys[i]) && extra.steps[i] == 0) {
          pending_keys_.erase(extra.keys[i]);
          continue;
        }
        extra.ops[kept] = extra.ops[i];
        extra.steps[kept] = extra.steps[i];
        extra.keys[kept++] = extra.keys[i];
      }
      extra.ops.resize(kept);
      extra.steps.resize(kept);
      extra.keys.resize(kept);
    }
  }
  const int lookahead = expecting ? 0 : lookahead_asked;
  v1::EstimateRequest req;
  if (extra.ops.empty()) {
    EncodeOps(missed_ops, &req);
  } else {
    std::vector<Op> all(missed_ops.begin(), missed_ops.end());
    all.insert(all.end(), extra.ops.begin(), extra.ops.end());
    EncodeOps(all, &req);
    req.set_expected(static_cast<int>(extra.ops.size()));
    if (std::any_of(extra.steps.begin(), extra.steps.end(), [](int32_t k) { return k > 0; })) {
      req.mutable_expected_steps()->Add(extra.steps.begin(), extra.steps.end());
    }
  }
  req.set_lookahead(lookahead);
  req.mutable_measured()->Reserve(static_cast<int>(absorb.size()));
  for (const devices::StepMeasurement& m : absorb) EncodeMeasurement(m, req.add_measured());
  v1::EstimateResponse resp;
  // The answer as DecodeCostTable gives it: its costs once apiece, and per
  // cost its position among them.
  std::vector<Cost> unique;
  std::vector<uint32_t> index;
  size_t predictable = 0;
  for (const Op& op : missed_ops) predictable += Predictable(op) ? 1 : 0;
  int used = 0;
  // The home costs the ops: its thread measuring ahead waits meanwhile.
  bool whole = false;
  if (spread) {
    std::lock_guard<std::mutex> lock(mu_);
    whole = !splits_;
  }
  if (whole) Busy(0, +1);
  // Decodes and checks an answer to `req`.
  auto take = [&]() -> grpc::Status {
    unique.clear();
    index.clear();
    if (absl::Status d = DecodeCostTable(resp.cost_table(), &unique, &index); !d.ok()) {
      return grpc::Status(grpc::StatusCode::INTERNAL,
                          absl::StrCat("answered a malformed cost table: ", d.message()));
    }
    const int answered = resp.lookahead_answered();
    const int expected = resp.expected_answered();
    if (answered < 0 || answered > lookahead || expected < 0 ||
        static_cast<size_t>(expected) > extra.ops.size() ||
        index.size() != missed.size() + predictable * answered +
                            ExpectedCosts(extra.ops, extra.steps, static_cast<size_t>(expected))) {
      return grpc::Status(
          grpc::StatusCode::INTERNAL,
          absl::StrCat("answered ", index.size(), " costs (", answered, " lookahead steps, ",
                       expected, " expected ops) for ", missed.size(), " ops, ", predictable,
                       " of them predictable, and ", extra.ops.size(), " expected"));
    }
    return grpc::Status::OK;
  };

  // A device with one endpoint asks on its estimate stream (opened if need
  // be), as its prefetches do: no call to set up, and the agent answers on
  // its stream thread. Answers come in order, so this one comes after those
  // in flight. If the stream fails, or answers amiss, the plain call below
  // asks again, with retries. (Several endpoints take plain calls, round
  // robin, as the header says.)
  bool streamed = false;
  if (!spread && endpoints_.size() == 1) {
    std::shared_ptr<Prefetch> p;
    {
      std::lock_guard<std::mutex> lock(mu_);
      Endpoint* ep = endpoints_[last_endpoint_].get();
      if (!ep->no_stream && ep->bound && ep->down_until <= std::chrono::steady_clock::now()) {
        p = std::make_shared<Prefetch>();
        p->blocking = true;
        p->req = std::move(req);
        LaunchLocked(ep, p.get());
        used = last_endpoint_;
      }
    }
    if (p != nullptr) {
      StartPrefetch(p);
      PollAnswers(/*until_idle=*/true, p.get());
      if (p->status.ok()) {
        resp = std::move(p->resp);
        streamed = take().ok();
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        --stats_.estimate_rpcs;  // counted once it is answered, below
      }
      req = std::move(p->req);
    }
  }
  const absl::Status called =
      streamed ? absl::OkStatus()
               : Call(
                     "Estimate",
                     [&](v1::DeviceAgent::Stub* stub, const std::string& key,
                         grpc::ClientContext* ctx) {
                       req.set_device_key(key);
                       resp.Clear();
                       grpc::Status st = stub->Estimate(ctx, req, &resp);
                       if (!st.ok()) return st;
                       return take();
                     },
                     spread ? 0 : -1, &used);
  if (whole) Busy(0, -1);
  if (!called.ok()) {
    // The expected ops were not answered: forget them (a later hint may
    // name them again).
    std::lock_guard<std::mutex> lock(mu_);
    InsertExpectedLocked(extra, 0, {}, {}, 0);
    return called;
  }
  const int answered = resp.lookahead_answered();
  // The asked ops' costs and their lookahead steps, in full.
  std::vector<Cost> answer;
  const size_t own = missed.size() + predictable * static_cast<size_t>(answered);
  answer.reserve(own);
  for (size_t j = 0; j < own; ++j) answer.push_back(unique[index[j]]);
  for (size_t j = 0; j < missed.size(); ++j) {
    costs[missed[j]] = answer[j];
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (spread && used == 0) home_holds_.insert(held.begin(), held.end());
  last_endpoint_ = used;
  ++stats_.estimate_rpcs;
  stats_.ops_memo_misses += static_cast<int64_t>(missed.size());
  TrimLocked();
  // The keys name lists by id; ids from before an emptying are void.
  if (rekey || memo_epoch_ != epoch) KeysLocked(ops, &keys);
  uint64_t id = 0;
  std::shared_ptr<Window> window;
  if (answered > 0 && predictable > 0) {
    id = next_window_++;
    window = std::make_shared<Window>();
    CopyOwned(missed_ops, &window->ops, &window->seqs, &window->stacks);
    window->horizon = answered;
    memo_bytes_ += OwnedBytes(window->seqs, window->stacks, window->ops.size());
    windows_.emplace(id, window);
  }
  for (size_t j = 0; j < missed.size(); ++j) {
    memo_.emplace(keys[missed[j]], MemoEntry{costs[missed[j]], 0, id});
  }
  if (window != nullptr) {
    InsertStepsLocked(id, *window, 1, answered, answer, missed.size());
  }
  if (!extra.ops.empty()) {
    InsertExpectedLocked(extra, resp.expected_answered(), unique, index, own);
  }
  return absl::OkStatus();
}

int RemoteDevice::ExpectSteps() const {
  if (options_.lookahead_max <= 0) return 0;
  int ok = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ok = lookahead_ok_;
  }
  if (ok < 0) {
    if (!DescribeOrError().ok()) return 0;  // no hints until an agent answers
    std::lock_guard<std::mutex> lock(mu_);
    ok = lookahead_ok_;
  }
  return ok == 1 ? std::min(kExpectSteps, options_.lookahead_max) : 0;
}

void RemoteDevice::Expect(absl::Span<const Op> ops, absl::Span<const int32_t> steps) const {
  if (ops.empty() || ExpectSteps() <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  expecting_ = true;
  const size_t before = pending_.ops.size();
  AddPendingLocked(ops, steps);
  if (pending_.ops.size() > before) pending_.due = true;
}

void RemoteDevice::ExpectLater(absl::Span<const Op> ops) const {
  if (ops.empty() || ExpectSteps() <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  expecting_ = true;
  AddPendingLocked(ops, {});
}

void RemoteDevice::AddPendingLocked(absl::Span<const Op> ops,
                                    absl::Span<const int32_t> steps) const {
  // Bounds on what waits: beyond them hints are dropped (the next call
  // that misses asks anyway).
  constexpr size_t kMaxPendingOps = 8192;
  constexpr int64_t kMaxPendingSequences = int64_t{1} << 18;
  thread_local std::vector<MemoKey> keys;
  if (pending_.ops.empty()) pending_.epoch = memo_epoch_;
  if (pending_.epoch != memo_epoch_) {  // emptied since: start the list again
    pending_ = OwnedOps{};
    pending_.epoch = memo_epoch_;
  }
  // Lists the ops share are interned once (KeysLocked) and copied once
  // (CopyOwned), and only for the ops kept.
  KeysLocked(ops, &keys);
  thread_local std::vector<MemoKey> run_keys;
  thread_local std::vector<int64_t> offsets;
  if (!runs_.empty()) RunKeysLocked(ops, /*add=*/false, &run_keys, &offsets);
  thread_local std::vector<Op> fresh;
  fresh.clear();
  int64_t sequences = pending_.sequences;
  for (size_t i = 0; i < ops.size(); ++i) {
    const int32_t k =
        steps.size() == ops.size() ? std::clamp<int32_t>(steps[i], 0, kMaxLookahead) : 0;
    const int64_t weight = static_cast<int64_t>(ops[i].seqs.size()) * (1 + k);
    if (pending_.ops.size() + fresh.size() >= kMaxPendingOps ||
        sequences + weight > kMaxPendingSequences) {
      break;
    }
    if (memo_.contains(keys[i]) ||
        (!runs_.empty() && FindRunLocked(run_keys[i], offsets[i]) != nullptr) ||
        !pending_keys_.insert(keys[i]).second) {
      continue;
    }
    fresh.push_back(ops[i]);
    pending_.keys.push_back(keys[i]);
    pending_.steps.push_back(k);
    sequences += weight;
  }
  CopyOwned(fresh, &pending_.ops, &pending_.seqs, &pending_.stacks);
  pending_.sequences = sequences;
}

void RemoteDevice::Prepare(absl::Span<const Op> ops) const {
  if (ops.empty()) return;
  std::shared_ptr<Prefetch> p;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Only where asking ahead is safe (an agent answers expected ops for
    // those devices only), and never for steps spread over endpoints.
    if (lookahead_ok_ != 1 || spread_ == 1 || (spread_ < 0 && endpoints_.size() > 1)) return;
    const size_t before = pending_.ops.size();
    AddPendingLocked(ops, {});
    if (pending_.ops.size() == before) return;  // all answered, waiting or in flight
    const size_t asked = pending_.ops.size();
    p = SendExpectedLocked();
    if (p == nullptr) return;  // not bound yet: the Estimate asks itself
    prepared_ = true;
    ++stats_.prepare_rpcs;
    stats_.prepared_ops += static_cast<int64_t>(asked - before);
  }
  StartPrefetch(p);
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

// ------------------------------------------------------------- sessions ----

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
      return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                          absl::StrCat(device_->label_, ": agent ",
                                       device_->endpoints_[endpoint_]->address,
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
