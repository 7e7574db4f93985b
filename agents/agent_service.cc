// AgentService's core (agents/agent_service.h): the header's free functions
// (CheckToken, DeviceKey, SpecKindName, AgentPresetSpec), creating the
// service and its own device, authorization, the devices it hosts (bound by
// spec, at most max_devices), and the stateless methods: Describe,
// Estimate (with its lookahead steps and expected ops), Measure and
// Execute, whose kernels poll the call's cancellation, deadline and budget.
// Estimate streams and sessions are agents/agent_service_streams.cc and
// agents/agent_service_sessions.cc.
#include "agents/agent_service.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "agents/agent_service_internal.h"
#include "agents/convert.h"
#include "common/status_macros.h"
#include "devices/attacc/attacc_device.h"
#include "devices/cta/cta_device.h"
#include "devices/interrupt.h"
#include "devices/lad/lad_device.h"
#include "devices/presets.h"
#include "devices/reference_attention.h"
#include "devices/registry.h"
#include "devices/spatten/spatten_device.h"
#include "devices/topick/topick_device.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "grpcpp/security/auth_context.h"

namespace servesim::agents {

namespace v1 = servesim::v1;

absl::Status CheckToken(const std::string& token, const std::string& where) {
  if (token.empty() || token.size() > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": the token is ", token.empty() ? "empty" : "longer than 4,096 characters",
        "; expected 1-4,096 printable ASCII characters without spaces"));
  }
  for (size_t i = 0; i < token.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c <= 0x20 || c >= 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": the token has ", c == ' ' ? "a space" : "a control or non-ASCII character",
          " at position ", i + 1, "; expected 1-4,096 printable ASCII characters without spaces"));
    }
  }
  return absl::OkStatus();
}

std::string DeviceKey(const v1::DeviceSpec& spec) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream out(&stream);
    out.SetSerializationDeterministic(true);
    spec.SerializeToCodedStream(&out);
  }
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return absl::StrFormat("%016x", h);
}

std::string SpecKindName(const v1::DeviceSpec& spec) {
  switch (spec.kind_case()) {
    case v1::DeviceSpec::kGpu:
      return "gpu";
    case v1::DeviceSpec::kAttacc:
      return "attacc";
    case v1::DeviceSpec::kTopick:
      return "topick";
    case v1::DeviceSpec::kSpatten:
      return "spatten";
    case v1::DeviceSpec::kCta:
      return "cta";
    case v1::DeviceSpec::kLad:
      return "lad";
    default:
      return "";
  }
}

absl::StatusOr<v1::DeviceSpec> AgentPresetSpec(const std::string& kind, std::string preset) {
  v1::DeviceSpec spec;
  if (kind == "gpu") {
    if (preset.empty()) preset = "a100-80gb";
    auto* g = spec.mutable_gpu();
    ASSIGN_OR_RETURN(*g->mutable_xpu(), devices::XpuPreset(preset));
    ASSIGN_OR_RETURN(*g->mutable_interconnect(), devices::LinkPreset("nvlink3"));
    g->set_dtype(v1::DTYPE_FP16);
  } else if (kind == "attacc") {
    if (preset.empty()) preset = "attacc_bank";
    ASSIGN_OR_RETURN(*spec.mutable_attacc()->mutable_attacc(), devices::AttAccPreset(preset));
    spec.mutable_attacc()->set_dtype(v1::DTYPE_FP16);
  } else if (kind == "topick") {
    if (preset.empty()) preset = "topick";
    ASSIGN_OR_RETURN(*spec.mutable_topick()->mutable_topick(), devices::TopickPreset(preset));
    spec.mutable_topick()->set_fidelity(v1::PRUNE_FIDELITY_ANALYTIC);
  } else if (kind == "spatten") {
    if (preset.empty()) preset = "spatten";
    ASSIGN_OR_RETURN(*spec.mutable_spatten()->mutable_spatten(), devices::SpattenPreset(preset));
    spec.mutable_spatten()->set_fidelity(v1::PRUNE_FIDELITY_ANALYTIC);
  } else if (kind == "cta") {
    if (preset.empty()) preset = "cta_0";
    ASSIGN_OR_RETURN(*spec.mutable_cta()->mutable_cta(), devices::CtaPreset(preset));
    spec.mutable_cta()->set_fidelity(v1::PRUNE_FIDELITY_ANALYTIC);
  } else if (kind == "lad") {
    if (preset.empty()) preset = "lad_1.5";
    ASSIGN_OR_RETURN(*spec.mutable_lad()->mutable_lad(), devices::LadPreset(preset));
    spec.mutable_lad()->set_fidelity(v1::PRUNE_FIDELITY_ANALYTIC);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device ", kind,
        ": unknown kind; registered: ", absl::StrJoin(devices::RegisteredDeviceKinds(), ", ")));
  }
  return spec;
}

