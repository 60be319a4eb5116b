// gpu_plugin: offsim's CUDA/NCCL code lives in a module, liboffsim_gpu.so, that is loaded on
// first use. Commands that never touch a GPU (run, sweep, plan, validate, list) then start
// without loading cudart, cuBLASLt and NCCL, which alone take about half a second and 200 MB.
// The module is built wherever nvcc is found (OFFSIM_WITH_CUDA); a build without CUDA has none
// and every entry point answers with a clear kUnsupported error.
//
//   OFFSIM_ASSIGN_OR_RETURN(const backends::GpuPlugin* gpu, backends::load_gpu_plugin());
//   OFFSIM_ASSIGN_OR_RETURN(std::unique_ptr<backends::Device> dev, gpu->make_cuda_device(0, 1));
//   OFFSIM_ASSIGN_OR_RETURN(void* entry, backends::gpu_plugin_symbol("offsim_calibrate_gpu_v1"));
//
// Search order: $OFFSIM_GPU_PLUGIN (a file), then liboffsim_gpu.so next to the executable, in
// ../lib and ../lib/offsim relative to it, then the build tree the executable came from.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/device.h"
#include "sim/core/result.h"

namespace offsim::backends {

// Entry points of the module. `build_tag` must equal the loader's: a module from another build
// (other compiler, other offsim version) is refused instead of being called with the wrong
// layout of these C++ types.
struct GpuPlugin {
  const char* build_tag = nullptr;
  sim::Result<std::unique_ptr<Device>> (*make_cuda_device)(int first_gpu, int ranks) = nullptr;
  std::vector<DeviceInfo> (*list_cuda_devices)() = nullptr;
  // Bytes in use on `gpu` before offsim allocates (driver context, other processes); -1 unknown.
  std::int64_t (*memory_in_use_bytes)(int gpu) = nullptr;
  // "sm max 1980 MHz, mem 2619 MHz (as reported, not changed)"; "" when unknown.
  std::string (*clock_summary)(int gpu) = nullptr;
};

// The tag compiled into both sides: offsim version, compiler and C++ library.
const char* gpu_plugin_build_tag();

// True when this build produced the module (CUDA was found at configure time).
bool gpu_plugin_built();

// Loads the module once (thread-safe) and returns its entry points, or an error naming the
// files tried and, for a module that fails to load, the loader's message (typically a missing
// CUDA 13 runtime, cuBLASLt or NCCL library).
sim::Result<const GpuPlugin*> load_gpu_plugin();

// Another entry point of the loaded module, by its extern "C" name.
sim::Result<void*> gpu_plugin_symbol(const std::string& name);

namespace detail {
// Loads the module at `path`, without the search and the once-only cache (for tests).
sim::Result<const GpuPlugin*> load_gpu_plugin_file(const std::string& path);
}  // namespace detail

}  // namespace offsim::backends
