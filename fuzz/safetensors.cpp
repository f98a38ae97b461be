// Fuzz target: the safetensors reader (runtime/dopt/runtime/safetensors.hpp)
// on a whole file in memory: the header's JSON, shapes, offsets, checksums,
// the tensors' bytes. Its contract: anything malformed is a dopt::IOError,
// the reader never reads outside the buffer.
#include <cstddef>
#include <cstdint>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const dopt::SafetensorsFile f = dopt::parse_safetensors(data, size, "fuzz.safetensors");
    for (const auto& [name, t] : f.tensors)
      if (!t.defined()) __builtin_trap();
  } catch (const dopt::IOError&) {
  }
  return 0;
}