namespace internal {

int64_t SteadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// heads x q_len x kv_len x d_head of q [heads, q_len, d_head] over a K of
// kv_len positions, saturating; 0 for shapes the kernel refuses anyway.
int64_t AttentionMacs(const std::vector<int64_t>& q_shape, int64_t kv_len) {
  if (q_shape.size() != 3) return 0;
  const double macs = static_cast<double>(q_shape[0]) * static_cast<double>(q_shape[1]) *
                      static_cast<double>(kv_len) * static_cast<double>(q_shape[2]);
  return macs >= 9.2e18 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(macs);
}

grpc::Status TooMuchWork(int64_t macs, int64_t max_macs) {
  return grpc::Status(
      grpc::StatusCode::RESOURCE_EXHAUSTED,
      absl::StrCat("q, k: heads x q_len x kv_len x d_head = ", macs,
                   " multiply-accumulates; this agent runs at most ", max_macs, " per call"));
}

}  // namespace internal

using internal::AttentionMacs;
using internal::SteadyNs;
using internal::TooMuchWork;

AgentService::AgentService(AgentServiceOptions options) : options_(std::move(options)) {
  kind_ = SpecKindName(options_.spec);
}

absl::StatusOr<std::unique_ptr<AgentService>> AgentService::Create(AgentServiceOptions options) {
  if (options.max_tensor_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tensor_bytes = ", options.max_tensor_bytes, "; expected >= 1"));
  }
  if (options.max_sessions_per_client < 1 || !(options.session_idle_s > 0) ||
      !(options.call_budget_s > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_sessions_per_client = ", options.max_sessions_per_client,
                     ", session_idle_s = ", options.session_idle_s,
                     ", call_budget_s = ", options.call_budget_s, "; expected >= 1, > 0 and > 0"));
  }
  if (!options.token.empty()) RETURN_IF_ERROR(CheckToken(options.token, "the agent's token"));
  if (options.max_kv_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_kv_bytes = ", options.max_kv_bytes, "; expected >= 1"));
  }
  std::unique_ptr<AgentService> s(new AgentService(std::move(options)));
  if (s->kind_.empty()) {
    return absl::InvalidArgumentError("the agent's DeviceSpec selects no device kind");
  }
  ASSIGN_OR_RETURN(auto device, devices::CreateDevice(s->options_.spec));
  auto own = std::make_shared<Hosted>();
  own->spec = s->options_.spec;
  const devices::DeviceDescription d = device->Describe();
  own->accepts = d.accepts;
  own->lookahead_ok = d.lookahead_ok;
  own->device = std::move(device);
  s->own_ = std::move(own);
  return s;
}

AgentService::~AgentService() {
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    stop_watch_ = true;
  }
  streams_cv_.notify_all();
  if (watch_.joinable()) watch_.join();
}

grpc::Status AgentService::Authorize(grpc::ServerContextBase* ctx) {
  calls_.fetch_add(1);
  if (options_.token.empty()) return grpc::Status::OK;
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  const std::string want = "Bearer " + options_.token;
  if (it == md.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "this agent requires 'authorization: Bearer <token>' metadata");
  }
  const std::string got(it->second.data(), it->second.size());
  // Compare every byte, whatever the first difference.
  unsigned diff = got.size() != want.size();
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) diff |= got[i] ^ want[i];
  if (diff != 0) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong bearer token");
  }
  return grpc::Status::OK;
}

