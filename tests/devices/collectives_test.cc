// Collectives from measurements (devices/collectives.h): the nccl-tests
// parser on output written by hand in its printed layout, interpolation,
// the published reduced tables, the compiled-in presets, and vLLM's custom
// all-reduce rules in the GPU device (gpu_collectives.cc).
#include "devices/collectives.h"

#include <cmath>
#include <string>

#include "devices/device.h"
#include "devices/presets.h"
#include "devices/registry.h"
#include "gtest/gtest.h"

namespace servesim::devices {
namespace {

// all_reduce_perf -b 8 -e 128M -f 8 -g 2, as nccl-tests 2.13 prints it,
// with an NCCL INFO line in the middle.
constexpr char kAllReduce2[] = R"(# Collective test starting: all_reduce_perf
# nThread 1 nGpus 2 minBytes 8 maxBytes 134217728 step: 8(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid   4711 on     node01 device  0 [0x01] NVIDIA RTX PRO 6000 Blackwell Server Edition
#  Rank  1 Group  0 Pid   4711 on     node01 device  1 [0x02] NVIDIA RTX PRO 6000 Blackwell Server Edition
node01:4711:4711 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2     float     sum      -1    10.00    0.00    0.00      0     9.90    0.00    0.00      0
          64            16     float     sum      -1    10.20    0.01    0.01      0    10.10    0.01    0.01      0
         512           128     float     sum      -1    10.40    0.05    0.05      0    10.30    0.05    0.05      0
        4096          1024     float     sum      -1    11.00    0.37    0.37      0    11.00    0.37    0.37      0
       32768          8192     float     sum      -1    14.00    2.34    2.34      0    14.00    2.34    2.34      0
      262144         65536     float     sum      -1    30.00    8.74    8.74      0    30.00    8.74    8.74      0
     2097152        524288     float     sum      -1   100.00   20.97   20.97      0   100.00   20.97   20.97      0
    16777216       4194304     float     sum      -1   600.00   27.96   27.96      0   600.00   27.96   27.96      0
   134217728      33554432     float     sum      -1  4600.00   29.18   29.18      0  4600.00   29.18   29.18      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 9.9 
#
)";

TEST(NcclTestsParserTest, ReadsThePrintedTable) {
  auto c = ParseNcclTests(kAllReduce2, "tables/pcie5.txt");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->op(), "all_reduce");
  EXPECT_EQ(c->gpus(), 2);  // two "#  Rank" lines
  ASSERT_EQ(c->bytes_size(), 9);
  EXPECT_EQ(c->bytes(0), 8);
  EXPECT_EQ(c->bytes(8), 134217728);
  EXPECT_DOUBLE_EQ(c->time_s(0), 10.00e-6);  // out-of-place, not in-place
  EXPECT_DOUBLE_EQ(c->time_s(8), 4600e-6);
  EXPECT_EQ(c->source(), "tables/pcie5.txt:12");
}

TEST(NcclTestsParserTest, OlderLayoutAndCountsFromTheHeaderOrTheName) {
  // nccl-tests 2.0's all_gather_perf: no redop and root columns, "error".
  const std::string old =
      R"(# nThread 1 nGpus 4 minBytes 1024 maxBytes 4096 step: 2(factor) warmup iters: 5 iters: 20 validation: 1
#       size         count    type     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)             (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
        1024            64   float    20.00    0.05    0.04  0e+00    20.00    0.05    0.04  0e+00
        2048           128   float    21.00    0.10    0.07  0e+00    21.00    0.10    0.07  0e+00
)";
  auto c = ParseNcclTests(old, "x/all_gather_perf.txt");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->op(), "all_gather");
  EXPECT_EQ(c->gpus(), 4);  // nThread 1 x nGpus 4
  EXPECT_DOUBLE_EQ(c->time_s(1), 21e-6);
  // Without device lines or the nThread line, the name's .g<N>.
  std::string bare = old.substr(old.find('\n') + 1);
  auto named = ParseNcclTests(bare, "x/alltoall_perf.g16.mine.txt");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->op(), "alltoall");
  EXPECT_EQ(named->gpus(), 16);
}

