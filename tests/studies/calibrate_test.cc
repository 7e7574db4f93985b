// Roofline calibration recovers the efficiencies a bundle was made with.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_format.h"
#include "devices/gpu/profile.h"
#include "devices/presets.h"
#include "gtest/gtest.h"
#include "studies/calibrate.h"
#include "tests/test_util.h"

namespace servesim::studies {
namespace {

// A bundle whose GEMM times are the roofline at compute 0.6, memory 0.7 and
// 5 us per kernel, for Llama-3.1-8B's shapes on an RTX PRO 6000: the fit
// must find those figures, with no error left.
TEST(CalibrateTest, RecoversTheEfficienciesTheTimesWereMadeWith) {
  const std::string dir = test_util::FreshDir("bundle") + "/tp1";
  std::filesystem::create_directories(dir);
  const auto xpu = *devices::XpuPreset("rtx-pro-6000");
  const double peak = xpu.peak_flops_fp16(), bw = xpu.memory_bw_bytes_per_s();
  auto time_us = [&](double m, double n, double k) {
    const double flops = 2 * m * n * k, bytes = (m * k + k * n + m * n) * 2;
    return 1e6 * (std::max(flops / (peak * 0.6), bytes / (bw * 0.7)) + 5e-6);
  };
  std::ofstream dense(dir + "/dense.csv");
  dense << "layer,tokens,time_us\n";
  const struct {
    const char* name;
    double n, k;
  } layers[] = {{"qkv_proj", 6144, 4096},
                {"o_proj", 4096, 4096},
                {"gate_up_proj", 28672, 4096},
                {"down_proj", 4096, 14336}};
  for (const auto& l : layers) {
    for (double m = 1; m <= 4096; m *= 2) {
      dense << absl::StrFormat("%s,%.0f,%.6f\n", l.name, m, time_us(m, l.n, l.k));
    }
  }
  dense.close();
  std::ofstream seq(dir + "/per_sequence.csv");
  seq << "layer,sequences,time_us\n";
  for (double s = 1; s <= 256; s *= 2) {
    seq << absl::StrFormat("lm_head,%.0f,%.6f\n", s, time_us(s, 128256, 4096));
  }
  seq.close();
  std::ofstream(dir + "/attention.csv")
      << "prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n0,0,1,16,10\n";
  auto profile = devices::GpuProfile::Load(dir);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const auto model = devices::ModelDimsFromSpec(*devices::ModelPreset("llama3.1-8b"));
  auto xpu_spec = xpu;
  xpu_spec.set_compute_utilization(0.8);
  xpu_spec.set_memory_utilization(0.85);
  xpu_spec.set_kernel_overhead_s(4e-6);
  auto fits = CalibrateRoofline(**profile, model, 1, xpu_spec);
  ASSERT_TRUE(fits.ok()) << fits.status();
  ASSERT_EQ(fits->size(), 2u);  // gemm, attention
  const RooflineFit& gemm = (*fits)[0];
  EXPECT_EQ(gemm.op_class, "gemm");
  EXPECT_EQ(gemm.points, 4 * 13 + 9);
  EXPECT_NEAR(gemm.compute_utilization, 0.6, 1e-9);
  EXPECT_NEAR(gemm.memory_utilization, 0.7, 1e-9);
  EXPECT_NEAR(gemm.kernel_overhead_s, 5e-6, 1e-9);
  EXPECT_LT(gemm.max_error, 1e-6);
  EXPECT_GT(gemm.uncalibrated_mean_error, 0.05);  // the preset's caps are off
  EXPECT_EQ((*fits)[1].op_class, "attention");
  EXPECT_EQ((*fits)[1].points, 1);
  const std::string text = CalibrationPbtxt("tp1", xpu_spec, *fits);
  EXPECT_NE(text.find("    op_class: \"gemm\"\n    compute_utilization: 0.600\n"
                      "    memory_utilization: 0.700\n    kernel_overhead_s: 5e-06\n"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace servesim::studies
