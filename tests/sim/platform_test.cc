// Tests of the platform: system catalogue, topology routes, calibration profiles and their JSON.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>

#include "sim/core/file_io.h"
#include "sim/platform/profile.h"
#include "sim/platform/system.h"
#include "sim/platform/topology.h"

namespace offsim::sim::platform {
namespace {

using nlohmann::json;

std::vector<std::string> resources(const Route& r) {
  std::vector<std::string> out;
  for (const RouteHop& h : r.hops) out.push_back(h.resource);
  return out;
}

TEST(SystemTest, CatalogueHasTheBriefsSystemsAndAllValidate) {
  for (const char* name :
       {"dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100", "hgx-h200", "h100-pcie", "gh200",
        "gb200-nvl72", "dgx-b200", "a100-80gb-1gpu", "h200-1gpu", "hgx-h800"}) {
    auto s = find_system(name);
    ASSERT_TRUE(s.has_value()) << name;
    EXPECT_TRUE(validate(*s).has_value()) << name;
    EXPECT_TRUE(builtin_profile(s->gpu).has_value()) << name << " uses " << s->gpu;
  }
  for (const System& s : list_systems()) {
    EXPECT_TRUE(validate(s).has_value()) << s.name;
  }
}

TEST(SystemTest, UnknownSystemListsKnownNames) {
  auto s = find_system("dgx-z900");
  ASSERT_FALSE(s.has_value());
  EXPECT_EQ(s.error().code, ErrorCode::kNotFound);
  EXPECT_NE(s.error().message.find("dgx-z900"), std::string::npos);
  EXPECT_NE(s.error().message.find("dgx-h100"), std::string::npos);
}

TEST(SystemTest, DgxA100Layout) {
  // 8 GPUs, 2 per PCIe switch, 4 per socket: GPU 5 is on switch 2 and socket 1.
  const System s = *find_system("dgx-a100-80gb");
  EXPECT_EQ(s.gpus_per_socket(), 4);
  EXPECT_EQ(s.pcie_switch_of(5), 2);
  EXPECT_EQ(s.socket_of(5), 1);
  const System four = s.with_nodes(4);
  EXPECT_EQ(four.gpu_count(), 32);
  EXPECT_EQ(four.node_of(17), 2);
  EXPECT_EQ(four.local_gpu(17), 1);
  EXPECT_TRUE(four.same_nvlink_domain(8, 15));
  EXPECT_FALSE(four.same_nvlink_domain(7, 8));
}

TEST(SystemTest, Nvl72DomainSpansTrays) {
  const System s = *find_system("gb200-nvl72");
  EXPECT_EQ(s.gpu_count(), 72);
  EXPECT_TRUE(s.same_nvlink_domain(0, 71));  // tray 0 and tray 17, one NVLink domain
  EXPECT_NE(s.node_of(0), s.node_of(71));
}

TEST(SystemTest, ValidateRejectsInconsistentLayouts) {
  System s = *find_system("dgx-a100-80gb");
  s.gpus_per_pcie_switch = 3;  // 4 GPUs per socket do not split into switches of 3
  EXPECT_FALSE(validate(s).has_value());
  s = *find_system("dgx-a100-80gb");
  s.gpu = "tpu-v5p";
  auto st = validate(s);
  ASSERT_FALSE(st.has_value());
  EXPECT_NE(st.error().message.find("tpu-v5p"), std::string::npos);
}

TEST(TopologyTest, DgxA100HostToDeviceCrossesLinkUplinkRootComplexAndDram) {
  const System s = *find_system("dgx-a100-80gb");
  const auto profile = *builtin_profile(s.gpu);
  const Topology t = Topology::build(s, profile);
  // GPU 3 hangs off switch 1 (GPUs 2 and 3) on socket 0 (GPUs 0-3).
  auto r = t.route(t.dram(0, 0), t.gpu(0, 3));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(resources(*r), (std::vector<std::string>{"node0.socket0.dram", "node0.socket0.rc",
                                                     "node0.pcie_sw1.up.h2d", "node0.gpu3.pcie.h2d",
                                                     "node0.gpu3.pcie.duplex"}));
  // Capacities from the profile: 25 GB/s link and uplink, 2 × 25 GB/s root complex.
  EXPECT_DOUBLE_EQ(r->hops[3].bytes_per_s, 25e9);
  EXPECT_DOUBLE_EQ(r->hops[2].bytes_per_s, 25e9);
  EXPECT_DOUBLE_EQ(r->hops[1].bytes_per_s, 50e9);

  auto back = t.route(t.gpu(0, 3), t.dram(0, 0));
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(resources(*back),
            (std::vector<std::string>{"node0.gpu3.pcie.d2h", "node0.gpu3.pcie.duplex",
                                      "node0.pcie_sw1.up.d2h", "node0.socket0.rc",
                                      "node0.socket0.dram"}));
}

TEST(TopologyTest, TwoGpusShareASwitchUplink) {
  const System s = *find_system("dgx-a100-80gb");
  const Topology t = Topology::build(s, *builtin_profile(s.gpu));
  auto a = t.route(t.dram(0, 0), t.gpu(0, 2));
  auto b = t.route(t.dram(0, 0), t.gpu(0, 3));
  auto c = t.route(t.dram(0, 0), t.gpu(0, 1));
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(a->hops[2].resource, b->hops[2].resource);  // node0.pcie_sw1.up.h2d
  EXPECT_NE(a->hops[2].resource, c->hops[2].resource);  // GPU 1 is on switch 0
}

TEST(TopologyTest, Gh200CopiesCrossC2cToGrace) {
  const System s = *find_system("gh200");
  const Topology t = Topology::build(s, *builtin_profile(s.gpu));
  auto r = t.route(t.dram(0, 0), t.gpu(0, 0));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(resources(*r),
            (std::vector<std::string>{"node0.socket0.dram", "node0.socket0.rc",
                                      "node0.gpu0.c2c.h2d", "node0.gpu0.c2c.duplex"}));
  EXPECT_DOUBLE_EQ(r->hops[2].bytes_per_s, 360e9);
}

TEST(TopologyTest, GpusTalkOverNvSwitchInsideANodeAndNicsAcrossNodes) {
  const System s = find_system("dgx-h100")->with_nodes(2);
  const Topology t = Topology::build(s, *builtin_profile(s.gpu));
  auto same = t.route(t.gpu(0, 1), t.gpu(0, 6));
  ASSERT_TRUE(same.has_value());
  EXPECT_EQ(resources(*same),
            (std::vector<std::string>{"node0.gpu1.nvlink.tx", "node0.gpu6.nvlink.rx"}));
  auto across = t.route(t.gpu(0, 1), t.gpu(1, 1));
  ASSERT_TRUE(across.has_value());
  const auto names = resources(*across);
  EXPECT_NE(std::find(names.begin(), names.end(), "node0.nic1.tx"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "node1.nic1.rx"), names.end());
}

TEST(ProfileTest, InterpolatesOnLogSize) {
  const std::vector<CurveKnot> knots = {{.size = 1e9, .efficiency = {.value = 0.6}},
                                        {.size = 16e9, .efficiency = {.value = 0.9}}};
  // 4 GFLOP lies at log(4)/log(16) = 1/2 of the way: 0.6 + 0.3 / 2 = 0.75.
  EXPECT_NEAR(interpolate_log(knots, 4e9), 0.75, 1e-12);
  EXPECT_DOUBLE_EQ(interpolate_log(knots, 1e6), 0.6);   // clamped below
  EXPECT_DOUBLE_EQ(interpolate_log(knots, 1e15), 0.9);  // clamped above
}

TEST(ProfileTest, GemmEfficiencyPenalisesPartialTilesAndMisalignment) {
  // The model of profiles without the wave and depth figures (format 1 files written before
  // they existed): curve × tile fill of 128-element tiles × alignment.
  auto p = *builtin_profile("h100-sxm");
  p.gemm.sm_count.value = 0;
  p.gemm.k_overhead_elements.value = 0;
  p.gemm.reference_dim.value = 0;
  // The H100's short-run best (795 TFLOP/s) at the sustained / short-run ratio measured on an
  // H200 (667 / 790, two GPUs).
  const double best = 795.0 * 667.0 / 790.0 / 989.0;
  // 8192^3 = 1.1 TFLOP, above the top knot (128 GFLOP): the measured best GEMM fraction.
  EXPECT_NEAR(p.gemm.efficiency({.m = 8192, .n = 8192, .k = 8192}), best, 1e-12);
  // m = 8256 = 64.5 tiles of 128: 8256 / (65 · 128) = 0.99231 of the tiles hold real rows.
  EXPECT_NEAR(p.gemm.efficiency({.m = 8256, .n = 8192, .k = 8192}), best * 8256.0 / 8320.0, 1e-12);
  // k = 8191 is not a multiple of 8: × 0.7.
  EXPECT_NEAR(p.gemm.efficiency({.m = 8192, .n = 8192, .k = 8191}), best * 0.7, 1e-12);
}

TEST(ProfileTest, GemmEfficiencyHasWaveAndDepthTerms) {
  // A100: tiles in whole waves (stream_k 0). 108 SMs, 256x128 tiles.
  const auto a100 = *builtin_profile("a100-80gb");
  EXPECT_EQ(a100.gemm.stream_k.value, 0);
  EXPECT_EQ(a100.gemm.sm_count.value, 108);
  // 256 x 13824 = 1 x 108 tiles of 256x128 (or 2 x 54 of 128x256): one full wave. 264 rows need
  // 2 x 108 (or 3 x 54 = 162) tiles: two waves of 108 tile slots for 264/256 of the work, fill
  // 264 / 512 (the depth term is the same for both).
  EXPECT_NEAR(a100.gemm.shape_factor({.m = 264, .n = 13824, .k = 16384}) /
                  a100.gemm.shape_factor({.m = 256, .n = 13824, .k = 16384}),
              264.0 / 512.0, 1e-12);

  // H100: stream-K (stream_k 1), 132 SMs, 256x128 tiles, k0 = 2 · 989e12 / (2 · 3350e9) =
  // 295.2 -> 295 elements.
  const auto p = *builtin_profile("h100-sxm");
  const double best = 795.0 * 667.0 / 790.0 / 989.0;  // sustained (see above)
  EXPECT_EQ(p.gemm.stream_k.value, 1);
  EXPECT_EQ(p.gemm.sm_count.value, 132);
  EXPECT_EQ(p.gemm.k_overhead_elements.value, 295);
  // The reference shape 8192^3 gets the measured best exactly (the shape factor is normalised).
  EXPECT_NEAR(p.gemm.efficiency({.m = 8192, .n = 8192, .k = 8192}), best, 1e-12);
  // 256 x 16896 is 132 tiles: each SM one tile, 16384 main-loop steps and one segment's 295.
  // 264 rows: as 128x256 tiles, 3 x 66 = 198 tiles over 132 SMs, 1.5 tiles' steps and two
  // segments per SM (no idle SMs in the partial wave), for 264/256 of the work.
  const GemmShape full{.m = 256, .n = 16896, .k = 16384};
  const GemmShape over{.m = 264, .n = 16896, .k = 16384};
  EXPECT_NEAR(p.gemm.shape_factor(full), 16384.0 / 16679.0, 1e-12);
  EXPECT_NEAR(p.gemm.shape_factor(over) / p.gemm.shape_factor(full),
              (264.0 / 256.0) * 16679.0 / (198.0 * 16384.0 / 132.0 + 2 * 295.0), 1e-12);
  // The full tiles at k = 16384 run deeper than the reference cube: their factors alone would
  // put them above the measured best, which is the best of a shape sweep (MAMF); they are held
  // there. The padded shape stays under it.
  const GemmShape cube{.m = 8192, .n = 8192, .k = 8192};
  EXPECT_GT(p.gemm.shape_factor(full), p.gemm.shape_factor(cube));
  EXPECT_NEAR(p.gemm.efficiency(full), best, 1e-12);
  EXPECT_NEAR(p.gemm.efficiency(over), best * p.gemm.shape_factor(over) / p.gemm.shape_factor(cube),
              1e-12);
  // Depth: 8192 x 8192 is 2048 tiles, 15.5 per SM in 16 segments: at k = 128 against 8192.
  const auto depth = [](double k) { return k / (2048.0 * k / 132.0 + 16.0 * 295.0); };
  EXPECT_NEAR(p.gemm.shape_factor({.m = 8192, .n = 8192, .k = 128}) /
                  p.gemm.shape_factor({.m = 8192, .n = 8192, .k = 8192}),
              depth(128) / depth(8192), 1e-12);
  // k = 8191 is not a multiple of 8: × 0.7, and its depth term against the reference's.
  EXPECT_NEAR(p.gemm.efficiency({.m = 8192, .n = 8192, .k = 8191}),
              best * 0.7 * depth(8191) / depth(8192), 1e-12);
  // Fewer tiles than SMs split along k: 128 x 2048 at k = 8192 is 8 tiles of 128x256 over all
  // 132 SMs, each one segment of 8 · 8192 / 132 steps.
  EXPECT_NEAR(p.gemm.shape_factor({.m = 128, .n = 2048, .k = 8192}),
              8.0 * 8192.0 / (132.0 * (8.0 * 8192.0 / 132.0 + 295.0)), 1e-12);
  // A single 64-deep k-block cannot be split: 128 x 256 x 64 runs on one SM.
  EXPECT_NEAR(p.gemm.shape_factor({.m = 128, .n = 256, .k = 64}), 64.0 / (132.0 * (64.0 + 295.0)),
              1e-12);
}

TEST(ProfileTest, Fp8GemmsHaveTheirOwnDepthTermAndMamfPoint) {
  auto p = *builtin_profile("h100-sxm");
  // FP8: the main loop at the FP8 peak (2 · 989), the C tile written in bf16:
  // k0 = 2 · 1978e12 / (2 · 3350e9) = 590.4 -> 590 elements, against 295 for bf16.
  EXPECT_EQ(p.gemm.k_overhead_elements_fp8.value, 590);
  const GemmShape shallow{.m = 8192, .n = 8192, .k = 4096, .dtype = DType::kFp8};
  const GemmShape ref{.m = 8192, .n = 8192, .k = 8192, .dtype = DType::kFp8};
  // 2048 tiles over 132 SMs, 16 segments each (stream-K, see above).
  const auto depth = [](double k, double k0) { return k / (2048.0 * k / 132.0 + 16.0 * k0); };
  EXPECT_NEAR(p.gemm.shape_factor(shallow) / p.gemm.shape_factor(ref),
              depth(4096, 590) / depth(8192, 590), 1e-12);
  GemmShape shallow_bf16 = shallow;
  shallow_bf16.dtype = DType::kBf16;
  EXPECT_NEAR(
      p.gemm.shape_factor(shallow_bf16) / p.gemm.shape_factor({.m = 8192, .n = 8192, .k = 8192}),
      depth(4096, 295) / depth(8192, 295), 1e-12);
  // The FP8 surface takes the MAMF table's FP8 figure at the reference shape, at the bf16
  // sustained / short-run ratio.
  EXPECT_NEAR(p.gemm.efficiency(ref), 1402.6 * 667.0 / 790.0 / 1978.0, 1e-12);
  // Without the FP8 figure, FP8 GEMMs fall back to the bf16 depth term.
  p.gemm.k_overhead_elements_fp8.value = 0;
  EXPECT_NEAR(p.gemm.shape_factor(shallow), p.gemm.shape_factor(shallow_bf16), 1e-15);
}

TEST(ProfileTest, ProfilesWithoutTheWaveFiguresStillLoad) {
  json j = profile_to_json(*builtin_profile("a100-80gb"));
  for (const char* key : {"sm_count", "wave_tile_m", "wave_tile_n", "k_overhead_elements",
                          "k_overhead_elements_fp8", "reference_dim", "stream_k"}) {
    j["gemm"].erase(key);
  }
  auto p = profile_from_json(j, "old.json");
  ASSERT_TRUE(p.has_value()) << p.error().message;
  EXPECT_EQ(p->gemm.sm_count.value, 0.0);
  EXPECT_EQ(p->gemm.k_overhead_elements.value, 0.0);
  EXPECT_EQ(p->gemm.k_overhead_elements_fp8.value, 0.0);
  // Without them, the curve and 128-element tile model: 8256 rows fill 8256 / 8320 of 65 tiles.
  EXPECT_NEAR(p->gemm.efficiency({.m = 8256, .n = 8192, .k = 8192}),
              257.0 / 312.0 * 8256.0 / 8320.0, 1e-12);
  j["gemm"]["sm_count"] = json{{"value", 1e9}, {"origin", "measured"}, {"source", "x"}};
  auto bad = profile_from_json(j, "old.json");
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("$.gemm.sm_count.value"), std::string::npos);
}

TEST(ProfileTest, MeasuredGemmPointsOverrideTheCurve) {
  auto p = *builtin_profile("h200");
  // The built-in H200 profile carries the published 8192^3 points: bf16, then FP8 (MAMF table).
  ASSERT_EQ(p.gemm.points.size(), 2u);
  EXPECT_EQ(p.gemm.points[0].dtype, DType::kBf16);
  EXPECT_EQ(p.gemm.points[1].dtype, DType::kFp8);
  p.gemm.points.pop_back();  // the bf16 point alone from here on
  p.gemm.points[0].efficiency.value = 0.5;
  EXPECT_DOUBLE_EQ(p.gemm.efficiency({.m = 8192, .n = 8192, .k = 8192}), 0.5);
  // Elsewhere the model is scaled by the measured/model ratio of the (only) point: 0.5 / model.
  const GemmShape other{.m = 4096, .n = 4096, .k = 4096};
  const double ratio = 0.5 / p.gemm.model_efficiency({.m = 8192, .n = 8192, .k = 8192});
  EXPECT_NEAR(p.gemm.efficiency(other), p.gemm.model_efficiency(other) * ratio, 1e-12);
  // Points of another dtype do not apply.
  const GemmShape fp8{.m = 8192, .n = 8192, .k = 8192, .dtype = DType::kFp8};
  EXPECT_DOUBLE_EQ(p.gemm.efficiency(fp8), p.gemm.model_efficiency(fp8));
}

TEST(ProfileTest, EveryBuiltinFigureHasASource) {
  for (const std::string& kind : known_gpu_kinds()) {
    auto p = builtin_profile(kind);
    ASSERT_TRUE(p.has_value()) << kind;
    const json j = profile_to_json(*p);
    // Walk the JSON: every object with a "value" is a figure and must name its source.
    std::vector<std::pair<std::string, const json*>> stack = {{"$", &j}};
    int figures = 0;
    while (!stack.empty()) {
      auto [path, node] = stack.back();
      stack.pop_back();
      if (node->is_object() && node->contains("value")) {
        ++figures;
        EXPECT_FALSE((*node)["source"].get<std::string>().empty()) << kind << " " << path;
        continue;
      }
      if (node->is_object()) {
        for (auto it = node->begin(); it != node->end(); ++it) {
          stack.push_back({path + "." + it.key(), &*it});
        }
      } else if (node->is_array()) {
        for (std::size_t i = 0; i < node->size(); ++i) {
          stack.push_back({path + "[" + std::to_string(i) + "]", &(*node)[i]});
        }
      }
    }
    EXPECT_GT(figures, 40) << kind;
  }
}

TEST(ProfileTest, JsonRoundTripForEveryBuiltin) {
  for (const std::string& kind : known_gpu_kinds()) {
    const auto p = *builtin_profile(kind);
    const std::string text = profile_to_json(p).dump(2);
    auto back = profile_from_json_text(text, kind + ".json");
    ASSERT_TRUE(back.has_value()) << back.error().message;
    EXPECT_EQ(*back, p) << kind;
  }
}

class ProfileErrorTest : public ::testing::Test {
 protected:
  json base_ = profile_to_json(*builtin_profile("a100-80gb"));
  std::string parse_error(const json& j) {
    auto r = profile_from_json(j, "a100.json");
    EXPECT_FALSE(r.has_value());
    return r.has_value() ? std::string() : r.error().message;
  }
};

TEST_F(ProfileErrorTest, UnknownKeysAreRejected) {
  json j = base_;
  j["host_link"]["h2d_bandwidth"] = j["host_link"]["h2d_bytes_per_s"];
  const std::string m = parse_error(j);
  EXPECT_NE(m.find("a100.json"), std::string::npos) << m;
  EXPECT_NE(m.find("$.host_link"), std::string::npos) << m;
  EXPECT_NE(m.find("unknown key 'h2d_bandwidth'"), std::string::npos) << m;

  j = base_;
  j["gpu"]["hbm_usable_bytes"]["unit"] = "bytes";
  EXPECT_NE(parse_error(j).find("$.gpu.hbm_usable_bytes: unknown key 'unit'"), std::string::npos);

  j = base_;
  j["extra"] = 1;
  EXPECT_NE(parse_error(j).find("unknown key 'extra'"), std::string::npos);
}

TEST_F(ProfileErrorTest, WrongTypesAreRejected) {
  json j = base_;
  j["nvlink"]["latency_s"]["value"] = "20us";
  const std::string m = parse_error(j);
  EXPECT_NE(m.find("a100.json: $.nvlink.latency_s.value: expected a number, got string"),
            std::string::npos)
      << m;
  j = base_;
  j["gemm"]["curve"] = json::object();
  EXPECT_NE(parse_error(j).find("$.gemm.curve: expected an array"), std::string::npos);
}

TEST_F(ProfileErrorTest, NegativeBandwidthIsRejected) {
  json j = base_;
  j["host_link"]["d2h_bytes_per_s"]["value"] = -25e9;
  const std::string m = parse_error(j);
  EXPECT_NE(m.find("a100.json: $.host_link.d2h_bytes_per_s.value: value -2.5e+10 is outside "
                   "[1e+06, 1e+14] (a bandwidth in bytes/s"),
            std::string::npos)
      << m;
  j = base_;
  j["host_link"]["d2h_bytes_per_s"]["value"] = 0.0;  // a divisor must be positive
  EXPECT_NE(parse_error(j).find("$.host_link.d2h_bytes_per_s.value: value 0 is outside"),
            std::string::npos);
  j = base_;
  j["nvlink"]["bytes_per_s_per_gpu"]["value"] = 0.0;  // 0: no NVLink
  j["nvlink"]["ring_all_gather_bus_bytes_per_s"]["value"] = 0.0;
  j["nvlink"]["ring_reduce_scatter_bus_bytes_per_s"]["value"] = 0.0;
  j["nvlink"]["ring_all_reduce_bus_bytes_per_s"]["value"] = 0.0;
  j["nvlink"]["nvls_all_reduce_bus_bytes_per_s"]["value"] = 0.0;
  EXPECT_TRUE(profile_from_json(j, "a100.json"));
}

// Every figure is checked against its plausible range from one table, with the key path.
TEST_F(ProfileErrorTest, AbsurdFiguresAreRejectedWithTheirRange) {
  const struct {
    const char* section;
    const char* key;
    double value;
    const char* expected;
  } cases[] = {
      {"gpu", "hbm_usable_bytes", 1e30, "$.gpu.hbm_usable_bytes.value: value 1e+30 is outside"},
      {"gpu", "dense_flops_bf16", 1e-3, "$.gpu.dense_flops_bf16.value: value 0.001 is outside"},
      {"gpu", "kernel_launch_s", 5.0, "$.gpu.kernel_launch_s.value: value 5 is outside"},
      {"gpu", "compute_capability", 90.0, "$.gpu.compute_capability.value: value 90 is outside"},
      {"gpu", "compute_capability", 9.05, "$.gpu.compute_capability.value: expected major.minor"},
      {"host", "cores_per_socket", 1e6, "$.host.cores_per_socket.value: value 1e+06 is outside"},
      {"host_link", "latency_s", 1e5, "$.host_link.latency_s.value: value 100000 is outside"},
      {"nvlink", "bytes_per_s_per_gpu", 1e20, "$.nvlink.bytes_per_s_per_gpu.value"},
      {"inter_node", "efficiency", 0.0, "$.inter_node.efficiency.value: value 0 is outside"},
      {"interference", "copy_hbm_bytes_per_byte", 1e9, "copy_hbm_bytes_per_byte.value"},
      {"allocator", "fixed_bytes", 1e20, "$.allocator.fixed_bytes.value"},
  };
  for (const auto& c : cases) {
    json j = base_;
    j[c.section][c.key]["value"] = c.value;
    const std::string m = parse_error(j);
    EXPECT_NE(m.find(c.expected), std::string::npos) << c.key << ": " << m;
  }
  json j = base_;
  j["gemm"]["curve"][0]["size"] = 1e30;
  EXPECT_NE(parse_error(j).find("$.gemm.curve[0].size: value 1e+30 is outside"), std::string::npos);
  j = base_;
  j["memory_bound"][0]["efficiency"]["value"] = 1e-9;
  EXPECT_NE(parse_error(j).find("$.memory_bound[0].efficiency.value: value 1e-09 is outside"),
            std::string::npos);
}

TEST_F(ProfileErrorTest, BadCurvesOriginsAndMissingKeysAreRejected) {
  json j = base_;
  j["gemm"]["curve"].push_back(j["gemm"]["curve"][0]);
  j["gemm"]["curve"][1]["size"] = 1e8;
  EXPECT_NE(parse_error(j).find("$.gemm.curve[1].size: expected sizes in increasing order"),
            std::string::npos);
  j = base_;
  j["attention"]["flash_fwd"]["value"] = 1.5;
  EXPECT_NE(parse_error(j).find("$.attention.flash_fwd.value: value 1.5 is outside [0.0001, 1]"),
            std::string::npos);
  j = base_;
  j["host"]["cores_per_socket"]["origin"] = "guess";
  EXPECT_NE(parse_error(j).find("unknown origin 'guess'"), std::string::npos);
  j = base_;
  j["interference"].erase("nccl_compute_slowdown");
  EXPECT_NE(parse_error(j).find("$.interference: missing key 'nccl_compute_slowdown'"),
            std::string::npos);
  j = base_;
  j["gpu"].erase("compute_capability");
  EXPECT_NE(parse_error(j).find("$.gpu: missing key 'compute_capability'"), std::string::npos);
  j = base_;
  j["format_version"] = 99;
  EXPECT_NE(parse_error(j).find("$.format_version: expected 1, got 99"), std::string::npos);
}

// Figures above the peak they are measured against are refused, naming both key paths.
TEST_F(ProfileErrorTest, FiguresAboveTheirPeakAreRejected) {
  json j = base_;
  j["gpu"]["hbm_achievable_bytes_per_s"]["value"] = 2.5e12;  // A100-80GB peak: 2.039e12
  std::string m = parse_error(j);
  EXPECT_NE(m.find("a100.json: $.gpu.hbm_achievable_bytes_per_s.value: value 2.5e+12 is outside "
                   "[0, 2.039e+12] (at most $.gpu.hbm_peak_bytes_per_s"),
            std::string::npos)
      << m;
  j = base_;
  j["nvlink"]["ring_all_reduce_bus_bytes_per_s"]["value"] = 400e9;  // line rate 300e9
  m = parse_error(j);
  EXPECT_NE(m.find("$.nvlink.ring_all_reduce_bus_bytes_per_s.value: value 4e+11 is outside "
                   "[0, 3e+11] (at most $.nvlink.bytes_per_s_per_gpu"),
            std::string::npos)
      << m;
  j = base_;
  j["nvlink"]["nvls_all_reduce_bus_bytes_per_s"]["value"] = 700e9;
  m = parse_error(j);
  EXPECT_NE(m.find("$.nvlink.nvls_all_reduce_bus_bytes_per_s.value: value 7e+11 is outside "
                   "[0, 6e+11] (at most 2 x $.nvlink.bytes_per_s_per_gpu"),
            std::string::npos)
      << m;
  j = base_;
  j["gpu"]["dense_flops_fp32"]["value"] = 1e15;
  EXPECT_NE(parse_error(j).find("$.gpu.dense_flops_fp32.value: value 1e+15 is outside"),
            std::string::npos);
  j = base_;
  j["attention"]["flash_bwd"]["value"] = std::nan("");
  EXPECT_NE(parse_error(j).find("$.attention.flash_bwd.value"), std::string::npos);
}

TEST_F(ProfileErrorTest, BadAttentionCurvesAreRejected) {
  json j = profile_to_json(*builtin_profile("h100-sxm"));
  ASSERT_TRUE(j.contains("attention_by_seq"));
  json bad = j;
  bad["attention_by_seq"]["flash_fwd"][2]["efficiency"]["value"] = 1.2;
  EXPECT_NE(parse_error(bad).find(
                "$.attention_by_seq.flash_fwd[2].efficiency.value: value 1.2 is outside"),
            std::string::npos);
  bad = j;
  bad["attention_by_seq"]["flash_bwd"][0]["size"] = -512;
  EXPECT_NE(parse_error(bad).find("$.attention_by_seq.flash_bwd[0].size: value -512 is outside"),
            std::string::npos);
  bad = j;
  bad["attention_by_seq"].erase("flash_bwd");
  EXPECT_NE(parse_error(bad).find("$.attention_by_seq: missing key 'flash_bwd'"),
            std::string::npos);
  // Optional: a profile without the curves loads and uses the single figures.
  bad = j;
  bad.erase("attention_by_seq");
  auto p = profile_from_json(bad, "h100.json");
  ASSERT_TRUE(p) << p.error().message;
  EXPECT_TRUE(p->attention.flash_fwd_by_seq.empty());
  EXPECT_EQ(p->attention.flash(false, 4096), p->attention.flash_fwd.value);
  // The FlashAttention-2 curves are optional but go together, and are checked like the others.
  ASSERT_TRUE(j["attention_by_seq"].contains("flash2_fwd"));
  bad = j;
  bad["attention_by_seq"].erase("flash2_bwd");
  EXPECT_NE(parse_error(bad).find("$.attention_by_seq: flash2_fwd and flash2_bwd go together"),
            std::string::npos);
  bad = j;
  bad["attention_by_seq"]["flash2_bwd"][1]["size"] = 100;
  EXPECT_NE(parse_error(bad).find("$.attention_by_seq.flash2_bwd[1].size: expected sizes in "
                                  "increasing order"),
            std::string::npos);
  bad = j;
  bad["attention_by_seq"]["flash2_fwd"][0]["efficiency"]["value"] = 0.0;
  EXPECT_NE(parse_error(bad).find("$.attention_by_seq.flash2_fwd[0].efficiency.value"),
            std::string::npos);
  bad = j;
  bad["attention_by_seq"]["flash3_fwd"] = bad["attention_by_seq"]["flash2_fwd"];
  EXPECT_NE(parse_error(bad).find("$.attention_by_seq: unknown key 'flash3_fwd'"),
            std::string::npos);
  bad = j;
  bad["attention_by_seq"].erase("flash2_fwd");
  bad["attention_by_seq"].erase("flash2_bwd");
  p = profile_from_json(bad, "h100.json");
  ASSERT_TRUE(p) << p.error().message;
  EXPECT_TRUE(p->attention.flash2_fwd_by_seq.empty());
  EXPECT_EQ(p->attention.flash2(true, 2048), p->attention.flash(true, 2048));
  // Written and read back unchanged.
  auto back = profile_from_json(j, "h100.json");
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(back->attention, builtin_profile("h100-sxm")->attention);
}

// Attention by shape: the H100 curve is the published cuDNN causal one, rising with sequence
// length; a measured single figure replaces it.
TEST(ProfileTest, FlashAttentionEfficiencyDependsOnSequenceLength) {
  auto p = builtin_profile("h100-sxm");
  ASSERT_TRUE(p);
  const auto& a = p->attention;
  EXPECT_NEAR(a.flash(false, 8192), 529.0 / 989.0, 1e-12);
  EXPECT_NEAR(a.flash(false, 512), 315.0 / 989.0, 1e-12);
  EXPECT_NEAR(a.flash(true, 8192), 518.0 * (529.0 / 600.0) / 989.0, 1e-12);
  EXPECT_LT(a.flash(false, 1024), a.flash(false, 4096));
  EXPECT_LT(a.flash(true, 4096), a.flash(false, 4096));
  // Between knots: linear in log(sequence).
  const double mid = a.flash(false, std::sqrt(4096.0 * 8192.0));
  EXPECT_NEAR(mid, 0.5 * (518.0 + 529.0) / 989.0, 1e-12);
  auto measured = *p;
  measured.attention.flash_fwd = Figure{.value = 0.4, .origin = Origin::kMeasured, .source = "m"};
  EXPECT_EQ(measured.attention.flash(false, 8192), 0.4);
  EXPECT_NE(measured.attention.flash(true, 8192), measured.attention.flash_bwd.value);
}

// The H800 is an H100 SXM with NVLink cut to 400 GB/s: every figure but NVLink's is the H100's;
// NCCL's ring runs at the 160 GB/s the DeepSeek-V3 report gives for H800 NVLink.
TEST(ProfileTest, H800IsAnH100WithItsOwnNvlink) {
  auto h800 = builtin_profile("h800");
  auto h100 = builtin_profile("h100-sxm");
  ASSERT_TRUE(h800 && h100);
  EXPECT_EQ(h800->provenance.profile_name, "h800");
  EXPECT_EQ(h800->gpu, h100->gpu);
  EXPECT_EQ(h800->gemm, h100->gemm);
  EXPECT_EQ(h800->attention, h100->attention);
  EXPECT_EQ(h800->host_link, h100->host_link);
  EXPECT_EQ(h800->inter_node, h100->inter_node);
  EXPECT_EQ(h800->nvlink.bytes_per_s_per_gpu.value, 200e9);
  EXPECT_EQ(h800->nvlink.ring_all_reduce_bus_bytes_per_s.value, 160e9);
  EXPECT_EQ(h800->nvlink.ring_all_reduce_bus_bytes_per_s.origin, Origin::kPublished);
  EXPECT_NEAR(h800->nvlink.nvls_all_reduce_bus_bytes_per_s.value, 477.5e9 * 200.0 / 450.0, 1.0);
  auto s = find_system("hgx-h800");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->gpu, "h800");
  EXPECT_EQ(s->nvlink_domain_gpus, 8);
  EXPECT_EQ(s->host, "xeon-8480c");
}

