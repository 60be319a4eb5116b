#include "calibrate/fit.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace offsim::calibrate {

namespace platform = sim::platform;
using platform::CurveKnot;
using platform::Figure;
using platform::Origin;

const char* to_string(CopyLink link) {
  switch (link) {
    case CopyLink::kH2D:
      return "h2d";
    case CopyLink::kD2H:
      return "d2h";
    case CopyLink::kD2D:
      return "d2d";
    case CopyLink::kBidirectional:
      return "bidirectional";
  }
  return "?";
}

namespace {

double median_of(std::vector<double> v) {
  OFFSIM_CHECK(!v.empty());
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

bool usable(double x) { return std::isfinite(x) && x > 0.0; }

// Knots sorted by strictly increasing size: equal sizes merged by their median efficiency;
// efficiencies clamped to (0, 1].
std::vector<CurveKnot> knots_from(const std::vector<std::pair<double, double>>& size_eff,
                                  const std::string& source) {
  std::map<double, std::vector<double>> by_size;
  for (auto [size, eff] : size_eff) {
    if (usable(size) && usable(eff)) by_size[size].push_back(std::min(eff, 1.0));
  }
  std::vector<CurveKnot> knots;
  for (auto& [size, effs] : by_size) {
    knots.push_back(CurveKnot{size, Figure{median_of(effs), Origin::kMeasured, source}});
  }
  return knots;
}

class Fitter {
 public:
  Fitter(const Samples& s, platform::CalibrationProfile p) : s_(s), p_(std::move(p)) {
    measured_.insert(p_.provenance.measured.begin(), p_.provenance.measured.end());
  }

  sim::Result<platform::CalibrationProfile> run(const std::string& command_line,
                                                const std::string& date) {
    OFFSIM_RETURN_IF_ERROR(fit_copies());
    fit_gemms();
    fit_memory_kernels();
    fit_attention();
    OFFSIM_RETURN_IF_ERROR(fit_collectives());
    fit_interference();
    fit_allocator();
    if (!s_.kernel_launch_s.empty()) {
      set(p_.gpu.kernel_launch_s, median_of(s_.kernel_launch_s), "gpu.kernel_launch_s",
          fmt::format("median of {} back-to-back launch gaps", s_.kernel_launch_s.size()));
    }
    if (!s_.copy_submit_s.empty()) {
      set(p_.host_link.submit_overhead_s, median_of(s_.copy_submit_s),
          "host_link.submit_overhead_s",
          fmt::format("median host time of {} cudaMemcpyAsync calls", s_.copy_submit_s.size()));
    }
    if (s_.machine.compute_capability > 0.0) {
      set(p_.gpu.compute_capability, s_.machine.compute_capability, "gpu.compute_capability",
          "cudaGetDeviceProperties major.minor");
    }
    platform::Provenance& pv = p_.provenance;
    const MachineFacts& m = s_.machine;
    if (!m.gpu_name.empty()) pv.gpu_name = m.gpu_name;
    pv.gpu_count = m.gpu_count;
    pv.driver_version = m.driver_version;
    pv.cuda_version = m.cuda_version;
    pv.cublas_version = m.cublas_version;
    pv.nccl_version = m.nccl_version;
    pv.clocks = m.clocks;
    pv.date = date;
    pv.command_line = command_line;
    pv.measured.assign(measured_.begin(), measured_.end());
    return p_;
  }

 private:
  void set(Figure& f, double value, const std::string& key, const std::string& source) {
    if (!usable(value)) return;
    f = Figure{value, Origin::kMeasured, "offsim calibrate: " + source};
    measured_.insert(key);
  }

  void set_fraction(Figure& f, double value, const std::string& key, const std::string& source) {
    if (usable(value)) set(f, std::min(value, 1.0), key, source);
  }

  // Fits the copies of one link and pinning; nullopt-like {points = 0} when too few sizes.
  sim::Result<LatencyBandwidth> fit_link(CopyLink link, bool pinned, double bytes_factor) {
    std::vector<double> x, t;
    for (const CopySample& c : s_.copies) {
      if (c.link == link && c.pinned == pinned && c.gpus == 1) {
        x.push_back(static_cast<double>(c.bytes) * bytes_factor);
        t.push_back(c.seconds);
      }
    }
    if (x.size() < 2) return LatencyBandwidth{};
    auto fit = fit_latency_bandwidth(x, t);
    if (!fit) {
      return sim::fail(sim::with_context(
          fit.error(),
          fmt::format("{} copies ({}): ", to_string(link), pinned ? "pinned" : "pageable")));
    }
    return fit;
  }

  sim::Status fit_copies() {
    OFFSIM_ASSIGN_OR_RETURN(LatencyBandwidth h2d, fit_link(CopyLink::kH2D, true, 1.0));
    OFFSIM_ASSIGN_OR_RETURN(LatencyBandwidth d2h, fit_link(CopyLink::kD2H, true, 1.0));
    auto src = [](const LatencyBandwidth& f, const char* what) {
      return fmt::format("least squares over {} {} sizes (max residual {:.1f}%)", f.points, what,
                         100.0 * f.max_relative_residual);
    };
    if (h2d.points)
      set(p_.host_link.h2d_bytes_per_s, h2d.bytes_per_s, "host_link.h2d_bytes_per_s",
          src(h2d, "pinned H2D"));
    if (d2h.points)
      set(p_.host_link.d2h_bytes_per_s, d2h.bytes_per_s, "host_link.d2h_bytes_per_s",
          src(d2h, "pinned D2H"));
    if (h2d.points && d2h.points) {
      set(p_.host_link.latency_s, 0.5 * (h2d.latency_s + d2h.latency_s), "host_link.latency_s",
          "mean latency term of the pinned H2D and D2H fits");
    } else if (h2d.points || d2h.points) {
      const LatencyBandwidth& one = h2d.points ? h2d : d2h;
      set(p_.host_link.latency_s, one.latency_s, "host_link.latency_s",
          "latency term of the pinned copy fit");
    }
    OFFSIM_ASSIGN_OR_RETURN(LatencyBandwidth ph2d, fit_link(CopyLink::kH2D, false, 1.0));
    OFFSIM_ASSIGN_OR_RETURN(LatencyBandwidth pd2h, fit_link(CopyLink::kD2H, false, 1.0));
    std::vector<double> pageable;
    if (ph2d.points) pageable.push_back(ph2d.bytes_per_s);
    if (pd2h.points) pageable.push_back(pd2h.bytes_per_s);
    if (!pageable.empty()) {
      set(p_.host_link.pageable_bytes_per_s, median_of(pageable), "host_link.pageable_bytes_per_s",
          "mean bandwidth of the pageable H2D/D2H fits");
    }
    // Both directions at once: the combined bytes (2·bytes) over the time.
    OFFSIM_ASSIGN_OR_RETURN(LatencyBandwidth duplex, fit_link(CopyLink::kBidirectional, true, 2.0));
    if (duplex.points) {
      set(p_.host_link.duplex_bytes_per_s, duplex.bytes_per_s, "host_link.duplex_bytes_per_s",
          src(duplex, "bidirectional pinned (both directions counted)"));
    }
    // Device-to-device: every byte is read once and written once.
    OFFSIM_ASSIGN_OR_RETURN(LatencyBandwidth d2d, fit_link(CopyLink::kD2D, true, 2.0));
    if (d2d.points) {
      set(p_.gpu.hbm_achievable_bytes_per_s, d2d.bytes_per_s, "gpu.hbm_achievable_bytes_per_s",
          src(d2d, "D2D copy (read + write)"));
    }
    // Several GPUs copying H2D at once: a shared cap shows when the aggregate falls short of
    // the sum of single-GPU rates by more than 10%.
    double best_aggregate = 0.0;
    int gpus_at_best = 0;
    for (const CopySample& c : s_.copies) {
      if (c.link != CopyLink::kH2D || !c.pinned || c.gpus < 2 || !usable(c.seconds)) continue;
      const double aggregate = static_cast<double>(c.bytes) * c.gpus / c.seconds;
      if (aggregate > best_aggregate) {
        best_aggregate = aggregate;
        gpus_at_best = c.gpus;
      }
    }
    if (h2d.points && best_aggregate > 0.0 &&
        best_aggregate < 0.9 * gpus_at_best * h2d.bytes_per_s) {
      set(p_.host_link.root_complex_bytes_per_s, best_aggregate,
          "host_link.root_complex_bytes_per_s",
          fmt::format("aggregate pinned H2D of {} GPUs copying at once", gpus_at_best));
    }
    return sim::ok();
  }

  void fit_gemms() {
    if (s_.gemms.empty()) return;
    std::vector<std::pair<double, double>> curve;
    platform::GemmEfficiency& g = p_.gemm;
    std::vector<platform::GemmPoint> points;
    for (const GemmSample& smp : s_.gemms) {
      const sim::GemmShape& sh = smp.shape;
      const double flops = 2.0 * static_cast<double>(sh.m) * static_cast<double>(sh.n) *
                           static_cast<double>(sh.k) *
                           static_cast<double>(std::max<std::int64_t>(sh.batch, 1));
      const double peak = p_.gpu.dense_flops(sh.dtype);
      if (!usable(smp.seconds) || !usable(peak) || !usable(flops)) continue;
      const double eff = std::min(flops / smp.seconds / peak, 1.0);
      points.push_back(
          platform::GemmPoint{sh.m, sh.n, sh.k, sh.dtype,
                              Figure{eff, Origin::kMeasured,
                                     fmt::format("offsim calibrate: cuBLASLt {} {}x{}x{}",
                                                 sim::to_string(sh.dtype), sh.m, sh.n, sh.k)}});
      if (sh.dtype != sim::DType::kBf16) continue;
      // The curve carries what the tile and alignment penalties of the model do not.
      const double curve_value = platform::interpolate_log(g.curve, flops);
      const double model = g.model_efficiency(sh);
      const double penalty = usable(curve_value) && usable(model) ? model / curve_value : 1.0;
      curve.emplace_back(flops, eff / std::max(penalty, 1e-3));
    }
    if (points.empty()) return;
    g.points = std::move(points);
    measured_.insert("gemm.points");
    std::vector<CurveKnot> knots = knots_from(curve,
                                              "offsim calibrate: bf16 GEMM grid, "
                                              "efficiency over the model's tile penalties");
    if (knots.size() >= 2) {
      g.curve = std::move(knots);
      measured_.insert("gemm.curve");
    }
  }

  void fit_memory_kernels() {
    const double peak = p_.gpu.hbm_peak_bytes_per_s.value;
    if (s_.memory_kernels.empty() || !usable(peak)) return;
    std::vector<std::pair<double, double>> pts;
    for (const MemoryKernelSample& m : s_.memory_kernels) {
      if (usable(m.seconds))
        pts.emplace_back(static_cast<double>(m.bytes),
                         static_cast<double>(m.bytes) / m.seconds / peak);
    }
    std::vector<CurveKnot> knots = knots_from(pts,
                                              "offsim calibrate: elementwise kernel, bytes "
                                              "read + written over the HBM peak");
    if (knots.size() >= 2) {
      p_.memory_bound = std::move(knots);
      measured_.insert("memory_bound");
    }
  }

  // A sample's fraction of the dense peak, for cuDNN's fused SDPA only: the fallback kernel's
  // speed says nothing about flash attention (see AttentionKernel). Nullopt when not usable.
  std::optional<double> fused_efficiency(const AttentionSample& a) const {
    if (a.kernel != AttentionKernel::kCudnnSdpa) return std::nullopt;
    const double peak = p_.gpu.dense_flops(a.shape.dtype);
    if (!usable(a.seconds) || !usable(peak) || !usable(a.flops)) return std::nullopt;
    return a.flops / a.seconds / peak;
  }

  void fit_attention() {
    auto eff = [&](const std::vector<AttentionSample>& v) {
      std::vector<double> e;
      for (const AttentionSample& a : v) {
        if (const std::optional<double> x = fused_efficiency(a)) e.push_back(*x);
      }
      return e.empty() ? 0.0 : median_of(e);
    };
    // Only cuDNN's fused SDPA measures the flash-attention efficiencies (provenance keys
    // attention.cudnn_sdpa.*); samples of the fallback kernel stay in the samples file only.
    auto fused = [](const std::vector<AttentionSample>& v) {
      return std::count_if(v.begin(), v.end(), [](const AttentionSample& a) {
        return a.kernel == AttentionKernel::kCudnnSdpa;
      });
    };
    set_fraction(p_.attention.flash_fwd, eff(s_.attention_fwd), "attention.cudnn_sdpa.fwd",
                 fmt::format("median over {} shapes of cuDNN's fused SDPA (forward)",
                             fused(s_.attention_fwd)));
    set_fraction(p_.attention.flash_bwd, eff(s_.attention_bwd), "attention.cudnn_sdpa.bwd",
                 fmt::format("median over {} shapes of cuDNN's fused SDPA (backward)",
                             fused(s_.attention_bwd)));
    scale_attention_curve(p_.attention.flash_fwd_by_seq, s_.attention_fwd,
                          "attention_by_seq.flash_fwd", "forward");
    scale_attention_curve(p_.attention.flash_bwd_by_seq, s_.attention_bwd,
                          "attention_by_seq.flash_bwd", "backward");
  }

  // The efficiency-by-sequence curve through the fused samples: at each measured length the
  // measured efficiency (median of its samples); elsewhere the base curve's shape times the
  // measured / base ratio, interpolated in log length between measured lengths and held beyond
  // them. A profile without a base curve keeps only the single figure.
  void scale_attention_curve(std::vector<CurveKnot>& curve, const std::vector<AttentionSample>& v,
                             const std::string& key, const char* direction) {
    if (curve.empty()) return;
    std::map<double, std::vector<double>> by_seq;
    for (const AttentionSample& a : v) {
      if (const std::optional<double> x = fused_efficiency(a))
        by_seq[static_cast<double>(a.shape.seq_kv)].push_back(*x);
    }
    if (by_seq.empty()) return;
    std::vector<CurveKnot> ratios;
    std::vector<std::string> said;
    for (const auto& [seq, effs] : by_seq) {
      const double measured = median_of(effs);
      const double base = interpolate_log(curve, seq);
      if (!usable(base)) return;
      ratios.push_back({.size = seq, .efficiency = Figure{measured / base, Origin::kMeasured, ""}});
      said.push_back(fmt::format("{:.0f} tokens {:.3f} ({:.2f}x the base curve)", seq, measured,
                                 measured / base));
    }
    const std::string source = fmt::format(
        "offsim calibrate: cuDNN's fused SDPA ({}) measured at {}; between and beyond, the base "
        "curve ({}) times the measured ratios, interpolated in log length",
        direction, fmt::join(said, ", "), curve.front().efficiency.source);
    std::vector<double> sizes;
    for (const CurveKnot& k : curve) sizes.push_back(k.size);
    for (const CurveKnot& r : ratios) sizes.push_back(r.size);
    std::sort(sizes.begin(), sizes.end());
    sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
    std::vector<CurveKnot> scaled;
    for (double size : sizes) {
      const double e = interpolate_log(curve, size) * interpolate_log(ratios, size);
      scaled.push_back({.size = size,
                        .efficiency = Figure{std::clamp(e, 1e-6, 1.0), Origin::kMeasured, source}});
    }
    curve = std::move(scaled);
    measured_.insert(key);
  }

  sim::Status fit_collectives() {
    std::map<sim::CollectiveKind, std::pair<std::vector<double>, std::vector<double>>> by_kind;
    int ranks = 0;
    for (const CollectiveSample& c : s_.collectives) {
      if (c.ranks < 2) continue;
      ranks = std::max(ranks, c.ranks);
      auto& [x, t] = by_kind[c.kind];
      x.push_back(static_cast<double>(c.bytes) * bus_factor(c.kind, c.ranks));
      t.push_back(c.seconds);
    }
    std::vector<double> latencies;
    for (auto& [kind, xt] : by_kind) {
      if (xt.first.size() < 2) continue;
      auto fit = fit_latency_bandwidth(xt.first, xt.second);
      if (!fit) {
        return sim::fail(
            sim::with_context(fit.error(), fmt::format("NCCL {}: ", sim::to_string(kind))));
      }
      const std::string src = fmt::format("NCCL {} on {} GPUs, bus bandwidth fit over {} sizes",
                                          sim::to_string(kind), ranks, fit->points);
      latencies.push_back(fit->latency_s);
      switch (kind) {
        case sim::CollectiveKind::kAllReduce:
          set(p_.nvlink.ring_all_reduce_bus_bytes_per_s, fit->bytes_per_s,
              "nvlink.ring_all_reduce_bus_bytes_per_s", src);
          break;
        case sim::CollectiveKind::kAllGather:
          set(p_.nvlink.ring_all_gather_bus_bytes_per_s, fit->bytes_per_s,
              "nvlink.ring_all_gather_bus_bytes_per_s", src);
          break;
        case sim::CollectiveKind::kReduceScatter:
          set(p_.nvlink.ring_reduce_scatter_bus_bytes_per_s, fit->bytes_per_s,
              "nvlink.ring_reduce_scatter_bus_bytes_per_s", src);
          break;
        default:
          break;
      }
    }
    if (!latencies.empty()) {
      set(p_.nvlink.latency_s, median_of(latencies), "nvlink.latency_s",
          "median latency term of the NCCL fits");
    }
    return sim::ok();
  }

  void fit_interference() {
    std::vector<double> per_byte;
    for (const InterferenceSample& i : s_.interference) {
      if (i.what.find("memory_kernel") == std::string::npos) continue;
      if (!usable(i.kernel_alone_s) || !usable(i.kernel_together_s) || !usable(i.copy_together_s) ||
          !usable(i.kernel_bytes) || !usable(i.copy_bytes)) {
        continue;
      }
      // HBM bytes per second the kernel lost while the copy ran, per copy byte per second.
      const double alone = i.kernel_bytes / i.kernel_alone_s;
      const double together = i.kernel_bytes / i.kernel_together_s;
      const double copy_rate = i.copy_bytes / i.copy_together_s;
      per_byte.push_back(std::clamp((alone - together) / copy_rate, 0.0, 4.0));
    }
    if (!per_byte.empty()) {
      const double v = median_of(per_byte);
      // Zero is a real outcome (no visible interference) but figures must be positive to count.
      if (v > 0.0) {
        set(p_.interference.copy_hbm_bytes_per_byte, v, "interference.copy_hbm_bytes_per_byte",
            "slowdown of a memory-bound kernel while an H2D copy runs");
      }
    }
  }

  void fit_allocator() {
    double requested = 0.0, reserved = 0.0;
    for (const AllocatorSample& a : s_.allocator) {
      requested += static_cast<double>(a.requested_bytes);
      reserved += static_cast<double>(a.reserved_bytes);
    }
    if (requested > 0.0 && reserved >= requested) {
      const double overhead = (reserved - requested) / requested;
      if (overhead > 0.0) {
        set(p_.allocator.overhead_fraction, overhead, "allocator.overhead_fraction",
            "pool bytes reserved over bytes requested, minus one");
      }
    }
    if (s_.machine.context_bytes > 0) {
      set(p_.allocator.fixed_bytes, static_cast<double>(s_.machine.context_bytes),
          "allocator.fixed_bytes", "device memory in use before the first allocation");
    }
  }

  const Samples& s_;
  platform::CalibrationProfile p_;
  std::set<std::string> measured_;
};

}  // namespace

sim::Result<LatencyBandwidth> fit_latency_bandwidth(const std::vector<double>& bytes,
                                                    const std::vector<double>& seconds) {
  if (bytes.size() != seconds.size()) {
    return sim::fail(sim::ErrorCode::kInvalidInput, "fit: {} sizes but {} times", bytes.size(),
                     seconds.size());
  }
  std::set<double> distinct;
  double s0 = 0, s1 = 0, s2 = 0, t0 = 0, t1 = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    const double x = bytes[i];
    const double t = seconds[i];
    if (!usable(x) || !usable(t)) {
      return sim::fail(sim::ErrorCode::kInvalidInput,
                       "fit: sample {} has size {} and time {}; both must be positive and finite",
                       i, x, t);
    }
    distinct.insert(x);
    const double w = 1.0 / (t * t);  // relative residuals
    s0 += w;
    s1 += w * x;
    s2 += w * x * x;
    t0 += w * t;
    t1 += w * x * t;
  }
  if (distinct.size() < 2) {
    return sim::fail(sim::ErrorCode::kInvalidInput, "fit: need at least two distinct sizes, got {}",
                     distinct.size());
  }
  const double det = s0 * s2 - s1 * s1;
  double a = (t0 * s2 - s1 * t1) / det;
  double b = (s0 * t1 - s1 * t0) / det;
  if (!(a >= 0.0)) {  // a negative latency is not physical: refit through the origin
    a = 0.0;
    b = t1 / s2;
  }
  if (!(b > 0.0) || !std::isfinite(b)) {
    return sim::fail(sim::ErrorCode::kInvalidInput,
                     "fit: time does not grow with size (slope {} s/byte); the samples are not "
                     "latency + size / bandwidth",
                     b);
  }
  LatencyBandwidth fit{a, 1.0 / b, 0.0, static_cast<int>(bytes.size())};
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    fit.max_relative_residual =
        std::max(fit.max_relative_residual, std::abs((a + b * bytes[i] - seconds[i]) / seconds[i]));
  }
  return fit;
}

