// Fuzz target: a state dict loaded from a safetensors file
// (runtime/dopt/runtime/state_dict.hpp): parse_safetensors, then
// state_dict_from_safetensors (entry names, group indices, hyperparameters
// as JSON). Malformed files are dopt::IOError or dopt::StateDictError.
#include <cstddef>
#include <cstdint>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/safetensors.hpp"
#include "dopt/runtime/state_dict.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const dopt::SafetensorsFile f = dopt::parse_safetensors(data, size, "fuzz.safetensors");
    const dopt::StateDict sd = dopt::state_dict_from_safetensors(f, "fuzz.safetensors");
    (void)dopt::state_dict_to_safetensors(sd);
  } catch (const dopt::Error&) {
  }
  return 0;
}
