#include "calibrate/host_calibration.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace offsim::calibrate {
namespace fs = std::filesystem;

// The vector loops are compiled for each x86 width the CPU may have (chosen at load time), as
// DeepSpeed compiles its AVX-512 or AVX2 kernel; sqrt without errno so that it vectorizes.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define OFFSIM_HOST_VECTOR \
  __attribute__((target_clones("avx512f", "avx2", "default"), optimize("no-math-errno")))
#elif defined(__x86_64__) && defined(__clang__) && !__has_feature(thread_sanitizer)
// (Not under ThreadSanitizer: the clones' load-time resolver runs before its runtime is ready
// and the test binary crashes at start.)
#define OFFSIM_HOST_VECTOR __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define OFFSIM_HOST_VECTOR
#endif

namespace {

using Clock = std::chrono::steady_clock;

std::string utc_now() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

sim::Result<std::string> read_small_file(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return sim::fail(sim::ErrorCode::kNotFound, "{}: cannot be read", path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

sim::Result<int> read_int_file(const fs::path& path) {
  OFFSIM_ASSIGN_OR_RETURN(std::string text, read_small_file(path));
  try {
    std::size_t used = 0;
    const int v = std::stoi(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  return sim::fail(sim::ErrorCode::kInvalidInput, "{}: expected an integer, got \"{}\"",
                   path.string(), text);
}

sim::Status pin_to_cpu(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  const int rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  if (rc != 0) {
    return sim::fail(sim::ErrorCode::kDevice, "pinning a thread to CPU {}: {}", cpu,
                     std::strerror(rc));
  }
  return sim::ok();
}

// Pins the calling worker thread to `cpu`; the first failure among the workers is kept in `error`.
void pin_or_latch(int cpu, std::mutex& mu, std::optional<sim::Error>& error) {
  if (sim::Status st = pin_to_cpu(cpu); !st) {
    std::lock_guard lock(mu);
    if (!error) error = st.error();
  }
}

std::string vector_isa() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) return "AVX-512";
  if (__builtin_cpu_supports("avx2")) return "AVX2";
  return "SSE2";
#else
  return "the compiler's default";
#endif
}

std::uint16_t to_bf16(float f) {
  std::uint32_t u = 0;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<std::uint16_t>(u >> 16);
}

OFFSIM_HOST_VECTOR void widen(std::int64_t n, const std::uint16_t* __restrict in,
                              float* __restrict out) {
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t u = static_cast<std::uint32_t>(in[i]) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    out[i] = f;
  }
}

OFFSIM_HOST_VECTOR double sum_squares(std::int64_t n, const float* __restrict g) {
  constexpr int kLanes = 16;
  float acc[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += g[i + l] * g[i + l];
  }
  double total = 0.0;
  for (; i < n; ++i) total += static_cast<double>(g[i]) * g[i];
  for (float a : acc) total += a;
  return total;
}

OFFSIM_HOST_VECTOR void scale_in_place(std::int64_t n, float* __restrict g, float s) {
  for (std::int64_t i = 0; i < n; ++i) g[i] *= s;
}

OFFSIM_HOST_VECTOR void adam(std::int64_t n, const float* __restrict g, float* __restrict w,
                             float* __restrict m, float* __restrict v, float b1, float b2,
                             float lr_c1, float inv_sqrt_c2, float eps, float decay) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    w[i] = w[i] * decay - lr_c1 * mi / (std::sqrt(vi) * inv_sqrt_c2 + eps);
  }
}

OFFSIM_HOST_VECTOR void narrow(std::int64_t n, const float* __restrict in,
                               std::uint16_t* __restrict out) {
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t u;
    std::memcpy(&u, &in[i], 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    out[i] = static_cast<std::uint16_t>(u >> 16);
  }
}

enum class Kernel { kRead, kWrite, kCopy, kStop };

