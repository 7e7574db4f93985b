// On-die traffic of GPU kernels: the bytes a GEMM's tiles move from L2 to
// L1/shared memory and from L1 to registers, and its register accesses, by
// the tiling model of the AttAcc authors' simulator (scale-snu/
// attacc_simulator, src/devices.py: _get_optimal_tile, _get_traffic). The
// GPU device charges them at XpuSpec.on_die's energies (docs/energy.md).
#ifndef SERVESIM_DEVICES_GPU_ON_DIE_H_
#define SERVESIM_DEVICES_GPU_ON_DIE_H_

namespace servesim::devices {

struct OnDieTraffic {
  double l2_bytes = 0;            // L2 -> L1/shared memory
  double l1_bytes = 0;            // L1/shared memory -> registers
  double register_accesses = 0;   // operand reads and writes
  double tile_m = 0, tile_n = 0;  // the L1 tile chosen
  double sm_utilization = 1;      // its blocks' share of the last wave's SMs
};

struct GemmShape {
  double m = 0, n = 0, k = 0;  // [m x k] x [k x n]
  double count = 1;            // independent products (attention: heads)
  // Element bytes of the [m x k] operand and the output, and of the
  // [k x n] operand.
  double a_bytes = 2, b_bytes = 2;
  // Thread blocks: one per output tile (a GEMM), or one per product
  // (attention heads, as the authors' simulator counts them).
  bool block_per_tile = true;
};

// The L1 tile (tm, tn) out of {8, 16, 32, 64, 128, 192, 256, 320, 384, 448,
// 512}^2 (clipped to m and n) whose (tm + tn) x 32 + tm x tn elements fit
// `l1_bytes` and that minimises L2 bytes / u^2, u being the share of the
// last wave's SMs that its thread blocks fill (blocks / (ceil(blocks /
// cores) x cores)); ties go to the first in that order. Then:
//   L2 bytes = count x (ceil(n/tn) m k a + ceil(m/tm) n k b + m n a)
//   L1 bytes = the same with 16 x 16 register tiles
//   register accesses = 3 m n k x count (two operands read, one written
//   per multiply-accumulate).
// Where no tile fits, the smallest is taken.
OnDieTraffic GemmOnDie(const GemmShape& g, int cores, double l1_bytes);

// blocks / (ceil(blocks / cores) x cores): the share of the SMs that
// `blocks` thread blocks keep busy, averaged over their waves.
double SmUtilization(double blocks, int cores);

}  // namespace servesim::devices

#endif  // SERVESIM_DEVICES_GPU_ON_DIE_H_