// Each bad input: the file, the line and the column in the message.
TEST(NcclTestsParserTest, BadTablesNameFileLineAndColumn) {
  const std::string header =
      "#  Rank  0 Group 0\n#  Rank  1 Group 0\n"
      "#       size         count      type   redop    root     time   algbw   busbw #wrong\n"
      "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)\n";
  struct Case {
    std::string text, expect;
  } cases[] = {
      {header + "8 2 float sum -1 10.0 0 0 0\n8 2 float sum -1 11.0 0 0 0\n",
       "t/all_reduce.txt:6: column size: 8 does not increase"},
      {header + "8 2 float sum -1 -3.0 0 0 0\n",
       "t/all_reduce.txt:5: column time: \"-3.0\" is not a positive time"},
      {header + "8 2 float sum -1 nan 0 0 0\n", "t/all_reduce.txt:5: column time: \"nan\""},
      {header + "8 2 float\n", "t/all_reduce.txt:5: column time (column 6) missing"},
      {"#  Rank 0\n#       size         count      type\n8 2 float\n",
       "t/all_reduce.txt:2: the header has no \"time\" column"},
      {"#  Rank 0\n#       size  count  type  redop  root  time\n#  (B)  (elements)  (s/op)\n",
       "t/all_reduce.txt:3: column time: unit (s/op) does not parse"},
      {"8 2 float sum -1 10.0\n", "t/all_reduce.txt:1: a row before the header"},
      {header, "t/all_reduce.txt: no nccl-tests rows"},
  };
  for (const Case& k : cases) {
    auto c = ParseNcclTests(k.text, "t/all_reduce.txt");
    ASSERT_FALSE(c.ok()) << k.expect;
    EXPECT_NE(c.status().message().find(k.expect), absl::string_view::npos) << c.status();
  }
  auto no_op = ParseNcclTests(header + "8 2 float sum -1 10.0 0 0 0\n", "t/mine.txt");
  EXPECT_NE(no_op.status().message().find("which collective is not said"), absl::string_view::npos);
  auto no_count = ParseNcclTests("#  size count type redop root time\n8 2 float sum -1 10.0\n",
                                 "t/all_reduce.txt");
  EXPECT_NE(no_count.status().message().find("the GPU count is not said"), absl::string_view::npos);
}

TEST(NcclTestsParserTest, ReducedTableOfBusBandwidth) {
  // The reduced form vendors publish: size label and busbw, 8 GPUs.
  const std::string reduced =
      "# source: a vendor page\n| Message Size (Bytes) | 8 GPUs (GB/s) |\n| --- | --- |\n"
      "| 1K | 0.07 |\n| 65K | 2.72 |\n| 1G | 466.35 |\n";
  auto c = ParseNcclTests(reduced, "t/all_reduce_perf.g8.vendor.txt");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->gpus(), 8);
  ASSERT_EQ(c->bytes_size(), 3);
  EXPECT_EQ(c->bytes(1), 65536);  // "65K": the nearest power of two
  EXPECT_EQ(c->bytes(2), 1073741824);
  // busbw = size / time x 2(n-1)/n, so time = size x 1.75 / busbw.
  EXPECT_DOUBLE_EQ(c->time_s(0), 1024 * 1.75 / 0.07e9);
  EXPECT_DOUBLE_EQ(c->time_s(2), 1073741824 * 1.75 / 466.35e9);
  auto bad = ParseNcclTests("| Message Size | x (GB/s) |\n| 1K | fast |\n", "t/all_reduce.g8.txt");
  EXPECT_NE(bad.status().message().find("t/all_reduce.g8.txt:2: column busbw: \"fast\""),
            absl::string_view::npos)
      << bad.status();
}

CollectiveTable TableOf(const std::string& text, const std::string& path) {
  google::protobuf::RepeatedPtrField<servesim::v1::CollectiveCurve> curves;
  *curves.Add() = *ParseNcclTests(text, path);
  return *CollectiveTable::Create(curves);
}

