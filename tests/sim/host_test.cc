// The host catalogue, attaching a host to a system, figure overrides and host files.
#include "sim/platform/host.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>

namespace offsim::sim::platform {
namespace {

System system_named(const char* name) {
  auto s = find_system(name);
  EXPECT_TRUE(s) << s.error().message;
  return *s;
}

CalibrationProfile profile_of(const System& s) {
  auto p = builtin_profile(s.gpu);
  EXPECT_TRUE(p) << p.error().message;
  return *p;
}

TEST(Host, CatalogueFiguresCarrySourcesAndDeriveDramFromChannels) {
  for (const char* name : {"xeon-8480c", "xeon-6960p", "xeon-6980p", "epyc-9654", "epyc-9755",
                           "epyc-7742", "ryzen-9-7950x", "grace"}) {
    auto h = find_host(name);
    ASSERT_TRUE(h) << h.error().message;
    for (const Figure* f :
         {&h->cores_per_socket, &h->vector_bits, &h->memory_channels_per_socket,
          &h->dram_peak_bytes_per_s_per_socket, &h->dram_bytes_per_s_per_socket,
          &h->pcie_lanes_per_socket, &h->root_complex_bytes_per_s, &h->numa_nodes_per_socket}) {
      EXPECT_FALSE(f->source.empty()) << name;
    }
    EXPECT_LE(h->dram_bytes_per_s_per_socket.value, h->dram_peak_bytes_per_s_per_socket.value);
  }
  // 12 channels x 6400 MT/s x 8 bytes = 614.4 GB/s; achievable at hardware.md's 290/307.2.
  auto x6 = find_host("xeon-6960p");
  EXPECT_DOUBLE_EQ(x6->dram_peak_bytes_per_s_per_socket.value, 614.4e9);
  EXPECT_NEAR(x6->dram_bytes_per_s_per_socket.value, 580e9, 1e6);
  // 96 lanes against the 8480C's 80 and its measured 139 GB/s: 166.8 GB/s.
  EXPECT_NEAR(x6->root_complex_bytes_per_s.value, 166.8e9, 1e6);
  EXPECT_EQ(find_host("xeon-6980p")->cores_per_socket.value, 128);
  EXPECT_DOUBLE_EQ(find_host("epyc-9654")->dram_peak_bytes_per_s_per_socket.value, 460.8e9);
}

TEST(Host, UnknownHostListsTheKnownOnes) {
  auto h = find_host("pentium");
  ASSERT_FALSE(h);
  EXPECT_NE(h.error().message.find("unknown host 'pentium' (expected one of: xeon-8480c"),
            std::string::npos)
      << h.error().message;
}

TEST(Host, EverySystemsOwnHostAttachesAndLeavesItsDefaultProfileUnchanged) {
  for (const System& s : list_systems()) {
    ASSERT_FALSE(s.host.empty()) << s.name;
    auto h = find_host(s.host);
    ASSERT_TRUE(h) << s.name;
    EXPECT_TRUE(check_attach(*h, s)) << s.name << ": " << check_attach(*h, s).error().message;
    // The systems that predate the host catalogue: their profiles' host figures are their
    // host's, so resolving changes no number (only sources).
    const std::vector<std::string> original = {
        "dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100", "hgx-h200",       "h100-pcie",
        "gh200",         "gb200-nvl72",   "dgx-b200", "a100-40gb-1gpu", "a100-80gb-1gpu",
        "h100-1gpu",     "h200-1gpu",     "b200-1gpu"};
    if (std::find(original.begin(), original.end(), s.name) == original.end()) continue;
    const CalibrationProfile p = profile_of(s);
    auto hw = resolve_hardware(s, p, "", {});
    ASSERT_TRUE(hw) << hw.error().message;
    EXPECT_EQ(hw->profile.host.cores_per_socket.value, p.host.cores_per_socket.value) << s.name;
    EXPECT_EQ(hw->profile.host.dram_bytes_per_s_per_socket.value,
              p.host.dram_bytes_per_s_per_socket.value)
        << s.name;
    EXPECT_EQ(hw->profile.host_link.root_complex_bytes_per_s.value,
              p.host_link.root_complex_bytes_per_s.value)
        << s.name;
  }
}

TEST(Host, CpuAdamRateScalesWithVectorWidth) {
  // DeepSpeed PR #735: 11.6e9 parameters x 42 B in 8.2 s on 48 AVX-512 cores per core; an AVX2
  // core (EPYC 7742, 256 bits) runs DeepSpeed's 8-lane kernel at half that.
  const double per_core_512 = 11.6e9 * 42.0 / 8.2 / 48.0;
  auto xeon = find_host("xeon-8480c");
  auto rome = find_host("epyc-7742");
  ASSERT_TRUE(xeon && rome);
  EXPECT_DOUBLE_EQ(xeon->adam_bytes_per_s_per_core.value, per_core_512);
  EXPECT_DOUBLE_EQ(rome->adam_bytes_per_s_per_core.value, per_core_512 / 2);
  EXPECT_EQ(rome->adam_bytes_per_s_per_core.origin, Origin::kPublished);
  EXPECT_FALSE(rome->remote_dram_time_ratio.source.empty());
  // The DGX A100 resolves to its EPYC 7742 host's rate.
  const System a100 = system_named("dgx-a100-40gb");
  auto hw = resolve_hardware(a100, profile_of(a100), "", {});
  ASSERT_TRUE(hw) << hw.error().message;
  EXPECT_DOUBLE_EQ(hw->profile.host.adam_bytes_per_s_per_core.value, per_core_512 / 2);
}

TEST(Host, GraceCpuAdamRateIsTheOneMeasuredOnGrace) {
  // SuperOffload's Figure 5: DeepSpeed CPU-Adam steps 8e9 parameters in 0.769 s on a GH200's
  // Grace; 28 bytes per parameter over 72 cores = 4.045 GB/s per core, about 3.3x the x86
  // 512-bit figure (1.24 GB/s), not a scaled x86 core.
  auto grace = find_host("grace");
  ASSERT_TRUE(grace);
  EXPECT_DOUBLE_EQ(grace->adam_bytes_per_s_per_core.value, 8e9 * 28.0 / 0.769 / 72.0);
  EXPECT_EQ(grace->adam_bytes_per_s_per_core.origin, Origin::kPublished);
  EXPECT_NE(grace->adam_bytes_per_s_per_core.source.find("2509.21271"), std::string::npos);
  // The other rows of the figure agree within 3%: 1e9 x 28 B / 0.098 s / 72.
  EXPECT_NEAR(1e9 * 28.0 / 0.098 / 72.0 / grace->adam_bytes_per_s_per_core.value, 1.0, 0.03);
  // GH200 resolves to it: 72 cores then stream 291 GB/s, under Grace's DRAM figure.
  const System gh = system_named("gh200");
  auto hw = resolve_hardware(gh, profile_of(gh), "", {});
  ASSERT_TRUE(hw) << hw.error().message;
  EXPECT_DOUBLE_EQ(hw->profile.host.adam_bytes_per_s_per_core.value,
                   grace->adam_bytes_per_s_per_core.value);
  EXPECT_LT(72.0 * grace->adam_bytes_per_s_per_core.value,
            hw->profile.host.dram_bytes_per_s_per_socket.value);
}

TEST(Host, AXeon6HostChangesTheHostFiguresOfHgxH200) {
  const System s = system_named("hgx-h200-xeon6");
  auto hw = resolve_hardware(s, profile_of(s), "", {});
  ASSERT_TRUE(hw) << hw.error().message;
  EXPECT_EQ(hw->host, "xeon-6960p");
  EXPECT_EQ(hw->profile.host.cores_per_socket.value, 72);
  EXPECT_NEAR(hw->profile.host.dram_bytes_per_s_per_socket.value, 580e9, 1e6);
}

TEST(Host, HostsThatCannotAttachTheGpusAreErrors) {
  const System dgx = system_named("dgx-h100");
  auto grace_on_pcie = resolve_hardware(dgx, profile_of(dgx), "grace", {});
  ASSERT_FALSE(grace_on_pcie);
  EXPECT_NE(grace_on_pcie.error().message.find(
                "hardware.host: host 'grace' attaches GPUs over nvlink-c2c, but system "
                "'dgx-h100' connects its GPUs over pcie-gen5"),
            std::string::npos)
      << grace_on_pcie.error().message;
  const System gh = system_named("gh200");
  EXPECT_FALSE(resolve_hardware(gh, profile_of(gh), "epyc-9755", {}));
  auto gen4 = resolve_hardware(dgx, profile_of(dgx), "epyc-7742", {});
  ASSERT_FALSE(gen4);
  EXPECT_NE(gen4.error().message.find("pcie-gen4 root ports"), std::string::npos);
  // Eight GPUs on one socket with a dedicated x16 each need 128 lanes; an 8480C has 80.
  System one_socket = dgx;
  one_socket.sockets_per_node = 1;
  auto lanes = check_attach(*find_host("xeon-8480c"), one_socket);
  ASSERT_FALSE(lanes);
  EXPECT_NE(lanes.error().message.find("has 80 PCIe lanes per socket, but system 'dgx-h100' "
                                       "needs 128 (8 x16 links per socket)"),
            std::string::npos)
      << lanes.error().message;
  EXPECT_TRUE(check_attach(*find_host("epyc-7742"), system_named("dgx-a100-80gb")));
  EXPECT_FALSE(resolve_hardware(dgx, profile_of(dgx), "no-such-host", {}));
}

TEST(Host, OverridesReplaceOneFigureAfterTheHost) {
  const System s = system_named("dgx-h100");
  auto hw = resolve_hardware(s, profile_of(s), "xeon-6980p",
                             {{"profile.host.cores_per_socket", 32},
                              {"profile.host_link.h2d_bytes_per_s", 50e9},
                              {"system.host_memory_bytes_per_node", 1e12}});
  ASSERT_TRUE(hw) << hw.error().message;
  EXPECT_EQ(hw->profile.host.cores_per_socket.value, 32);
  EXPECT_EQ(hw->profile.host.cores_per_socket.origin, Origin::kAssumption);
  EXPECT_NE(hw->profile.host.cores_per_socket.source.find("hardware.overrides."),
            std::string::npos);
  EXPECT_EQ(hw->profile.host_link.h2d_bytes_per_s.value, 50e9);
  EXPECT_EQ(hw->system.host_memory_bytes_per_node, 1'000'000'000'000);
  // The host's DRAM figure is kept where no override names it.
  EXPECT_NEAR(hw->profile.host.dram_bytes_per_s_per_socket.value, 580e9, 1e6);
}

TEST(Host, BadOverridesNameTheKeyAndTheChoices) {
  const System s = system_named("dgx-h100");
  const CalibrationProfile p = profile_of(s);
  auto unknown = resolve_hardware(s, p, "", {{"profile.host.cores", 8}});
  ASSERT_FALSE(unknown);
  const std::string& m = unknown.error().message;
  EXPECT_NE(m.find("hardware.overrides.profile.host.cores: unknown figure 'profile.host.cores'; "
                   "expected one of: "),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("profile.host.cores_per_socket"), std::string::npos);
  EXPECT_NE(m.find("system.sockets_per_node"), std::string::npos);
  // A section, not a figure.
  EXPECT_FALSE(resolve_hardware(s, p, "", {{"profile.host", 8}}));
  EXPECT_FALSE(resolve_hardware(s, p, "", {{"nodes", 8}}));
  // Out of range: the profile's own validation names the key.
  auto negative = resolve_hardware(s, p, "", {{"profile.host.cores_per_socket", -4}});
  ASSERT_FALSE(negative);
  EXPECT_NE(negative.error().message.find("hardware.overrides.profile.host.cores_per_socket"),
            std::string::npos)
      << negative.error().message;
  // An impossible system: 8 GPUs do not divide over 3 sockets.
  auto sockets = resolve_hardware(s, p, "", {{"system.sockets_per_node", 3}});
  ASSERT_FALSE(sockets);
  EXPECT_NE(sockets.error().message.find("do not divide over 3 sockets"), std::string::npos)
      << sockets.error().message;
  EXPECT_FALSE(resolve_hardware(s, p, "", {{"system.sockets_per_node", 1.5}}));
}

TEST(Host, OverridePathsListEveryFigureOnce) {
  const System s = system_named("gh200");
  const auto paths = override_paths(s, profile_of(s));
  EXPECT_NE(std::find(paths.begin(), paths.end(), "profile.host.adam_bytes_per_s_per_core"),
            paths.end());
  EXPECT_NE(std::find(paths.begin(), paths.end(), "system.host_memory_bytes_per_node"),
            paths.end());
  EXPECT_TRUE(std::is_sorted(paths.begin(), paths.end()));
  EXPECT_EQ(std::adjacent_find(paths.begin(), paths.end()), paths.end());
}

// A host file: every figure of a catalogue host written and read back unchanged.
TEST(HostFile, RoundTripsEveryFigure) {
  for (const Host& h : list_hosts()) {
    auto back = host_from_json(host_to_json(h), "h.json");
    ASSERT_TRUE(back) << back.error().message;
    EXPECT_EQ(*back, h) << h.name;
  }
}

TEST(HostFile, OverridesOneFigureOverItsBase) {
  const nlohmann::json j = nlohmann::json::parse(R"({"format": "offsim-host", "base": "xeon-8480c",
      "name": "lab", "cores_per_socket": {"value": 32, "origin": "measured", "source": "lscpu"}})");
  auto h = host_from_json(j, "lab.json");
  ASSERT_TRUE(h) << h.error().message;
  Host expected = *find_host("xeon-8480c");
  EXPECT_NE(expected.cores_per_socket.value, 32);
  expected.name = "lab";
  expected.cores_per_socket = Figure{.value = 32, .origin = Origin::kMeasured, .source = "lscpu"};
  EXPECT_EQ(*h, expected);
  // Written over its base, the file lists only what differs.
  const Host base = *find_host("xeon-8480c");
  const nlohmann::json out = host_to_json(*h, &base);
  EXPECT_EQ(out.at("base"), "xeon-8480c");
  EXPECT_TRUE(out.contains("cores_per_socket"));
  EXPECT_FALSE(out.contains("vector_bits"));
  EXPECT_FALSE(out.contains("attach"));
  auto again = host_from_json(out, "lab.json");
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(*again, *h);
}

TEST(HostFile, ResolvesLikeACatalogueHost) {
  const std::string path =
      (std::filesystem::temp_directory_path() / fmt::format("offsim_host_{}.json", ::getpid()))
          .string();
  Host lab = *find_host("xeon-6960p");
  lab.name = "lab";
  lab.adam_bytes_per_s_per_core.value = 5e9;
  std::ofstream(path) << host_to_json(lab).dump(2);
  const System dgx = system_named("dgx-h100");
  auto hw = resolve_hardware(dgx, profile_of(dgx), path, {});
  std::filesystem::remove(path);
  ASSERT_TRUE(hw) << hw.error().message;
  EXPECT_EQ(hw->host, path);
  EXPECT_EQ(hw->profile.host.adam_bytes_per_s_per_core.value, 5e9);
  EXPECT_EQ(hw->profile.host.cores_per_socket, lab.cores_per_socket);
}

std::string host_error(const std::string& text) {
  auto j = nlohmann::json::parse(text);
  auto h = host_from_json(j, "bad.json");
  return h ? std::string() : h.error().message;
}

TEST(HostFile, BadFilesAreErrorsNamingTheFileAndKey) {
  const std::string head = R"({"format": "offsim-host", "base": "grace", )";
  EXPECT_EQ(host_error(head + R"("cores": 3})"),
            "bad.json: $: unknown key 'cores' (expected one of: format, format_version, name, "
            "description, base, attach, cores_per_socket, vector_bits, memory_channels_per_socket, "
            "dram_peak_bytes_per_s_per_socket, dram_bytes_per_s_per_socket, "
            "pcie_lanes_per_socket, root_complex_bytes_per_s, numa_nodes_per_socket, "
            "adam_bytes_per_s_per_core, remote_dram_time_ratio)");
  const std::string zero = host_error(
      head + R"("cores_per_socket": {"value": 0, "origin": "measured", "source": "x"}})");
  EXPECT_EQ(zero,
            "bad.json: $.cores_per_socket.value: expected a whole number in [1, 4096] (cores), "
            "got 0");
  EXPECT_NE(host_error(head + R"("adam_bytes_per_s_per_core": {"value": -1e9, "origin": )"
                              R"("measured", "source": "x"}})")
                .find("$.adam_bytes_per_s_per_core.value: expected a number in"),
            std::string::npos);
  EXPECT_NE(host_error(head + R"("vector_bits": {"value": "wide", "origin": "datasheet", )"
                              R"("source": "x"}})")
                .find("bad.json: $.vector_bits.value: expected a number"),
            std::string::npos);
  EXPECT_NE(host_error(head + R"("vector_bits": 512})").find("$.vector_bits: expected an object"),
            std::string::npos);
  EXPECT_NE(host_error(head + R"("vector_bits": {"value": 512, "origin": "guess", "source": "x"}})")
                .find("$.vector_bits.origin: unknown origin 'guess'"),
            std::string::npos);
  EXPECT_NE(host_error(R"({"format": "offsim-host", "base": "pentium"})")
                .find("bad.json: $.base: unknown host 'pentium' (expected one of: xeon-8480c"),
            std::string::npos);
  EXPECT_NE(host_error(R"({"format": "offsim-host", "attach": "pcie-gen5"})")
                .find("bad.json: $: missing key 'cores_per_socket'"),
            std::string::npos);
  EXPECT_NE(host_error(R"({"format": "offsim-profile"})")
                .find("bad.json: $.format: expected \"offsim-host\""),
            std::string::npos);
  EXPECT_NE(host_error(head + R"("attach": "usb"})").find("$.attach: unknown attach 'usb'"),
            std::string::npos);
  auto missing = read_host_file("no/such/host.json");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("no/such/host.json"), std::string::npos);
}

}  // namespace
}  // namespace offsim::sim::platform
