// The range of simulated time servesim accepts.
//
// Simulated time is a double in seconds (SimGrid's clock). Its resolution
// shrinks as it grows: the gap between neighbouring doubles at 2^30 s
// (~34 years) is 2^-22 s = 0.24 us. An iteration of a small model lasts a
// few milliseconds and a token gap is measured as a difference of two clock
// readings, so past ~1e9 s the figures lose their sub-microsecond
// resolution (and far past it, a TBT of 0). Every input that places
// events in time (trace timestamps, arrival rates and rate scales, windows)
// is therefore checked against kMaxSimulatedSeconds, and a run that would
// pass it stops with an error rather than report degraded figures.
#ifndef SERVESIM_COMMON_SIM_TIME_H_
#define SERVESIM_COMMON_SIM_TIME_H_

namespace servesim {

// 1e9 s (31.7 years): doubles there are spaced 1.19e-7 s apart.
inline constexpr double kMaxSimulatedSeconds = 1e9;

}  // namespace servesim

#endif  // SERVESIM_COMMON_SIM_TIME_H_