std::string AgentService::CallerOf(const grpc::ServerContextBase* ctx) {
  const std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    std::string id;
    for (const grpc::string_ref& v : auth->GetPeerIdentity()) {
      absl::StrAppend(&id, id.empty() ? "" : ",", std::string(v.data(), v.size()));
    }
    if (!id.empty()) return absl::StrCat("cert:", id);
  }
  // "ipv4:127.0.0.1:40312", "ipv6:[::1]:40312": the port changes with each
  // connection, the host does not.
  std::string peer = ctx->peer();
  const size_t colon = peer.rfind(':');
  if (colon != std::string::npos && colon > peer.find(':')) peer.resize(colon);
  return peer;
}

absl::StatusOr<devices::AttentionResult> AgentService::RunKernel(
    grpc::ServerContext* ctx, const devices::Device& device, const devices::AttentionCall& call) {
  bool stopped = false;
  devices::InterruptScope scope(CallPoll(ctx, &stopped));
  absl::StatusOr<devices::AttentionResult> r = device.Execute(call);
  if (stopped) interrupted_.fetch_add(1);
  return r;
}

std::function<absl::Status()> AgentService::CallPoll(grpc::ServerContext* ctx,
                                                     bool* stopped) const {
  const int64_t start_ns = SteadyNs();
  const int64_t budget_ns = static_cast<int64_t>(std::min(options_.call_budget_s, 1e9) * 1e9);
  // Kernels poll often (SpAtten between heads); asking gRPC whether the call
  // was cancelled takes its locks, and at that rate the handler contended
  // with gRPC's own threads for them (system time equal to the kernels').
  // Once a millisecond is soon enough to stop.
  int64_t next_ns = 0;
  return [this, ctx, stopped, start_ns, budget_ns, next_ns,
          deadline = ctx->deadline()]() mutable -> absl::Status {
    const int64_t now = SteadyNs();
    if (now < next_ns) return absl::OkStatus();
    next_ns = now + 1'000'000;
    absl::Status st = PollCall(ctx, deadline, start_ns, budget_ns);
    *stopped = *stopped || !st.ok();
    return st;
  };
}

absl::Status AgentService::PollCall(grpc::ServerContext* ctx,
                                    std::chrono::system_clock::time_point deadline,
                                    int64_t start_ns, int64_t budget_ns) const {
  if (ctx->IsCancelled()) {
    return absl::CancelledError("the caller cancelled the call; the kernel stopped");
  }
  if (std::chrono::system_clock::now() > deadline) {
    return absl::DeadlineExceededError("the call's deadline passed; the kernel stopped");
  }
  if (SteadyNs() - start_ns > budget_ns) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the kernel ran past this agent's budget of ", options_.call_budget_s,
                     " s per call (servesim-agent --call-budget-s) and stopped"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const AgentService::Hosted>> AgentService::Find(
    const std::string& key) {
  if (key.empty()) return own_;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& h : devices_) {
    if (h->key == key) return h;
  }
  return absl::NotFoundError(
      absl::StrCat("device_key ", key,
                   " is not bound on this agent (restarted?); call Describe with its "
                   "spec"));
}

absl::StatusOr<std::shared_ptr<const AgentService::Hosted>> AgentService::Bind(
    const v1::DeviceSpec& spec) {
  if (spec.kind_case() != options_.spec.kind_case()) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec: this agent hosts '", kind_, "' devices; the spec is '",
                     SpecKindName(spec).empty() ? "(none)" : SpecKindName(spec), "'"));
  }
  const std::string key = DeviceKey(spec);
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& h : devices_) {
    if (h->key == key) return h;
  }
  // Created under the lock: concurrent binds of one spec create it once.
  auto device = devices::CreateDevice(spec);
  if (!device.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec: ", device.status().message()));
  }
  auto h = std::make_shared<Hosted>();
  h->key = key;
  h->spec = spec;
  const devices::DeviceDescription d = (*device)->Describe();
  h->accepts = d.accepts;
  h->lookahead_ok = d.lookahead_ok;
  h->device = std::move(*device);
  devices_.push_back(h);
  while (static_cast<int>(devices_.size()) > options_.max_devices) devices_.pop_front();
  return std::shared_ptr<const Hosted>(std::move(h));
}

