// The replay on the CUDA device (ctest label "gpu"). Every test skips cleanly without a GPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_device.h"
#include "backends/cuda/cudnn_sdpa.h"
#include "backends/cuda/kernels.h"
#include "backends/replay.h"

namespace offsim::backends {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr std::int64_t kMiB = std::int64_t{1} << 20;

// Skips the test unless a GPU can be opened; returns the device otherwise.
#define OFFSIM_REQUIRE_GPU(dev, ranks)                              \
  auto dev##_result = make_cuda_device(0, ranks);                   \
  if (!dev##_result) {                                              \
    ASSERT_EQ(dev##_result.error().code, sim::ErrorCode::kNoDevice) \
        << dev##_result.error().message;                            \
    GTEST_SKIP() << dev##_result.error().message;                   \
  }                                                                 \
  std::unique_ptr<Device> dev = std::move(dev##_result).value()

// rank0: g0 (bf16 GEMM 4096³, allocs act 64 MiB) → d2h copy of act (frees it) → g1 → h2d
// prefetch (allocs act.back) → g2 (frees act.back); plus attention and an elementwise pass.
sim::Plan gpu_plan() {
  sim::PlanBuilder b;
  sim::LaneId compute = b.lane("rank0.compute", {.rank = 0, .role = sim::LaneRole::kCompute});
  sim::LaneId d2h = b.lane("rank0.d2h", {.rank = 0, .role = sim::LaneRole::kD2H});
  sim::LaneId h2d = b.lane("rank0.h2d", {.rank = 0, .role = sim::LaneRole::kH2D});
  sim::PoolId hbm = b.pool("rank0.hbm", std::int64_t{140} << 30, sim::PoolKind::kHbm, 0);
  sim::PoolId pinned = b.pool("host0.pinned", std::int64_t{1} << 40, sim::PoolKind::kPinnedHost, 0);
  sim::TensorId w = b.tensor("weights", hbm, 256 * kMiB, sim::TensorCategory::kParams);
  sim::TensorId act = b.tensor("act", hbm, 64 * kMiB, sim::TensorCategory::kActivations);
  sim::TensorId act_host =
      b.tensor("act.host", pinned, 64 * kMiB, sim::TensorCategory::kActivations);
  sim::TensorId act_back = b.tensor("act.back", hbm, 64 * kMiB, sim::TensorCategory::kActivations);
  b.initial(w);
  auto gemm = [&](const char* name) {
    sim::Op op{.name = name, .lane = compute, .kind = sim::OpKind::kGemm};
    op.sizes.gemm = {.m = 4096, .n = 4096, .k = 4096, .dtype = sim::DType::kBf16};
    return op;
  };
  sim::Op g0 = gemm("g0");
  g0.allocs = {act};
  sim::OpId g0_id = b.op(g0);
  sim::Op off{.name = "offload", .lane = d2h, .kind = sim::OpKind::kCopy};
  off.sizes.bytes = 64 * kMiB;
  off.sizes.copy_direction = sim::CopyDirection::kD2H;
  off.deps = {g0_id};
  off.allocs = {act_host};
  off.frees = {act};
  sim::OpId off_id = b.op(off);
  sim::Op attn{.name = "attn", .lane = compute, .kind = sim::OpKind::kAttention};
  attn.sizes.attention = {.batch = 1,
                          .heads = 32,
                          .kv_heads = 8,
                          .seq_q = 2048,
                          .seq_kv = 2048,
                          .head_dim = 128,
                          .causal = true};
  b.op(attn);
  sim::Op ew{.name = "ew", .lane = compute, .kind = sim::OpKind::kElementwise};
  ew.sizes.bytes = 256 * kMiB;
  sim::OpId ew_id = b.op(ew);
  sim::Op pre{.name = "prefetch", .lane = h2d, .kind = sim::OpKind::kCopy};
  pre.sizes.bytes = 64 * kMiB;
  pre.sizes.copy_direction = sim::CopyDirection::kH2D;
  pre.deps = {off_id, ew_id};
  pre.allocs = {act_back};
  sim::OpId pre_id = b.op(pre);
  sim::Op g2 = gemm("g2");
  g2.deps = {pre_id};
  g2.frees = {act_back};
  b.op(g2);
  return std::move(b).build();
}

TEST(CudaReplayTest, ListsGpusOrNothing) {
  std::vector<DeviceInfo> gpus = list_cuda_devices();
  for (const DeviceInfo& d : gpus) {
    EXPECT_EQ(d.kind, DeviceKind::kCuda);
    EXPECT_FALSE(d.name.empty());
    EXPECT_GT(d.memory_bytes, 0);
  }
}

TEST(CudaReplayTest, NoGpuIsReportedNotCrashed) {
  auto dev = make_cuda_device(0, 1);
  if (dev) GTEST_SKIP() << "a GPU is present";
  EXPECT_EQ(dev.error().code, sim::ErrorCode::kNoDevice);
  EXPECT_THAT(dev.error().message, HasSubstr("no GPU"));
}

TEST(CudaReplayTest, EventsTimeAGemm) {
  OFFSIM_REQUIRE_GPU(dev, 1);
  StreamId s = *dev->create_stream(0, "rank0.compute");
  EventId a = *dev->create_event(0), b = *dev->create_event(0);
  const std::int64_t bytes = 4096 * 4096 * 2;
  Buffer x = *dev->scratch(0, MemoryKind::kDevice, bytes);
  Buffer y = *dev->scratch(0, MemoryKind::kDevice, bytes);
  Buffer z = *dev->scratch(0, MemoryKind::kDevice, bytes);
  const sim::GemmShape g{.m = 4096, .n = 4096, .k = 4096, .dtype = sim::DType::kBf16};
  ASSERT_TRUE(dev->gemm(s, g, x, y, z));  // warm-up: algorithm choice
  ASSERT_TRUE(dev->record(s, a));
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(dev->gemm(s, g, x, y, z));
  ASSERT_TRUE(dev->record(s, b));
  sim::Status st = dev->synchronize(60s);
  ASSERT_TRUE(st) << st.error().message;
  sim::Duration d = *dev->elapsed(a, b);
  // 10 × 2·4096³ = 1.37e12 FLOP; any GPU this runs on does that in 10 µs .. 10 s.
  EXPECT_GT(d.count(), 10'000);
  EXPECT_LT(d.count(), 10'000'000'000);
}

TEST(CudaReplayTest, ReplayKeepsOrderAndMeasuresThePool) {
  OFFSIM_REQUIRE_GPU(probe, 1);
  probe.reset();
  sim::Plan plan = gpu_plan();
  ReplayOptions o;
  o.device = DeviceKind::kCuda;
  o.warmup_steps = 1;
  o.measured_steps = 3;
  sim::Result<ReplayResult> r = replay(plan, o);
  ASSERT_TRUE(r) << r.error().message;
  const sim::Timeline& t = r->timeline;
  ASSERT_EQ(t.spans.size(), plan.ops.size());
  std::vector<sim::Span> by_op(plan.ops.size());
  for (const sim::Span& s : t.spans) by_op[s.op.index()] = s;
  for (std::size_t i = 0; i < plan.ops.size(); ++i) {
    EXPECT_LE(by_op[i].start, by_op[i].end);
    for (sim::OpId dep : plan.ops[i].deps) EXPECT_GE(by_op[i].start, by_op[dep.index()].end);
  }
  ASSERT_EQ(r->pools.size(), 1u);
  // Planned peak: weights 256 MiB + act 64 MiB (act.back comes after act is freed) = 320 MiB;
  // the allocator's high-water is at least that.
  EXPECT_EQ(r->pools[0].planned_peak_bytes, 320 * kMiB);
  EXPECT_GE(r->pools[0].used_high_bytes, 320 * kMiB);
  EXPECT_LT(r->pools[0].used_high_bytes, 400 * kMiB);
}

TEST(CudaReplayTest, AllocationFailureNamesRequestInUseAndOp) {
  OFFSIM_REQUIRE_GPU(probe, 1);
  const std::int64_t too_much = probe->info().memory_bytes * 2;
  probe.reset();
  sim::PlanBuilder b;
  sim::LaneId compute = b.lane("rank0.compute", {.rank = 0, .role = sim::LaneRole::kCompute});
  sim::PoolId hbm = b.pool("rank0.hbm", too_much * 2, sim::PoolKind::kHbm, 0);
  sim::TensorId big = b.tensor("huge", hbm, too_much, sim::TensorCategory::kActivations);
  sim::Op op{.name = "fwd.huge", .lane = compute, .kind = sim::OpKind::kMarker};
  op.allocs = {big};
  op.frees = {big};
  b.op(op);
  ReplayOptions o;
  o.device = DeviceKind::kCuda;
  sim::Result<ReplayResult> r = replay(std::move(b).build(), o);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, sim::ErrorCode::kLimitExceeded) << r.error().message;
  EXPECT_THAT(r.error().message, HasSubstr("op 'fwd.huge' requested"));
  EXPECT_THAT(r.error().message, HasSubstr("bytes in use"));
}

// gpu-check's first stage: attention throughput of the kernel the replay runs (the fallback is
// expected at a few percent of the dense peak, a fused flash kernel at 40-70 %), and what the
// pool's high-water marks count: requested bytes (used) against the allocator's granularity
// (reserved). Printed for the log; the checks only bound the figures.
TEST(CudaReplayTest, FirstLookAttentionThroughputAndPoolMarks) {
  OFFSIM_REQUIRE_GPU(dev, 1);
  StreamId s = *dev->create_stream(0, "rank0.compute");
  EventId a = *dev->create_event(0), b = *dev->create_event(0);
  const sim::AttentionShape shape{.batch = 1,
                                  .heads = 32,
                                  .kv_heads = 8,
                                  .seq_q = 4096,
                                  .seq_kv = 4096,
                                  .head_dim = 128,
                                  .causal = true};
  const std::int64_t q = shape.heads * shape.seq_q * shape.head_dim * 2;
  const std::int64_t kv = 2 * shape.kv_heads * shape.seq_kv * shape.head_dim * 2;
  Buffer qkv = *dev->scratch(0, MemoryKind::kDevice, q + kv);
  Buffer out = *dev->scratch(0, MemoryKind::kDevice, q);
  ASSERT_TRUE(dev->attention(s, shape, qkv, out));  // warm-up
  ASSERT_TRUE(dev->record(s, a));
  ASSERT_TRUE(dev->attention(s, shape, qkv, out));
  ASSERT_TRUE(dev->record(s, b));
  sim::Status st = dev->synchronize(60s);
  ASSERT_TRUE(st) << st.error().message;
  const double seconds = sim::to_seconds(*dev->elapsed(a, b));
  // QK^T and PV: 4·heads·seq²·head_dim FLOPs, halved by the causal mask.
  const double flops = 4.0 * 32 * 4096.0 * 4096.0 * 128 / 2;
  std::printf(
      "first look: attention fwd 32/8 heads, 4096 tokens, head_dim 128 (%s): %.3f ms, "
      "%.1f TFLOP/s\n",
      dev->info().note.c_str(), seconds * 1e3, flops / seconds / 1e12);
  EXPECT_GT(seconds, 0.0);

  // Pool marks: 3 allocations of 64 MiB + 1 byte each.
  ASSERT_TRUE(dev->reset_pool_high_water(0));
  const std::int64_t each = 64 * kMiB + 1;
  for (std::uint64_t key = 1; key <= 3; ++key) ASSERT_TRUE(dev->allocate(s, key, each, "look"));
  st = dev->synchronize(60s);
  ASSERT_TRUE(st) << st.error().message;
  PoolUsage u = *dev->pool_usage(0);
  std::printf(
      "first look: pool after 3 x %lld B: in use %lld, used high %lld, reserved high "
      "%lld B\n",
      static_cast<long long>(each), static_cast<long long>(u.in_use_bytes),
      static_cast<long long>(u.used_high_bytes), static_cast<long long>(u.reserved_high_bytes));
  EXPECT_GE(u.used_high_bytes, 3 * each);
  EXPECT_GE(u.reserved_high_bytes, u.used_high_bytes);
  for (std::uint64_t key = 1; key <= 3; ++key) ASSERT_TRUE(dev->release(s, key));
  st = dev->synchronize(60s);
  ASSERT_TRUE(st) << st.error().message;
}

// The cuDNN SDPA graph (cudnn_sdpa.h) computes what the fallback kernel computes: causal
// attention with scale 1/sqrt(head_dim), GQA 4/2 heads. Passing this on a GPU is what allows the
// replay to switch to it.
TEST(CudaReplayTest, CudnnSdpaMatchesTheFallbackKernel) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    cudaGetLastError();
    GTEST_SKIP() << "no GPU";
  }
  auto dnn = cuda::cudnn_api();
  if (!dnn) GTEST_SKIP() << dnn.error().message;
  const cuda::CudnnApi& api = **dnn;
  cudnnHandle_t handle = nullptr;
  ASSERT_TRUE(api.check(api.Create(&handle), "cudnnCreate"));
  const cuda::SdpaShape shape{
      .batch = 1, .q_heads = 4, .kv_heads = 2, .seq_q = 256, .seq_kv = 256, .head_dim = 64};
  // The graph the replay runs: with the softmax statistics a backward needs.
  auto sdpa = cuda::CudnnSdpaForward::build(api, handle, shape, /*with_stats=*/true);
  ASSERT_TRUE(sdpa) << sdpa.error().message;
  {
    // Without statistics (an inference graph): logged, not required; the replay never builds it.
    auto plain = cuda::CudnnSdpaForward::build(api, handle, shape);
    std::printf("first look: cuDNN SDPA forward without statistics: %s\n",
                plain ? "built" : plain.error().message.c_str());
  }
  const std::int64_t q_elems = shape.q_heads * shape.seq_q * shape.head_dim;
  const std::int64_t kv_elems = shape.kv_heads * shape.seq_kv * shape.head_dim;
  const std::int64_t qkv_bytes = (q_elems + 2 * kv_elems) * 2;
  void *raw = nullptr, *ref = nullptr, *got = nullptr, *ws = nullptr, *stats = nullptr;
  ASSERT_EQ(cudaMalloc(&raw, qkv_bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&stats, 4 * shape.q_heads * shape.seq_q), cudaSuccess);
  char* qkv = static_cast<char*>(raw);
  ASSERT_EQ(cudaMalloc(&ref, q_elems * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&got, q_elems * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&ws, std::max<std::int64_t>((*sdpa)->workspace_bytes(), 256)), cudaSuccess);
  ASSERT_EQ(cuda::launch_fill(qkv, qkv_bytes, 11, nullptr), cudaSuccess);
  const cuda::AttentionLaunch l{shape.q_heads,  shape.q_heads / shape.kv_heads,
                                shape.seq_q,    shape.seq_kv,
                                shape.head_dim, true};
  ASSERT_EQ(cuda::launch_attention(qkv, ref, l, nullptr), cudaSuccess);
  ASSERT_TRUE(api.check(api.SetStream(handle, nullptr), "cudnnSetStream"));
  const sim::Status ran =
      (*sdpa)->run(handle, qkv, qkv + q_elems * 2, qkv + (q_elems + kv_elems) * 2, got, ws, stats);
  ASSERT_TRUE(ran) << ran.error().message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<std::uint16_t> a(static_cast<std::size_t>(q_elems)), b(a.size());
  ASSERT_EQ(cudaMemcpy(a.data(), ref, q_elems * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(b.data(), got, q_elems * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  auto to_float = [](std::uint16_t h) {
    const std::uint32_t bits = std::uint32_t{h} << 16;
    float f = 0.0f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  };
  double max_ref = 0.0, max_diff = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    max_ref = std::max(max_ref, std::abs(static_cast<double>(to_float(a[i]))));
    max_diff = std::max(max_diff, std::abs(static_cast<double>(to_float(a[i]) - to_float(b[i]))));
  }
  EXPECT_GT(max_ref, 0.0);
  EXPECT_LT(max_diff, 0.02 * max_ref) << "max |cudnn - fallback| " << max_diff << " of " << max_ref;
  cudaFree(ws);
  cudaFree(got);
  cudaFree(ref);
  cudaFree(raw);
  cudaFree(stats);

  // Throughput at the first-look shape (32/8 heads, 4096 tokens, head_dim 128), for the log.
  const cuda::SdpaShape big{
      .batch = 1, .q_heads = 32, .kv_heads = 8, .seq_q = 4096, .seq_kv = 4096, .head_dim = 128};
  auto fast = cuda::CudnnSdpaForward::build(api, handle, big, /*with_stats=*/true);
  ASSERT_TRUE(fast) << fast.error().message;
  const std::int64_t bq = big.q_heads * big.seq_q * big.head_dim * 2;
  const std::int64_t bkv = big.kv_heads * big.seq_kv * big.head_dim * 2;
  ASSERT_EQ(cudaMalloc(&raw, bq + 2 * bkv), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&stats, 4 * big.q_heads * big.seq_q), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&got, bq), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&ws, std::max<std::int64_t>((*fast)->workspace_bytes(), 256)), cudaSuccess);
  ASSERT_EQ(cuda::launch_fill(raw, bq + 2 * bkv, 12, nullptr), cudaSuccess);
  char* p = static_cast<char*>(raw);
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  ASSERT_EQ(cudaEventCreate(&e0), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&e1), cudaSuccess);
  ASSERT_TRUE((*fast)->run(handle, p, p + bq, p + bq + bkv, got, ws, stats));  // warm-up
  ASSERT_EQ(cudaEventRecord(e0, nullptr), cudaSuccess);
  ASSERT_TRUE((*fast)->run(handle, p, p + bq, p + bq + bkv, got, ws, stats));
  ASSERT_EQ(cudaEventRecord(e1, nullptr), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(e1), cudaSuccess);
  float ms = 0.0f;
  ASSERT_EQ(cudaEventElapsedTime(&ms, e0, e1), cudaSuccess);
  const double flops = 4.0 * 32 * 4096.0 * 4096.0 * 128 / 2;
  std::printf(
      "first look: cuDNN SDPA fwd 32/8 heads, 4096 tokens, head_dim 128: %.3f ms, "
      "%.1f TFLOP/s\n",
      ms, flops / (ms * 1e-3) / 1e12);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(ws);
  cudaFree(got);
  cudaFree(raw);
  cudaFree(stats);
  api.Destroy(handle);
}

