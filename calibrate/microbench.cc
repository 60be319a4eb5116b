#include "calibrate/microbench.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "backends/gpu_plugin.h"
#include "calibrate/timing.h"

namespace offsim::calibrate {

using backends::MemoryKind;

namespace {

// NVML's clocks, power and temperature of `gpu`, or why there is no reading.
std::string nvml_reading(int gpu) {
  auto entry = backends::gpu_plugin_symbol("offsim_gpu_nvml_reading_v1");
  if (!entry) return "no NVML entry point in the GPU module";
  char text[512] = {};
  reinterpret_cast<int (*)(int, char*, int)> (*entry)(gpu, text, static_cast<int>(sizeof text));
  return text;
}

constexpr std::chrono::milliseconds kWatchdog{60000};

std::int64_t gemm_bytes(const sim::GemmShape& g) {
  const std::int64_t e = sim::dtype_bytes(g.dtype) * std::max<std::int64_t>(g.batch, 1);
  const std::int64_t out = (g.dtype == sim::DType::kFp8 ? 2 : sim::dtype_bytes(g.dtype)) *
                           std::max<std::int64_t>(g.batch, 1);
  return std::max({g.m * g.k * e, g.k * g.n * e, g.m * g.n * out});
}

}  // namespace

sim::Result<MicroBench> MicroBench::open(int first_gpu, int gpus) {
  MicroBench b;
  OFFSIM_ASSIGN_OR_RETURN(const backends::GpuPlugin* gpu, backends::load_gpu_plugin());
  OFFSIM_ASSIGN_OR_RETURN(b.device_, gpu->make_cuda_device(first_gpu, gpus));
  b.gpus_ = gpus;
  b.context_bytes_ = std::max<std::int64_t>(gpu->memory_in_use_bytes(first_gpu), 0);
  for (int r = 0; r < gpus; ++r) {
    for (auto* lanes : {&b.compute_, &b.copy_in_, &b.copy_out_}) {
      Lane lane;
      OFFSIM_ASSIGN_OR_RETURN(lane.stream, b.device_->create_stream(r, fmt::format("bench{}", r)));
      OFFSIM_ASSIGN_OR_RETURN(lane.start, b.device_->create_event(r));
      OFFSIM_ASSIGN_OR_RETURN(lane.end, b.device_->create_event(r));
      lanes->push_back(lane);
    }
  }
  b.device_scratch_.resize(static_cast<std::size_t>(gpus));
  b.pinned_scratch_.resize(static_cast<std::size_t>(gpus));
  b.pageable_scratch_.resize(static_cast<std::size_t>(gpus));
  return b;
}

sim::Status MicroBench::sync() { return device_->synchronize(kWatchdog); }

sim::Result<double> MicroBench::elapsed_s(const Lane& lane) {
  OFFSIM_ASSIGN_OR_RETURN(sim::Duration d, device_->elapsed(lane.start, lane.end));
  return sim::to_seconds(d);
}

namespace {

// Three buffers of at least `bytes` each in `s`, replaced by larger ones when needed.
template <class Scratch>
sim::Status ensure(backends::Device& dev, Scratch& s, int rank, MemoryKind kind,
                   std::int64_t bytes) {
  if (s.bytes >= bytes) return sim::ok();
  OFFSIM_ASSIGN_OR_RETURN(s.a, dev.scratch(rank, kind, bytes));
  OFFSIM_ASSIGN_OR_RETURN(s.b, dev.scratch(rank, kind, bytes));
  OFFSIM_ASSIGN_OR_RETURN(s.c, dev.scratch(rank, kind, bytes));
  s.bytes = bytes;
  return sim::ok();
}

}  // namespace

sim::Result<double> MicroBench::gemm(const sim::GemmShape& shape, int reps, double heat_s) {
  // Larger than any GPU's L2 (H100/H200: 50 MB, B200: 126 MB; vendor datasheets).
  constexpr std::int64_t kL2FlushBytes = std::int64_t{256} << 20;
  OFFSIM_RETURN_IF_ERROR(
      ensure(*device_, device_scratch_[0], 0, MemoryKind::kDevice, gemm_bytes(shape)));
  OFFSIM_RETURN_IF_ERROR(ensure(*device_, l2_flush_, 0, MemoryKind::kDevice, kL2FlushBytes));
  const Lane& l = compute_[0];
  const Scratch& s = device_scratch_[0];
  if (heat_s > 0.0) {
    // One run sizes the heat: heat_s of back-to-back runs, at most 20,000 (tiny GEMMs draw
    // little power anyway).
    OFFSIM_RETURN_IF_ERROR(device_->record(l.stream, l.start));
    OFFSIM_RETURN_IF_ERROR(device_->gemm(l.stream, shape, s.a, s.b, s.c));
    OFFSIM_RETURN_IF_ERROR(device_->record(l.stream, l.end));
    OFFSIM_RETURN_IF_ERROR(sync());
    OFFSIM_ASSIGN_OR_RETURN(const double one, elapsed_s(l));
    const int runs = static_cast<int>(std::clamp(heat_s / std::max(one, 1e-7), 1.0, 20000.0));
    for (int i = 0; i < runs; ++i)
      OFFSIM_RETURN_IF_ERROR(device_->gemm(l.stream, shape, s.a, s.b, s.c));
  }
  double total = 0.0;
  for (int i = 0; i < reps; ++i) {
    OFFSIM_RETURN_IF_ERROR(
        device_->elementwise(l.stream, 2 * kL2FlushBytes, l2_flush_.a, l2_flush_.b));
    OFFSIM_RETURN_IF_ERROR(device_->record(l.stream, l.start));
    OFFSIM_RETURN_IF_ERROR(device_->gemm(l.stream, shape, s.a, s.b, s.c));
    OFFSIM_RETURN_IF_ERROR(device_->record(l.stream, l.end));
    OFFSIM_RETURN_IF_ERROR(sync());
    OFFSIM_ASSIGN_OR_RETURN(double t, elapsed_s(l));
    total += t;
  }
  return total / std::max(reps, 1);
}

sim::Result<AttentionKernel> MicroBench::attention_kernel(const sim::AttentionShape& a) {
  OFFSIM_ASSIGN_OR_RETURN(backends::AttentionKernelChoice c, device_->prepare_attention(0, a));
  return c.fused ? AttentionKernel::kCudnnSdpa : AttentionKernel::kFallback;
}

sim::Result<double> MicroBench::attention(const sim::AttentionShape& a, int reps) {
  const std::int64_t kv = a.kv_heads > 0 ? a.kv_heads : a.heads;
  const std::int64_t bytes =
      (a.batch * a.heads * a.seq_q + 2 * a.batch * kv * a.seq_kv) * a.head_dim * 2;
  OFFSIM_RETURN_IF_ERROR(ensure(*device_, device_scratch_[0], 0, MemoryKind::kDevice, bytes));
  const Lane& l = compute_[0];
  const Scratch& s = device_scratch_[0];
  OFFSIM_RETURN_IF_ERROR(device_->record(l.stream, l.start));
  for (int i = 0; i < reps; ++i) OFFSIM_RETURN_IF_ERROR(device_->attention(l.stream, a, s.a, s.c));
  OFFSIM_RETURN_IF_ERROR(device_->record(l.stream, l.end));
  OFFSIM_RETURN_IF_ERROR(sync());
  OFFSIM_ASSIGN_OR_RETURN(double t, elapsed_s(l));
  return t / reps;
}

sim::Result<double> MicroBench::memory_kernel(std::int64_t bytes, int reps) {
  OFFSIM_RETURN_IF_ERROR(ensure(*device_, device_scratch_[0], 0, MemoryKind::kDevice, bytes / 2));
  const Lane& l = compute_[0];
  const Scratch& s = device_scratch_[0];
  OFFSIM_RETURN_IF_ERROR(device_->record(l.stream, l.start));
  for (int i = 0; i < reps; ++i)
    OFFSIM_RETURN_IF_ERROR(device_->elementwise(l.stream, bytes, s.a, s.c));
  OFFSIM_RETURN_IF_ERROR(device_->record(l.stream, l.end));
  OFFSIM_RETURN_IF_ERROR(sync());
  OFFSIM_ASSIGN_OR_RETURN(double t, elapsed_s(l));
  return t / reps;
}

sim::Result<double> MicroBench::copy(CopyLink link, bool pinned, std::int64_t bytes, int gpus) {
  gpus = std::clamp(gpus, 1, gpus_);
  const MemoryKind host = pinned ? MemoryKind::kHostPinned : MemoryKind::kHostPageable;
  for (int r = 0; r < gpus; ++r) {
    const auto i = static_cast<std::size_t>(r);
    OFFSIM_RETURN_IF_ERROR(ensure(*device_, device_scratch_[i], r, MemoryKind::kDevice, bytes));
    OFFSIM_RETURN_IF_ERROR(
        ensure(*device_, pinned ? pinned_scratch_[i] : pageable_scratch_[i], r, host, bytes));
  }
  if (link == CopyLink::kBidirectional) {
    const Lane& in = copy_in_[0];
    const Lane& out = copy_out_[0];
    const Scratch& d = device_scratch_[0];
    const Scratch& h = pinned ? pinned_scratch_[0] : pageable_scratch_[0];
    OFFSIM_RETURN_IF_ERROR(device_->record(in.stream, in.start));
    OFFSIM_RETURN_IF_ERROR(device_->wait(out.stream, in.start));
    OFFSIM_RETURN_IF_ERROR(device_->copy(in.stream, d.a, h.a, bytes));
    OFFSIM_RETURN_IF_ERROR(device_->copy(out.stream, h.b, d.b, bytes));
    OFFSIM_RETURN_IF_ERROR(device_->record(out.stream, out.end));
    OFFSIM_RETURN_IF_ERROR(device_->wait(in.stream, out.end));
    OFFSIM_RETURN_IF_ERROR(device_->record(in.stream, in.end));
    OFFSIM_RETURN_IF_ERROR(sync());
    return elapsed_s(in);
  }
  for (int r = 0; r < gpus; ++r) {
    const auto i = static_cast<std::size_t>(r);
    const Lane& l = link == CopyLink::kD2H ? copy_out_[i] : copy_in_[i];
    const Scratch& d = device_scratch_[i];
    const Scratch& h = pinned ? pinned_scratch_[i] : pageable_scratch_[i];
    OFFSIM_RETURN_IF_ERROR(device_->record(l.stream, l.start));
    switch (link) {
      case CopyLink::kH2D:
        OFFSIM_RETURN_IF_ERROR(device_->copy(l.stream, d.a, h.a, bytes));
        break;
      case CopyLink::kD2H:
        OFFSIM_RETURN_IF_ERROR(device_->copy(l.stream, h.a, d.a, bytes));
        break;
      default:
        OFFSIM_RETURN_IF_ERROR(device_->copy(l.stream, d.c, d.a, bytes));
        break;
    }
    OFFSIM_RETURN_IF_ERROR(device_->record(l.stream, l.end));
  }
  OFFSIM_RETURN_IF_ERROR(sync());
  double slowest = 0.0;
  for (int r = 0; r < gpus; ++r) {
    const auto i = static_cast<std::size_t>(r);
    OFFSIM_ASSIGN_OR_RETURN(double t,
                            elapsed_s(link == CopyLink::kD2H ? copy_out_[i] : copy_in_[i]));
    slowest = std::max(slowest, t);
  }
  return slowest;
}

sim::Result<double> MicroBench::collective(sim::CollectiveKind kind, std::int64_t bytes) {
  if (gpus_ < 2) {
    return sim::fail(sim::ErrorCode::kUnsupported, "collectives need 2 or more GPUs, have {}",
                     gpus_);
  }
  std::vector<int> all;
  for (int r = 0; r < gpus_; ++r) all.push_back(r);
  if (!comm_) {
    OFFSIM_ASSIGN_OR_RETURN(backends::CommId made, device_->create_communicator(all));
    comm_ = made;
  }
  const backends::CommId comm = *comm_;
  for (int r = 0; r < gpus_; ++r) {
    OFFSIM_RETURN_IF_ERROR(ensure(*device_, device_scratch_[static_cast<std::size_t>(r)], r,
                                  MemoryKind::kDevice, bytes));
  }
  for (int r = 0; r < gpus_; ++r) {
    const auto i = static_cast<std::size_t>(r);
    const Lane& l = compute_[i];
    OFFSIM_RETURN_IF_ERROR(device_->record(l.stream, l.start));
    OFFSIM_RETURN_IF_ERROR(
        device_->collective(l.stream, comm, kind, device_scratch_[i].a, bytes, "calibrate"));
    OFFSIM_RETURN_IF_ERROR(device_->record(l.stream, l.end));
  }
  OFFSIM_RETURN_IF_ERROR(sync());
  double slowest = 0.0;
  for (const Lane& l : compute_) {
    OFFSIM_ASSIGN_OR_RETURN(double t, elapsed_s(l));
    slowest = std::max(slowest, t);
  }
  return slowest;
}

sim::Result<double> MicroBench::launch_gap(int launches) {
  OFFSIM_RETURN_IF_ERROR(ensure(*device_, device_scratch_[0], 0, MemoryKind::kDevice, 4096));
  const Lane& l = compute_[0];
  const Scratch& s = device_scratch_[0];
  OFFSIM_RETURN_IF_ERROR(device_->record(l.stream, l.start));
  for (int i = 0; i < launches; ++i)
    OFFSIM_RETURN_IF_ERROR(device_->elementwise(l.stream, 64, s.a, s.c));
  OFFSIM_RETURN_IF_ERROR(device_->record(l.stream, l.end));
  OFFSIM_RETURN_IF_ERROR(sync());
  OFFSIM_ASSIGN_OR_RETURN(double t, elapsed_s(l));
  return t / launches;
}

sim::Result<double> MicroBench::copy_submit_gap(int copies) {
  OFFSIM_RETURN_IF_ERROR(ensure(*device_, device_scratch_[0], 0, MemoryKind::kDevice, 4096));
  OFFSIM_RETURN_IF_ERROR(ensure(*device_, pinned_scratch_[0], 0, MemoryKind::kHostPinned, 4096));
  const Lane& l = copy_in_[0];
  OFFSIM_RETURN_IF_ERROR(device_->record(l.stream, l.start));
  for (int i = 0; i < copies; ++i) {
    OFFSIM_RETURN_IF_ERROR(device_->copy(l.stream, device_scratch_[0].a, pinned_scratch_[0].a, 4));
  }
  OFFSIM_RETURN_IF_ERROR(device_->record(l.stream, l.end));
  OFFSIM_RETURN_IF_ERROR(sync());
  OFFSIM_ASSIGN_OR_RETURN(double t, elapsed_s(l));
  return t / copies;
}

sim::Result<InterferenceSample> MicroBench::interference(bool with_gemm, std::int64_t copy_bytes) {
  InterferenceSample out;
  out.what = with_gemm ? "h2d+gemm" : "h2d+memory_kernel";
  out.copy_bytes = static_cast<double>(copy_bytes);
  const sim::GemmShape g{.m = 8192, .n = 8192, .k = 8192, .dtype = sim::DType::kBf16};
  // A memory-bound pass a few times shorter than the copy, so the copy covers it whole.
  const std::int64_t kernel_bytes = std::int64_t{4} << 30;
  OFFSIM_RETURN_IF_ERROR(ensure(*device_, device_scratch_[0], 0, MemoryKind::kDevice,
                                std::max({copy_bytes, gemm_bytes(g), kernel_bytes / 2})));
  OFFSIM_RETURN_IF_ERROR(
      ensure(*device_, pinned_scratch_[0], 0, MemoryKind::kHostPinned, copy_bytes));
  const Scratch& d = device_scratch_[0];
  const Lane& k = compute_[0];
  const Lane& c = copy_in_[0];
  auto kernel = [&]() -> sim::Status {
    if (with_gemm) {
      for (int i = 0; i < 3; ++i) OFFSIM_RETURN_IF_ERROR(device_->gemm(k.stream, g, d.a, d.b, d.c));
      return sim::ok();
    }
    return device_->elementwise(k.stream, kernel_bytes, d.b, d.c);
  };
  OFFSIM_ASSIGN_OR_RETURN(out.copy_alone_s, copy(CopyLink::kH2D, true, copy_bytes));
  OFFSIM_RETURN_IF_ERROR(device_->record(k.stream, k.start));
  OFFSIM_RETURN_IF_ERROR(kernel());
  OFFSIM_RETURN_IF_ERROR(device_->record(k.stream, k.end));
  OFFSIM_RETURN_IF_ERROR(sync());
  OFFSIM_ASSIGN_OR_RETURN(out.kernel_alone_s, elapsed_s(k));
  // Together: both start from the kernel stream's start event.
  OFFSIM_RETURN_IF_ERROR(device_->record(k.stream, k.start));
  OFFSIM_RETURN_IF_ERROR(device_->wait(c.stream, k.start));
  OFFSIM_RETURN_IF_ERROR(device_->record(c.stream, c.start));
  OFFSIM_RETURN_IF_ERROR(device_->copy(c.stream, d.a, pinned_scratch_[0].a, copy_bytes));
  OFFSIM_RETURN_IF_ERROR(kernel());
  OFFSIM_RETURN_IF_ERROR(device_->record(k.stream, k.end));
  OFFSIM_RETURN_IF_ERROR(device_->record(c.stream, c.end));
  OFFSIM_RETURN_IF_ERROR(sync());
  OFFSIM_ASSIGN_OR_RETURN(out.kernel_together_s, elapsed_s(k));
  OFFSIM_ASSIGN_OR_RETURN(out.copy_together_s, elapsed_s(c));
  out.kernel_bytes = with_gemm ? 0.0 : static_cast<double>(kernel_bytes);
  return out;
}

sim::Result<AllocatorSample> MicroBench::allocator_sample() {
  OFFSIM_RETURN_IF_ERROR(device_->reset_pool_high_water(0));
  OFFSIM_ASSIGN_OR_RETURN(backends::PoolUsage before, device_->pool_usage(0));
  const Lane& l = compute_[0];
  AllocatorSample s;
  std::uint32_t x = 12345;
  std::vector<std::uint64_t> keys;
  for (int i = 0; i < 64; ++i) {
    x = x * 1664525u + 1013904223u;
    const std::int64_t bytes = std::int64_t{1024} << (x >> 28);  // 1 KiB .. 32 MiB
    const std::uint64_t key = next_key_++;
    OFFSIM_RETURN_IF_ERROR(device_->allocate(l.stream, key, bytes, "calibrate allocator"));
    keys.push_back(key);
    s.requested_bytes += bytes;
  }
  for (std::uint64_t key : keys) OFFSIM_RETURN_IF_ERROR(device_->release(l.stream, key));
  OFFSIM_RETURN_IF_ERROR(sync());
  OFFSIM_ASSIGN_OR_RETURN(backends::PoolUsage after, device_->pool_usage(0));
  s.reserved_bytes = after.reserved_high_bytes - before.in_use_bytes;
  return s;
}

namespace {

// The measurement sweep of measure_machine(): each family of benchmarks in turn, every timing
// taken under one stop rule and kept with its spread (nvbench reports noise, not only times).
// The first failure ends the sweep: later timings are skipped and the family returns it.
class Sweep {
 public:
  Sweep(MicroBench& bench, bool quick, int gpus) : bench_(bench), quick_(quick), gpus_(gpus) {
    rule_ = quick ? StopRule{.warmup = 1,
                             .min_samples = 3,
                             .max_samples = 10,
                             .max_noise = 0.02,
                             .max_total_s = 0.25}
                  : StopRule{.warmup = 2,
                             .min_samples = 5,
                             .max_samples = 50,
                             .max_noise = 0.005,
                             .max_total_s = 2.0};
  }