grpc::Status AgentService::Describe(grpc::ServerContext* ctx, const v1::DescribeRequest* req,
                                    v1::DescribeResponse* resp) {
  if (auto st = Authorize(ctx); !st.ok()) return st;
  absl::StatusOr<std::shared_ptr<const Hosted>> h =
      req->has_spec() ? Bind(req->spec()) : absl::StatusOr<std::shared_ptr<const Hosted>>(own_);
  if (!h.ok()) return ToGrpcStatus(h.status());
  EncodeDescription((*h)->device->Describe(), resp);
  resp->set_device_key((*h)->key);
  resp->set_model_version(absl::StrCat("servesim 0.1.0; ", kAgentProtocolVersion));
  *resp->mutable_spec() = (*h)->spec;
  return grpc::Status::OK;
}

grpc::Status AgentService::Estimate(grpc::ServerContext* ctx, const v1::EstimateRequest* req,
                                    v1::EstimateResponse* resp) {
  if (auto st = Authorize(ctx); !st.ok()) return st;
  return EstimateAuthorized(req, resp);
}

namespace {

bool Accepted(const std::vector<devices::OpKind>& accepts, const devices::Op& op) {
  return std::find(accepts.begin(), accepts.end(), op.kind) != accepts.end();
}

// Checks a request's expected ops (the last `expected` of its `ops` ops)
// and their steps.
grpc::Status CheckExpected(const v1::EstimateRequest& req, size_t ops) {
  const int expected = req.expected();
  if (expected < 0 || expected > static_cast<int>(ops)) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("expected = ", expected, "; expected 0..", ops, " (the ops sent)"));
  }
  if (req.expected_steps_size() != 0 && req.expected_steps_size() != expected) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("expected_steps: ", req.expected_steps_size(),
                     " values; expected none or one per expected op (", expected, ")"));
  }
  for (int i = 0; i < req.expected_steps_size(); ++i) {
    if (req.expected_steps(i) < 0 || req.expected_steps(i) > kMaxLookahead) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("expected_steps[", i, "] = ", req.expected_steps(i),
                                       "; expected 0..", kMaxLookahead));
    }
  }
  return grpc::Status::OK;
}

// The lookahead steps: each predictable op again, its sequences j steps
// later. Ops that shared a sequence list share its shifted copy, as they
// would in the iteration that sends them. A step the device refuses (a
// context past its capacity) ends the lookahead; the ops' own answer
// stands.
// The steps together cost at most kMaxOpSequences sequences, as the
// request itself may: past that the answer is shorter.
// Appends the steps' costs to `costs`; returns how many steps they are.
int CostLookahead(const devices::Device& device, bool lookahead_ok,
                  absl::Span<const devices::Op> asked, int lookahead,
                  std::vector<devices::Cost>* costs) {
  int answered = 0;
  int64_t step_sequences = 0;
  for (const devices::Op& op : asked) {
    if (Predictable(op)) step_sequences += static_cast<int64_t>(op.seqs.size());
  }
  const int64_t affordable = kMaxOpSequences / std::max<int64_t>(step_sequences, 1);
  std::vector<devices::Op> step;
  std::deque<std::vector<devices::AttentionSeq>> shifted;
  std::vector<devices::Cost> step_costs;
  for (int j = 1; j <= lookahead && j <= affordable && lookahead_ok; ++j) {
    LookaheadStep(asked, j, &step, &shifted);
    if (step.empty()) break;
    step_costs.assign(step.size(), devices::Cost{});
    if (!device.Estimate(step, absl::MakeSpan(step_costs)).ok()) break;
    costs->insert(costs->end(), step_costs.begin(), step_costs.end());
    answered = j;
  }
  return answered;
}

