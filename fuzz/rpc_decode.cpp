// Fuzz target: dopt::rpc's decoder (actors/dopt/actors/rpc_serialize.hpp)
// reading the argument and result types RPC functions take, from bytes a
// peer sent. Every malformed message is a dopt::TypeError; counts and
// tensor shapes are checked before anything is allocated for them.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "dopt/actors/rpc_serialize.hpp"
#include "dopt/runtime/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::vector<char> bytes(reinterpret_cast<const char*>(data) + 1, reinterpret_cast<const char*>(data) + size);
  dopt::rpc::Decoder d(bytes, nullptr, "fuzz");
  try {
    switch (data[0] % 6) {
      case 0: {
        std::tuple<int, double, std::string, bool> v;
        dopt::rpc::read(d, v);
        break;
      }
      case 1: {
        dopt::Tensor t;
        dopt::rpc::read(d, t);
        break;
      }
      case 2: {
        std::vector<std::vector<std::string>> v;
        dopt::rpc::read(d, v);
        break;
      }
      case 3: {
        std::optional<std::pair<std::int64_t, dopt::Tensor>> v;
        dopt::rpc::read(d, v);
        break;
      }
      case 4: {
        std::vector<dopt::Tensor> v;
        dopt::rpc::read(d, v);
        break;
      }
      default: {
        std::tuple<std::uint8_t, std::vector<double>, std::optional<std::string>> v;
        dopt::rpc::read(d, v);
        break;
      }
    }
  } catch (const dopt::Error&) {
  }
  return 0;
}