  Samples& samples() { return s_; }

  // Copies: 4 KiB .. 1 GiB (quick: every 16x; full: every 4x), pinned then pageable, then
  // (several GPUs) all GPUs at once; the submit and launch gaps.
  sim::Status copies() {
    std::vector<std::int64_t> sizes;
    for (std::int64_t b = 4096; b <= (std::int64_t{1} << 30); b *= quick_ ? 16 : 4) {
      sizes.push_back(b);
    }
    if (sizes.back() != (std::int64_t{1} << 30)) sizes.push_back(std::int64_t{1} << 30);
    for (CopyLink link :
         {CopyLink::kH2D, CopyLink::kD2H, CopyLink::kBidirectional, CopyLink::kD2D}) {
      for (std::int64_t b : sizes) {
        const double t = stable(fmt::format("copy {} pinned {} B", to_string(link), b),
                                [&] { return bench_.copy(link, true, b); });
        OFFSIM_RETURN_IF_ERROR(status());
        s_.copies.push_back({link, true, b, t, 1});
      }
    }
    for (CopyLink link : {CopyLink::kH2D, CopyLink::kD2H}) {
      for (std::int64_t b : sizes) {
        if (quick_ && b < (std::int64_t{1} << 20)) continue;
        const double t = stable(fmt::format("copy {} pageable {} B", to_string(link), b),
                                [&] { return bench_.copy(link, false, b); });
        OFFSIM_RETURN_IF_ERROR(status());
        s_.copies.push_back({link, false, b, t, 1});
      }
    }
    if (gpus_ > 1) {
      const std::int64_t b = std::int64_t{256} << 20;
      const double t = stable(fmt::format("copy h2d pinned {} B on {} GPUs", b, gpus_),
                              [&] { return bench_.copy(CopyLink::kH2D, true, b, gpus_); });
      OFFSIM_RETURN_IF_ERROR(status());
      s_.copies.push_back({CopyLink::kH2D, true, b, t, gpus_});
    }
    s_.copy_submit_s.push_back(stable("copy submit gap", [&] { return bench_.copy_submit_gap(); }));
    OFFSIM_RETURN_IF_ERROR(status());
    s_.kernel_launch_s.push_back(stable("kernel launch gap", [&] { return bench_.launch_gap(); }));
    return status();
  }