double bus_factor(sim::CollectiveKind kind, int ranks) {
  if (ranks < 2) return 1.0;
  const double n = ranks;
  switch (kind) {
    case sim::CollectiveKind::kAllReduce:
      return 2.0 * (n - 1.0) / n;
    case sim::CollectiveKind::kAllGather:
    case sim::CollectiveKind::kReduceScatter:
      return (n - 1.0) / n;
    default:
      return 1.0;
  }
}

const char* to_string(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::kFallback:
      return "fallback";
    case AttentionKernel::kCudnnSdpa:
      return "cudnn_sdpa";
  }
  return "fallback";
}

double attention_flops(const sim::AttentionShape& a) {
  // QK^T: 2·b·h·sq·skv·d, PV the same.
  double f = 4.0 * static_cast<double>(a.batch) * static_cast<double>(a.heads) *
             static_cast<double>(a.seq_q) * static_cast<double>(a.seq_kv) *
             static_cast<double>(a.head_dim);
  if (a.causal) f *= 0.5;
  if (a.backward) f *= 2.5;
  return f;
}

sim::Result<std::string> gpu_kind_from_name(const std::string& gpu_name) {
  std::string n;
  for (char c : gpu_name) n += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  if (has("gb300")) return std::string("gb300");
  if (has("b300")) return std::string("b300");
  if (has("l40s")) return std::string("l40s");
  if (has("rtx 6000 ada")) return std::string("rtx6000ada");
  if (has("rtx 4090")) return std::string("rtx4090");
  if (has("rtx 5090")) return std::string("rtx5090");
  if (has("nvidia l4")) return std::string("l4");
  if (has("gb200")) return std::string("gb200");
  if (has("gh200")) return std::string("gh200");
  if (has("b200")) return std::string("b200");
  if (has("h200")) return std::string("h200");
  if (has("h800")) return std::string("h800");
  if (has("h100")) return std::string(has("pcie") ? "h100-pcie" : "h100-sxm");
  if (has("a100")) return std::string(has("80") ? "a100-80gb" : "a100-40gb");
  return sim::fail(sim::ErrorCode::kNotFound,
                   "GPU '{}' is not one of the kinds with a base profile (a100-40gb, a100-80gb, "
                   "h100-sxm, h100-pcie, h800, h200, gh200, b200, gb200, b300, gb300, l4, l40s, "
                   "rtx4090, rtx5090, rtx6000ada); pass the kind explicitly",
                   gpu_name);
}