OFFSIM_HOST_VECTOR double read_kernel(const double* __restrict a, std::size_t n) {
  constexpr int kLanes = 16;
  double acc[kLanes] = {};
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l];
  }
  double total = 0.0;
  for (; i < n; ++i) total += a[i];
  for (double x : acc) total += x;
  return total;
}

// One thread per CPU of `cpus`, each on its own part of the arrays (first touched by itself,
// so on its node); every sample starts the threads together and ends when the last is done.
sim::Result<NodeBandwidth> measure_node(int node, const std::vector<int>& cpus,
                                        std::int64_t array_bytes, int samples) {
  const int threads = static_cast<int>(cpus.size());
  const std::size_t per =
      std::max<std::size_t>(1024, static_cast<std::size_t>(array_bytes / 8 / threads));
  std::barrier sync(threads + 1);
  std::atomic<Kernel> kernel{Kernel::kRead};
  std::atomic<double> sink{0.0};
  std::mutex mu;
  std::optional<sim::Error> error;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, cpu = cpus[static_cast<std::size_t>(t)]] {
      pin_or_latch(cpu, mu, error);
      std::vector<double> a(per, 1.0), c(per, 0.0);  // first touch on this thread's node
      sync.arrive_and_wait();                        // ready
      for (;;) {
        sync.arrive_and_wait();  // start
        const Kernel k = kernel.load();
        if (k == Kernel::kStop) return;
        switch (k) {
          case Kernel::kRead:
            sink.store(read_kernel(a.data(), per), std::memory_order_relaxed);
            break;
          case Kernel::kWrite:
            std::fill(a.begin(), a.end(), 2.0);
            break;
          case Kernel::kCopy:
            std::copy(a.begin(), a.end(), c.begin());
            break;
          case Kernel::kStop:
            break;
        }
        sync.arrive_and_wait();  // end
      }
    });
  }
  sync.arrive_and_wait();
  auto run = [&](Kernel k) {
    kernel.store(k);
    // The clock starts before this thread's arrival: no worker starts before it, so a
    // descheduled measuring thread cannot miss part of the work.
    const auto t0 = Clock::now();
    sync.arrive_and_wait();
    sync.arrive_and_wait();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  NodeBandwidth out;
  out.node = node;
  out.threads = threads;
  const double bytes = static_cast<double>(per) * 8.0 * threads;
  for (Kernel k : {Kernel::kRead, Kernel::kWrite, Kernel::kCopy}) {
    run(k);  // warm-up
    std::vector<double> rates;
    for (int s = 0; s < samples; ++s) {
      const double seconds = std::max(run(k), 1e-9);
      rates.push_back((k == Kernel::kCopy ? 2.0 : 1.0) * bytes / seconds);
    }
    Measured m = summarize(std::move(rates));
    (k == Kernel::kRead ? out.read : k == Kernel::kWrite ? out.write : out.copy) = std::move(m);
  }
  kernel.store(Kernel::kStop);
  sync.arrive_and_wait();
  for (std::thread& t : pool) t.join();
  if (error) return sim::fail(*error);
  return out;
}

// The buffers of one Adam loop over `n` parameters, filled (first touched) by the thread that
// makes it.
struct AdamBuffers {
  explicit AdamBuffers(std::int64_t count)
      : n(count),
        grad(static_cast<std::size_t>(count)),
        param(static_cast<std::size_t>(count)),
        grad32(static_cast<std::size_t>(count)),
        master(static_cast<std::size_t>(count)),
        m(static_cast<std::size_t>(count), 0.0f),
        v(static_cast<std::size_t>(count), 0.0f) {
    for (std::size_t i = 0; i < master.size(); ++i) {
      master[i] = 0.01f * static_cast<float>((i * 2654435761u) % 1000) - 5.0f;
      grad[i] = to_bf16(0.001f * static_cast<float>((i * 40503u) % 2000) - 1.0f);
    }
  }
  void step(int s) {
    host_adam_step(n, grad.data(), grad32.data(), master.data(), m.data(), v.data(), param.data(),
                   s);
  }
  std::int64_t n;
  std::vector<std::uint16_t> grad, param;
  std::vector<float> grad32, master, m, v;
};

