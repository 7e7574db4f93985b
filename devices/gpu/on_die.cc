#include "devices/gpu/on_die.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace servesim::devices {
namespace {

constexpr double kTiles[] = {8, 16, 32, 64, 128, 192, 256, 320, 384, 448, 512};
constexpr double kTileK = 32;         // the L1 tile's depth
constexpr double kRegisterTile = 16;  // register tiles are 16 x 16

double TileBytes(const GemmShape& g, double tm, double tn) {
  return g.count * (std::ceil(g.n / tn) * g.m * g.k * g.a_bytes +
                    std::ceil(g.m / tm) * g.n * g.k * g.b_bytes + g.m * g.n * g.a_bytes);
}

double Blocks(const GemmShape& g, double tm, double tn) {
  return g.block_per_tile ? std::ceil(g.m / tm) * std::ceil(g.n / tn) * g.count : g.count;
}

}  // namespace

double SmUtilization(double blocks, int cores) {
  if (blocks <= 0) return 1;
  const double c = std::max(1, cores);
  return blocks / (std::ceil(blocks / c) * c);
}

OnDieTraffic GemmOnDie(const GemmShape& g, int cores, double l1_bytes) {
  OnDieTraffic t;
  if (g.m <= 0 || g.n <= 0 || g.k <= 0 || g.count <= 0) return t;
  const double elem = std::max(g.a_bytes, g.b_bytes);
  double best = std::numeric_limits<double>::infinity();
  double best_m = std::min(kTiles[0], g.m), best_n = std::min(kTiles[0], g.n);
  for (double tile_m : kTiles) {
    for (double tile_n : kTiles) {
      const double tm = std::min(tile_m, g.m), tn = std::min(tile_n, g.n);
      if ((tm + tn) * kTileK * elem + tm * tn * elem > l1_bytes) continue;
      const double u = SmUtilization(Blocks(g, tm, tn), cores);
      const double cost = TileBytes(g, tm, tn) / (u * u);
      if (cost < best) {
        best = cost;
        best_m = tm;
        best_n = tn;
      }
    }
  }
  t.tile_m = best_m;
  t.tile_n = best_n;
  t.sm_utilization = SmUtilization(Blocks(g, best_m, best_n), cores);
  t.l2_bytes = TileBytes(g, best_m, best_n);
  t.l1_bytes = TileBytes(g, kRegisterTile, kRegisterTile);
  t.register_accesses = 3 * g.m * g.n * g.k * g.count;
  return t;
}

}  // namespace servesim::devices