// The expected ops, by blocks with their steps (see agent.proto). A
// block is costed at once; when the device refuses it, a block without
// steps is answered one op at a time up to the refused op, and the answer
// ends there. So does it at the first op of a kind the device does not
// take. The steps of all blocks together cost at most kMaxOpSequences
// sequences.
// Appends their costs to `costs`; returns how many expected ops they answer.
int CostExpected(const devices::Device& device, const std::vector<devices::OpKind>& accepts,
                 absl::Span<const devices::Op> hinted, absl::Span<const int32_t> steps,
                 std::vector<devices::Cost>* costs) {
  int expected_answered = 0;
  std::vector<devices::Op> step;
  std::deque<std::vector<devices::AttentionSeq>> shifted;
  std::vector<devices::Cost> step_costs;
  int64_t budget = kMaxOpSequences;
  bool stop = false;
  ForEachExpectedBlock(hinted.size(), steps, [&](size_t b, size_t e, int32_t n) {
    if (stop) return;
    size_t usable = b;
    while (usable < e && Accepted(accepts, hinted[usable])) ++usable;
    stop = usable < e;
    const auto block = hinted.subspan(b, usable - b);
    if (block.empty()) return;
    const size_t at = costs->size();
    costs->resize(at + block.size());
    if (!device.Estimate(block, absl::MakeSpan(*costs).subspan(at)).ok()) {
      costs->resize(at);
      stop = true;
      if (n > 0) return;
      for (size_t i = 0; i < block.size(); ++i) {
        devices::Cost c;
        if (!device.Estimate(block.subspan(i, 1), absl::MakeSpan(&c, 1)).ok()) break;
        costs->push_back(c);
        ++expected_answered;
      }
      return;
    }
    for (int32_t j = 1; j <= n; ++j) {
      LookaheadStep(block, j, &step, &shifted);
      if (step.empty()) break;
      for (const devices::Op& op : step) budget -= static_cast<int64_t>(op.seqs.size());
      step_costs.assign(step.size(), devices::Cost{});
      if (budget < 0 || !device.Estimate(step, absl::MakeSpan(step_costs)).ok()) {
        costs->resize(at);
        stop = true;
        return;
      }
      costs->insert(costs->end(), step_costs.begin(), step_costs.end());
    }
    expected_answered += static_cast<int>(block.size());
  });
  return expected_answered;
}

}  // namespace

grpc::Status AgentService::EstimateAuthorized(const v1::EstimateRequest* req,
                                              v1::EstimateResponse* resp) {
  auto h = Find(req->device_key());
  if (!h.ok()) return ToGrpcStatus(h.status());
  DecodedOps ops;
  if (absl::Status st = DecodeOps(*req, &ops); !st.ok()) return ToGrpcStatus(st);
  if (grpc::Status st = CheckExpected(*req, ops.ops.size()); !st.ok()) return st;
  const int expected = req->expected();
  const absl::Span<const devices::Op> asked =
      absl::MakeConstSpan(ops.ops).first(ops.ops.size() - static_cast<size_t>(expected));
  const absl::Span<const devices::Op> hinted = absl::MakeConstSpan(ops.ops).subspan(asked.size());
  const auto& accepts = (*h)->accepts;
  for (size_t i = 0; i < asked.size(); ++i) {
    if (!Accepted(accepts, asked[i])) {
      return grpc::Status(
          grpc::StatusCode::UNIMPLEMENTED,
          absl::StrCat("ops[", i, "]: device '", kind_, "' does not implement op kind ",
                       static_cast<int>(EncodeOpKind(ops.ops[i].kind))));
    }
  }
  const int lookahead = req->lookahead();
  if (lookahead < 0 || lookahead > kMaxLookahead) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("lookahead = ", lookahead, "; expected 0..", kMaxLookahead));
  }
  if (req->measured_size() > 0) {
    // Steps other agents measured (Measure): into the memo before costing.
    auto measured = DecodeMeasurements(req->measured(), kMaxMeasuredSteps, "measured");
    if (!measured.ok()) return ToGrpcStatus(measured.status());
    if (absl::Status st = (*h)->device->Absorb(*measured); !st.ok()) return ToGrpcStatus(st);
  }
  std::vector<devices::Cost> costs(asked.size());
  if (absl::Status st = (*h)->device->Estimate(asked, absl::MakeSpan(costs)); !st.ok()) {
    return ToGrpcStatus(st);
  }
  resp->set_lookahead_answered(
      CostLookahead(*(*h)->device, (*h)->lookahead_ok, asked, lookahead, &costs));
  int expected_answered = 0;
  if ((*h)->lookahead_ok && !hinted.empty()) {
    expected_answered = CostExpected(*(*h)->device, accepts, hinted, req->expected_steps(), &costs);
  }
  resp->set_expected_answered(expected_answered);
  EncodeCosts(costs, resp->mutable_cost_table());
  return grpc::Status::OK;
}

