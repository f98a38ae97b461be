#include "checkpoint/agree.hpp"

#include <algorithm>
#include <cstring>

#include "dopt/runtime/error.hpp"

namespace dopt::checkpoint {

namespace {

// One rank's record: value (8 bytes), error class (1 byte: 0 none), message.
constexpr std::size_t kMessageBytes = 1015;
constexpr std::size_t kRecordBytes = 8 + 1 + kMessageBytes;

enum Kind : std::uint8_t { none = 0, io = 1, state_dict = 2, value = 3, state = 4, other = 5 };

Kind kind_and_message(std::exception_ptr e, std::string* message) {
  try {
    std::rethrow_exception(e);
  } catch (const StateDictError& x) {
    *message = x.what();
    return state_dict;
  } catch (const ValueError& x) {
    *message = x.what();
    return value;
  } catch (const IOError& x) {
    *message = x.what();
    return io;
  } catch (const StateError& x) {
    *message = x.what();
    return state;
  } catch (const std::exception& x) {
    *message = x.what();
  } catch (...) {
    *message = "unknown exception";
  }
  return other;
}

[[noreturn]] void throw_as(Kind kind, const char* op, const std::string& what, int rank) {
  switch (kind) {
    case io: throw IOError(op, what, rank);
    case state_dict: throw StateDictError(op, what, rank);
    case value: throw ValueError(op, what, rank);
    case state: throw StateError(op, what, rank);
    default: throw Error(op, what, rank);
  }
}

}  // namespace

std::vector<std::int64_t> agree(ProcessGroup& group, std::exception_ptr local, std::int64_t value, const char* op,
                                const std::string& consequence) {
  const int n = group.size(), me = group.rank();
  Tensor mine = Tensor::zeros({static_cast<std::int64_t>(kRecordBytes)}, DType::uint8);
  auto* p = mine.data<std::uint8_t>();
  std::memcpy(p, &value, 8);
  if (local) {
    std::string message;
    p[8] = kind_and_message(local, &message);
    std::memcpy(p + 9, message.data(), std::min(message.size(), kMessageBytes));
  }
  Tensor all = Tensor::zeros({static_cast<std::int64_t>(kRecordBytes) * n}, DType::uint8);
  group.all_gather_into_tensor(all, mine);
  std::vector<std::int64_t> values(static_cast<std::size_t>(n));
  const auto* a = all.data<std::uint8_t>();
  int failed = -1;
  for (int r = 0; r < n; ++r) {
    const auto* rec = a + static_cast<std::size_t>(r) * kRecordBytes;
    std::memcpy(&values[static_cast<std::size_t>(r)], rec, 8);
    if (rec[8] != none && failed < 0) failed = r;
  }
  if (failed < 0) return values;
  if (local) std::rethrow_exception(local);
  const auto* rec = a + static_cast<std::size_t>(failed) * kRecordBytes;
  const char* text = reinterpret_cast<const char*>(rec + 9);
  const std::string message(text, strnlen(text, kMessageBytes));
  throw_as(static_cast<Kind>(rec[8]), op, "rank " + std::to_string(failed) + " failed: " + message + "; " + consequence,
           me);
}

}  // namespace dopt::checkpoint
