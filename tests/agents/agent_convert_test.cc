// Device agents: the protocol's conversions (bit-exact costs, shared
// sequence lists) and the agent's request limits, each refusal naming the
// field and its allowed range.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agents/agent_server.h"
#include "agents/agent_service.h"
#include "agents/convert.h"
#include "agents/remote_device.h"
#include "devices/attacc/attacc_device.h"
#include "devices/attention_data.h"
#include "devices/lad/lad_device.h"
#include "devices/presets.h"
#include "devices/registry.h"
#include "devices/topick/topick_device.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "studies/sweep.h"
#include "tests/agents/agent_test_util.h"
#include "tests/test_util.h"

#ifndef SERVESIM_BINARY
#error "SERVESIM_BINARY must name the servesim executable"
#endif
#ifndef SERVESIM_AGENT_BINARY
#error "SERVESIM_AGENT_BINARY must name the servesim-agent executable"
#endif

namespace servesim::agents {
namespace {

namespace fs = std::filesystem;
namespace v1 = servesim::v1;
using devices::AttentionSeq;
using devices::Cost;
using devices::Op;
using devices::OpKind;
using test::AttAccSpec;
using test::Bits;
using test::CostsOf;
using test::ExpectSameBits;
using test::FastClient;
using test::FreshDir;
using test::GpuSpec;
using test::LocalAgent;
using test::MakeCerts;
using test::Ramp;
using test::SampleOps;
using test::StartLocal;
using test_util::ReadFile;
using test_util::WriteFile;

// --------------------------------------------------------- conversions ----

TEST(AgentConvertTest, OpsRoundTripAndShareSequenceLists) {
  SampleOps s;
  s.stacks = {0, 1, 2, 3, 4, 5};
  s.ops[0].kv_heads = 2, s.ops[1].kv_heads = 2;
  s.ops[0].kv_head_stack = s.stacks;
  s.ops[1].kv_head_stack = s.stacks;
  v1::EstimateRequest req;
  EncodeOps(s.ops, &req);
  EXPECT_EQ(req.seq_lists_size(), 1);  // both head groups name one list
  EXPECT_EQ(req.stack_lists_size(), 1);
  // Through the wire format, too.
  v1::EstimateRequest wire;
  ASSERT_TRUE(wire.ParseFromString(req.SerializeAsString()));
  DecodedOps d;
  ASSERT_TRUE(DecodeOps(wire, &d).ok());
  ASSERT_EQ(d.ops.size(), s.ops.size());
  EXPECT_EQ(d.ops[0].seqs.data(), d.ops[1].seqs.data());
  for (size_t i = 0; i < s.ops.size(); ++i) {
    const Op &a = s.ops[i], &b = d.ops[i];
    EXPECT_EQ(a.kind, b.kind);
    EXPECT_EQ(a.stage, b.stage);
    EXPECT_EQ(std::tie(a.m, a.n, a.k, a.heads, a.kv_heads, a.d_head, a.head_begin, a.head_end,
                       a.elements, a.participants),
              std::tie(b.m, b.n, b.k, b.heads, b.kv_heads, b.d_head, b.head_begin, b.head_end,
                       b.elements, b.participants));
    EXPECT_EQ(Bits(a.bytes_per_element), Bits(b.bytes_per_element));
    EXPECT_EQ(Bits(a.flops_per_element), Bits(b.flops_per_element));
    EXPECT_EQ(Bits(a.bytes), Bits(b.bytes));
    ASSERT_EQ(a.seqs.size(), b.seqs.size());
    for (size_t j = 0; j < a.seqs.size(); ++j) {
      EXPECT_EQ(a.seqs[j].new_tokens, b.seqs[j].new_tokens);
      EXPECT_EQ(a.seqs[j].past_tokens, b.seqs[j].past_tokens);
      EXPECT_EQ(a.seqs[j].request_id, b.seqs[j].request_id);
    }
    EXPECT_EQ(std::vector<int32_t>(a.kv_head_stack.begin(), a.kv_head_stack.end()),
              std::vector<int32_t>(b.kv_head_stack.begin(), b.kv_head_stack.end()));
  }
}

TEST(AgentConvertTest, CostsAreBitExactAndRepeatsTravelAsOneEntry) {
  Cost c;
  double v = 1.0 / 3.0;
  for (double Cost::*f :
       {&Cost::time_s, &Cost::flops, &Cost::dram_bytes, &Cost::link_bytes, &Cost::compute_energy_pj,
        &Cost::dram_energy_pj, &Cost::link_energy_pj, &Cost::bg_bus_bytes, &Cost::tsv_bytes,
        &Cost::external_bytes, &Cost::cycles, &Cost::score_s, &Cost::softmax_s, &Cost::context_s,
        &Cost::internode_bytes}) {
    c.*f = v;
    v = v * 7.1e13 + 4.9e-324;  // spans magnitudes, with a subnormal step
  }
  c.cycles = -0.0;
  c.score_s = 4.9e-324;
  Cost sparse;  // two fields set: time (field 1) and link_bytes (field 4)
  sparse.time_s = 2.5e-6;
  sparse.link_bytes = 4096;
  Cost negative_zero = sparse;  // differs from `sparse` only in a sign bit
  negative_zero.flops = -0.0;
  const std::vector<Cost> costs = {c, c, c, sparse, Cost{}, Cost{}, sparse, negative_zero, c};
  v1::CostTable wire;
  EncodeCosts(costs, &wire);
  // One entry per cost: 0 for a repeat of the one before, else 0x8000 and
  // the fields' bits; the values of the new costs only.
  EXPECT_EQ(std::vector<uint32_t>(wire.fields().begin(), wire.fields().end()),
            (std::vector<uint32_t>{0xffff, 0, 0, 0x8009, 0x8000, 0, 0x8009, 0x800b, 0xffff}));
  EXPECT_EQ(wire.values_size(), 15 + 2 + 2 + 3 + 15);
  v1::CostTable parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire.SerializeAsString()));
  std::vector<Cost> got = {sparse};  // decoding appends
  ASSERT_TRUE(DecodeCosts(parsed, &got).ok());
  ASSERT_EQ(got.size(), costs.size() + 1);
  ExpectSameBits(got[0], sparse);
  for (size_t i = 0; i < costs.size(); ++i) {
    SCOPED_TRACE(i);
    ExpectSameBits(got[i + 1], costs[i]);
  }
  // Without copying repeats: each new cost once, appended, and per cost its
  // position (a repeat names the one before's); a malformed table appends
  // to neither.
  std::vector<Cost> unique = {sparse};
  std::vector<uint32_t> index = {7};
  ASSERT_TRUE(DecodeCostTable(parsed, &unique, &index).ok());
  EXPECT_EQ(index, (std::vector<uint32_t>{7, 1, 1, 1, 2, 3, 3, 4, 5, 6}));
  ASSERT_EQ(unique.size(), 7u);
  for (size_t i = 0; i < costs.size(); ++i) {
    SCOPED_TRACE(i);
    ExpectSameBits(unique[index[i + 1]], costs[i]);
  }
  v1::CostTable bad = parsed;
  bad.add_values(1.0);  // one value too many
  EXPECT_FALSE(DecodeCostTable(bad, &unique, &index).ok());
  EXPECT_EQ(unique.size(), 7u);
  EXPECT_EQ(index.size(), 10u);
}