  // GEMMs: the catalogue's layer shapes (Llama-3 8B/70B projections at 4096 and 8192 tokens)
  // and a cube grid; fp16 and fp8 on two of them.
  sim::Status gemms() {
    std::vector<sim::GemmShape> shapes;
    for (std::int64_t d : quick_ ? std::vector<std::int64_t>{1024, 2048, 4096, 8192}
                                 : std::vector<std::int64_t>{512, 1024, 2048, 4096, 8192, 16384}) {
      shapes.push_back({.m = d, .n = d, .k = d, .dtype = sim::DType::kBf16});
    }
    for (auto [m, n, k] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{4096, 6144, 4096},
                           {4096, 28672, 4096},
                           {4096, 4096, 14336},
                           {8192, 10240, 8192},
                           {8192, 57344, 8192},
                           {8192, 8192, 28672}}) {
      shapes.push_back({.m = m, .n = n, .k = k, .dtype = sim::DType::kBf16});
    }
    for (sim::DType dt : {sim::DType::kFp16, sim::DType::kFp8}) {
      for (std::int64_t d : {4096, 8192}) shapes.push_back({.m = d, .n = d, .k = d, .dtype = dt});
    }
    for (const sim::GemmShape& g : shapes) {
      // A heat of 1 s of the same GEMM first (see gemm()); the samples then follow one another
      // closely enough to keep the clocks near where the heat left them. (A 0.3 s heat left an
      // H200's 8192^3 GEMM at 758 TFLOP/s against 655-679 sustained: the power limit takes
      // about a second of full load to bring the clock down.)
      heat(g);
      const double t =
          stable(fmt::format("gemm {}x{}x{} {}", g.m, g.n, g.k, sim::to_string(g.dtype)),
                 [&] { return bench_.gemm(g); });
      OFFSIM_RETURN_IF_ERROR(status());
      s_.gemms.push_back({g, t});
    }
    return sim::ok();
  }