grpc::Status AgentService::Measure(grpc::ServerContext* ctx, const v1::MeasureRequest* req,
                                   v1::MeasureResponse* resp) {
  if (auto st = Authorize(ctx); !st.ok()) return st;
  auto h = Find(req->device_key());
  if (!h.ok()) return ToGrpcStatus(h.status());
  auto steps = DecodeStepKeys(req->steps(), kMaxMeasureSteps, "steps");
  if (!steps.ok()) return ToGrpcStatus(steps.status());
  // The kernels stop between steps when the caller cancels, its deadline
  // passes or the call's budget is spent (as Execute's do between heads).
  bool stopped = false;
  absl::StatusOr<std::vector<devices::StepMeasurement>> measured;
  {
    devices::InterruptScope scope(CallPoll(ctx, &stopped));
    const int parts = std::max(1, req->parts());
    if (parts > devices::kMaxLayerParts || req->part() < 0 || req->part() >= parts) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("part = ", req->part(), ", parts = ", req->parts(),
                                       "; expected parts in [0, ", devices::kMaxLayerParts,
                                       "] and part in [0, parts)"));
    }
    if (req->ahead()) {
      if (parts > 1) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "ahead: measures whole steps, not shares (parts must be 0 or 1)");
      }
      const absl::Status st = (*h)->device->MeasureAhead(*steps);
      if (stopped) interrupted_.fetch_add(1);
      return ToGrpcStatus(st);
    }
    measured = parts > 1 ? (*h)->device->MeasureLayers(*steps, req->part(), parts)
                         : (*h)->device->Measure(*steps);
  }
  if (stopped) interrupted_.fetch_add(1);
  if (!measured.ok()) return ToGrpcStatus(measured.status());
  resp->mutable_measured()->Reserve(static_cast<int>(measured->size()));
  for (const devices::StepMeasurement& m : *measured) EncodeMeasurement(m, resp->add_measured());
  return grpc::Status::OK;
}

grpc::Status AgentService::Execute(grpc::ServerContext* ctx, const v1::ExecuteRequest* req,
                                   v1::ExecuteResponse* resp) {
  if (auto st = Authorize(ctx); !st.ok()) return st;
  auto h = Find(req->device_key());
  if (!h.ok()) return ToGrpcStatus(h.status());
  devices::AttentionCall call;
  for (auto [field, src, dst] :
       {std::tuple{"q", &req->q(), &call.q}, std::tuple{"k", &req->k(), &call.k},
        std::tuple{"v", &req->v(), &call.v}}) {
    auto t = DecodeTensor(*src, options_.max_tensor_bytes, field);
    if (!t.ok()) return ToGrpcStatus(t.status());
    *dst = std::move(*t);
  }
  call.scale = req->scale();
  if (call.k.shape.size() == 3) {
    if (const int64_t macs = AttentionMacs(call.q.shape, call.k.shape[1]);
        macs > options_.max_execute_macs) {
      return TooMuchWork(macs, options_.max_execute_macs);
    }
  }
  auto r = RunKernel(ctx, *(*h)->device, call);
  if (!r.ok()) return ToGrpcStatus(r.status());
  EncodeTensor(r->out, resp->mutable_out());
  EncodeStats(r->stats, resp->mutable_stats());
  return grpc::Status::OK;
}

}  // namespace servesim::agents