sim::Result<platform::CalibrationProfile> fit_profile(const Samples& samples,
                                                      const platform::CalibrationProfile& base,
                                                      const std::string& command_line,
                                                      const std::string& date) {
  Fitter fitter(samples, base);
  return fitter.run(command_line, date);
}

nlohmann::json samples_to_json(const Samples& s) {
  using nlohmann::json;
  json j;
  const MachineFacts& m = s.machine;
  j["machine"] = {{"gpu_name", m.gpu_name},
                  {"gpu_count", m.gpu_count},
                  {"driver_version", m.driver_version},
                  {"cuda_version", m.cuda_version},
                  {"cublas_version", m.cublas_version},
                  {"nccl_version", m.nccl_version},
                  {"clocks", m.clocks},
                  {"context_bytes", m.context_bytes},
                  {"compute_capability", m.compute_capability}};
  j["copies"] = json::array();
  for (const CopySample& c : s.copies) {
    j["copies"].push_back({{"link", to_string(c.link)},
                           {"pinned", c.pinned},
                           {"bytes", c.bytes},
                           {"seconds", c.seconds},
                           {"gpus", c.gpus}});
  }
  j["gemms"] = json::array();
  for (const GemmSample& g : s.gemms) {
    j["gemms"].push_back({{"m", g.shape.m},
                          {"n", g.shape.n},
                          {"k", g.shape.k},
                          {"batch", g.shape.batch},
                          {"dtype", sim::to_string(g.shape.dtype)},
                          {"seconds", g.seconds}});
  }
  j["memory_kernels"] = json::array();
  for (const MemoryKernelSample& k : s.memory_kernels) {
    j["memory_kernels"].push_back({{"bytes", k.bytes}, {"seconds", k.seconds}});
  }
  for (const auto* list : {&s.attention_fwd, &s.attention_bwd}) {
    json arr = json::array();
    for (const AttentionSample& a : *list) {
      arr.push_back({{"batch", a.shape.batch},
                     {"heads", a.shape.heads},
                     {"seq_q", a.shape.seq_q},
                     {"seq_kv", a.shape.seq_kv},
                     {"head_dim", a.shape.head_dim},
                     {"causal", a.shape.causal},
                     {"flops", a.flops},
                     {"seconds", a.seconds},
                     {"kernel", to_string(a.kernel)}});
    }
    j[list == &s.attention_fwd ? "attention_fwd" : "attention_bwd"] = arr;
  }
  j["collectives"] = json::array();
  for (const CollectiveSample& c : s.collectives) {
    j["collectives"].push_back({{"kind", sim::to_string(c.kind)},
                                {"ranks", c.ranks},
                                {"bytes", c.bytes},
                                {"seconds", c.seconds}});
  }
  j["interference"] = json::array();
  for (const InterferenceSample& i : s.interference) {
    j["interference"].push_back({{"what", i.what},
                                 {"copy_bytes", i.copy_bytes},
                                 {"kernel_bytes", i.kernel_bytes},
                                 {"copy_alone_s", i.copy_alone_s},
                                 {"kernel_alone_s", i.kernel_alone_s},
                                 {"copy_together_s", i.copy_together_s},
                                 {"kernel_together_s", i.kernel_together_s}});
  }
  j["allocator"] = json::array();
  for (const AllocatorSample& a : s.allocator) {
    j["allocator"].push_back(
        {{"requested_bytes", a.requested_bytes}, {"reserved_bytes", a.reserved_bytes}});
  }
  j["kernel_launch_s"] = s.kernel_launch_s;
  j["copy_submit_s"] = s.copy_submit_s;
  j["timings"] = json::array();
  for (const TimingRecord& t : s.timings) {
    j["timings"].push_back({{"what", t.what},
                            {"median_s", t.median_s},
                            {"min_s", t.min_s},
                            {"noise", t.noise},
                            {"samples", t.samples},
                            {"stable", t.stable}});
  }
  j["nvml_before"] = s.nvml_before;
  j["nvml_after"] = s.nvml_after;
  return j;
}

}  // namespace offsim::calibrate