TEST(AgentConvertTest, MalformedCostTablesAreRefusedAndAppendNothing) {
  auto decode = [](std::vector<uint32_t> fields, int values) {
    v1::CostTable t;
    for (uint32_t f : fields) t.add_fields(f);
    for (int i = 0; i < values; ++i) t.add_values(1.5);
    std::vector<Cost> out(2);
    const absl::Status st = DecodeCosts(t, &out);
    EXPECT_EQ(out.size(), 2u);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    return std::string(st.message());
  };
  EXPECT_EQ(decode({0}, 0),
            "cost_table.fields[0] is 0, a repeat of the cost before, but there is none");
  EXPECT_EQ(decode({0x8001, 0x1}, 1),
            "cost_table.fields[1] is 1: allowed are 0 (a repeat) and 32768 + a mask of Cost's "
            "field numbers 1..15 (bit f - 1 for field f)");
  EXPECT_EQ(decode({0x18000}, 0),
            "cost_table.fields[0] is 98304: allowed are 0 (a repeat) and 32768 + a mask of "
            "Cost's field numbers 1..15 (bit f - 1 for field f)");
  EXPECT_EQ(decode({0x8001, 0x8003}, 2),
            "cost_table.fields[1] sets 2 fields but only 1 of cost_table.values are left");
  EXPECT_EQ(decode({0x8001, 0}, 3), "cost_table has 3 values but its fields use 1");
}

