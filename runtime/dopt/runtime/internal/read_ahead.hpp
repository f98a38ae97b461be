#pragma once
// Internal: reading many tensors of one safetensors file into fresh memory,
// with the destinations' pages mapped on a second thread ahead of the reads.
// Not part of the API (the consolidated ZeRO load uses it).
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "dopt/runtime/safetensors.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::detail {

/// Maps the whole 4 KiB pages of [p, p + n) writable now
/// (MADV_POPULATE_WRITE); ranges under 64 KiB are left to fault as written.
/// Advice only: a kernel older than 5.14 ignores it. Any thread.
void populate_pages(void* p, std::size_t n) noexcept;

/// Reads every (name, destination) of `items` with rd.read_into, in order, on
/// the calling thread (its errors are read_into's, thrown from here; the
/// items after a failed one are not read). Meanwhile one helper thread maps
/// the destinations' pages in the same order, ahead of the reads; the
/// calling thread maps any destination the helper has not begun, and does
/// not wait for one the helper is mapping (read_into maps it as well; the
/// two threads then fault the same range). Returns after the helper has
/// stopped.
/// With one hardware thread, or under 8 MiB in all, everything runs on the
/// calling thread. Nothing else may use the destinations meanwhile.
void read_into_all(SafetensorsReader& rd, const std::vector<std::pair<std::string, Tensor>>& items);

}  // namespace dopt::detail
