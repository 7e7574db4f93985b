// Dense tensors for functional kernels: row-major, fp16 or fp32, packed in a
// byte buffer so the same bytes can travel over gRPC unchanged.
#ifndef SERVESIM_DEVICES_TENSOR_H_
#define SERVESIM_DEVICES_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace servesim::devices {

// IEEE 754 binary16 <-> binary32, round-to-nearest-even.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);

enum class ElementType { kFp16, kFp32 };

struct Tensor {
  ElementType type = ElementType::kFp32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  int64_t NumElements() const;
  static int ElementSize(ElementType t) { return t == ElementType::kFp16 ? 2 : 4; }
  // Element i as float (fp16 is widened exactly).
  float At(int64_t i) const {
    if (type == ElementType::kFp16) {
      uint16_t h;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      return HalfToFloat(h);
    }
    float f;
    std::memcpy(&f, bytes.data() + 4 * i, 4);
    return f;
  }
  void Set(int64_t i, float v) {
    if (type == ElementType::kFp16) {
      const uint16_t h = FloatToHalf(v);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    } else {
      std::memcpy(bytes.data() + 4 * i, &v, 4);
    }
  }
  static Tensor Zeros(ElementType type, std::vector<int64_t> shape);
};

// The index of the first NaN or infinite element of `size` bytes of
// `type` elements, or -1 if every one is finite. The kernels' fixed-point
// and hashing steps are defined for finite inputs only, so tensors from
// outside (agent requests, .npy captures) are checked with this.
int64_t FirstNonFinite(ElementType type, const uint8_t* data, size_t size);

}  // namespace servesim::devices

#endif  // SERVESIM_DEVICES_TENSOR_H_
