#pragma once
// The collectives of the shared-memory plane, one file each. Every member
// of the group calls the same function for the same call (the group's
// executor runs the calls in sequence order); see channel.hpp for rounds.
//
// Three ways to move the bytes, chosen from the descriptor alone (so every
// member takes the same one):
//   small   one round: each member copies its data into its buffer, and after
//           one synchronisation computes its whole result from the buffers;
//   staged  processes: rounds of buffer-sized chunks; all_reduce and reduce
//           split every chunk into one slice per member (each reduces its
//           slice over all buffers, then copies the others' slices out);
//   direct  threads of one process: members read and write each other's
//           tensors in place (reduce-scatter + all-gather in one pass).
#include <cstddef>

#include "transport/shm/channel.hpp"

namespace dopt::detail::shm_plane {

void all_reduce(Channel& ch, Call& c);      // also all_reduce_coalesced
void reduce(Channel& ch, Call& c);
void broadcast(Channel& ch, Call& c);       // also broadcast_coalesced
void all_gather(Channel& ch, Call& c);      // list and flat
void reduce_scatter(Channel& ch, Call& c);
void barrier(Channel& ch, Call& c);

}  // namespace dopt::detail::shm_plane
