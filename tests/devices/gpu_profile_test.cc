// Measured GPU profile bundles (devices/gpu/profile.h) and the GPU device
// costing ops from them: interpolation, extrapolation, skew, bad input.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "devices/gpu/gpu_device.h"
#include "devices/gpu/profile.h"
#include "devices/presets.h"
#include "gtest/gtest.h"

namespace servesim::devices {
namespace {

namespace fs = std::filesystem;

constexpr char kDense[] =
    "layer,tokens,time_us\n"
    "qkv_proj,1,10\nqkv_proj,4,13\nqkv_proj,16,40\n"
    "rotary_emb,1,1\nrotary_emb,16,2\n"
    "layernorm,1,2\nlayernorm,16,4\n";
constexpr char kPerSeq[] = "layer,sequences,time_us\nlm_head,1,100\nlm_head,8,120\n";
// Rows ascending in (prefill_chunk, kv_prefill, n_decode, kv_decode).
constexpr char kAttention[] =
    "prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n"
    "0,0,1,16,5\n0,0,1,64,9\n0,0,4,16,8\n0,0,4,64,20\n"
    "32,0,0,0,30\n32,0,1,16,34\n32,0,1,64,40\n";

// A bundle <tmp>/<name>/tp1 with the given files (missing: the defaults).
std::string Bundle(const std::string& name, std::map<std::string, std::string> files = {}) {
  const fs::path dir = fs::path(::testing::TempDir()) / "gpu_profile_test" / name / "tp1";
  fs::remove_all(dir.parent_path());
  fs::create_directories(dir);
  files.emplace("dense.csv", kDense);
  files.emplace("per_sequence.csv", kPerSeq);
  files.emplace("attention.csv", kAttention);
  for (const auto& [file, text] : files) {
    const fs::path p = file == "meta.yaml" ? dir.parent_path() / file : dir / file;
    std::ofstream(p) << text;
  }
  return dir.string();
}

AttentionShapeQuery Decodes(double n, double kv) {
  AttentionShapeQuery q;
  q.n_decode = n;
  q.kv_decode_mean = q.kv_decode_min = q.kv_decode_max = kv;
  return q;
}

TEST(GpuProfileTest, DenseCurvesAreExactAtGridPointsAndLinearBetween) {
  auto p = GpuProfile::Load(Bundle("dense"));
  ASSERT_TRUE(p.ok()) << p.status();
  const ProfileCurve* qkv = (*p)->Dense("qkv_proj");
  ASSERT_NE(qkv, nullptr);
  bool beyond = false;
  EXPECT_DOUBLE_EQ(qkv->Eval(1, &beyond), 10e-6);
  EXPECT_DOUBLE_EQ(qkv->Eval(4, &beyond), 13e-6);
  EXPECT_DOUBLE_EQ(qkv->Eval(16, &beyond), 40e-6);
  EXPECT_DOUBLE_EQ(qkv->Eval(10, &beyond), 26.5e-6);  // 13 + (6 / 12) x 27
  EXPECT_FALSE(beyond);
  // Monotone between neighbours (the measured values need not be).
  for (double x = 1; x < 16; x += 0.25) {
    EXPECT_LE(qkv->Eval(x, &beyond), qkv->Eval(x + 0.25, &beyond)) << x;
  }
  EXPECT_DOUBLE_EQ(qkv->Eval(0.5, &beyond), 10e-6);  // below: the first point
  EXPECT_FALSE(beyond);
  EXPECT_DOUBLE_EQ(qkv->Eval(64, &beyond), 40e-6);  // above: the last, flagged
  EXPECT_TRUE(beyond);
  EXPECT_EQ((*p)->Dense("o_proj"), nullptr);
  EXPECT_DOUBLE_EQ((*p)->PerSequence("lm_head")->Eval(8, &beyond), 120e-6);
}

TEST(GpuProfileTest, AttentionInterpolatesNestedOverTheGridTree) {
  auto p = GpuProfile::Load(Bundle("attention"));
  ASSERT_TRUE(p.ok()) << p.status();
  AttentionShapeQuery clamped;
  // Grid points: exact.
  EXPECT_DOUBLE_EQ((*p)->Attention(Decodes(1, 16), &clamped), 5e-6);
  EXPECT_DOUBLE_EQ((*p)->Attention(Decodes(4, 64), &clamped), 20e-6);
  AttentionShapeQuery prefill;
  prefill.prefill_chunk = 32;
  EXPECT_DOUBLE_EQ((*p)->Attention(prefill, &clamped), 30e-6);
  // Two decodes at history 40: at n=1, 5 + (24 / 48) x 4 = 7; at n=4,
  // 8 + (24 / 48) x 12 = 14; n = 2 is a third of the way: 9.333.
  EXPECT_NEAR((*p)->Attention(Decodes(2, 40), &clamped), (7 + (14 - 7) / 3.0) * 1e-6, 1e-15);
  // A 16-token chunk beside one decode at 16: halfway between chunk 0's 5
  // and chunk 32's 34.
  AttentionShapeQuery mixed = Decodes(1, 16);
  mixed.prefill_chunk = 16;
  EXPECT_DOUBLE_EQ((*p)->Attention(mixed, &clamped), 19.5e-6);
  EXPECT_EQ(clamped.prefill_chunk, 16);
  // Past the grid: the last point, the query held to it.
  EXPECT_DOUBLE_EQ((*p)->Attention(Decodes(1, 256), &clamped), 9e-6);
  EXPECT_EQ(clamped.kv_decode_mean, 64);
  EXPECT_DOUBLE_EQ((*p)->Attention(Decodes(8, 16), &clamped), 8e-6);
  EXPECT_EQ(clamped.n_decode, 4);
}

TEST(GpuProfileTest, SkewedDecodeHistoriesMoveTowardTheLongest) {
  const char* meta =
      "gpu: Test GPU\n"
      "skew_fit:\n"
      "  enabled: true\n"
      "  bucket_axes:\n"
      "    n_bins: [0, 2, 8]\n"
      "    n_labels: [n<=2, n<=8]\n"
      "    skew_rate_bins: [-0.01, 0.5, 1.01]\n"
      "    skew_rate_labels: [lo, hi]\n"
      "    kv_big_bins: [0, 1024]\n"
      "    kv_big_labels: [kvB<=1k]\n"
      "    kp_bins: [-1, 0]\n"
      "    kp_labels: [kp=0]\n"
      "  per_tp:\n"
      "    1:\n"
      "      alpha_default: 0.1\n";
  const char* fit = "pc,n_label,skew_rate_label,kv_big_label,kp_label,alpha,n_samples\n"
                    "0,n<=8,lo,kvB<=1k,kp=0,0.5,4\n";
  auto p = GpuProfile::Load(Bundle("skew", {{"meta.yaml", meta}, {"skew_fit.csv", fit}}));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->gpu_name(), "Test GPU");
  // Four decodes at histories 16, 16, 16, 64: mean 28, skew rate
  // (28 - 16) / 48 = 0.25 -> bucket "lo": alpha 0.5.
  AttentionShapeQuery q = Decodes(4, 28);
  q.kv_decode_min = 16;
  q.kv_decode_max = 64;
  EXPECT_DOUBLE_EQ((*p)->SkewAlpha(q), 0.5);
  const double t_mean = 8 + (12.0 / 48) * 12, t_max = 20;  // us
  EXPECT_NEAR((*p)->Attention(q, nullptr), (t_mean + 0.5 * (t_max - t_mean)) * 1e-6, 1e-15);
  // No bucket for a skew rate of 0.75: meta.yaml's default for tp1.
  q.kv_decode_mean = 52;
  EXPECT_DOUBLE_EQ((*p)->SkewAlpha(q), 0.1);
  // Equal histories: no skew.
  EXPECT_DOUBLE_EQ((*p)->SkewAlpha(Decodes(4, 28)), 0);
  // A bundle whose meta.yaml turns the fit off ignores skew_fit.csv.
  std::string off = meta;
  off.replace(off.find("enabled: true"), 13, "enabled: false");
  auto q2 = GpuProfile::Load(Bundle("skew_off", {{"meta.yaml", off}, {"skew_fit.csv", fit}}));
  ASSERT_TRUE(q2.ok()) << q2.status();
  EXPECT_DOUBLE_EQ((*q2)->SkewAlpha(q), 0);
}

// Every malformed file: an error naming the file, the line and the column.
TEST(GpuProfileTest, BadFilesNameTheFileLineAndColumn) {
  struct Case {
    const char* name;
    const char* file;
    const char* text;
    const char* expect;
  };
  const Case cases[] = {
      {"missing_column", "dense.csv", "layer,tokens\nqkv_proj,1\n",
       "dense.csv:1: header has no column time_us (expected columns layer,tokens,time_us)"},
      {"nan", "dense.csv", "layer,tokens,time_us\nqkv_proj,1,10\nqkv_proj,2,nan\n",
       "dense.csv:3: column time_us is \"nan\"; expected a finite number >= 0"},
      {"negative", "per_sequence.csv", "layer,sequences,time_us\nlm_head,1,-4\n",
       "per_sequence.csv:2: column time_us is \"-4\"; expected a finite number >= 0"},
      {"text", "dense.csv", "layer,tokens,time_us\nqkv_proj,one,10\n",
       "dense.csv:2: column tokens is \"one\"; expected a finite number >= 0"},
      {"unsorted", "dense.csv", "layer,tokens,time_us\nqkv_proj,4,10\nqkv_proj,2,9\n",
       "dense.csv:3: column tokens is 2 after 4 for layer qkv_proj; expected each layer's grid "
       "points ascending and unique"},
      {"duplicate", "attention.csv",
       "prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n0,0,1,16,5\n0,0,1,16,6\n",
       "attention.csv:3: grid point (0, 0, 1, 16) is not after the previous row's"},
      {"short_row", "attention.csv",
       "prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n0,0,1,16\n",
       "attention.csv:2: 4 fields; the header has 5"},
  };
  for (const Case& c : cases) {
    auto p = GpuProfile::Load(Bundle(c.name, {{c.file, c.text}}));
    ASSERT_FALSE(p.ok()) << c.name;
    EXPECT_NE(p.status().message().find(c.expect), std::string::npos)
        << c.name << ": " << p.status().message();
  }
  const fs::path bad = fs::path(::testing::TempDir()) / "gpu_profile_test" / "tpx";
  fs::create_directories(bad);
  auto p = GpuProfile::Load(bad.string());
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("not a profile bundle's tp<N> folder"), std::string::npos);
  auto missing = GpuProfile::Load(Bundle("no_files", {{"dense.csv", kDense}}) + "/../nothere/tp1");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

// The GPU device with a bundle: measured times where the grid covers the
// op, the roofline anchored at the last point past it.
TEST(GpuProfileTest, DeviceUsesMeasuredTimesAndAnchorsTheRooflinePastTheGrid) {
  const std::string dir = Bundle("device");
  servesim::v1::DeviceSpec spec;
  auto* gpu = spec.mutable_gpu();
  *gpu->mutable_xpu() = *XpuPreset("rtx-pro-6000");
  gpu->mutable_xpu()->clear_roofline();  // these caps for every op, not the preset's GEMM fit
  gpu->mutable_xpu()->set_compute_utilization(0.8);
  gpu->mutable_xpu()->set_memory_utilization(0.85);
  gpu->mutable_xpu()->set_kernel_overhead_s(4e-6);
  for (auto* f : {gpu->mutable_xpu()}) {
    f->set_dram_energy_pj_per_byte(0);
    f->set_flop_energy_pj(0);
    f->set_int8_op_energy_pj(0);
  }
  *gpu->mutable_interconnect() = *LinkPreset("nvlink4");
  gpu->set_dtype(servesim::v1::DTYPE_BF16);
  auto* ref = gpu->mutable_profile();
  ref->set_dir(dir);
  ref->set_d_model(4096);
  ref->set_qkv_n(6144);
  ref->set_attn_out_k(4096);
  ref->set_ff1_n(28672);
  ref->set_ff2_k(14336);
  ref->set_lm_head_n(128256);
  auto device = GpuDevice::Create(spec);
  ASSERT_TRUE(device.ok()) << device.status();
  auto profile = GpuProfile::Get(dir);
  const GpuProfile::Counts before = (*profile)->counts();

  Op qkv;
  qkv.kind = OpKind::kGemm;
  qkv.stage = Stage::kQkv;
  qkv.m = 4, qkv.n = 6144, qkv.k = 4096;
  Op big = qkv;
  big.m = 64;
  Op norm;
  norm.kind = OpKind::kElementwise;
  norm.stage = Stage::kNorm;
  norm.elements = 16 * 4096;
  norm.bytes_per_element = 4;
  norm.flops_per_element = 5;
  norm.tokens = 16;
  Op attention;
  attention.kind = OpKind::kAttention;
  attention.stage = Stage::kAttention;
  attention.heads = 32, attention.kv_heads = 8, attention.d_head = 128;
  const AttentionSeq seqs[] = {{1, 16, 0}, {1, 16, 1}, {1, 16, 2}, {1, 16, 3}};
  attention.seqs = seqs;
  Op proj = qkv;  // no o_proj in this bundle: the roofline
  proj.stage = Stage::kProjection;
  proj.n = 4096;
  Op ops[] = {qkv, big, norm, attention, proj};
  Cost costs[5];
  ASSERT_TRUE((*device)->Estimate(ops, costs).ok());
  // qkv_proj + rotary_emb at 4 tokens: 13 + (1 + 3/15) us.
  EXPECT_NEAR(costs[0].time_s, (13 + 1 + 3.0 / 15) * 1e-6, 1e-15);
  // 64 tokens, past the grid (16): the last point scaled by the roofline's
  // ratio of the two shapes (qkv_proj; rotary_emb alike).
  auto roofline = [](double m) {
    const double flops = 2 * m * 6144 * 4096, bytes = (m * 4096 + 4096.0 * 6144 + m * 6144) * 2;
    return std::max(flops / (500e12 * 0.8), bytes / (1597e9 * 0.85)) + 4e-6;
  };
  EXPECT_NEAR(costs[1].time_s, (40e-6 + 2e-6) * roofline(64) / roofline(16), 1e-12);
  EXPECT_DOUBLE_EQ(costs[2].time_s, 4e-6);   // layernorm at 16 tokens
  EXPECT_DOUBLE_EQ(costs[3].time_s, 8e-6);   // four decodes at 16: a grid point
  EXPECT_GT(costs[4].time_s, 0);             // the roofline's, flagged missing
  // FLOPs and bytes stay the roofline's.
  EXPECT_DOUBLE_EQ(costs[0].flops, 2.0 * 4 * 6144 * 4096);
  const GpuProfile::Counts after = (*profile)->counts();
  EXPECT_EQ(after.lookups - before.lookups, 2 + 2 + 1 + 1);
  EXPECT_EQ(after.beyond_grid - before.beyond_grid, 2);
  EXPECT_EQ(after.missing_layer - before.missing_layer, 1);
}

// The bundle shipped with the examples loads, with its measured figures.
TEST(GpuProfileTest, ShippedBundleLoads) {
  auto p = GpuProfile::Load(std::string(SERVESIM_SOURCE_DIR) +
                            "/examples/vllm/profiles/RTXPRO6000/meta-llama/Llama-3.1-8B/bf16/tp1");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->tensor_parallel(), 1);
  EXPECT_EQ((*p)->gpu_name(), "NVIDIA RTX PRO 6000 Blackwell Server Edition");
  EXPECT_DOUBLE_EQ((*p)->Attention(Decodes(1, 16), nullptr), 8.35233e-6);
  bool beyond = false;
  EXPECT_DOUBLE_EQ((*p)->Dense("qkv_proj")->Eval(2, &beyond), 38.6667e-6);
  EXPECT_EQ((*p)->Dense("qkv_proj")->x.size(), 152u);
  EXPECT_EQ((*p)->attention_points().size(), 19364u);
}

}  // namespace
}  // namespace servesim::devices