TEST(AgentConvertTest, MoeOpsRoundTripAndBadOnesAreRefused) {
  Op moe;
  moe.kind = OpKind::kMoe;
  moe.stage = devices::Stage::kMoe;
  moe.m = 10, moe.n = 768, moe.k = 2048;
  moe.routed = 40.5, moe.experts_touched = 30.25, moe.experts_total = 128;
  moe.top_k = 8, moe.expert_matrices = 3;
  v1::EstimateRequest req;
  EncodeOps(absl::MakeConstSpan(&moe, 1), &req);
  DecodedOps d;
  ASSERT_TRUE(DecodeOps(req, &d).ok());
  ASSERT_EQ(d.ops.size(), 1u);
  const Op& b = d.ops[0];
  EXPECT_EQ(b.kind, OpKind::kMoe);
  EXPECT_EQ(b.stage, devices::Stage::kMoe);
  EXPECT_EQ(std::tie(b.m, b.n, b.k, b.experts_total, b.top_k, b.expert_matrices),
            std::tie(moe.m, moe.n, moe.k, moe.experts_total, moe.top_k, moe.expert_matrices));
  EXPECT_EQ(Bits(b.routed), Bits(moe.routed));
  EXPECT_EQ(Bits(b.experts_touched), Bits(moe.experts_touched));
  req.mutable_ops(0)->set_top_k(129);
  const absl::Status st = DecodeOps(req, &d);
  EXPECT_NE(st.message().find("top_k 1..experts_total"), absl::string_view::npos) << st;
  // The GPU accepts MoE ops, and says so through Describe.
  v1::DescribeResponse wire;
  devices::DeviceDescription desc;
  desc.accepts = {OpKind::kGemm, OpKind::kMoe};
  EncodeDescription(desc, &wire);
  auto back = DecodeDescription(wire);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->accepts, desc.accepts);
}

TEST(AgentConvertTest, LatentAttentionOpsRoundTripAndStrayLatentsAreRefused) {
  const std::vector<devices::AttentionSeq> seqs = {{1, 99, 4}, {16, 0, 5}};
  Op mla;
  mla.kind = OpKind::kAttention;
  mla.stage = devices::Stage::kAttention;
  mla.heads = mla.kv_heads = 16;
  mla.d_head = 128;
  mla.kv_latent = 512, mla.d_rope = 64, mla.d_value = 128;
  mla.seqs = seqs;
  v1::EstimateRequest req;
  EncodeOps(absl::MakeConstSpan(&mla, 1), &req);
  DecodedOps d;
  ASSERT_TRUE(DecodeOps(req, &d).ok());
  ASSERT_EQ(d.ops.size(), 1u);
  const Op& b = d.ops[0];
  EXPECT_EQ(std::tie(b.kv_latent, b.d_rope, b.d_value),
            std::tie(mla.kv_latent, mla.d_rope, mla.d_value));
  EXPECT_EQ(b.seqs.size(), 2u);
  // A latent on a GEMM is a malformed request.
  req.mutable_ops(0)->set_kind(v1::OP_KIND_GEMM);
  const absl::Status st = DecodeOps(req, &d);
  EXPECT_NE(st.message().find("expected on attention ops only"), absl::string_view::npos) << st;
  // A sliding window rides along the same way.
  Op sliding = mla;
  sliding.kv_latent = sliding.d_rope = sliding.d_value = 0;
  sliding.window = 128;
  v1::EstimateRequest wreq;
  EncodeOps(absl::MakeConstSpan(&sliding, 1), &wreq);
  ASSERT_TRUE(DecodeOps(wreq, &d).ok());
  EXPECT_EQ(d.ops[0].window, 128);
  wreq.mutable_ops(0)->set_window(-1);
  EXPECT_FALSE(DecodeOps(wreq, &d).ok());
}

