#pragma once
// Internal to dopt_gpu: how NCCL results become dopt errors (no NCCL types
// here, so it is tested on machines without a GPU). Codes are ncclResult_t
// values (nccl.cpp checks they match nccl.h).
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
#include <exception>
#include <string>

namespace dopt::gpu::detail {

const char* nccl_result_name(int code) noexcept;
std::exception_ptr nccl_error(int code, const std::string& op, int rank, const std::string& detail = "");

}  // namespace dopt::gpu::detail