sim::Result<Measured> measure_adam(int cpu, std::int64_t params, int samples) {
  sim::Result<Measured> result = sim::fail(sim::ErrorCode::kInternal, "not run");
  std::thread worker([&] {
    if (sim::Status st = pin_to_cpu(cpu); !st) {
      result = sim::fail(st.error());
      return;
    }
    AdamBuffers b(params);
    b.step(1);  // warm-up
    std::vector<double> rates;
    for (int s = 0; s < samples; ++s) {
      const auto t0 = Clock::now();
      b.step(s + 2);
      const double seconds =
          std::max(std::chrono::duration<double>(Clock::now() - t0).count(), 1e-9);
      rates.push_back(kHostAdamBytesPerParam * static_cast<double>(params) / seconds);
    }
    result = summarize(std::move(rates));
  });
  worker.join();
  return result;
}

// One pinned thread per CPU of `cpus`, each stepping its own params / threads slice; a sample
// starts them together and ends when the last is done.
sim::Result<Measured> measure_adam_threads(const std::vector<int>& cpus, std::int64_t params,
                                           int samples) {
  const int threads = static_cast<int>(cpus.size());
  const std::int64_t per = std::max<std::int64_t>(1024, params / threads);
  std::barrier sync(threads + 1);
  std::atomic<bool> stop{false};
  std::atomic<int> step{1};
  std::mutex mu;
  std::optional<sim::Error> error;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, cpu = cpus[static_cast<std::size_t>(t)]] {
      pin_or_latch(cpu, mu, error);
      AdamBuffers b(per);
      b.step(1);               // warm-up
      sync.arrive_and_wait();  // ready
      for (;;) {
        sync.arrive_and_wait();  // start
        if (stop.load()) return;
        b.step(step.load());
        sync.arrive_and_wait();  // end
      }
    });
  }
  sync.arrive_and_wait();
  std::vector<double> rates;
  for (int s = 0; s < samples; ++s) {
    step.store(s + 2);
    const auto t0 = Clock::now();  // before the start barrier, as in the copy kernels
    sync.arrive_and_wait();
    sync.arrive_and_wait();
    const double seconds = std::max(std::chrono::duration<double>(Clock::now() - t0).count(), 1e-9);
    rates.push_back(kHostAdamBytesPerParam * static_cast<double>(per) * threads / seconds);
  }
  stop.store(true);
  sync.arrive_and_wait();
  for (std::thread& t : pool) t.join();
  if (error) return sim::fail(*error);
  return summarize(std::move(rates));
}

// CPU Adam by thread count on the first node's CPUs (at most its physical cores).
sim::Result<std::vector<AdamScaling>> measure_adam_scaling(const HostTopology::Node& node,
                                                           const HostCalibrationOptions& o) {
  int most = std::min(static_cast<int>(node.cpus.size()), std::max(1, node.cores));
  if (o.max_adam_threads > 0) most = std::min(most, o.max_adam_threads);
  std::vector<AdamScaling> out;
  for (int threads : adam_thread_counts(most)) {
    const std::vector<int> cpus(node.cpus.begin(), node.cpus.begin() + threads);
    OFFSIM_ASSIGN_OR_RETURN(Measured m, measure_adam_threads(cpus, o.adam_params, o.adam_samples));
    out.push_back(AdamScaling{.threads = threads, .bytes_per_s = std::move(m)});
  }
  return out;
}

std::int64_t memlock_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_MEMLOCK, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return -1;
  return static_cast<std::int64_t>(r.rlim_cur);
}