TEST(AgentConvertTest, TensorsAndDescriptionsRoundTrip) {
  for (auto type : {devices::ElementType::kFp16, devices::ElementType::kFp32}) {
    const devices::Tensor t = Ramp(type, {2, 3, 4}, 0.3f);
    v1::Tensor wire;
    EncodeTensor(t, &wire);
    auto back = DecodeTensor(wire, 1 << 20, "t");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->shape, t.shape);
    EXPECT_EQ(back->bytes, t.bytes);
    EXPECT_EQ(back->type, t.type);
  }
  auto dev = devices::CreateDevice(AttAccSpec());
  ASSERT_TRUE(dev.ok());
  const devices::DeviceDescription d = (*dev)->Describe();
  v1::DescribeResponse wire;
  EncodeDescription(d, &wire);
  auto back = DecodeDescription(wire);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->kind, d.kind);
  EXPECT_EQ(back->preset, d.preset);
  EXPECT_EQ(back->accepts, d.accepts);
  EXPECT_EQ(Bits(back->memory_bytes), Bits(d.memory_bytes));
  // The static power rides along (40 stacks x 0.653 W), and a hostile
  // agent's NaN or negative figure is refused.
  EXPECT_EQ(Bits(back->static_power_w), Bits(d.static_power_w));
  EXPECT_NEAR(back->static_power_w, 40 * 0.653, 1e-9);
  EXPECT_EQ(back->static_in_op_energy, d.static_in_op_energy);
  for (double bad : {-1.0, std::nan(""), 1e8}) {
    v1::DescribeResponse evil = wire;
    evil.set_static_power_w(bad);
    EXPECT_FALSE(DecodeDescription(evil).ok()) << bad;
  }
  ASSERT_EQ(back->parameters.size(), d.parameters.size());
  for (size_t i = 0; i < d.parameters.size(); ++i) {
    EXPECT_EQ(back->parameters[i].first, d.parameters[i].first);
    EXPECT_EQ(Bits(back->parameters[i].second), Bits(d.parameters[i].second));
  }
  // A measured step's cost profile (placement weights) rides along too, and
  // out-of-range figures are refused with the field named.
  devices::DeviceDescription p;
  p.step_base_positions = 12.5;
  p.first_step_positions_per_token = 32;
  v1::DescribeResponse pw;
  EncodeDescription(p, &pw);
  auto pb = DecodeDescription(pw);
  ASSERT_TRUE(pb.ok()) << pb.status();
  EXPECT_EQ(pb->step_base_positions, 12.5);
  EXPECT_EQ(pb->first_step_positions_per_token, 32);
  for (double bad : {-1.0, std::nan(""), 2e6}) {
    v1::DescribeResponse evil = pw;
    evil.set_first_step_positions_per_token(bad);
    const absl::Status st = DecodeDescription(evil).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(st.message(), "first_step_positions_per_token")) << st;
    evil = pw;
    evil.set_step_base_positions(bad);
    EXPECT_TRUE(
        absl::StrContains(DecodeDescription(evil).status().message(), "step_base_positions = "))
        << bad;
  }
}

TEST(AgentConvertTest, InconsistentRequestsAreRejected) {
  DecodedOps d;
  v1::EstimateRequest req;
  req.add_ops()->set_kind(static_cast<v1::OpKind>(9));
  EXPECT_EQ(DecodeOps(req, &d).code(), absl::StatusCode::kUnimplemented);
  req.Clear();
  auto* l = req.add_seq_lists();
  l->add_new_tokens(1);
  l->add_past_tokens(-4);
  l->add_request_id(1);
  auto st = DecodeOps(req, &d);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(st.message(), "past_tokens = -4")) << st;
  l->set_past_tokens(0, 4);
  l->add_new_tokens(1);  // columns of different lengths
  EXPECT_EQ(DecodeOps(req, &d).code(), absl::StatusCode::kInvalidArgument);
  req.Clear();
  auto* op = req.add_ops();
  op->set_kind(v1::OP_KIND_ATTENTION);
  op->set_seq_list(3);
  st = DecodeOps(req, &d);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(st.message(), "ops[0].seq_list = 3")) << st;
  v1::Tensor t;
  t.set_type(v1::ELEMENT_TYPE_FP32);
  t.add_shape(2);
  t.set_data(std::string(7, '\0'));
  EXPECT_EQ(DecodeTensor(t, 1000, "q").status().code(), absl::StatusCode::kInvalidArgument);
  t.set_shape(0, -1);
  EXPECT_EQ(DecodeTensor(t, 1000, "q").status().code(), absl::StatusCode::kInvalidArgument);
  t.set_shape(0, int64_t{1} << 40);
  EXPECT_EQ(DecodeTensor(t, 1000, "q").status().code(), absl::StatusCode::kResourceExhausted);
}

// ------------------------------------------------------------- limits ----
// What one request may ask of an agent (agents/convert.h kMax*, and
// AgentServiceOptions): each limit exactly at and one past its value,
// called on the service directly, as gRPC would after decoding.

