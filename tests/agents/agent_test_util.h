// What the device-agent tests share: device specs, a sample iteration's ops
// and its decode steps, an agent started in this process, bit-level cost
// comparison, throw-away TLS certificates.
#ifndef SERVESIM_TESTS_AGENTS_AGENT_TEST_UTIL_H_
#define SERVESIM_TESTS_AGENTS_AGENT_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agents/agent_server.h"
#include "agents/agent_service.h"
#include "agents/client_options.h"
#include "agents/convert.h"
#include "agents/remote_device.h"
#include "devices/attacc/attacc_device.h"
#include "devices/device.h"
#include "devices/presets.h"
#include "devices/registry.h"
#include "devices/tensor.h"
#include "devices/topick/topick_device.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace servesim::agents::test {

namespace v1 = servesim::v1;
using devices::AttentionSeq;
using devices::Cost;
using devices::Op;
using devices::OpKind;

using test_util::ReadFile;
using test_util::WriteFile;
inline std::string FreshDir() { return test_util::FreshDir("agent"); }

inline uint64_t Bits(double d) {
  uint64_t b;
  std::memcpy(&b, &d, 8);
  return b;
}

inline void ExpectSameBits(const Cost& a, const Cost& b) {
  for (double Cost::*f :
       {&Cost::time_s, &Cost::flops, &Cost::dram_bytes, &Cost::link_bytes, &Cost::compute_energy_pj,
        &Cost::dram_energy_pj, &Cost::link_energy_pj, &Cost::bg_bus_bytes, &Cost::tsv_bytes,
        &Cost::external_bytes, &Cost::cycles, &Cost::score_s, &Cost::softmax_s, &Cost::context_s,
        &Cost::internode_bytes}) {
    EXPECT_EQ(Bits(a.*f), Bits(b.*f));
  }
}

// The costs an Estimate answered, decoded from its cost table.
inline std::vector<Cost> CostsOf(const v1::EstimateResponse& resp) {
  std::vector<Cost> costs;
  const absl::Status st = DecodeCosts(resp.cost_table(), &costs);
  EXPECT_TRUE(st.ok()) << st;
  return costs;
}

inline v1::DeviceSpec GpuSpec() {
  v1::DeviceSpec spec;
  auto* g = spec.mutable_gpu();
  *g->mutable_xpu() = *devices::XpuPreset("a100-80gb");
  *g->mutable_interconnect() = *devices::LinkPreset("nvlink3");
  g->set_dtype(v1::DTYPE_FP16);
  return spec;
}

inline v1::DeviceSpec AttAccSpec() {
  v1::DeviceSpec spec;
  *spec.mutable_attacc()->mutable_attacc() = *devices::AttAccPreset("attacc_bank");
  spec.mutable_attacc()->set_dtype(v1::DTYPE_FP16);
  return spec;
}

// One decode iteration's ops (GPT-3-like shapes), attention in two head
// groups over the same sequences.
struct SampleOps {
  std::vector<AttentionSeq> seqs{{1, 100, 7}, {1, 2047, 8}, {1, 5, -1}};
  std::vector<int32_t> stacks;
  std::vector<Op> ops;
  explicit SampleOps(bool gemm_and_elementwise = true) {
    for (int g = 0; g < 2; ++g) {
      Op a;
      a.kind = OpKind::kAttention;
      a.stage = devices::Stage::kAttention;
      a.heads = 96, a.kv_heads = 96, a.d_head = 128;
      a.seqs = seqs;
      a.head_begin = 48 * g, a.head_end = 48 * (g + 1);
      ops.push_back(a);
    }
    Op gemm;
    gemm.kind = OpKind::kGemm;
    gemm.stage = devices::Stage::kFf1;
    gemm.m = 3, gemm.n = 12288, gemm.k = 1536;
    ops.push_back(gemm);
    if (gemm_and_elementwise) {
      Op e;
      e.kind = OpKind::kElementwise;
      e.stage = devices::Stage::kNorm;
      e.elements = 3 * 12288, e.bytes_per_element = 4, e.flops_per_element = 5;
      ops.push_back(e);
      Op r;
      r.kind = OpKind::kAllReduce;
      r.stage = devices::Stage::kAllReduce;
      r.bytes = 1e6, r.participants = 8;
      ops.push_back(r);
    }
  }
};

// An agent in this process, on a free loopback port.
struct LocalAgent {
  std::unique_ptr<AgentService> service;
  RunningAgent running;
  std::string address() const { return absl::StrCat("127.0.0.1:", running.port); }
  ~LocalAgent() {
    if (running.server) {
      service->EndStreams();  // else Shutdown waits for their clients
      running.server->Shutdown();
    }
  }
};

inline std::unique_ptr<LocalAgent> StartLocal(v1::DeviceSpec spec, AgentServiceOptions opts = {},
                                              AgentServerOptions server = {}) {
  auto a = std::make_unique<LocalAgent>();
  opts.spec = std::move(spec);
  auto svc = AgentService::Create(opts);
  EXPECT_TRUE(svc.ok()) << svc.status();
  if (!svc.ok()) return nullptr;
  a->service = std::move(*svc);
  auto running = StartAgentServer(a->service.get(), server);
  EXPECT_TRUE(running.ok()) << running.status();
  if (!running.ok()) return nullptr;
  a->running = std::move(*running);
  return a;
}

inline ClientOptions FastClient() {
  ClientOptions o;
  o.deadline_s = 5;
  o.attempts_per_endpoint = 2;
  o.backoff_initial_s = 0.01;
  o.retry_s = 0.2;
  return o;
}