std::string bytes_text(std::int64_t bytes) {
  if (bytes < 0) return "unlimited";
  const double mib = static_cast<double>(bytes) / (1024.0 * 1024.0);
  if (mib < 1024.0) return fmt::format("{:.1f} MiB", mib);
  return fmt::format("{:.2f} GiB", mib / 1024.0);
}

std::string gbs(double bytes_per_s) { return fmt::format("{:.2f} GB/s", bytes_per_s / 1e9); }

std::string measured_text(const Measured& m) {
  return fmt::format("median {} (min {}, max {}, noise {:.1f}%, {} samples)", gbs(m.median),
                     gbs(m.min), gbs(m.max), 100.0 * m.noise, m.samples.size());
}

std::string scaling_text(const std::vector<AdamScaling>& scaling) {
  std::string out;
  for (const AdamScaling& s : scaling) {
    out += fmt::format("{}{} thread{}: {} ({} per thread)", out.empty() ? "" : ", ", s.threads,
                       s.threads == 1 ? "" : "s", gbs(s.bytes_per_s.median),
                       gbs(s.bytes_per_s.median / s.threads));
  }
  return out;
}

}  // namespace

sim::Result<std::vector<int>> parse_cpu_list(const std::string& text, const std::string& what) {
  std::vector<int> cpus;
  std::stringstream ss(text);
  std::string part;
  auto bad = [&] {
    return sim::fail(sim::ErrorCode::kInvalidInput,
                     "{}: expected a CPU list such as \"0-3,8,10-11\", got \"{}\"", what, text);
  };
  while (std::getline(ss, part, ',')) {
    if (part.empty()) continue;
    const std::size_t dash = part.find('-');
    try {
      std::size_t used = 0;
      const int lo = std::stoi(part.substr(0, dash), &used);
      if (used != (dash == std::string::npos ? part.size() : dash) || lo < 0) return bad();
      int hi = lo;
      if (dash != std::string::npos) {
        const std::string rest = part.substr(dash + 1);
        hi = std::stoi(rest, &used);
        if (used != rest.size() || hi < lo) return bad();
      }
      for (int c = lo; c <= hi; ++c) cpus.push_back(c);
    } catch (const std::exception&) {
      return bad();
    }
  }
  return cpus;
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) out.push_back(c);
  }
  return out;
}

sim::Result<HostTopology> read_host_topology(const std::string& sysfs_root,
                                             const std::vector<int>& allowed) {
  const fs::path root = fs::path(sysfs_root) / "devices/system";
  HostTopology t;
  std::map<int, std::vector<int>> node_cpus;
  std::error_code ec;
  if (fs::is_directory(root / "node", ec)) {
    for (const auto& entry : fs::directory_iterator(root / "node", ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("node", 0) != 0 || name.size() == 4 ||
          !std::all_of(name.begin() + 4, name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        continue;
      }
      OFFSIM_ASSIGN_OR_RETURN(std::string list, read_small_file(entry.path() / "cpulist"));
      OFFSIM_ASSIGN_OR_RETURN(std::vector<int> cpus,
                              parse_cpu_list(list, (entry.path() / "cpulist").string()));
      node_cpus[std::stoi(name.substr(4))] = std::move(cpus);
    }
  }
  if (node_cpus.empty()) {
    t.numa_from_sysfs = false;
    const fs::path online = root / "cpu/online";
    OFFSIM_ASSIGN_OR_RETURN(std::string list, read_small_file(online));
    OFFSIM_ASSIGN_OR_RETURN(node_cpus[0], parse_cpu_list(list, online.string()));
  }
  std::map<int, int> socket_index;                // package id -> index
  std::map<int, std::set<int>> cores_of_package;  // package id -> core ids
  for (auto& [id, cpus] : node_cpus) {
    HostTopology::Node node;
    node.id = id;
    std::set<std::pair<int, int>> cores;
    std::map<int, int> packages;  // package -> count of CPUs
    for (int cpu : cpus) {
      if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), cpu) == allowed.end()) {
        continue;
      }
      const fs::path topo = root / fmt::format("cpu/cpu{}/topology", cpu);
      OFFSIM_ASSIGN_OR_RETURN(int package, read_int_file(topo / "physical_package_id"));
      OFFSIM_ASSIGN_OR_RETURN(int core, read_int_file(topo / "core_id"));
      if (!cores.insert({package, core}).second) continue;  // an SMT sibling: one CPU per core
      node.cpus.push_back(cpu);
      ++packages[package];
      cores_of_package[package].insert(core);
      socket_index.emplace(package, 0);
    }
    t.logical_cpus += static_cast<int>(cpus.size());
    if (node.cpus.empty()) continue;  // memory-only node, or none of its CPUs allowed
    node.cores = static_cast<int>(node.cpus.size());
    node.socket = std::max_element(packages.begin(), packages.end(), [](auto& a, auto& b) {
                    return a.second < b.second;
                  })->first;
    t.nodes.push_back(std::move(node));
  }
  if (t.nodes.empty()) {
    return sim::fail(sim::ErrorCode::kNotFound, "{}: no NUMA node with a CPU this process may use",
                     root.string());
  }
  int index = 0;
  for (auto& [package, i] : socket_index) i = index++;
  t.sockets = index;
  t.cores_per_socket.assign(static_cast<std::size_t>(t.sockets), 0);
  for (auto& [package, cores] : cores_of_package) {
    t.cores_per_socket[static_cast<std::size_t>(socket_index[package])] =
        static_cast<int>(cores.size());
  }
  for (HostTopology::Node& n : t.nodes) n.socket = socket_index[n.socket];
  return t;
}

