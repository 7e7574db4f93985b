#include "devices/tensor.h"

#include <cmath>

namespace servesim::devices {

int64_t FirstNonFinite(ElementType type, const uint8_t* data, size_t size) {
  // All exponent bits set: infinity or NaN.
  if (type == ElementType::kFp16) {
    for (size_t i = 0; i + 1 < size; i += 2) {
      uint16_t h;
      std::memcpy(&h, data + i, 2);
      if ((h & 0x7c00) == 0x7c00) return static_cast<int64_t>(i / 2);
    }
  } else {
    for (size_t i = 0; i + 3 < size; i += 4) {
      uint32_t x;
      std::memcpy(&x, data + i, 4);
      if ((x & 0x7f800000u) == 0x7f800000u) return static_cast<int64_t>(i / 4);
    }
  }
  return -1;
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: value = mant * 2^-24
      const float f = std::ldexp(static_cast<float>(mant), -24);
      return sign ? -f : f;
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t abs = x & 0x7fffffff;
  if (abs >= 0x7f800000u) {  // inf or nan
    return sign | 0x7c00 | (abs > 0x7f800000u ? 0x200 : 0);
  }
  if (abs >= 0x477ff000u) return sign | 0x7c00;  // rounds above 65504: inf
  if (abs < 0x38800000u) {  // below 2^-14: subnormal half (or zero)
    const float a = std::fabs(f);
    // a * 2^24 rounded to nearest even gives the subnormal mantissa.
    const float scaled = a * 16777216.0f;
    const uint16_t mant = static_cast<uint16_t>(std::nearbyint(scaled));
    return sign | mant;  // mant == 0x400 correctly becomes the min normal
  }
  // Normal: drop 13 mantissa bits with round-to-nearest-even.
  const uint32_t rounded = abs + 0xfff + ((abs >> 13) & 1);
  return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

int64_t Tensor::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Tensor Tensor::Zeros(ElementType type, std::vector<int64_t> shape) {
  Tensor t;
  t.type = type;
  t.shape = std::move(shape);
  t.bytes.assign(t.NumElements() * ElementSize(type), 0);
  return t;
}

}  // namespace servesim::devices
