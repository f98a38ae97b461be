// Readable type names for RPC error messages (rpc_serialize.hpp).
#include <cxxabi.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "dopt/actors/rpc_serialize.hpp"

namespace dopt::rpc::detail {

std::string readable_type_name(const std::string& mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status),
                                              std::free);
  return status == 0 && out ? std::string(out.get()) : mangled;
}

}  // namespace dopt::rpc::detail