  // Memory-bound kernel: 1 MiB .. 4 GiB moved (read + written).
  sim::Status memory_kernels() {
    for (std::int64_t b = std::int64_t{1} << 20; b <= (std::int64_t{4} << 30);
         b *= quick_ ? 16 : 4) {
      const double t =
          stable(fmt::format("memory kernel {} B", b), [&] { return bench_.memory_kernel(b); });
      OFFSIM_RETURN_IF_ERROR(status());
      s_.memory_kernels.push_back({b, t});
    }
    return sim::ok();
  }

  // Attention (GQA 32/8 heads, head_dim 128), forward and backward, at training lengths. Each
  // call holds 16,384 tokens (batch = 16384 / seq, at least 1), as a micro-batch does, so that
  // a call's host-side submission does not show in its time.
  sim::Status attention() {
    for (std::int64_t seq : quick_ ? std::vector<std::int64_t>{2048, 8192}
                                   : std::vector<std::int64_t>{1024, 2048, 4096, 8192, 16384}) {
      for (bool bwd : {false, true}) {
        sim::AttentionShape a{.batch = std::max<std::int64_t>(1, 16384 / seq),
                              .heads = 32,
                              .kv_heads = 8,
                              .seq_q = seq,
                              .seq_kv = seq,
                              .head_dim = 128,
                              .causal = true,
                              .backward = bwd};
        // The kernel the device runs for this very shape: cuDNN's fused SDPA graphs, or the
        // fallback (whose speed never reaches the flash-attention keys; see fit.h).
        OFFSIM_ASSIGN_OR_RETURN(const AttentionKernel kernel, bench_.attention_kernel(a));
        // In a training step attention runs between GEMMs that hold the GPU at its power limit;
        // alone it draws less and runs at a higher clock (an H200's cuDNN backward at 8,192
        // tokens: 0.535 of peak measured alone, 0.445-0.455 inside a replayed step). A second
        // of large GEMMs first puts the clock where a step keeps it.
        heat({.m = 8192, .n = 8192, .k = 8192, .dtype = sim::DType::kBf16});
        const double t = stable(
            fmt::format("attention {} seq {} ({})", bwd ? "bwd" : "fwd", seq, to_string(kernel)),
            [&] { return bench_.attention(a); });
        OFFSIM_RETURN_IF_ERROR(status());
        (bwd ? s_.attention_bwd : s_.attention_fwd).push_back({a, attention_flops(a), t, kernel});
      }
    }
    return sim::ok();
  }

