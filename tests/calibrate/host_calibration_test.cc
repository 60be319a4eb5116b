// Host calibration: the sysfs topology reader on made-up trees (SMT siblings, two sockets, no
// NUMA directories, broken files), the Adam loop against a scalar reference, and a small
// measurement on this machine checked against plausibility ranges (not speeds).
#include "calibrate/host_calibration.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "sim/platform/profile.h"

namespace offsim::calibrate {
namespace {
namespace fs = std::filesystem;

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text << "\n";
}

// CPUs 0-7 on two sockets; CPU i+4 is the SMT sibling of CPU i.
fs::path fake_sysfs(const std::string& name, bool numa) {
  const fs::path root = fs::path(::testing::TempDir()) / name;
  fs::remove_all(root);
  const fs::path sys = root / "devices/system";
  for (int cpu = 0; cpu < 8; ++cpu) {
    const int core = cpu % 4;
    write(sys / fmt::format("cpu/cpu{}/topology/physical_package_id", cpu), core < 2 ? "0" : "1");
    write(sys / fmt::format("cpu/cpu{}/topology/core_id", cpu), std::to_string(core % 2));
  }
  write(sys / "cpu/online", "0-7");
  if (numa) {
    write(sys / "node/node0/cpulist", "0-1,4-5");
    write(sys / "node/node1/cpulist", "2-3,6-7");
    write(sys / "node/node2/cpulist", "");  // a memory-only node
    write(sys / "node/possible", "0-2");
  }
  return root;
}

TEST(HostCalibration, ParsesCpuLists) {
  auto cpus = parse_cpu_list("0-3,8,10-11", "cpulist");
  ASSERT_TRUE(cpus) << cpus.error().message;
  EXPECT_EQ(*cpus, (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_TRUE(parse_cpu_list("", "x")->empty());
  for (const char* bad : {"3-1", "a", "1-", "2x", "-1"}) {
    auto r = parse_cpu_list(bad, "node0/cpulist");
    ASSERT_FALSE(r) << bad;
    EXPECT_NE(r.error().message.find("node0/cpulist"), std::string::npos);
    EXPECT_NE(r.error().message.find(bad), std::string::npos);
  }
}

TEST(HostCalibration, ReadsSocketsNodesAndPhysicalCores) {
  const fs::path root = fake_sysfs("sysfs_numa", true);
  auto t = read_host_topology(root.string(), {});
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_TRUE(t->numa_from_sysfs);
  EXPECT_EQ(t->sockets, 2);
  EXPECT_EQ(t->cores_per_socket, (std::vector<int>{2, 2}));
  EXPECT_EQ(t->logical_cpus, 8);
  ASSERT_EQ(t->nodes.size(), 2u);  // the memory-only node has no CPU to measure from
  EXPECT_EQ(t->nodes[0].cpus, (std::vector<int>{0, 1}));  // one CPU per physical core
  EXPECT_EQ(t->nodes[1].cpus, (std::vector<int>{2, 3}));
  EXPECT_EQ(t->nodes[0].socket, 0);
  EXPECT_EQ(t->nodes[1].socket, 1);
  // Only the allowed CPUs count.
  auto some = read_host_topology(root.string(), {0, 2, 3});
  ASSERT_TRUE(some) << some.error().message;
  EXPECT_EQ(some->cores_per_socket, (std::vector<int>{1, 2}));
  EXPECT_EQ(some->nodes[0].cpus, (std::vector<int>{0}));
}

TEST(HostCalibration, WithoutNumaDirectoriesOneNodeHoldsEveryCpu) {
  const fs::path root = fake_sysfs("sysfs_flat", false);
  auto t = read_host_topology(root.string(), {});
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_FALSE(t->numa_from_sysfs);
  ASSERT_EQ(t->nodes.size(), 1u);
  EXPECT_EQ(t->nodes[0].cpus, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(t->sockets, 2);
}

TEST(HostCalibration, BrokenTopologyFilesAreNamed) {
  const fs::path root = fake_sysfs("sysfs_broken", true);
  write(root / "devices/system/cpu/cpu5/topology/core_id", "five");
  auto t = read_host_topology(root.string(), {});
  ASSERT_FALSE(t);
  EXPECT_NE(t.error().message.find("cpu5/topology/core_id"), std::string::npos)
      << t.error().message;
  fs::remove(root / "devices/system/cpu/cpu5/topology/core_id");
  t = read_host_topology(root.string(), {});
  ASSERT_FALSE(t);
  EXPECT_NE(t.error().message.find("cpu5/topology/core_id"), std::string::npos)
      << t.error().message;
  EXPECT_FALSE(read_host_topology((fs::path(::testing::TempDir()) / "no_such_sysfs").string(), {}));
}

TEST(HostCalibration, SummaryKeepsMedianExtremesAndNoise) {
  const Measured m = summarize({4.0, 1.0, 3.0, 2.0});
  EXPECT_DOUBLE_EQ(m.median, 2.5);
  EXPECT_DOUBLE_EQ(m.min, 1.0);
  EXPECT_DOUBLE_EQ(m.max, 4.0);
  EXPECT_DOUBLE_EQ(m.noise, 3.0 / 2.5);
  EXPECT_EQ(m.samples.size(), 4u);
}

float from_bf16(std::uint16_t h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(HostCalibration, AdamLoopMatchesAScalarReference) {
  constexpr std::int64_t n = 1000;
  std::vector<std::uint16_t> grad(n), param(n);
  std::vector<float> g32(n), master(n), m(n, 0.0f), v(n, 0.0f);
  double sq = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = 0.001f * static_cast<float>(i % 50) - 0.02f;  // exact in bf16? close enough
    std::uint32_t u;
    std::memcpy(&u, &g, 4);
    grad[static_cast<std::size_t>(i)] = static_cast<std::uint16_t>(u >> 16);
    const float gb = from_bf16(grad[static_cast<std::size_t>(i)]);
    sq += static_cast<double>(gb) * gb;
    master[static_cast<std::size_t>(i)] = 0.5f + 0.001f * static_cast<float>(i);
  }
  const std::vector<float> before = master;
  const double norm = host_adam_step(n, grad.data(), g32.data(), master.data(), m.data(), v.data(),
                                     param.data(), 1);
  EXPECT_NEAR(norm, std::sqrt(sq), 1e-5 * std::sqrt(sq));
  const double clip = norm > 1.0 ? 1.0 / (norm + 1e-6) : 1.0;
  for (std::int64_t i = 0; i < n; i += 37) {
    const auto k = static_cast<std::size_t>(i);
    const double g = from_bf16(grad[k]) * clip;
    const double mi = 0.1 * g, vi = 0.001 * g * g;
    const double mhat = mi / 0.1, vhat = vi / 0.001;
    const double w = before[k] * (1.0 - 1e-4 * 0.01) - 1e-4 * mhat / (std::sqrt(vhat) + 1e-8);
    EXPECT_NEAR(m[k], mi, 1e-7);
    EXPECT_NEAR(v[k], vi, 1e-9);
    EXPECT_NEAR(master[k], w, 1e-6) << i;
    EXPECT_NEAR(from_bf16(param[k]), master[k], std::abs(master[k]) * 0.004);  // bf16 rounding
  }
}

TEST(HostCalibration, AdamThreadCountsDoubleUpToTheCpus) {
  EXPECT_EQ(adam_thread_counts(0), std::vector<int>{});
  EXPECT_EQ(adam_thread_counts(1), std::vector<int>{1});
  EXPECT_EQ(adam_thread_counts(2), (std::vector<int>{1, 2}));
  EXPECT_EQ(adam_thread_counts(6), (std::vector<int>{1, 2, 4, 6}));
  EXPECT_EQ(adam_thread_counts(72), (std::vector<int>{1, 2, 4, 8, 16, 32, 64, 72}));
}

TEST(HostCalibration, ReadsMemTotalAndNamesABrokenMeminfo) {
  const fs::path dir = fs::path(::testing::TempDir()) / "meminfo";
  write(dir / "good", "MemFree:  100 kB\nMemTotal:       131072 kB\nBuffers: 1 kB");
  auto total = read_mem_total((dir / "good").string());
  ASSERT_TRUE(total) << total.error().message;
  EXPECT_EQ(*total, std::int64_t{131072} * 1024);  // 128 MiB
  write(dir / "bad", "MemFree: 100 kB");
  auto bad = read_mem_total((dir / "bad").string());
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find((dir / "bad").string()), std::string::npos);
  EXPECT_NE(bad.error().message.find("MemTotal"), std::string::npos);
  EXPECT_FALSE(read_mem_total((dir / "missing").string()));
}

TEST(HostCalibration, MeasuresThisMachineWithinPlausibleRanges) {
  HostCalibrationOptions o;
  o.array_bytes = std::int64_t{8} << 20;
  o.samples = 3;
  o.adam_params = std::int64_t{1} << 18;
  o.adam_samples = 3;
  o.max_threads_per_node = 2;
  o.max_adam_threads = 2;
  o.date = "2026-12-01T00:00:00Z";
  auto h = measure_host(o);
  ASSERT_TRUE(h) << h.error().message;
  const HostTopology& t = h->topology;
  ASSERT_GE(t.sockets, 1);
  ASSERT_FALSE(t.nodes.empty());
  for (int c : t.cores_per_socket) {
    EXPECT_GE(c, 1);
    EXPECT_LE(c, t.logical_cpus);
  }
  ASSERT_EQ(h->nodes.size(), t.nodes.size());
  for (const NodeBandwidth& n : h->nodes) {
    EXPECT_GE(n.threads, 1);
    EXPECT_LE(n.threads, 2);
    for (const Measured* m : {&n.read, &n.write, &n.copy}) {
      EXPECT_EQ(m->samples.size(), 3u);
      // 100 MB/s to 10 TB/s: a working kernel on any machine, not a figure of this one.
      EXPECT_GT(m->median, 1e8);
      EXPECT_LT(m->median, 1e13);
      EXPECT_LE(m->min, m->median);
      EXPECT_LE(m->median, m->max);
      EXPECT_GE(m->noise, 0.0);
    }
  }
  // CPU Adam by threads: 1, then 2 when the first node has two CPUs (capped at 2 here).
  ASSERT_FALSE(h->adam_scaling.empty());
  EXPECT_EQ(h->adam_scaling.front().threads, 1);
  EXPECT_LE(h->adam_scaling.back().threads, 2);
  for (const AdamScaling& s : h->adam_scaling) {
    EXPECT_EQ(s.bytes_per_s.samples.size(), 3u);
    EXPECT_GT(s.bytes_per_s.median, 1e8);
    EXPECT_LT(s.bytes_per_s.median, 1e13);
  }
  EXPECT_GT(h->mem_total_bytes, std::int64_t{1} << 26);  // any machine that builds offsim
  EXPECT_NE(host_calibration_to_text(*h).find("pinnable memory: RLIMIT_MEMLOCK"),
            std::string::npos);
  const Measured& adam = h->adam_bytes_per_s_per_core;
  EXPECT_EQ(adam.samples.size(), 3u);
  EXPECT_GT(adam.median, 1e8);  // DeepSpeed's published AVX-512 rate is ~1.5 GB/s per core
  EXPECT_LT(adam.median, 1e12);

  auto profile = sim::platform::builtin_profile("h200");
  ASSERT_TRUE(profile);
  apply_host_calibration(*h, *profile);
  EXPECT_EQ(profile->host.adam_bytes_per_s_per_core.origin, sim::platform::Origin::kMeasured);
  EXPECT_DOUBLE_EQ(profile->host.adam_bytes_per_s_per_core.value, adam.median);
  EXPECT_EQ(profile->host.cores_per_socket.origin, sim::platform::Origin::kMeasured);
  EXPECT_EQ(profile->host.cores_per_socket.value,
            *std::min_element(t.cores_per_socket.begin(), t.cores_per_socket.end()));
  EXPECT_EQ(profile->host.dram_bytes_per_s_per_socket.origin, sim::platform::Origin::kMeasured);
  EXPECT_NE(profile->host.dram_bytes_per_s_per_socket.source.find("2026-12-01"), std::string::npos);
  EXPECT_NE(profile->host.adam_bytes_per_s_per_core.source.find("1 thread: "), std::string::npos);
  const auto& measured = profile->provenance.measured;
  EXPECT_NE(std::find(measured.begin(), measured.end(), "host.adam_bytes_per_s_per_core"),
            measured.end());
  // The written profile reads back (the keys and sources are valid profile JSON).
  auto back = sim::platform::profile_from_json(sim::platform::profile_to_json(*profile), "t");
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, *profile);
  EXPECT_NE(host_calibration_to_text(*h).find("CPU Adam"), std::string::npos);
}

}  // namespace
}  // namespace offsim::calibrate