// FlashAttention-2 on Hopper: the same paper's FA2 bars, well below cuDNN's (Ampere mma
// instructions, no wgmma or TMA); the Hopper GPUs other than H100 SXM take the same fractions.
TEST(ProfileTest, FlashAttention2RunsAtItsOwnPublishedHopperRates) {
  auto p = builtin_profile("h100-sxm");
  ASSERT_TRUE(p);
  const auto& a = p->attention;
  EXPECT_NEAR(a.flash2(false, 2048), 298.0 / 989.0, 1e-12);
  EXPECT_NEAR(a.flash2(false, 16384), 335.0 / 989.0, 1e-12);
  EXPECT_NEAR(a.flash2(true, 2048), 291.0 * (298.0 / 362.0) / 989.0, 1e-12);
  for (double seq : {512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0}) {
    EXPECT_LT(a.flash2(false, seq), a.flash(false, seq)) << seq;
    EXPECT_LT(a.flash2(true, seq), a.flash(true, seq)) << seq;
  }
  EXPECT_EQ(a.flash2_fwd_by_seq.front().efficiency.origin, Origin::kPublished);
  for (const char* gpu : {"h200", "gh200", "h100-pcie"}) {
    auto h = builtin_profile(gpu);
    ASSERT_TRUE(h) << gpu;
    EXPECT_EQ(h->attention.flash2(false, 4096), a.flash2(false, 4096)) << gpu;
    EXPECT_EQ(h->attention.flash2_fwd_by_seq.front().efficiency.origin, Origin::kAssumption);
  }
  // Blackwell: the B200's measured non-causal forward (tritonbench PR #171), causal and backward
  // at H100's FlashAttention-2 ratios, in TFLOP/s that do not grow with the peak.
  auto b200 = builtin_profile("b200");
  auto gb300 = builtin_profile("gb300");
  ASSERT_TRUE(b200 && gb300);
  EXPECT_NEAR(b200->attention.flash2(false, 4096), 353.912 * (319.0 / 368.0) / 2250.0, 1e-12);
  EXPECT_NEAR(b200->attention.flash2(true, 4096),
              353.912 * (310.0 / 368.0) * (319.0 / 368.0) / 2250.0, 1e-12);
  EXPECT_NEAR(gb300->attention.flash2(false, 4096) * gb300->gpu.dense_flops_bf16.value,
              b200->attention.flash2(false, 4096) * b200->gpu.dense_flops_bf16.value, 1e3);
  EXPECT_LT(b200->attention.flash2(false, 4096), 0.5 * b200->attention.flash(false, 4096));
  // No FlashAttention-2 curve elsewhere: flash2 is priced as flash.
  auto a100 = builtin_profile("a100-80gb");
  ASSERT_TRUE(a100);
  EXPECT_TRUE(a100->attention.flash2_fwd_by_seq.empty());
  EXPECT_EQ(a100->attention.flash2(false, 2048), a100->attention.flash(false, 2048));
}

