#pragma once
// The MPI plane (DOPT_BACKEND=mpi, ranks started by mpirun or srun): every
// collective on CPU tensors moves its bytes through MPI (the fabric MPI drives:
// InfiniBand, RoCE, shared memory, TCP), on a communicator per group: the
// world's is a duplicate of MPI_COMM_WORLD, a subgroup's comes from
// MPI_Comm_split inside the world's new_group call. Built only when the build
// found MPI (DOPT_HAVE_MPI); otherwise make_mpi_plane throws.
//
// What stays dopt's:
//  * matching: every call first gathers a hash of every member's descriptor
//    (MPI_Iallgather); members that disagree all fail with
//    CollectiveMismatchError naming both calls, and the group stays usable;
//  * reduction order: MPI's reductions are not used. all_reduce, reduce and
//    reduce_scatter send slice s of every member's data to member s
//    (MPI_Ialltoallv), which combines the n contributions in the group's order
//    (rank order, or gloo's ring order) with dopt's kernels; the results
//    travel back with MPI_Iallgatherv (or MPI_Igatherv to a reduce's root).
//    So results are bit for bit those of the other planes;
//  * waits: every call polls its MPI requests, bounded by the call's timeout
//    (TimeoutError; the group is then unusable: MPI cannot cancel a
//    collective) and by the control plane's view of the peers (PeerLostError
//    naming the lost rank). A process that dies usually makes MPI abort the
//    whole job instead (MPI's default error handler): that is MPI's choice.
//  * send/recv run on the actor plane (dopt's control connections).
// Threads: each group's calls run in sequence order on its SerialExecutor;
// groups run concurrently (MPI_THREAD_MULTIPLE is required).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dopt/runtime/launch_env.hpp"
#include "plane/peer_table.hpp"
#include "dopt/actors/internal/group_plane.hpp"

namespace dopt::detail::mpi {

class MpiPlane;

/// Whether this build has the MPI plane.
bool available() noexcept;

/// Initialises MPI when nobody did (MPI_THREAD_MULTIPLE; finalised at exit),
/// checks that MPI_COMM_WORLD's ranks are dopt's (rank, size), and returns the
/// plane of the world group (gid 0). host_ids: every rank's host identity
/// (plane_stats counts the bytes addressed to other hosts). Throws
/// ValueError / StateError naming what does not fit.
std::shared_ptr<GroupPlane> make_world_plane(const LaunchEnv& env, std::shared_ptr<PeerTable> peers,
                                             std::vector<std::string> host_ids);

}  // namespace dopt::detail::mpi
