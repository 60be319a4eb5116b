// nvml_reading: clocks, power and temperature of one GPU through NVML, loaded with dlopen
// (libnvidia-ml.so.1 ships with the driver, not the toolkit, and the module must not need it).
// Calibration logs a reading before and after its benchmarks, as nvbench and nccl-tests advise:
// a GPU that throttled (power, temperature) during a run is visible in the samples file.
//
//   sim::Result<std::string> r = cuda::nvml_reading("0000:3B:00.0");
//   // "sm 1980 MHz, mem 3201 MHz, 612.4 W of 700.0 W limit, 61 C"
#pragma once

#include <string>

#include "sim/core/result.h"

namespace offsim::backends::cuda {

// `pci_bus_id` as cudaDeviceGetPCIBusId writes it (NVML and CUDA may number GPUs differently).
// kUnsupported when NVML cannot be loaded; kDevice when a query fails (the message names it).
sim::Result<std::string> nvml_reading(const std::string& pci_bus_id);

}  // namespace offsim::backends::cuda