  // Interference, once each (the copy dominates: 1 GiB), and the allocator.
  sim::Status interference_and_allocator() {
    for (bool with_gemm : {true, false}) {
      OFFSIM_ASSIGN_OR_RETURN(InterferenceSample r,
                              bench_.interference(with_gemm, std::int64_t{1} << 30));
      s_.interference.push_back(r);
    }
    OFFSIM_ASSIGN_OR_RETURN(AllocatorSample alloc, bench_.allocator_sample());
    s_.allocator.push_back(alloc);
    return sim::ok();
  }

  // Collectives over every GPU (several GPUs only): 1 MiB .. 1 GiB.
  sim::Status collectives() {
    if (gpus_ <= 1) return sim::ok();
    for (auto kind : {sim::CollectiveKind::kAllReduce, sim::CollectiveKind::kAllGather,
                      sim::CollectiveKind::kReduceScatter}) {
      for (std::int64_t b = std::int64_t{1} << 20; b <= (std::int64_t{1} << 30);
           b *= quick_ ? 32 : 4) {
        const double t = stable(fmt::format("{} {} B on {} GPUs", sim::to_string(kind), b, gpus_),
                                [&] { return bench_.collective(kind, b); });
        OFFSIM_RETURN_IF_ERROR(status());
        s_.collectives.push_back({kind, gpus_, b, t});
      }
    }
    return sim::ok();
  }