std::unique_ptr<AgentService> DirectService(AgentServiceOptions opts = {}) {
  opts.spec = GpuSpec();
  auto svc = AgentService::Create(opts);
  EXPECT_TRUE(svc.ok()) << svc.status();
  return svc.ok() ? std::move(*svc) : nullptr;
}

// One decode attention op over `seqs` sequences of `past` cached tokens.
v1::EstimateRequest DecodeAttention(int64_t seqs, int64_t past) {
  v1::EstimateRequest req;
  v1::SeqList* l = req.add_seq_lists();
  for (int64_t s = 0; s < seqs; ++s) {
    l->add_new_tokens(1);
    l->add_past_tokens(past);
    l->add_request_id(s);
  }
  v1::Op* op = req.add_ops();
  op->set_kind(v1::OP_KIND_ATTENTION);
  op->set_stage(v1::STAGE_ATTENTION);
  op->set_heads(12);
  op->set_kv_heads(12);
  op->set_d_head(128);
  op->set_seq_list(0);
  op->set_head_end(-1);
  op->set_stack_list(-1);
  return req;
}

grpc::Status DirectEstimate(AgentService* svc, const v1::EstimateRequest& req,
                            v1::EstimateResponse* resp) {
  grpc::ServerContext ctx;
  return svc->Estimate(&ctx, &req, resp);
}

