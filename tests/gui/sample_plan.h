// A small hand-built offload step for the GUI tests: two ranks that prefetch each layer's
// weights over PCIe (h2d), run the layer's GEMM, and offload its activation (d2h), with a CPU
// optimizer step at the end. Both ranks' copies share one host DRAM resource.
//
//   sim::Plan plan = gui::testing::sample_offload_plan({.layers = 8});
//   auto result = sim::simulate(plan);   // 7 lanes, 2 * 3 * layers + 1 spans
//
// `prefetch_depth` k > 0 lets layer l's weights start copying only once layer l - k's GEMM has
// ended (at most k layers of weights in flight): less HBM, more exposed copy time.
#pragma once

#include <fmt/format.h>

#include "sim/plan/plan.h"

namespace offsim::gui::testing {

struct SamplePlanOptions {
  int layers = 8;
  int prefetch_depth = 0;          // 0: unlimited
  double pcie_bytes_per_s = 25e9;  // per direction, per GPU
  std::int64_t hbm_capacity_bytes = 4'000'000'000;
};

inline sim::Plan sample_offload_plan(const SamplePlanOptions& options) {
  const int layers = options.layers;
  using sim::OpKind;
  sim::PlanBuilder b;
  const sim::ResourceId dram = b.resource("socket0.dram", 60e9);  // bytes/s, shared by both ranks
  const sim::ResourceId cpu = b.resource("host0.cpu", 2e12);      // FLOP/s
  const sim::PoolId pinned = b.pool("host0.pinned", 512'000'000'000);
  std::vector<sim::OpId> last_offloads;
  for (int r = 0; r < 2; ++r) {
    const sim::LaneId compute = b.lane(fmt::format("rank{}.compute", r));
    const sim::LaneId h2d = b.lane(fmt::format("rank{}.h2d", r));
    const sim::LaneId d2h = b.lane(fmt::format("rank{}.d2h", r));
    const sim::ResourceId sm = b.resource(fmt::format("rank{}.sm", r), 400e12);
    const sim::ResourceId up =
        b.resource(fmt::format("rank{}.pcie.h2d", r), options.pcie_bytes_per_s);
    const sim::ResourceId down =
        b.resource(fmt::format("rank{}.pcie.d2h", r), options.pcie_bytes_per_s);
    const sim::PoolId hbm = b.pool(fmt::format("rank{}.hbm", r), options.hbm_capacity_bytes);
    std::vector<sim::OpId> gemms;
    b.initial(b.tensor(fmt::format("rank{}.resident", r), hbm, 1'000'000'000,
                       sim::TensorCategory::kParams));
    sim::OpId offload;
    for (int l = 0; l < layers; ++l) {
      // Weights: 40 MB at 25 GB/s = 1.6 ms alone; activations 40 MB (1.6 ms alone).
      const std::int64_t weight_bytes = 40'000'000;
      const std::int64_t act_bytes = 40'000'000;
      const double flops = 2.0 * 4096 * 4096 * 16384;  // 5.5e11 FLOP = 1.37 ms at 400 TFLOP/s
      const sim::TensorId w =
          b.tensor(fmt::format("r{}.l{}.w", r, l), hbm, weight_bytes, sim::TensorCategory::kParams);
      const sim::TensorId a = b.tensor(fmt::format("r{}.l{}.act", r, l), hbm, act_bytes,
                                       sim::TensorCategory::kActivations);
      const sim::TensorId ah = b.tensor(fmt::format("r{}.l{}.act_host", r, l), pinned, act_bytes,
                                        sim::TensorCategory::kActivations);
      sim::Op copy_in{.name = fmt::format("r{}.l{}.prefetch_w", r, l),
                      .lane = h2d,
                      .kind = OpKind::kCopy,
                      .category = sim::OpCategory::kOffload,
                      .layer = l};
      copy_in.sizes.bytes = weight_bytes;
      copy_in.sizes.copy_direction = sim::CopyDirection::kH2D;
      copy_in.cost = {.work = double(weight_bytes), .uses = {{up, 1.0}, {dram, 1.0}}};
      copy_in.allocs = {w};
      if (options.prefetch_depth > 0 && l >= options.prefetch_depth) {
        copy_in.deps = {gemms[static_cast<std::size_t>(l - options.prefetch_depth)]};
      }
      const sim::OpId in = b.op(copy_in);
      sim::Op gemm{.name = fmt::format("r{}.l{}.fwd_gemm", r, l),
                   .lane = compute,
                   .kind = OpKind::kGemm,
                   .category = sim::OpCategory::kCompute,
                   .layer = l};
      gemm.sizes.flops = flops;
      gemm.sizes.gemm = {.m = 4096, .n = 4096, .k = 16384};
      gemm.cost = {.work = flops, .uses = {{sm, 1.0}}};
      gemm.deps = {in};
      gemm.allocs = {a};
      gemm.frees = {w};
      const sim::OpId g = b.op(gemm);
      gemms.push_back(g);
      sim::Op copy_out{.name = fmt::format("r{}.l{}.offload_act", r, l),
                       .lane = d2h,
                       .kind = OpKind::kCopy,
                       .category = sim::OpCategory::kOffload,
                       .layer = l};
      copy_out.sizes.bytes = act_bytes;
      copy_out.sizes.copy_direction = sim::CopyDirection::kD2H;
      copy_out.cost = {.work = double(act_bytes), .uses = {{down, 1.0}, {dram, 1.0}}};
      copy_out.deps = {g};
      copy_out.allocs = {ah};
      copy_out.frees = {a};
      offload = b.op(copy_out);
    }
    last_offloads.push_back(offload);
  }
  sim::Op adam{.name = "cpu_adam",
               .lane = b.lane("host0.cpu"),
               .kind = OpKind::kHostCompute,
               .category = sim::OpCategory::kOptimizer};
  adam.sizes.flops = 4e9;  // 2 ms at 2 TFLOP/s
  adam.cost = {.work = 4e9, .uses = {{cpu, 1.0}}};
  adam.deps = last_offloads;
  b.op(adam);
  return std::move(b).build();
}

}  // namespace offsim::gui::testing
