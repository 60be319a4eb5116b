// Host calibration: measures the CPU-side figures the forecast reads (profile keys host.*):
// the cores per socket and NUMA layout (from sysfs), the DRAM bandwidth of each NUMA node
// (STREAM-like read, write and copy kernels with one thread pinned to each of the node's cores,
// on memory those threads first touched, repeated samples: median, minimum, maximum and noise
// kept) and the CPU Adam rate of one core (our own loop over the passes DeepSpeed's host step
// makes, 52 bytes per parameter; see models/step_offload.cc) and of 1, 2, 4, ... threads
// together, then writes them into a profile's host keys with origin "measured", the date and
// the per-node details in each figure's source. The pinnable memory (RLIMIT_MEMLOCK, MemTotal)
// is reported alongside.
// Pinned-copy bandwidth per NUMA node (with a GPU) and the remote-DRAM ratio (two or more
// nodes) are not measured here: those keys keep their values.
//
//   calibrate::HostCalibrationOptions o;
//   o.array_bytes = 64 << 20;                       // per array and node
//   auto h = calibrate::measure_host(o);            // Result<HostCalibration>
//   if (!h) { ... h.error().message ... }
//   calibrate::apply_host_calibration(*h, profile); // profile.host.* measured
//   fmt::print("{}", calibrate::host_calibration_to_text(*h));
//   calibrate::apply_host_calibration(*h, host);    // a sim::platform::Host, for a host file
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sim/core/result.h"
#include "sim/platform/host.h"
#include "sim/platform/profile.h"

namespace offsim::calibrate {

struct HostTopology {
  struct Node {
    int id = 0;
    std::vector<int> cpus;  // logical CPUs (online ones this process may run on)
    int socket = 0;         // physical package of its CPUs
    int cores = 0;          // distinct physical cores among `cpus`
  };
  std::vector<Node> nodes;
  int sockets = 0;
  std::vector<int> cores_per_socket;  // physical cores, by socket index (0..sockets-1)
  int logical_cpus = 0;
  bool numa_from_sysfs = true;  // false: no node directories, one node over every CPU
};

// Reads <sysfs_root>/devices/system/node/node*/cpulist and
// <sysfs_root>/devices/system/cpu/cpu*/topology/{physical_package_id,core_id}; `allowed` keeps
// only those CPUs (empty: every CPU listed). A missing or malformed file is an error naming it.
sim::Result<HostTopology> read_host_topology(const std::string& sysfs_root,
                                             const std::vector<int>& allowed);

// The CPUs this process may run on (sched_getaffinity).
std::vector<int> allowed_cpus();

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}; an error names `what` and the text.
sim::Result<std::vector<int>> parse_cpu_list(const std::string& text, const std::string& what);

// A repeated measurement: every sample, its median, extremes and noise ((max - min) / median).
struct Measured {
  std::vector<double> samples;
  double median = 0.0;
  double min = 0.0;
  double max = 0.0;
  double noise = 0.0;
};
Measured summarize(std::vector<double> samples);

struct NodeBandwidth {
  int node = 0;
  int threads = 0;
  Measured read;   // bytes/s, bytes read
  Measured write;  // bytes/s, bytes written (the write-allocate reads not counted, as STREAM)
  Measured copy;   // bytes/s, bytes read plus written (STREAM's convention)
};

// CPU Adam with `threads` threads, each pinned to one CPU of the first NUMA node and stepping
// its own slice of the parameters (first touched by itself): all threads together, 52 B per
// parameter. Where it stops growing with the threads, the step is bound by DRAM, not cores
// (the forecast takes min(cores x per-core rate, DRAM); models/cost_model.h).
struct AdamScaling {
  int threads = 0;
  Measured bytes_per_s;
};

// 1, 2, 4, ... up to `cpus`, and `cpus` itself (empty when cpus < 1).
std::vector<int> adam_thread_counts(int cpus);

// MemTotal of a /proc/meminfo file in bytes; an error names the file when it has none.
sim::Result<std::int64_t> read_mem_total(const std::string& meminfo_path);

struct HostCalibrationOptions {
  std::string sysfs_root = "/sys";
  std::int64_t array_bytes = std::int64_t{256} << 20;  // per array, per node (copy uses two)
  int samples = 7;
  std::int64_t adam_params = std::int64_t{8} << 20;  // the Adam loop's parameters
  int adam_samples = 5;
  int max_threads_per_node = 0;  // 0: one per core of the node
  int max_adam_threads = 0;      // CPU Adam scaling up to this many threads; 0: the node's cores
  std::string meminfo_path = "/proc/meminfo";
  std::string date;  // ISO 8601 for the sources; empty: now (UTC)
};

struct HostCalibration {
  HostTopology topology;
  std::vector<NodeBandwidth> nodes;
  Measured adam_bytes_per_s_per_core;     // 52 bytes per parameter over one pinned thread's time
  std::vector<AdamScaling> adam_scaling;  // by thread count, on the first node
  // What the process may pin: RLIMIT_MEMLOCK (-1: unlimited) and the host's MemTotal. Pinned
  // copy bandwidth needs a GPU and is measured by the GPU stages.
  std::int64_t memlock_limit_bytes = -1;
  std::int64_t mem_total_bytes = 0;
  std::int64_t array_bytes = 0;
  std::int64_t adam_params = 0;
  std::string date;
};

sim::Result<HostCalibration> measure_host(const HostCalibrationOptions& options);

// Bytes the Adam loop streams per parameter: DeepSpeed's host step with bf16 gradients and
// parameters, fp32 master and moments (6 + 4 + 8 + 28 + 6).
inline constexpr double kHostAdamBytesPerParam = 52.0;

// One Adam pass of the loop over `n` parameters (exposed for its test): gradient widened from
// bf16 into the fp32 buffer, its norm, unscale/clip, Adam on fp32 master and moments, the
// master narrowed to bf16. Returns the gradient norm.
double host_adam_step(std::int64_t n, const std::uint16_t* grad_bf16, float* grad32, float* master,
                      float* m, float* v, std::uint16_t* param_bf16, int step);

// Writes host.cores_per_socket, host.dram_bytes_per_s_per_socket (the least over sockets of the
// sum of its nodes' copy medians) and host.adam_bytes_per_s_per_core (one core; the scaling by
// threads in its source) as measured figures and lists them in the provenance.
void apply_host_calibration(const HostCalibration& host,
                            sim::platform::CalibrationProfile& profile);

// The same measured figures (cores, DRAM copy bandwidth, CPU Adam rate) and the NUMA nodes per
// socket written into a host of sim/platform/host.h, for a host file (`calibrate --host-out`);
// the other figures (vector width, channels, PCIe, root complex, remote DRAM) stay the host's.
void apply_host_calibration(const HostCalibration& host, sim::platform::Host& out);

std::string host_calibration_to_text(const HostCalibration& host);

}  // namespace offsim::calibrate