// The cuDNN SDPA backward graph against a host reference: causal attention, 2 heads, 64 tokens,
// head_dim 64. The forward writes O and the statistics; the backward's dV = Pᵀ·dO and
// dQ = scale·(P∘(dO·Vᵀ − rowsum(dO∘O)))·K are recomputed on the host from the same bf16 data.
TEST(CudaReplayTest, CudnnSdpaBackwardMatchesAHostReference) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    cudaGetLastError();
    GTEST_SKIP() << "no GPU";
  }
  auto dnn = cuda::cudnn_api();
  if (!dnn) GTEST_SKIP() << dnn.error().message;
  const cuda::CudnnApi& api = **dnn;
  cudnnHandle_t handle = nullptr;
  ASSERT_TRUE(api.check(api.Create(&handle), "cudnnCreate"));
  const cuda::SdpaShape shape{
      .batch = 1, .q_heads = 2, .kv_heads = 2, .seq_q = 64, .seq_kv = 64, .head_dim = 64};
  auto fwd = cuda::CudnnSdpaForward::build(api, handle, shape, /*with_stats=*/true);
  ASSERT_TRUE(fwd) << fwd.error().message;
  auto bwd = cuda::CudnnSdpaBackward::build(api, handle, shape);
  ASSERT_TRUE(bwd) << bwd.error().message;
  const std::int64_t h = 2, n = 64, d = 64, elems = h * n * d, bytes = elems * 2;
  // [Q][K][V][O][dO][dQ][dK][dV], bf16; stats fp32.
  void* raw = nullptr;
  void* stats = nullptr;
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&raw, 8 * bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&stats, h * n * 4), cudaSuccess);
  const std::int64_t ws_bytes =
      std::max({(*fwd)->workspace_bytes(), (*bwd)->workspace_bytes(), std::int64_t{256}});
  ASSERT_EQ(cudaMalloc(&ws, ws_bytes), cudaSuccess);
  char* p = static_cast<char*>(raw);
  char *q = p, *k = p + bytes, *v = p + 2 * bytes, *o = p + 3 * bytes, *d_o = p + 4 * bytes;
  char *dq = p + 5 * bytes, *dk = p + 6 * bytes, *dv = p + 7 * bytes;
  ASSERT_EQ(cuda::launch_fill(p, 5 * bytes, 23, nullptr), cudaSuccess);
  ASSERT_TRUE(api.check(api.SetStream(handle, nullptr), "cudnnSetStream"));
  sim::Status ran = (*fwd)->run(handle, q, k, v, o, ws, stats);
  ASSERT_TRUE(ran) << ran.error().message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<std::uint16_t> host(static_cast<std::size_t>(8 * elems));
  ASSERT_EQ(cudaMemcpy(host.data(), raw, 5 * bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  auto at = [&](int tensor, std::int64_t i) {
    const std::uint32_t bits = std::uint32_t{host[static_cast<std::size_t>(tensor * elems + i)]}
                               << 16;
    float f = 0.0f;
    std::memcpy(&f, &bits, sizeof f);
    return static_cast<double>(f);
  };
  // Host reference of dQ, dK, dV from the same bf16 Q, K, V, dO.
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> ref_dq(static_cast<std::size_t>(elems), 0.0), ref_dk(ref_dq.size(), 0.0),
      ref_dv(ref_dq.size(), 0.0);
  std::vector<double> ref_row(static_cast<std::size_t>(h * n), 0.0);  // rowsum(dO ∘ O)
  for (std::int64_t head = 0; head < h; ++head) {
    const std::int64_t base = head * n * d;
    std::vector<double> prob(static_cast<std::size_t>(n * n), 0.0), dp(prob.size(), 0.0);
    for (std::int64_t i = 0; i < n; ++i) {
      double mx = -1e300, sum = 0.0;
      for (std::int64_t j = 0; j <= i; ++j) {
        double dot = 0.0;
        for (std::int64_t c = 0; c < d; ++c)
          dot += at(0, base + i * d + c) * at(1, base + j * d + c);
        prob[static_cast<std::size_t>(i * n + j)] = dot * scale;
        mx = std::max(mx, dot * scale);
      }
      for (std::int64_t j = 0; j <= i; ++j) {
        double& x = prob[static_cast<std::size_t>(i * n + j)];
        x = std::exp(x - mx);
        sum += x;
      }
      double row = 0.0;  // rowsum(dO ∘ O) with the reference O
      std::vector<double> out(static_cast<std::size_t>(d), 0.0);
      for (std::int64_t j = 0; j <= i; ++j) {
        prob[static_cast<std::size_t>(i * n + j)] /= sum;
        for (std::int64_t c = 0; c < d; ++c)
          out[static_cast<std::size_t>(c)] +=
              prob[static_cast<std::size_t>(i * n + j)] * at(2, base + j * d + c);
      }
      for (std::int64_t c = 0; c < d; ++c)
        row += at(4, base + i * d + c) * out[static_cast<std::size_t>(c)];
      ref_row[static_cast<std::size_t>(head * n + i)] = row;
      for (std::int64_t j = 0; j <= i; ++j) {
        double g = 0.0;
        for (std::int64_t c = 0; c < d; ++c) g += at(4, base + i * d + c) * at(2, base + j * d + c);
        const double pij = prob[static_cast<std::size_t>(i * n + j)];
        dp[static_cast<std::size_t>(i * n + j)] = scale * pij * (g - row);
      }
    }
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t j = 0; j <= i; ++j) {
        const double pij = prob[static_cast<std::size_t>(i * n + j)];
        const double dsij = dp[static_cast<std::size_t>(i * n + j)];
        for (std::int64_t c = 0; c < d; ++c) {
          ref_dv[static_cast<std::size_t>(base + j * d + c)] += pij * at(4, base + i * d + c);
          ref_dk[static_cast<std::size_t>(base + j * d + c)] += dsij * at(0, base + i * d + c);
          ref_dq[static_cast<std::size_t>(base + i * d + c)] += dsij * at(1, base + j * d + c);
        }
      }
    }
  }
  // Largest |reference| and largest |cuDNN − reference| of tensor 5 (dQ), 6 (dK) or 7 (dV).
  struct Err {
    double max = 0.0, err = 0.0;
  };
  auto compare = [&](int tensor, const std::vector<double>& ref) {
    Err e;
    for (std::int64_t i = 0; i < elems; ++i) {
      e.max = std::max(e.max, std::abs(ref[static_cast<std::size_t>(i)]));
      e.err = std::max(e.err, std::abs(ref[static_cast<std::size_t>(i)] - at(tensor, i)));
    }
    return e;
  };
  ASSERT_EQ(cudaMemset(dq, 0, 3 * bytes), cudaSuccess);
  ran = (*bwd)->run(handle, nullptr, {q, k, v, o, d_o, stats, dq, dk, dv}, ws);
  ASSERT_TRUE(ran) << ran.error().message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(host.data() + 5 * elems, dq, 3 * bytes, cudaMemcpyDeviceToHost),
            cudaSuccess);
  // rowsum(dO ∘ O) as the graph wrote it into its workspace: a graph the fused engine accepts
  // without computing it gives dQ and dK without that term (see cudnn_sdpa.cc).
  std::vector<float> sums(static_cast<std::size_t>(h * n), 0.0f);
  ASSERT_EQ(cudaMemcpy(sums.data(), static_cast<char*>(ws) + (*bwd)->softmax_sum_offset(),
                       sums.size() * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  Err er;
  for (std::size_t i = 0; i < sums.size(); ++i) {
    er.max = std::max(er.max, std::abs(ref_row[i]));
    er.err = std::max(er.err, std::abs(ref_row[i] - static_cast<double>(sums[i])));
  }
  const Err eq = compare(5, ref_dq), ek = compare(6, ref_dk), ev = compare(7, ref_dv);
  std::printf(
      "first look: cuDNN SDPA backward: max error rowsum(dO*O) %.3g of %.3g, dQ %.3g of %.3g, dK "
      "%.3g of %.3g, dV %.3g of %.3g\n",
      er.err, er.max, eq.err, eq.max, ek.err, ek.max, ev.err, ev.max);
  EXPECT_LT(er.err, 0.01 * er.max)
      << "rowsum(dO*O): max |cudnn - host| " << er.err << " of " << er.max;
  EXPECT_GT(ev.max, 0.0);
  EXPECT_LT(ev.err, 0.03 * ev.max) << "dV: max |cudnn - host| " << ev.err << " of " << ev.max;
  EXPECT_LT(eq.err, 0.05 * eq.max) << "dQ: max |cudnn - host| " << eq.err << " of " << eq.max;
  EXPECT_LT(ek.err, 0.05 * ek.max) << "dK: max |cudnn - host| " << ek.err << " of " << ek.max;
  cudaFree(ws);
  cudaFree(stats);
  cudaFree(raw);
  api.Destroy(handle);
}

}  // namespace
}  // namespace offsim::backends
