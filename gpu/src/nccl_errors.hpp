#pragma once
// Internal to dopt_gpu: how NCCL results become dopt errors, how a
// nonblocking NCCL call is waited for, and which device a communicator uses
// by default (no NCCL or CUDA types here, so all of it is tested on machines
// without a GPU). Codes are ncclResult_t values (nccl.cpp checks they match
// nccl.h).
//   0 ncclSuccess            -> no error (null)
//   1 ncclUnhandledCudaError -> DeviceError
//   2 ncclSystemError        -> IOError (a system call or the network failed)
//   3 ncclInternalError      -> Error
//   4 ncclInvalidArgument    -> ValueError
//   5 ncclInvalidUsage       -> StateError
//   6 ncclRemoteError        -> PeerLostError (a peer failed or exited)
//   7 ncclInProgress         -> no error (null): the nonblocking call is still running
//   other                    -> Error
// Messages: "<op>: NCCL <name> (<code>)[: detail]", with the rank attached.
#include <chrono>
#include <exception>
#include <optional>
#include <string>
#include <thread>

namespace dopt::gpu::detail {

const char* nccl_result_name(int code) noexcept;
std::exception_ptr nccl_error(int code, const std::string& op, int rank, const std::string& detail = "");
/// Like nccl_error for a failure that has been established: never null. A
/// code that is not an error (success, in progress) becomes an Error saying
/// that the communicator's state could not be determined.
std::exception_ptr nccl_failure(int code, const std::string& op, int rank, const std::string& detail = "");

/// How waiting for a nonblocking NCCL call ended.
struct NcclWaitResult {
  int code = 0;               // the call's final result (0: success)
  bool timed_out = false;     // still in progress at the deadline
  bool query_failed = false;  // ncclCommGetAsyncError itself failed; `code` is its result
};

/// Polls a nonblocking NCCL call whose first result was `r` until it is no
/// longer in progress (7). `query(int& r)` is ncclCommGetAsyncError on the
/// communicator: it returns its own result and sets r.
template <class Query>
NcclWaitResult wait_nccl(int r, Query&& query, std::chrono::steady_clock::time_point deadline,
                         std::chrono::microseconds poll = std::chrono::microseconds(10)) {
  NcclWaitResult out;
  while (r == 7) {
    if (std::chrono::steady_clock::now() >= deadline) {
      out.code = r;
      out.timed_out = true;
      return out;
    }
    std::this_thread::sleep_for(poll);
    const int q = query(r);
    if (q != 0) {
      out.code = q == 7 ? 3 : q;  // a query that cannot answer is an internal error
      out.query_failed = true;
      return out;
    }
  }
  out.code = r;
  return out;
}

/// The device a communicator uses when none is given: the launcher's local
/// rank (LOCAL_RANK and the like, one process per GPU) when the process was
/// launched, else the calling thread's current CUDA device. Throws ValueError
/// when the local rank names a device that is not there.
int default_nccl_device(std::optional<int> local_rank, int current_device, int device_count);

}  // namespace dopt::gpu::detail
