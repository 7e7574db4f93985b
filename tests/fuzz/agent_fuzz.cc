// libFuzzer target: the device agent's request handling
// (agents/agent_service.h), without the network: the input is decoded as a
// DescribeRequest, EstimateRequest, ExecuteRequest or MeasureRequest and
// handed to the service implementation of one device kind, as gRPC would
// after decoding.
//
// Input: byte 0 picks the kind (gpu, attacc, topick, spatten, lad, cta;
// modulo 6), byte 1 the method (Describe, Estimate, Execute, Measure; modulo
// 4: inputs written for three methods keep theirs where byte 1 < 3), the
// rest is the request's wire encoding (undecodable bytes are dropped, as
// gRPC drops them). Every call must return (no crash, abort, hang or huge
// allocation: scripts/fuzz.sh runs with -timeout and -rss_limit_mb) with an
// OK answer that is consistent, or an error status with a message.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "agents/agent_service.h"
#include "agents/convert.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/server_context.h"

namespace {

namespace v1 = servesim::v1;
using servesim::agents::AgentService;

constexpr const char* kKinds[] = {"gpu", "attacc", "topick", "spatten", "lad", "cta"};
constexpr int kNumKinds = 6;

void Check(bool ok) {
  if (!ok) std::abort();
}

AgentService* Service(int kind) {
  static std::unique_ptr<AgentService>* services = [] {
    auto* s = new std::unique_ptr<AgentService>[kNumKinds];
    for (int i = 0; i < kNumKinds; ++i) {
      servesim::agents::AgentServiceOptions o;
      o.spec = *servesim::agents::AgentPresetSpec(kKinds[i], "");
      // Small limits, so that what the defaults would allow at scale shows
      // up here as a refusal rather than a slow input.
      o.max_tensor_bytes = 1 << 16;
      o.max_execute_macs = 1 << 22;
      o.max_devices = 4;
      auto created = AgentService::Create(o);
      if (!created.ok()) std::abort();
      s[i] = std::move(*created);
    }
    // Undecodable strings are logged by protobuf on every such input.
    google::protobuf::SetLogHandler(nullptr);
    return s;
  }();
  return services[kind].get();
}

void CheckError(const grpc::Status& st) {
  Check(!st.error_message().empty());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  AgentService* service = Service(data[0] % kNumKinds);
  const int method = data[1] % 4;
  const char* body = reinterpret_cast<const char*>(data + 2);
  const int body_size = static_cast<int>(size - 2);
  grpc::ServerContext ctx;
  if (method == 0) {
    v1::DescribeRequest req;
    if (!req.ParseFromArray(body, body_size)) return 0;
    v1::DescribeResponse resp;
    const grpc::Status st = service->Describe(&ctx, &req, &resp);
    if (st.ok()) {
      Check(resp.kind() == service->kind());
    } else {
      CheckError(st);
    }
  } else if (method == 1) {
    v1::EstimateRequest req;
    if (!req.ParseFromArray(body, body_size)) return 0;
    v1::EstimateResponse resp;
    const grpc::Status st = service->Estimate(&ctx, &req, &resp);
    if (!st.ok()) {
      CheckError(st);
      return 0;
    }
    std::vector<servesim::devices::Cost> costs;
    Check(servesim::agents::DecodeCosts(resp.cost_table(), &costs).ok());
    // The asked ops are all answered; the expected ones from the first, up
    // to the first the device refuses (possibly none).
    Check(resp.expected_answered() >= 0 && resp.expected_answered() <= req.expected());
    Check(costs.size() >=
          static_cast<size_t>(req.ops_size() - req.expected() + resp.expected_answered()));
    Check(resp.lookahead_answered() >= 0 && resp.lookahead_answered() <= req.lookahead());
    for (const servesim::devices::Cost& c : costs) {
      Check(std::isfinite(c.time_s) && c.time_s >= 0);
      Check(std::isfinite(c.flops) && std::isfinite(c.dram_bytes));
    }
  } else if (method == 3) {
    v1::MeasureRequest req;
    if (!req.ParseFromArray(body, body_size)) return 0;
    v1::MeasureResponse resp;
    const grpc::Status st = service->Measure(&ctx, &req, &resp);
    if (!st.ok()) {
      CheckError(st);
      return 0;
    }
    Check(resp.measured_size() >= req.steps_size());
    for (const v1::StepMeasurement& m : resp.measured()) {
      Check(m.values_size() <= servesim::devices::kMaxStepValues);
      for (double v : m.values()) Check(std::isfinite(v));
    }
  } else {
    v1::ExecuteRequest req;
    if (!req.ParseFromArray(body, body_size)) return 0;
    v1::ExecuteResponse resp;
    const grpc::Status st = service->Execute(&ctx, &req, &resp);
    if (!st.ok()) {
      CheckError(st);
      return 0;
    }
    int64_t elements = 1;
    for (int64_t d : resp.out().shape()) elements *= d;
    Check(resp.out().type() == v1::ELEMENT_TYPE_FP32);
    Check(static_cast<int64_t>(resp.out().data().size()) == elements * 4);
  }
  return 0;
}