// An agent in this process serving `own` (default: `spec`), a client bound
// to `spec` on it, and the same device in process, to compare against.
struct AgentAndClient {
  std::unique_ptr<LocalAgent> agent;
  std::unique_ptr<RemoteDevice> remote;
  std::unique_ptr<devices::Device> local;
  bool ok() const { return agent != nullptr && remote != nullptr && local != nullptr; }
};

inline AgentAndClient StartWithClient(const v1::DeviceSpec& spec,
                                      const v1::DeviceSpec* own = nullptr,
                                      AgentServiceOptions opts = {}) {
  AgentAndClient t;
  t.agent = StartLocal(own != nullptr ? *own : spec, opts);
  if (t.agent == nullptr) return t;
  auto remote = RemoteDevice::Create(spec, {t.agent->address()}, FastClient(), "test device");
  EXPECT_TRUE(remote.ok()) << remote.status();
  if (remote.ok()) t.remote = std::move(*remote);
  auto local = devices::CreateDevice(spec);
  EXPECT_TRUE(local.ok()) << local.status();
  if (local.ok()) t.local = std::move(*local);
  return t;
}

inline devices::Tensor Ramp(devices::ElementType type, std::vector<int64_t> shape, float scale) {
  devices::Tensor t = devices::Tensor::Zeros(type, std::move(shape));
  for (int64_t i = 0; i < t.NumElements(); ++i) t.Set(i, std::sin(scale * float(i + 1)));
  return t;
}

// Throw-away CA, server and client certificates (openssl from Debian).
inline bool MakeCerts(const std::string& dir) {
  const std::string cmd = absl::StrCat(
      "cd ", dir, " && ",
      "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1 "
      "-subj /CN=servesim-test-ca 2>/dev/null && ",
      "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr "
      "-subj /CN=localhost 2>/dev/null && ",
      "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > san.ext && ",
      "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out "
      "server.crt -days 1 -extfile san.ext 2>/dev/null && ",
      "openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr "
      "-subj /CN=servesim-client 2>/dev/null && ",
      "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out "
      "client.crt -days 1 2>/dev/null && ",
      "openssl req -newkey rsa:2048 -nodes -keyout client2.key -out client2.csr "
      "-subj /CN=servesim-client-2 2>/dev/null && ",
      "openssl x509 -req -in client2.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out "
      "client2.crt -days 1 2>/dev/null && ",
      "openssl req -x509 -newkey rsa:2048 -nodes -keyout other.key -out other.crt -days 1 "
      "-subj /CN=other-ca 2>/dev/null");
  return std::system(cmd.c_str()) == 0;
}

// Server options for TLS with client certificates required, from the
// files MakeCerts wrote to `dir`.
inline AgentServerOptions MutualTlsServer(const std::string& dir) {
  AgentServerOptions server;
  server.tls_cert_file = dir + "/server.crt";
  server.tls_key_file = dir + "/server.key";
  server.tls_client_ca_file = dir + "/ca.crt";
  return server;
}

// A one-layer, two-head ToPick of the given fidelity, and one decode
// attention op over its heads.
inline v1::DeviceSpec SmallTopick(v1::PruneFidelity fidelity) {
  v1::DeviceSpec spec;
  *spec.mutable_topick()->mutable_topick() = *devices::TopickPreset("topick");
  spec.mutable_topick()->set_fidelity(fidelity);
  auto* m = spec.mutable_topick()->mutable_model();
  m->set_layers(1), m->set_heads(2), m->set_d_head(64);
  return spec;
}

inline Op SmallTopickOp(absl::Span<const AttentionSeq> seqs) {
  Op op;
  op.kind = OpKind::kAttention;
  op.stage = devices::Stage::kAttention;
  op.heads = 2, op.kv_heads = 2, op.d_head = 64;
  op.seqs = seqs;
  return op;
}

// Decode step j of SampleOps' batch (every past_tokens + j; the last
// sequence leaves after step `leaves_after`, -1: never), and a check of a
// remote device's costs for a step against the in-process device's, bit for
// bit (waiting for each asynchronous call, so counts do not depend on
// timing).
struct DecodeSteps {
  DecodeSteps(bool gemm_and_elementwise, int leaves_after)
      : s(gemm_and_elementwise), leaves_after(leaves_after) {}
  std::vector<Op> Ops(int j) {
    std::vector<AttentionSeq>& seqs = lists.emplace_back(s.seqs);
    if (leaves_after >= 0 && j > leaves_after) seqs.pop_back();
    for (AttentionSeq& q : seqs) q.past_tokens += j;
    std::vector<Op> ops = s.ops;
    for (Op& op : ops) {
      if (op.kind == OpKind::kAttention) op.seqs = seqs;
    }
    return ops;
  }
  static void Check(const devices::Device* local, const RemoteDevice* remote,
                    const std::vector<Op>& ops) {
    std::vector<Cost> want(ops.size()), got(ops.size());
    ASSERT_TRUE(local->Estimate(ops, absl::MakeSpan(want)).ok());
    ASSERT_TRUE(remote->Estimate(ops, absl::MakeSpan(got)).ok());
    remote->WaitForPrefetches();
    for (size_t i = 0; i < want.size(); ++i) ExpectSameBits(want[i], got[i]);
  }
  SampleOps s;
  int leaves_after;
  std::deque<std::vector<AttentionSeq>> lists;  // the ops' sequence lists
};

}  // namespace servesim::agents::test

#endif  // SERVESIM_TESTS_AGENTS_AGENT_TEST_UTIL_H_