std::vector<int> adam_thread_counts(int cpus) {
  std::vector<int> out;
  for (int t = 1; t < cpus; t *= 2) out.push_back(t);
  if (cpus >= 1) out.push_back(cpus);
  return out;
}

sim::Result<std::int64_t> read_mem_total(const std::string& meminfo_path) {
  std::ifstream in(meminfo_path);
  if (!in) return sim::fail(sim::ErrorCode::kNotFound, "{}: cannot be read", meminfo_path);
  std::string key, unit;
  std::int64_t value = 0;
  while (in >> key >> value) {
    std::getline(in, unit);
    if (key == "MemTotal:" && value > 0) return value * 1024;  // the file counts kB
  }
  return sim::fail(sim::ErrorCode::kInvalidInput, "{}: no \"MemTotal: <kB> kB\" line",
                   meminfo_path);
}

Measured summarize(std::vector<double> samples) {
  Measured m;
  m.samples = samples;
  if (samples.empty()) return m;
  std::sort(samples.begin(), samples.end());
  const std::size_t k = samples.size();
  m.median = k % 2 ? samples[k / 2] : 0.5 * (samples[k / 2 - 1] + samples[k / 2]);
  m.min = samples.front();
  m.max = samples.back();
  m.noise = m.median > 0 ? (m.max - m.min) / m.median : 0.0;
  return m;
}

double host_adam_step(std::int64_t n, const std::uint16_t* grad_bf16, float* grad32, float* master,
                      float* m, float* v, std::uint16_t* param_bf16, int step) {
  // DeepSpeed's defaults: betas (0.9, 0.999), eps 1e-8, weight decay 0.01 (AdamW), clip 1.0.
  constexpr float kB1 = 0.9f, kB2 = 0.999f, kEps = 1e-8f, kLr = 1e-4f, kDecay = 0.01f;
  constexpr double kClip = 1.0;
  widen(n, grad_bf16, grad32);                                     // read 2, write 4
  const double norm = std::sqrt(sum_squares(n, grad32));           // read 4
  const double clip = norm > kClip ? kClip / (norm + 1e-6) : 1.0;  // loss scale 1
  scale_in_place(n, grad32, static_cast<float>(clip));             // read 4, write 4
  const float c1 = 1.0f - std::pow(kB1, static_cast<float>(step));
  const float c2 = 1.0f - std::pow(kB2, static_cast<float>(step));
  adam(n, grad32, master, m, v, kB1, kB2, kLr / c1, 1.0f / std::sqrt(c2), kEps,
       1.0f - kLr * kDecay);      // read g, w, m, v 16, write w, m, v 12
  narrow(n, master, param_bf16);  // read 4, write 2
  return norm;
}

