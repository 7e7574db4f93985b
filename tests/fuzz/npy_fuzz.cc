// libFuzzer target: the .npy loader (devices/attention_data.h ParseNpy, what
// LoadNpy runs on a file's bytes) on arbitrary contents. A tensor it accepts
// must hold exactly the bytes its shape and type need.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "devices/attention_data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto t = servesim::devices::ParseNpy(bytes, "fuzz.npy");
  if (!t.ok()) {
    if (t.status().message().find("fuzz.npy") == absl::string_view::npos) std::abort();
    return 0;
  }
  size_t want = servesim::devices::Tensor::ElementSize(t->type);
  bool overflow = false;
  for (int64_t d : t->shape) {
    if (d < 0) std::abort();
    overflow |= __builtin_mul_overflow(want, static_cast<size_t>(d), &want);
  }
  // An empty tensor may have huge other dimensions; a non-empty one cannot.
  if (!t->bytes.empty() && (overflow || t->bytes.size() != want)) std::abort();
  if (t->bytes.empty() && !overflow && want != 0) std::abort();
  if (t->bytes.size() > size) std::abort();
  return 0;
}