TEST(ProfileFileTest, DefaultProfilePrefersAMeasuredFile) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("offsim_profile_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto measured = *builtin_profile("h100-sxm");
  measured.host_link.h2d_bytes_per_s = {
      .value = 52.5e9, .origin = Origin::kMeasured, .source = "offsim calibrate copy sweep"};
  measured.provenance.measured = {"host_link.h2d_bytes_per_s"};
  ASSERT_TRUE(write_profile_file((dir / "h100-sxm.json").string(), measured).has_value());
  ::setenv("OFFSIM_PROFILE_DIR", dir.string().c_str(), 1);
  auto loaded = default_profile("h100-sxm");
  ASSERT_TRUE(loaded.has_value()) << loaded.error().message;
  EXPECT_EQ(*loaded, measured);

  // A file whose provenance names another GPU is refused rather than silently used.
  measured.provenance.profile_name = "h200";
  ASSERT_TRUE(write_profile_file((dir / "h100-sxm.json").string(), measured).has_value());
  auto wrong = default_profile("h100-sxm");
  ASSERT_FALSE(wrong.has_value());
  EXPECT_NE(wrong.error().message.find("profile_name"), std::string::npos);

  ::unsetenv("OFFSIM_PROFILE_DIR");
  std::filesystem::remove_all(dir);
  EXPECT_FALSE(default_profile("tpu-v5p").has_value());
}