sim::Result<HostCalibration> measure_host(const HostCalibrationOptions& options) {
  if (options.array_bytes < 8 * 1024 || options.samples < 1 || options.adam_params < 1024 ||
      options.adam_samples < 1) {
    return sim::fail(sim::ErrorCode::kInvalidInput,
                     "host calibration: array bytes {} (at least 8192), samples {} and Adam "
                     "samples {} (at least 1), Adam parameters {} (at least 1024)",
                     options.array_bytes, options.samples, options.adam_samples,
                     options.adam_params);
  }
  HostCalibration h;
  h.date = options.date.empty() ? utc_now() : options.date;
  h.array_bytes = options.array_bytes;
  h.adam_params = options.adam_params;
  OFFSIM_ASSIGN_OR_RETURN(h.topology, read_host_topology(options.sysfs_root, allowed_cpus()));
  for (const HostTopology::Node& node : h.topology.nodes) {
    std::vector<int> cpus = node.cpus;
    if (options.max_threads_per_node > 0 &&
        static_cast<int>(cpus.size()) > options.max_threads_per_node) {
      cpus.resize(static_cast<std::size_t>(options.max_threads_per_node));
    }
    OFFSIM_ASSIGN_OR_RETURN(NodeBandwidth bw,
                            measure_node(node.id, cpus, options.array_bytes, options.samples));
    h.nodes.push_back(std::move(bw));
  }
  OFFSIM_ASSIGN_OR_RETURN(h.adam_bytes_per_s_per_core,
                          measure_adam(h.topology.nodes.front().cpus.front(), options.adam_params,
                                       options.adam_samples));
  OFFSIM_ASSIGN_OR_RETURN(h.adam_scaling, measure_adam_scaling(h.topology.nodes.front(), options));
  h.memlock_limit_bytes = memlock_limit();
  OFFSIM_ASSIGN_OR_RETURN(h.mem_total_bytes, read_mem_total(options.meminfo_path));
  return h;
}

void apply_host_calibration(const HostCalibration& host,
                            sim::platform::CalibrationProfile& profile) {
  using sim::platform::Figure;
  using sim::platform::Origin;
  const HostTopology& t = host.topology;
  const std::string by = fmt::format("measured by offsim calibrate --host on {}", host.date);

  const int cores = *std::min_element(t.cores_per_socket.begin(), t.cores_per_socket.end());
  profile.host.cores_per_socket =
      Figure{static_cast<double>(cores), Origin::kMeasured,
             fmt::format("{}: /sys topology, {} socket(s) with {} physical cores (usable by "
                         "this process), {} logical CPUs, {} NUMA node(s){}",
                         by, t.sockets, fmt::join(t.cores_per_socket, "/"), t.logical_cpus,
                         t.nodes.size(), t.numa_from_sysfs ? "" : " (no NUMA information)")};

  std::vector<double> per_socket(static_cast<std::size_t>(t.sockets), 0.0);
  std::string nodes;
  for (std::size_t i = 0; i < host.nodes.size(); ++i) {
    const NodeBandwidth& n = host.nodes[i];
    per_socket[static_cast<std::size_t>(t.nodes[i].socket)] += n.copy.median;
    nodes += fmt::format("; node {} ({} threads): copy {}, read median {}, write median {}", n.node,
                         n.threads, measured_text(n.copy), gbs(n.read.median), gbs(n.write.median));
  }
  profile.host.dram_bytes_per_s_per_socket = Figure{
      *std::min_element(per_socket.begin(), per_socket.end()), Origin::kMeasured,
      fmt::format("{}: STREAM-like copy (bytes read + written) with one pinned thread per core "
                  "on first-touched memory, {} MiB per array and node, the least socket's sum "
                  "of its nodes{}",
                  by, host.array_bytes >> 20, nodes)};

  profile.host.adam_bytes_per_s_per_core = Figure{
      host.adam_bytes_per_s_per_core.median, Origin::kMeasured,
      fmt::format("{}: one pinned thread running DeepSpeed's host step as five passes "
                  "(bf16 gradient widened, norm, unscale/clip, AdamW on fp32 master and moments, "
                  "master narrowed to bf16: 52 B per parameter) over {} parameters, {} vector "
                  "code, {}; threads together on node {}: {}",
                  by, host.adam_params, vector_isa(), measured_text(host.adam_bytes_per_s_per_core),
                  t.nodes.front().id, scaling_text(host.adam_scaling))};

  std::vector<std::string>& measured = profile.provenance.measured;
  for (const char* key : {"host.cores_per_socket", "host.dram_bytes_per_s_per_socket",
                          "host.adam_bytes_per_s_per_core"}) {
    if (std::find(measured.begin(), measured.end(), key) == measured.end()) {
      measured.push_back(key);
    }
  }
  std::sort(measured.begin(), measured.end());
}

