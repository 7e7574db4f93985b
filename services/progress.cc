#include "services/progress.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace servesim::services {

std::string ProgressBar::Line(double sim_s, double wall_s) const {
  constexpr int kWidth = 24;
  const double frac = trace_s_ > 0 && sim_s >= 0 ? std::min(sim_s / trace_s_, 1.0) : 0.0;
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(filled, '#');
  bar.resize(kWidth, '.');
  const double rtf = wall_s > 0 ? sim_s / wall_s : 0;
  std::string eta = "-";
  if (rtf > 0 && sim_s < trace_s_) {
    eta = absl::StrFormat("%.0fs", (trace_s_ - sim_s) / rtf);
  }
  return absl::StrFormat("[%s] %.0f/%.0f s simulated  %d/%d requests  %.0fx real time  ETA %s", bar,
                         sim_s, trace_s_, done_, requests_, rtf, eta);
}

void ProgressBar::OnClock(double simulated_s, double wall_s) {
  if (out_ == nullptr) return;
  if (every_s_ > 0) {
    // Lines: the first after every_s, then one each every_s.
    if (wall_s < (last_draw_s_ < 0 ? every_s_ : last_draw_s_ + every_s_)) return;
    last_draw_s_ = wall_s;
    std::string line = Line(simulated_s, wall_s);
    line = line.substr(line.find("] ") + 2);  // the bar only means something redrawn
    std::fprintf(out_, "servesim: progress: %s\n", line.c_str());
    std::fflush(out_);
    return;
  }
  if (wall_s < 1.0 || wall_s - last_draw_s_ < 0.2) return;
  last_draw_s_ = wall_s;
  std::fprintf(out_, "\r%s\033[K", Line(simulated_s, wall_s).c_str());
  std::fflush(out_);
  drawn_ = true;
}

void ProgressBar::OnDone(double, double) {
  if (out_ != nullptr && drawn_ && every_s_ <= 0) {
    std::fprintf(out_, "\r\033[K");
    std::fflush(out_);
  }
}

}  // namespace servesim::services