TEST(AgentLimitsTest, ContextLengthIsCheckedAtItsLimit) {
  auto svc = DirectService();
  ASSERT_NE(svc, nullptr);
  v1::EstimateResponse resp;
  // new_tokens 1 + past_tokens 4,194,303 = kMaxContextTokens: accepted.
  grpc::Status st = DirectEstimate(svc.get(), DecodeAttention(1, (1 << 22) - 1), &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(CostsOf(resp).size(), 1u);
  st = DirectEstimate(svc.get(), DecodeAttention(1, 1 << 22), &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message(),
            "seq_lists[0] sequence 0: new_tokens = 1, past_tokens = 4194304; expected "
            "new_tokens >= 1, past_tokens >= 0 and new_tokens + past_tokens <= 4194304");
  // A new_tokens near INT64_MAX would have overflowed the GPU model's
  // query-block loop.
  v1::EstimateRequest huge = DecodeAttention(1, 0);
  huge.mutable_seq_lists(0)->set_new_tokens(0, int64_t{1} << 62);
  st = DirectEstimate(svc.get(), huge, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(AgentLimitsTest, SequencesNamedByAllOpsAreBounded) {
  auto svc = DirectService();
  ASSERT_NE(svc, nullptr);
  // 4,096 ops naming one list of 1,024 sequences: 2^22 = kMaxOpSequences.
  v1::EstimateRequest req = DecodeAttention(1024, 100);
  for (int i = 1; i < 4096; ++i) *req.add_ops() = req.ops(0);
  v1::EstimateResponse resp;
  grpc::Status st = DirectEstimate(svc.get(), req, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(CostsOf(resp).size(), 4096u);
  *req.add_ops() = req.ops(0);
  st = DirectEstimate(svc.get(), req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StartsWith(st.error_message(),
                               "ops[4096]: the attention ops up to this one name 4195328 "
                               "sequences with 4195328 new tokens in all; expected at most "
                               "4194304 sequences"))
      << st.error_message();
}

TEST(AgentLimitsTest, LookaheadStopsAtTheSequenceBudget) {
  auto svc = DirectService();
  ASSERT_NE(svc, nullptr);
  // 2^16 decode sequences: 2^22 / 2^16 = 64 steps fit; 256 were asked.
  v1::EstimateRequest req = DecodeAttention(1 << 16, 10);
  req.set_lookahead(256);
  v1::EstimateResponse resp;
  grpc::Status st = DirectEstimate(svc.get(), req, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.lookahead_answered(), 64);
  EXPECT_EQ(CostsOf(resp).size(), size_t{1 + 64});
  // A small batch gets every step it asks for.
  req = DecodeAttention(4, 10);
  req.set_lookahead(256);
  st = DirectEstimate(svc.get(), req, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.lookahead_answered(), 256);
}

TEST(AgentLimitsTest, NonFiniteAndHugeOpFiguresAreRefused) {
  auto svc = DirectService();
  ASSERT_NE(svc, nullptr);
  v1::EstimateRequest req;
  v1::Op* e = req.add_ops();
  e->set_kind(v1::OP_KIND_ELEMENTWISE);
  e->set_elements(1000);
  e->set_bytes_per_element(std::nan(""));
  e->set_seq_list(-1);
  e->set_stack_list(-1);
  v1::EstimateResponse resp;
  grpc::Status st = DirectEstimate(svc.get(), req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(st.error_message(),
                                "expected bytes_per_element and flops_per_element 0..1e+06"))
      << st.error_message();
  e->set_bytes_per_element(1e6);  // at the limit
  st = DirectEstimate(svc.get(), req, &resp);
  EXPECT_TRUE(st.ok()) << st.error_message();
  v1::Op* g = req.add_ops();
  g->set_kind(v1::OP_KIND_GEMM);
  g->set_m((int64_t{1} << 40) + 1);
  g->set_n(1);
  g->set_k(1);
  st = DirectEstimate(svc.get(), req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StartsWith(st.error_message(), "ops[1]: m = 1099511627777")) << st.error_message();
}

TEST(AgentLimitsTest, ExecuteWorkAndEmptyTensorExtentsAreBounded) {
  AgentServiceOptions opts;
  opts.max_tensor_bytes = 4096;
  opts.max_execute_macs = 1000;
  auto svc = DirectService(opts);
  ASSERT_NE(svc, nullptr);
  using devices::ElementType;
  auto execute = [&](std::vector<int64_t> q_shape, int64_t kv_len) {
    v1::ExecuteRequest req;
    EncodeTensor(Ramp(ElementType::kFp16, q_shape, 0.1f), req.mutable_q());
    EncodeTensor(Ramp(ElementType::kFp16, {2, kv_len, 8}, 0.2f), req.mutable_k());
    EncodeTensor(Ramp(ElementType::kFp16, {2, kv_len, 8}, 0.3f), req.mutable_v());
    grpc::ServerContext ctx;
    v1::ExecuteResponse resp;
    return svc->Execute(&ctx, &req, &resp);
  };
  // 2 heads x 1 query x 62 positions x 8 = 992 MACs: run; 64 positions: 1,024.
  grpc::Status st = execute({2, 1, 8}, 62);
  EXPECT_TRUE(st.ok()) << st.error_message();
  st = execute({2, 1, 8}, 64);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(st.error_message(),
            "q, k: heads x q_len x kv_len x d_head = 1024 multiply-accumulates; this agent "
            "runs at most 1000 per call");
  // An empty q of shape [2^40, 0, 8] holds no bytes, but kernels would loop
  // over its 2^40 heads.
  v1::ExecuteRequest req;
  req.mutable_q()->set_type(v1::ELEMENT_TYPE_FP16);
  for (int64_t d : {int64_t{1} << 40, int64_t{0}, int64_t{8}}) req.mutable_q()->add_shape(d);
  EncodeTensor(Ramp(ElementType::kFp16, {2, 4, 8}, 0.2f), req.mutable_k());
  EncodeTensor(Ramp(ElementType::kFp16, {2, 4, 8}, 0.3f), req.mutable_v());
  grpc::ServerContext ctx;
  v1::ExecuteResponse resp;
  st = svc->Execute(&ctx, &req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StartsWith(st.error_message(), "q: 17592186044416 bytes by its shape"))
      << st.error_message();
}

// All sessions' K and V together are held to max_kv_bytes: an append that
// would pass it is refused with the figures, and closing a session gives its
// bytes back.
TEST(AgentLimitsTest, SessionShapeIsAModelShape) {
  auto svc = DirectService(AgentServiceOptions{});
  ASSERT_NE(svc, nullptr);
  auto open = [&](int64_t kv_heads, int64_t d_head) {
    grpc::ServerContext ctx;
    v1::OpenSessionRequest o;
    o.set_kv_heads(kv_heads);
    o.set_d_head(d_head);
    o.set_type(v1::ELEMENT_TYPE_FP16);
    v1::OpenSessionResponse r;
    return svc->OpenSession(&ctx, &o, &r);
  };
  EXPECT_TRUE(open(4096, 4096).ok());
  // 2^40 KV heads once made the session's per-head lists throw on resize.
  const grpc::Status huge = open(int64_t{1} << 40, 8);
  EXPECT_EQ(huge.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(huge.error_message(),
            "kv_heads = 1099511627776, d_head = 8; expected both in [1, 4096]");
  EXPECT_EQ(open(2, 4097).error_message(), "kv_heads = 2, d_head = 4097; expected both in [1, 4096]");
  EXPECT_EQ(open(0, 8).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(AgentLimitsTest, SessionsShareOneKvBudget) {
  AgentServiceOptions opts;
  opts.max_tensor_bytes = 4096;
  opts.max_kv_bytes = 3000;
  auto svc = DirectService(opts);
  ASSERT_NE(svc, nullptr);
  using devices::ElementType;
  auto open = [&]() {
    grpc::ServerContext ctx;
    v1::OpenSessionRequest o;
    o.set_kv_heads(2);
    o.set_d_head(8);
    o.set_type(v1::ELEMENT_TYPE_FP16);
    v1::OpenSessionResponse r;
    EXPECT_TRUE(svc->OpenSession(&ctx, &o, &r).ok());
    return r.session_id();
  };
  // 2 KV heads x 32 positions x 8 fp16 = 1,024 bytes of K, as many of V.
  auto append = [&](const std::string& id, int64_t expected_len) {
    grpc::ServerContext ctx;
    v1::AppendKvRequest a;
    a.set_session_id(id);
    a.set_expected_kv_len(expected_len);
    EncodeTensor(Ramp(ElementType::kFp16, {2, 32, 8}, 0.2f), a.mutable_k());
    EncodeTensor(Ramp(ElementType::kFp16, {2, 32, 8}, 0.3f), a.mutable_v());
    v1::AppendKvResponse r;
    return svc->AppendKv(&ctx, &a, &r);
  };
  const std::string first = open(), second = open();
  ASSERT_TRUE(append(first, 0).ok());
  grpc::Status st = append(second, 0);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(st.error_message(),
            "this agent's sessions hold 2048 bytes of K and V; 2048 more would pass its budget "
            "of 3000 bytes (servesim-agent --max-kv-bytes); close sessions first");
  // The refused append left the second session empty, and the first's own
  // next append is refused the same way (4,096 > 3,000).
  EXPECT_EQ(append(first, 32).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  {
    grpc::ServerContext ctx;
    v1::CloseSessionRequest c;
    c.set_session_id(first);
    v1::CloseSessionResponse r;
    ASSERT_TRUE(svc->CloseSession(&ctx, &c, &r).ok());
  }
  st = append(second, 0);
  EXPECT_TRUE(st.ok()) << st.error_message();
  AgentServiceOptions bad;
  bad.spec = GpuSpec();
  bad.max_kv_bytes = 0;
  EXPECT_EQ(AgentService::Create(bad).status().message(), "max_kv_bytes = 0; expected >= 1");
}

TEST(AgentLimitsTest, NonFiniteTensorElementsAreRefused) {
  auto svc = DirectService();
  ASSERT_NE(svc, nullptr);
  using devices::ElementType;
  for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
    for (ElementType type : {ElementType::kFp16, ElementType::kFp32}) {
      auto k = Ramp(type, {2, 4, 8}, 0.2f);
      k.Set(3, bad);
      v1::ExecuteRequest req;
      EncodeTensor(Ramp(type, {2, 1, 8}, 0.1f), req.mutable_q());
      EncodeTensor(k, req.mutable_k());
      EncodeTensor(Ramp(type, {2, 4, 8}, 0.3f), req.mutable_v());
      grpc::ServerContext ctx;
      v1::ExecuteResponse resp;
      const grpc::Status st = svc->Execute(&ctx, &req, &resp);
      EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
      EXPECT_EQ(st.error_message(), "k.data: element 3 is NaN or infinite; expected finite values");
    }
  }
}

TEST(AgentLimitsTest, PresetSpecsAreTheAgentsDefaults) {
  for (const char* kind : {"gpu", "attacc", "topick", "spatten", "lad", "cta"}) {
    auto spec = AgentPresetSpec(kind, "");
    ASSERT_TRUE(spec.ok()) << kind << ": " << spec.status();
    EXPECT_EQ(SpecKindName(*spec), kind);
    EXPECT_TRUE(devices::CreateDevice(*spec).ok()) << kind;
  }
  auto bad = AgentPresetSpec("tpu", "");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(bad.status().message(), "--device tpu: unknown kind; registered: "))
      << bad.status();
}

}  // namespace
}  // namespace servesim::agents