void apply_host_calibration(const HostCalibration& host, sim::platform::Host& out) {
  sim::platform::CalibrationProfile measured;
  apply_host_calibration(host, measured);
  out.cores_per_socket = measured.host.cores_per_socket;
  out.dram_bytes_per_s_per_socket = measured.host.dram_bytes_per_s_per_socket;
  out.adam_bytes_per_s_per_core = measured.host.adam_bytes_per_s_per_core;
  const HostTopology& t = host.topology;
  if (t.numa_from_sysfs && t.sockets > 0) {
    const double per_socket = std::max(
        1.0, std::round(static_cast<double>(t.nodes.size()) / static_cast<double>(t.sockets)));
    out.numa_nodes_per_socket = sim::platform::Figure{
        per_socket, sim::platform::Origin::kMeasured,
        fmt::format("measured by offsim calibrate --host on {}: /sys topology, {} NUMA node(s) "
                    "over {} socket(s)",
                    host.date, t.nodes.size(), t.sockets)};
  }
}

std::string host_calibration_to_text(const HostCalibration& host) {
  const HostTopology& t = host.topology;
  std::string out = fmt::format(
      "host: {} socket(s), physical cores per socket {}, {} logical CPUs, {} NUMA node(s)\n",
      t.sockets, fmt::join(t.cores_per_socket, "/"), t.logical_cpus, t.nodes.size());
  for (const NodeBandwidth& n : host.nodes) {
    out += fmt::format("  node {} ({} threads)\n    read   {}\n    write  {}\n    copy   {}\n",
                       n.node, n.threads, measured_text(n.read), measured_text(n.write),
                       measured_text(n.copy));
  }
  out += fmt::format("  CPU Adam, one core ({} params, 52 B each): {}\n", host.adam_params,
                     measured_text(host.adam_bytes_per_s_per_core));
  for (const AdamScaling& s : host.adam_scaling) {
    out += fmt::format("  CPU Adam, {:>3} thread(s) together: {} ({} per thread)\n", s.threads,
                       measured_text(s.bytes_per_s), gbs(s.bytes_per_s.median / s.threads));
  }
  out += fmt::format(
      "  pinnable memory: RLIMIT_MEMLOCK {}, MemTotal {} (offsim's pinned pool is the node's "
      "host memory: hardware.overrides.system.host_memory_bytes_per_node)\n",
      bytes_text(host.memlock_limit_bytes), bytes_text(host.mem_total_bytes));
  return out;
}

}  // namespace offsim::calibrate
