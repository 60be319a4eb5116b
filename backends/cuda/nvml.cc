#include "backends/cuda/nvml.h"

#include <mutex>
#include <optional>

#include <fmt/format.h>

#include "backends/cuda/dynlib.h"

namespace offsim::backends::cuda {
namespace {

// The few NVML types used, as the NVML API reference defines them (nvml.h is not part of the
// CUDA toolkit): nvmlReturn_t is an int enum with NVML_SUCCESS = 0, nvmlDevice_t an opaque
// pointer, NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2, NVML_TEMPERATURE_GPU = 0; power in mW.
using NvmlReturn = int;
using NvmlDevice = struct NvmlDeviceOpaque*;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr int kClockSm = 1;
constexpr int kClockMem = 2;
constexpr int kTemperatureGpu = 0;

struct Nvml {
  DynamicLibrary lib;
  NvmlReturn (*Init)() = nullptr;
  const char* (*ErrorString)(NvmlReturn) = nullptr;
  NvmlReturn (*HandleByPciBusId)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*ClockInfo)(NvmlDevice, int, unsigned*) = nullptr;
  NvmlReturn (*PowerUsage)(NvmlDevice, unsigned*) = nullptr;
  NvmlReturn (*PowerLimit)(NvmlDevice, unsigned*) = nullptr;
  NvmlReturn (*Temperature)(NvmlDevice, int, unsigned*) = nullptr;
};

sim::Result<Nvml> load_nvml() {
  Nvml n;
  OFFSIM_ASSIGN_OR_RETURN(n.lib, DynamicLibrary::open("libnvidia-ml.so.1", "NVML"));
  OFFSIM_RETURN_IF_ERROR(n.lib.bind("nvmlInit_v2", n.Init));
  OFFSIM_RETURN_IF_ERROR(n.lib.bind("nvmlErrorString", n.ErrorString));
  OFFSIM_RETURN_IF_ERROR(n.lib.bind("nvmlDeviceGetHandleByPciBusId_v2", n.HandleByPciBusId));
  OFFSIM_RETURN_IF_ERROR(n.lib.bind("nvmlDeviceGetClockInfo", n.ClockInfo));
  OFFSIM_RETURN_IF_ERROR(n.lib.bind("nvmlDeviceGetPowerUsage", n.PowerUsage));
  OFFSIM_RETURN_IF_ERROR(n.lib.bind("nvmlDeviceGetEnforcedPowerLimit", n.PowerLimit));
  OFFSIM_RETURN_IF_ERROR(n.lib.bind("nvmlDeviceGetTemperature", n.Temperature));
  const NvmlReturn init = n.Init();
  if (init != kNvmlSuccess) {
    return sim::fail(sim::ErrorCode::kUnsupported, "NVML: nvmlInit_v2 failed: {}",
                     n.ErrorString(init));
  }
  return n;
}

}  // namespace

sim::Result<std::string> nvml_reading(const std::string& pci_bus_id) {
  // Loaded and initialized once per process; never shut down (other threads may query).
  static std::once_flag once;
  static std::optional<sim::Result<Nvml>>* loaded = new std::optional<sim::Result<Nvml>>();
  std::call_once(once, [] { loaded->emplace(load_nvml()); });
  if (!**loaded) return sim::fail((*loaded)->error());
  const Nvml& n = ***loaded;
  auto check = [&](NvmlReturn r, const char* call) -> sim::Status {
    if (r == kNvmlSuccess) return sim::ok();
    return sim::fail(sim::ErrorCode::kDevice, "NVML {} for GPU {}: {}", call, pci_bus_id,
                     n.ErrorString(r));
  };
  NvmlDevice dev = nullptr;
  OFFSIM_RETURN_IF_ERROR(
      check(n.HandleByPciBusId(pci_bus_id.c_str(), &dev), "nvmlDeviceGetHandleByPciBusId_v2"));
  unsigned sm = 0, mem = 0, mw = 0, limit_mw = 0, celsius = 0;
  OFFSIM_RETURN_IF_ERROR(check(n.ClockInfo(dev, kClockSm, &sm), "nvmlDeviceGetClockInfo"));
  OFFSIM_RETURN_IF_ERROR(check(n.ClockInfo(dev, kClockMem, &mem), "nvmlDeviceGetClockInfo"));
  OFFSIM_RETURN_IF_ERROR(check(n.PowerUsage(dev, &mw), "nvmlDeviceGetPowerUsage"));
  OFFSIM_RETURN_IF_ERROR(check(n.PowerLimit(dev, &limit_mw), "nvmlDeviceGetEnforcedPowerLimit"));
  OFFSIM_RETURN_IF_ERROR(
      check(n.Temperature(dev, kTemperatureGpu, &celsius), "nvmlDeviceGetTemperature"));
  return fmt::format("sm {} MHz, mem {} MHz, {:.1f} W of {:.1f} W limit, {} C", sm, mem,
                     mw / 1000.0, limit_mw / 1000.0, celsius);
}

}  // namespace offsim::backends::cuda