// The shipped calibrate/profiles/*.json must parse, match their file name and, when nothing in
// them was measured, equal the built-in defaults (so the two never drift apart). Set
// OFFSIM_WRITE_PROFILES=1 to regenerate them from the built-ins.
TEST(ProfileFileTest, ShippedProfilesMatchTheBuiltins) {
  const std::filesystem::path dir =
      std::filesystem::path(OFFSIM_SOURCE_DIR) / "calibrate" / "profiles";
  const char* write = std::getenv("OFFSIM_WRITE_PROFILES");
  if (write != nullptr && std::string(write) == "1") {
    std::filesystem::create_directories(dir);
    for (const std::string& kind : known_gpu_kinds()) {
      ASSERT_TRUE(write_profile_file((dir / (kind + ".json")).string(), *builtin_profile(kind)));
    }
  }
  int checked = 0;
  for (const std::string& kind : known_gpu_kinds()) {
    const auto path = dir / (kind + ".json");
    if (!std::filesystem::exists(path)) continue;
    auto p = read_profile_file(path.string());
    ASSERT_TRUE(p.has_value()) << p.error().message;
    EXPECT_EQ(p->provenance.profile_name, kind);
    if (p->provenance.measured.empty()) {
      EXPECT_EQ(*p, *builtin_profile(kind)) << path;
    }
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(known_gpu_kinds().size()));
}

}  // namespace
}  // namespace offsim::sim::platform
