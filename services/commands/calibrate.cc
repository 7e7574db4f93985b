// `servesim calibrate PROFILE_DIR`: fit the GPU roofline's efficiencies to a
// measured profile bundle (studies/calibrate.h), print the fit and its error
// per op class, and optionally write the GEMM fit as a scenario fragment.
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "devices/gpu/profile.h"
#include "devices/model.h"
#include "devices/presets.h"
#include "services/commands/commands.h"
#include "studies/calibrate.h"

namespace servesim::services {

int CalibrateCommand(const Args& args) {
  namespace fs = std::filesystem;
  std::string dir, xpu_name, model_name, out;
  FlagParser flags;
  flags.Positional([&dir](const std::string& a) -> std::string {
    if (!dir.empty()) return absl::StrCat("unexpected argument ", a);
    dir = a;
    return "";
  });
  flags.String("--xpu", &xpu_name, "--xpu needs an xPU preset");
  flags.String("--model", &model_name, "--model needs a model preset");
  flags.String("--out", &out, "--out needs a file");
  if (auto exit = ParseFlags(flags, args)) return *exit;
  if (dir.empty()) {
    return UsageError("calibrate needs a profile bundle's tp<N> folder "
                      "(<root>/<gpu>/<org>/<model>/<dtype>/tp<N>)");
  }
  auto profile = devices::GpuProfile::Load(fs::absolute(dir).lexically_normal().string());
  if (!profile.ok()) return Fail(profile.status());
  // The bundle's path names the GPU and the model: <gpu>/<org>/<model>/<dtype>/tp<N>.
  const fs::path tp_dir = fs::path((*profile)->dir());
  const fs::path variant = tp_dir.parent_path(), model_dir = variant.parent_path();
  const std::string hf =
      absl::StrCat(model_dir.parent_path().filename().string(), "/", model_dir.filename().string());
  const std::string gpu = model_dir.parent_path().parent_path().filename().string();
  if (model_name.empty()) {
    for (const std::string& p : devices::ModelPresetNames()) {
      if (auto m = devices::ModelPreset(p); m.ok() && absl::EqualsIgnoreCase(m->hf_name(), hf)) {
        model_name = p;
      }
    }
    if (model_name.empty()) {
      return Fail(absl::NotFoundError(absl::StrCat(
          dir, ": model ", hf, " is no preset's hf_name; name the preset with --model (known: ",
          absl::StrJoin(devices::ModelPresetNames(), ", "), ")")));
    }
  }
  if (xpu_name.empty()) {
    for (const std::string& p : devices::XpuPresetNames()) {
      if (auto x = devices::XpuPreset(p); x.ok() && x->profile_name() == gpu) xpu_name = p;
    }
    if (xpu_name.empty()) {
      return Fail(absl::NotFoundError(absl::StrCat(
          dir, ": GPU folder ", gpu, " is no xPU preset's profile_name; name the preset with "
          "--xpu (known: ", absl::StrJoin(devices::XpuPresetNames(), ", "), ")")));
    }
  }
  auto model = devices::ModelPreset(model_name);
  if (!model.ok()) return Fail(model.status());
  auto xpu = devices::XpuPreset(xpu_name);
  if (!xpu.ok()) return Fail(xpu.status());
  devices::ModelDims dims = devices::ModelDimsFromSpec(*model);
  auto fits = studies::CalibrateRoofline(**profile, dims, (*profile)->tensor_parallel(), *xpu);
  if (!fits.ok()) return Fail(fits.status());
  std::cout << "servesim calibrate: " << hf << " on " << xpu_name << " (TP="
            << (*profile)->tensor_parallel() << "), " << (*profile)->dir() << "\n"
            << "  roofline: t = max(FLOPs / (peak x compute), bytes / (bandwidth x memory)) "
               "+ overhead\n"
            << studies::CalibrationTable(*fits);
  const std::string text = studies::CalibrationPbtxt(dir, *xpu, *fits);
  if (!out.empty()) {
    std::ofstream f(out, std::ios::trunc);
    f << text;
    f.close();
    if (!f) return Fail(absl::UnavailableError(absl::StrCat(out, ": cannot write")));
    std::cout << "  wrote " << out << "\n";
  } else {
    std::cout << "\n" << text;
  }
  return 0;
}

}  // namespace servesim::services
