// Reproducible random numbers.
//
// The simulator derives every random stream from one master seed. The
// engine (xoshiro256**, Blackman & Vigna 2018) and the distributions are our
// own code, so a (seed, stream) pair yields the same numbers with any
// compiler or standard library: the standard library's distributions are
// implementation-defined, and absl::BitGen is reseeded per process. SimGrid
// does the same for the same reason (include/xbt/random.hpp).
#ifndef SERVESIM_COMMON_RNG_H_
#define SERVESIM_COMMON_RNG_H_

#include <cmath>
#include <cstdint>
#include <string_view>

namespace servesim {

// SplitMix64 step; used to expand seeds into engine state.
inline uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// FNV-1a of a stream name, so streams are named, not numbered by hand.
inline uint64_t StreamId(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

class Rng {
 public:
  // The stream for `stream_name` under `master_seed`. Different names give
  // independent streams.
  Rng(uint64_t master_seed, std::string_view stream_name) {
    uint64_t sm = master_seed ^ StreamId(stream_name);
    for (uint64_t& word : s_) word = SplitMix64(sm);
  }

  uint64_t NextU64() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 53 random bits.
  double Uniform() { return static_cast<double>(NextU64() >> 11) * 0x1.0p-53; }

  // Uniform integer in [0, n), n > 0, without modulo bias (Lemire 2019).
  uint64_t UniformInt(uint64_t n) {
    unsigned __int128 m = static_cast<unsigned __int128>(NextU64()) * n;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < n) {
      const uint64_t threshold = -n % n;
      while (low < threshold) {
        m = static_cast<unsigned __int128>(NextU64()) * n;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

  // Exponential with the given mean.
  double Exponential(double mean) { return -mean * std::log1p(-Uniform()); }

  // Standard normal (Marsaglia polar method; the spare is discarded so the
  // stream position depends only on the number of calls).
  double Normal() {
    double u, v, s;
    do {
      u = 2.0 * Uniform() - 1.0;
      v = 2.0 * Uniform() - 1.0;
      s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    return u * std::sqrt(-2.0 * std::log(s) / s);
  }

  // Gamma(shape k, scale theta) by Marsaglia & Tsang (2000); for k < 1 uses
  // the boost Gamma(k+1) * U^(1/k).
  double Gamma(double shape, double scale) {
    if (shape < 1.0) {
      const double u = Uniform();
      return Gamma(shape + 1.0, scale) * std::pow(u, 1.0 / shape);
    }
    const double d = shape - 1.0 / 3.0;
    const double c = 1.0 / std::sqrt(9.0 * d);
    while (true) {
      double x, v;
      do {
        x = Normal();
        v = 1.0 + c * x;
      } while (v <= 0.0);
      v = v * v * v;
      const double u = Uniform();
      if (u < 1.0 - 0.0331 * x * x * x * x) return d * v * scale;
      if (std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) {
        return d * v * scale;
      }
    }
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace servesim

#endif  // SERVESIM_COMMON_RNG_H_