 private:
  sim::Status status() const {
    if (failure_) return sim::fail(*failure_);
    return sim::ok();
  }

  // The median of `one` under the stop rule; its spread is recorded unless a run failed.
  // Runs `g` back to back for about a second (MicroBench::gemm's heat), unless a benchmark has
  // already failed.
  void heat(const sim::GemmShape& g) {
    if (failure_) return;
    sim::Result<double> heated = bench_.gemm(g, 1, 1.0);
    if (!heated) failure_ = heated.error();
  }

  template <class One>
  double stable(const std::string& what, One&& one) {
    StableTiming t = measure_stable(
        [&]() -> double {
          if (failure_) return -1.0;
          sim::Result<double> r = one();
          if (!r) {
            failure_ = r.error();
            return -1.0;
          }
          return *r;
        },
        rule_);
    if (!failure_) s_.timings.push_back({what, t.median_s, t.min_s, t.noise, t.samples, t.stable});
    return t.median_s;
  }

  MicroBench& bench_;
  bool quick_;
  int gpus_;
  StopRule rule_;
  std::optional<sim::Error> failure_;
  Samples s_;
};

}  // namespace

sim::Result<Samples> measure_machine(const CalibrateOptions& options) {
  OFFSIM_ASSIGN_OR_RETURN(const backends::GpuPlugin* gpu, backends::load_gpu_plugin());
  int gpus = options.gpus;
  if (gpus <= 0) {
    gpus = static_cast<int>(gpu->list_cuda_devices().size()) - options.first_gpu;
    if (gpus <= 0) gpus = 1;  // make_cuda_device below says what is missing
  }
  OFFSIM_ASSIGN_OR_RETURN(MicroBench bench, MicroBench::open(options.first_gpu, gpus));
  Sweep sweep(bench, options.quick, gpus);
  Samples& s = sweep.samples();
  const backends::DeviceInfo& info = bench.info();
  s.machine.gpu_name = info.name;
  s.machine.gpu_count = gpus;
  s.machine.driver_version = info.driver_version;
  s.machine.cuda_version = info.runtime_version;
  s.machine.cublas_version = info.blas_version;
  s.machine.context_bytes = bench.context_bytes();
  s.machine.compute_capability =
      (10.0 * info.compute_capability_major + info.compute_capability_minor) / 10.0;
  s.machine.clocks = gpu->clock_summary(options.first_gpu);
  s.nvml_before = nvml_reading(options.first_gpu);

  OFFSIM_RETURN_IF_ERROR(sweep.copies());
  OFFSIM_RETURN_IF_ERROR(sweep.gemms());
  OFFSIM_RETURN_IF_ERROR(sweep.memory_kernels());
  OFFSIM_RETURN_IF_ERROR(sweep.attention());
  OFFSIM_RETURN_IF_ERROR(sweep.interference_and_allocator());
  OFFSIM_RETURN_IF_ERROR(sweep.collectives());
  // NCCL is loaded by the first communicator: its version is known only now ("" on one GPU).
  s.machine.nccl_version = bench.info().comm_version;
  s.nvml_after = nvml_reading(options.first_gpu);
  return std::move(s);
}

}  // namespace offsim::calibrate
