#pragma once
// The identity of this process's host, as the data planes see it.
#include <string>

namespace dopt {

/// This process's host: DOPT_HOST_ID when set, else the shared-memory
/// identity (boot id and the device of /dev/shm's file system). Two
/// processes with equal ids are on one host in the planes' sense: they share
/// the shared-memory plane (and the hierarchical plane groups them). Local:
/// no communication; simulated ranks (one process) all get the same id.
std::string this_host_id();

}  // namespace dopt
