// CudaDevice: the Device interface on NVIDIA GPUs (built only when OFFSIM_HAVE_CUDA).
//
// One local rank per GPU. Each GPU has a submission thread that makes its CUDA/NCCL calls in
// issue order (NCCL communicators are driven one thread per GPU), CUDA streams and events, a
// memory pool of its own (cudaMallocFromPoolAsync / cudaFreeAsync, internal-dependency reuse
// off so the pool adds no hidden waits), a cuBLASLt handle with a workspace per stream, and
// pinned host buffers for copies. synchronize() is the watchdog: past its timeout it calls
// ncclCommAbort on every communicator and returns a kDevice error instead of hanging.
//
//   auto dev = make_cuda_device(/*first_gpu=*/0, /*ranks=*/1);
//   if (!dev) { ... dev.error().code == sim::ErrorCode::kNoDevice ... }   // "no GPU: ..."
//   for (const DeviceInfo& d : list_cuda_devices()) fmt::print("{}\n", d.name);
#pragma once

#include <memory>
#include <vector>

#include "backends/device.h"
#include "sim/core/result.h"

namespace offsim::backends {

sim::Result<std::unique_ptr<Device>> make_cuda_device(int first_gpu, int ranks);

// The visible GPUs; empty when there is no GPU or driver.
std::vector<DeviceInfo> list_cuda_devices();

}  // namespace offsim::backends
