// The entry point of liboffsim_gpu.so (see backends/gpu_plugin.h): the CUDA device and the
// few device queries calibrate/ needs, behind plain function pointers.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "backends/cuda/cuda_device.h"
#include "backends/cuda/nvml.h"
#include "backends/gpu_plugin.h"

namespace offsim::backends {
namespace {

std::int64_t memory_in_use_bytes(int gpu) {
  std::size_t free_b = 0, total_b = 0;
  if (cudaSetDevice(gpu) != cudaSuccess || cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    return -1;
  }
  return static_cast<std::int64_t>(total_b - free_b);
}

std::string clock_summary(int gpu) {
  int sm_khz = 0, mem_khz = 0;
  if (cudaDeviceGetAttribute(&sm_khz, cudaDevAttrClockRate, gpu) != cudaSuccess ||
      cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, gpu) != cudaSuccess) {
    return {};
  }
  return fmt::format("sm max {} MHz, mem {} MHz (as reported, not changed)", sm_khz / 1000,
                     mem_khz / 1000);
}

}  // namespace
}  // namespace offsim::backends

extern "C" __attribute__((visibility("default"))) const offsim::backends::GpuPlugin*
offsim_gpu_plugin_v1() {
  static const offsim::backends::GpuPlugin plugin{
      .build_tag = offsim::backends::gpu_plugin_build_tag(),
      .make_cuda_device = &offsim::backends::make_cuda_device,
      .list_cuda_devices = &offsim::backends::list_cuda_devices,
      .memory_in_use_bytes = &offsim::backends::memory_in_use_bytes,
      .clock_summary = &offsim::backends::clock_summary,
  };
  return &plugin;
}

// The attention kernel of the CUDA device: "per_shape" — cuDNN's fused SDPA graphs where cuDNN
// builds them for a shape, else the fallback kernel (Device::prepare_attention() says which, per
// shape); calibration stores flash-attention efficiencies only from the fused one
// (calibrate/fit.h, AttentionKernel).
extern "C" __attribute__((visibility("default"))) const char* offsim_gpu_attention_kernel_v1() {
  return "per_shape";
}

// NVML's clocks, power and temperature of CUDA device `gpu` into `out` (NUL-terminated, at most
// `capacity` bytes): 0 on success, 1 with the reason in `out` otherwise.
extern "C" __attribute__((visibility("default"))) int offsim_gpu_nvml_reading_v1(int gpu, char* out,
                                                                                 int capacity) {
  if (!out || capacity <= 0) return 1;
  std::string text;
  int rc = 1;
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, static_cast<int>(sizeof bus), gpu) != cudaSuccess) {
    cudaGetLastError();
    text = fmt::format("no PCI bus id for GPU {}", gpu);
  } else if (auto r = offsim::backends::cuda::nvml_reading(bus)) {
    text = *r;
    rc = 0;
  } else {
    text = r.error().message;
  }
  const std::size_t n = std::min(text.size(), static_cast<std::size_t>(capacity - 1));
  std::memcpy(out, text.data(), n);
  out[n] = '\0';
  return rc;
}
