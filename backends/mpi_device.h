// MpiDevice: a Device whose communicators may reach ranks that other processes run, for
// `mpirun ... offsim replay --mpi` (backends/mpi_replay.h).
//
// It wraps the device of this process (the CPU device) and forwards every call to it, except
// communicators that name a remote rank: their collectives and p2p run as host functions ordered
// in the op's stream (Device::host_function) that exchange the buffer's bytes with MPI
// point-to-point messages on the group's MPI communicator, each matched by a per-communicator
// sequence number in the tag (as NCCL matches calls by their order on a communicator). A
// collective sends this member's part to every other member, then combines the parts in member
// order, so every member ends with the same bytes (sums are summed in one fixed order). Waits
// poll the messages, the device's abort and the watchdog, so a peer that never arrives ends in
// a kDevice error naming the op and the peers, never in a hang. The CPU device is the only one
// with host-visible scratch; on a GPU the inner device joins each group's NCCL communicator
// (MpiDeviceOptions::joined) and the wrapper only translates peers to member indexes.
//
//   MpiDeviceOptions o;
//   o.globals = {1, 0};                            // device index 0: rank 1 (here), 1: rank 0
//   o.local_ranks = 1;
//   o.groups[{0, 1}] = comm01;                     // sorted global ranks -> MPI communicator
//   o.timeout = std::chrono::seconds(120);
//   std::unique_ptr<Device> dev = make_mpi_device(make_cpu_device(cpu), o);
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "backends/device.h"

namespace offsim::backends {

struct MpiDeviceOptions {
  // Device index -> global rank: the inner device's local ranks first, then the remote ranks.
  std::vector<int> globals;
  int local_ranks = 1;
  // Every group this process is a member of: its global ranks sorted ascending -> an MPI
  // communicator whose rank order is that order.
  std::map<std::vector<int>, MPI_Comm> groups;
  // Groups the inner device joined across processes (Device::join_communicator; NCCL on GPUs):
  // sorted global ranks -> the inner device's communicator. Their collectives and p2p go to the
  // inner device (peers as member indexes); other groups with a remote member use MPI messages.
  std::map<std::vector<int>, CommId> joined;
  // A message of a collective or p2p carries at most this many bytes (the CPU device's
  // max_buffer_bytes, the same on every process).
  std::int64_t max_message_bytes = std::int64_t{1} << 20;
  std::chrono::milliseconds timeout{120000};  // the longest wait for a peer's message
};

std::unique_ptr<Device> make_mpi_device(std::unique_ptr<Device> inner,
                                        const MpiDeviceOptions& options);

}  // namespace offsim::backends