TEST(CollectiveTableTest, ExactAtMeasuredSizesLinearBetweenCountedOutside) {
  const CollectiveTable t = TableOf(kAllReduce2, "pcie5.txt");
  const CollectiveCounts before = CollectiveTable::ProcessCounts();
  EXPECT_DOUBLE_EQ(t.Time(CollectiveOp::kAllReduce, 2, 4096), 11e-6);
  EXPECT_DOUBLE_EQ(t.Time(CollectiveOp::kAllReduce, 2, 262144), 30e-6);
  // Halfway between 262144 (30 us) and 2097152 (100 us).
  EXPECT_DOUBLE_EQ(t.Time(CollectiveOp::kAllReduce, 2, (262144 + 2097152) / 2.0), 65e-6);
  // Below the smallest: its time; above the largest: the last segment's
  // slope, (4600 - 600) us over 117440512 B.
  EXPECT_DOUBLE_EQ(t.Time(CollectiveOp::kAllReduce, 2, 1), 10e-6);
  EXPECT_DOUBLE_EQ(t.Time(CollectiveOp::kAllReduce, 2, 2 * 134217728.0),
                   4600e-6 + 134217728.0 * (4000e-6 / 117440512.0));
  // Four GPUs from the two-GPU table: the ring's traffic 2(n-1)/n, 1.5 / 1.
  EXPECT_DOUBLE_EQ(t.Time(CollectiveOp::kAllReduce, 4, 4096), 11e-6 * 1.5);
  EXPECT_EQ(t.Time(CollectiveOp::kAllGather, 2, 4096), -1);
  const CollectiveCounts after = CollectiveTable::ProcessCounts();
  EXPECT_EQ(after.measured - before.measured, 3);
  EXPECT_EQ(after.below_smallest - before.below_smallest, 1);
  EXPECT_EQ(after.above_largest - before.above_largest, 1);
  EXPECT_EQ(after.other_gpu_count - before.other_gpu_count, 1);
}

// Every compiled-in preset parses, and spans the sizes a serving step
// needs (a few KiB for a decode's all-reduce to a GiB), so that neither
// extrapolation carries a step.
TEST(CollectivePresetTest, EveryPresetSpansTheSizesServingUses) {
  const auto names = CollectivePresetNames();
  ASSERT_FALSE(names.empty());
  for (const std::string& name : names) {
    auto curves = CollectivePreset(name);
    ASSERT_TRUE(curves.ok()) << name << ": " << curves.status();
    for (const auto& c : *curves) {
      EXPECT_LE(c.bytes(0), 4096) << c.source();
      EXPECT_GE(c.bytes(c.bytes_size() - 1), 1 << 30) << c.source();
    }
  }
  EXPECT_EQ(CollectivePreset("pcie9").status().code(), absl::StatusCode::kNotFound);
}

servesim::v1::DeviceSpec Gpu(const char* xpu, const char* link, const char* preset) {
  servesim::v1::DeviceSpec spec;
  auto* g = spec.mutable_gpu();
  *g->mutable_xpu() = *XpuPreset(xpu);
  *g->mutable_interconnect() = *LinkPreset(link);
  g->mutable_interconnect()->set_preset(link);
  g->set_dtype(servesim::v1::DTYPE_FP16);
  auto* c = g->mutable_collectives();
  c->set_preset(preset);
  c->set_peer_to_peer(true);
  c->set_custom_all_reduce(true);
  return spec;
}

double AllReduce(const Device& d, double bytes, int p) {
  Op op;
  op.kind = OpKind::kAllReduce;
  op.bytes = bytes;
  op.participants = p;
  Cost c;
  EXPECT_TRUE(d.Estimate({&op, 1}, {&c, 1}).ok());
  return c.time_s;
}

