#pragma once
// Internal: lets a test harness (dopt's deterministic simulation) make a
// checkpoint read fail or return damaged bytes. Not part of the API.
//
// When a hook is set, every SafetensorsReader asks it, once, when it opens a
// file: 0 reads normally, 1 fails the open with IOError, 2 flips bits in the
// first non-empty tensor it reads (a checksummed file then fails its check).
#include <atomic>
#include <string>

namespace dopt::detail {

using ReadFaultHook = int (*)(const std::string& path);
inline std::atomic<ReadFaultHook> g_read_fault_hook{nullptr};

}  // namespace dopt::detail