// vLLM's custom all-reduce where its source takes it, NCCL's measured
// table elsewhere (docs/collectives.md, "What vLLM calls").
TEST(CustomAllReduceTest, SwitchesToNcclAtVllmsLimits) {
  servesim::v1::DeviceSpec spec = Gpu("rtx-pro-6000", "pcie5", "mine");
  *spec.mutable_gpu()->mutable_collectives()->add_curves() =
      *ParseNcclTests(kAllReduce2, "pcie5.txt");
  auto d = *CreateDevice(spec);
  // Its bandwidth: NCCL's bus bandwidth at the largest size, extrapolated
  // to 1 GiB on the last segment's slope; its barriers the link's latency.
  const double big = 1073741824.0;
  const double t_big = 4600e-6 + (big - 134217728.0) * (4000e-6 / 117440512.0);
  const double bw = big * 1.0 / t_big;  // 2(n-1)/n = 1 for two GPUs
  // Two GPUs: one-shot under 8 MiB, a multiple of 16 bytes.
  const double small = 262144;
  EXPECT_DOUBLE_EQ(AllReduce(*d, small, 2), 2 * 5e-6 + small / bw);
  const double limit = 8.0 * 1024 * 1024;
  EXPECT_DOUBLE_EQ(AllReduce(*d, limit - 16, 2), 2 * 5e-6 + (limit - 16) / bw);
  // At 8 MiB, and at a size that is not a multiple of 16: NCCL's table.
  const double at_limit = 100e-6 + (limit - 2097152) / (16777216.0 - 2097152) * 500e-6;
  EXPECT_DOUBLE_EQ(AllReduce(*d, limit, 2), at_limit);
  EXPECT_DOUBLE_EQ(AllReduce(*d, 262152, 2), 30e-6 + 8 * (70e-6 / (2097152 - 262144.0)));
  // Four PCIe GPUs: vLLM does not take it without NVLink; nor without
  // peer-to-peer; nor when switched off.
  EXPECT_DOUBLE_EQ(AllReduce(*d, 4096, 4), 11e-6 * 1.5);
  spec.mutable_gpu()->mutable_collectives()->set_peer_to_peer(false);
  EXPECT_DOUBLE_EQ(AllReduce(**CreateDevice(spec), small, 2), 30e-6);
  spec.mutable_gpu()->mutable_collectives()->set_peer_to_peer(true);
  spec.mutable_gpu()->mutable_collectives()->set_custom_all_reduce(false);
  EXPECT_DOUBLE_EQ(AllReduce(**CreateDevice(spec), small, 2), 30e-6);
}

TEST(CustomAllReduceTest, OneShotAndTwoShotOverNvlink) {
  servesim::v1::DeviceSpec spec = Gpu("h100-sxm-80gb", "nvlink4", "nvlink4-nvswitch");
  auto curves = *CollectivePreset("nvlink4-nvswitch");
  for (const auto& c : curves) *spec.mutable_gpu()->mutable_collectives()->add_curves() = c;
  auto d = *CreateDevice(spec);
  const double big = 1073741824.0;
  double t_big = -1;
  for (const auto& c : curves) {
    for (int i = 0; i < c.bytes_size(); ++i) {
      if (c.op() == "all_reduce" && c.gpus() == 8 && c.bytes(i) == big) t_big = c.time_s(i);
    }
  }
  ASSERT_GT(t_big, 0);
  const double bw = big * 1.75 / t_big;
  // Eight GPUs: one-shot under 256 KiB (2 barriers, 7 peers' buffers),
  // two-shot from there to 8 MiB (3 barriers, 2 x 7/8 of the message).
  EXPECT_DOUBLE_EQ(AllReduce(*d, 131072, 8), 2 * 3e-6 + 7 * 131072 / bw);
  EXPECT_DOUBLE_EQ(AllReduce(*d, 262144, 8), 3 * 3e-6 + 2 * 7.0 / 8 * 262144 / bw);
  // Four: one-shot up to 512 KiB. Six is a size vLLM supports; three is not.
  EXPECT_DOUBLE_EQ(AllReduce(*d, 262144, 4), 2 * 3e-6 + 3 * 262144 / bw);
  EXPECT_DOUBLE_EQ(AllReduce(*d, 524288, 4), 3 * 3e-6 + 2 * 3.0 / 4 * 524288 / bw);
  // Three: NCCL's 8-GPU table at 4 KiB (busbw 0.27 GB/s) scaled by the
  // ring's traffic, (4/3) / (7/4).
  EXPECT_NEAR(AllReduce(*d, 4096, 3), 4096 * (4.0 / 3) / 0.27e9, 1e-15);
}

}  // namespace
}  // namespace servesim::devices
