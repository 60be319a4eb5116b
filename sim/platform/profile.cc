#include "sim/platform/profile.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <utility>

#include <fmt/ranges.h>

#include "sim/core/file_io.h"
#include "sim/core/json_reader.h"

namespace offsim::sim::platform {

using nlohmann::json;

const char* to_string(Origin origin) {
  switch (origin) {
    case Origin::kDatasheet:
      return "datasheet";
    case Origin::kPublished:
      return "published";
    case Origin::kAssumption:
      return "assumption";
    case Origin::kMeasured:
      return "measured";
  }
  return "?";
}

std::optional<Origin> origin_from_string(std::string_view name) {
  for (Origin o :
       {Origin::kDatasheet, Origin::kPublished, Origin::kAssumption, Origin::kMeasured}) {
    if (name == to_string(o)) return o;
  }
  return std::nullopt;
}

double interpolate_log(const std::vector<CurveKnot>& knots, double size) {
  OFFSIM_CHECK(!knots.empty());
  if (!(size > knots.front().size)) return knots.front().efficiency.value;
  if (size >= knots.back().size) return knots.back().efficiency.value;
  const double x = std::log(size);
  for (std::size_t i = 1; i < knots.size(); ++i) {
    if (size <= knots[i].size) {
      const double x0 = std::log(knots[i - 1].size);
      const double x1 = std::log(knots[i].size);
      const double y0 = knots[i - 1].efficiency.value;
      const double y1 = knots[i].efficiency.value;
      return y0 + (y1 - y0) * (x - x0) / (x1 - x0);
    }
  }
  return knots.back().efficiency.value;
}

namespace {

double gemm_flops(const GemmShape& s) {
  return 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k) *
         static_cast<double>(std::max<std::int64_t>(s.batch, 1));
}

// Fraction of the last tile that holds real output: d / (ceil(d / tile) · tile).
double tile_fill(std::int64_t d, double tile) {
  if (d <= 0 || !(tile >= 1.0)) return 1.0;
  const double t = std::floor(tile);
  const double tiles = std::ceil(static_cast<double>(d) / t);
  return static_cast<double>(d) / (tiles * t);
}

double log_distance(const GemmShape& a, const GemmPoint& b) {
  auto term = [](std::int64_t x, std::int64_t y) {
    const double d = std::log(static_cast<double>(std::max<std::int64_t>(x, 1))) -
                     std::log(static_cast<double>(std::max<std::int64_t>(y, 1)));
    return d * d;
  };
  return std::sqrt(term(a.m, b.m) + term(a.n, b.n) + term(a.k, b.k));
}

// Tile and wave quantization: useful output over the tile slots of the waves it occupies, for
// the better of the two tile orientations.
double wave_fill(std::int64_t m, std::int64_t n, std::int64_t batch, double sms, double tile_m,
                 double tile_n) {
  if (m <= 0 || n <= 0) return 1.0;
  const double useful = static_cast<double>(m) * static_cast<double>(n) *
                        static_cast<double>(std::max<std::int64_t>(batch, 1));
  double best = 0.0;
  for (const auto& [tm, tn] : {std::pair(tile_m, tile_n), std::pair(tile_n, tile_m)}) {
    const double tiles = std::ceil(static_cast<double>(m) / tm) *
                         std::ceil(static_cast<double>(n) / tn) *
                         static_cast<double>(std::max<std::int64_t>(batch, 1));
    const double waves = std::ceil(tiles / sms);
    best = std::max(best, useful / (waves * sms * tm * tn));
  }
  return best;
}

// Output tiles spread over the SMs stream-K style (CUTLASS's stream-K and cuBLAS's persistent
// kernels on Hopper and Blackwell): the T = ceil(m / tm) · ceil(n / tn) · batch tiles' main-loop
// iterations are divided evenly over the SMs, so a partial last wave costs no idle SMs, and
// fewer tiles than SMs are split along k. What it still costs: the padding of the last tile row
// and column (m and n rounded up to the tile), and a tile segment's prologue and epilogue (k0
// main-loop steps each, one per tile an SM touches: ceil(T / active) of them). An SM cannot take
// less than one k-block of a tile, so at most T · ceil(k / kStreamKBlock) SMs work. Fill =
// useful work over the SMs' time: m·n·k·batch / (S · tm·tn · (T·k / active + segments · k0)),
// for the better of the two tile orientations.
// k-block of one main-loop step: CUTLASS's SM90 and SM100 bf16 GEMM tiles are 128x256x64 and
// 256x128x64 (cutlass/examples/48_hopper_warp_specialized_gemm, 70_blackwell_gemm).
constexpr double kStreamKBlock = 64.0;

double stream_k_fill(const GemmShape& s, double sms, double tile_m, double tile_n, double k0) {
  if (s.m <= 0 || s.n <= 0 || s.k <= 0) return 1.0;
  const double batch = static_cast<double>(std::max<std::int64_t>(s.batch, 1));
  const double m = static_cast<double>(s.m);
  const double n = static_cast<double>(s.n);
  const double k = static_cast<double>(s.k);
  double best = 0.0;
  for (const auto& [tm, tn] : {std::pair(tile_m, tile_n), std::pair(tile_n, tile_m)}) {
    const double tiles_m = std::ceil(m / tm);
    const double tiles_n = std::ceil(n / tn);
    const double tiles = tiles_m * tiles_n * batch;
    const double active = std::min(sms, tiles * std::ceil(k / kStreamKBlock));
    const double segments = std::ceil(tiles / active);
    const double sm_steps = tiles * k / active + segments * std::max(k0, 0.0);
    best = std::max(best, m * n * k * batch / (sms * tm * tn * sm_steps));
  }
  return best;
}

}  // namespace

double GemmEfficiency::shape_factor(const GemmShape& shape) const {
  const double k0 = shape.dtype == DType::kFp8 && k_overhead_elements_fp8.value > 0.0
                        ? k_overhead_elements_fp8.value
                        : k_overhead_elements.value;
  const double sms = std::floor(sm_count.value);
  const double tm = std::floor(wave_tile_m.value);
  const double tn = std::floor(wave_tile_n.value);
  const bool waves = sms >= 1.0 && tm >= 1.0 && tn >= 1.0;
  if (waves && stream_k.value >= 0.5) return stream_k_fill(shape, sms, tm, tn, k0);
  double f = waves ? wave_fill(shape.m, shape.n, shape.batch, sms, tm, tn)
                   : tile_fill(shape.m, tile_size.value) * tile_fill(shape.n, tile_size.value);
  if (k0 > 0.0 && shape.k > 0) {
    const double k = static_cast<double>(shape.k);
    f *= k / (k + k0);
  }
  return f;
}

double GemmEfficiency::model_efficiency(const GemmShape& shape) const {
  double e = curve.empty() ? 1.0 : interpolate_log(curve, gemm_flops(shape));
  e *= shape_factor(shape);
  const auto r = static_cast<std::int64_t>(reference_dim.value);
  if (r >= 1) {
    const double ref = shape_factor({.m = r, .n = r, .k = r, .batch = 1, .dtype = shape.dtype});
    if (ref > 0.0) e /= ref;
    // The curve's top is the best GEMM of a shape sweep (MAMF: the maximum achievable over m, n
    // and k up to 16384): no shape runs faster, so a shape the factors favour over the reference
    // cube (a deeper k) is held at it.
    double top = 0.0;
    for (const CurveKnot& knot : curve) top = std::max(top, knot.efficiency.value);
    if (top > 0.0) e = std::min(e, top);
  }
  const auto align = static_cast<std::int64_t>(alignment_elements.value);
  if (align > 1 && (shape.m % align != 0 || shape.n % align != 0 || shape.k % align != 0)) {
    e *= misaligned_factor.value;
  }
  return e;
}

double GemmEfficiency::efficiency(const GemmShape& shape) const {
  const double model = model_efficiency(shape);
  double weight_sum = 0.0;
  double ratio_sum = 0.0;
  for (const GemmPoint& p : points) {
    if (p.dtype != shape.dtype) continue;
    const double d = log_distance(shape, p);
    if (d == 0.0) return p.efficiency.value;
    const double point_model = model_efficiency({.m = p.m, .n = p.n, .k = p.k, .dtype = p.dtype});
    if (!(point_model > 0.0)) continue;
    const double w = 1.0 / (d * d);
    weight_sum += w;
    ratio_sum += w * (p.efficiency.value / point_model);
  }
  const double e = weight_sum > 0.0 ? model * ratio_sum / weight_sum : model;
  return std::clamp(e, 1e-6, 1.0);
}

double AttentionEfficiency::flash(bool backward, double seq_kv) const {
  const Figure& single = backward ? flash_bwd : flash_fwd;
  const std::vector<CurveKnot>& curve = backward ? flash_bwd_by_seq : flash_fwd_by_seq;
  // A measured single figure beats a curve that is not measured (a calibration that sampled
  // one shape); a measured curve (calibrate's, through its samples) beats both.
  if (curve.empty() ||
      (single.origin == Origin::kMeasured && curve.front().efficiency.origin != Origin::kMeasured))
    return single.value;
  return interpolate_log(curve, seq_kv);
}

double AttentionEfficiency::flash2(bool backward, double seq_kv) const {
  const std::vector<CurveKnot>& curve = backward ? flash2_bwd_by_seq : flash2_fwd_by_seq;
  if (curve.empty()) return flash(backward, seq_kv);
  return interpolate_log(curve, seq_kv);
}

double GpuFigures::dense_flops(DType dtype) const {
  switch (dtype) {
    case DType::kBf16:
      return dense_flops_bf16.value;
    case DType::kFp16:
      return dense_flops_fp16.value;
    case DType::kFp8:
      return dense_flops_fp8.value;
    case DType::kFp32:
      return dense_flops_fp32.value;
  }
  return dense_flops_bf16.value;
}

int GpuFigures::compute_capability_major() const { return compute_capability_x10() / 10; }

int GpuFigures::compute_capability_x10() const {
  return static_cast<int>(std::lround(compute_capability.value * 10.0));
}

// ---------------------------------------------------------------------------------------------
// JSON. Each section is a table of (key, figure) so that writing, reading and the unknown-key
// check share one list.

namespace {

struct FigureField {
  const char* key;
  Figure* figure;
  bool is_fraction;  // must lie in [0, 1]
};

std::vector<FigureField> fields(GpuFigures& g) {
  return {{"hbm_usable_bytes", &g.hbm_usable_bytes, false},
          {"hbm_peak_bytes_per_s", &g.hbm_peak_bytes_per_s, false},
          {"hbm_achievable_bytes_per_s", &g.hbm_achievable_bytes_per_s, false},
          {"dense_flops_bf16", &g.dense_flops_bf16, false},
          {"dense_flops_fp16", &g.dense_flops_fp16, false},
          {"dense_flops_fp8", &g.dense_flops_fp8, false},
          {"dense_flops_fp32", &g.dense_flops_fp32, false},
          {"kernel_launch_s", &g.kernel_launch_s, false},
          {"compute_capability", &g.compute_capability, false}};
}
std::vector<FigureField> fields(AttentionEfficiency& a) {
  return {{"flash_fwd", &a.flash_fwd, true},
          {"flash_bwd", &a.flash_bwd, true},
          {"classic_fwd", &a.classic_fwd, true},
          {"classic_bwd", &a.classic_bwd, true}};
}
std::vector<FigureField> fields(HostLinkFigures& h) {
  return {{"h2d_bytes_per_s", &h.h2d_bytes_per_s, false},
          {"d2h_bytes_per_s", &h.d2h_bytes_per_s, false},
          {"duplex_bytes_per_s", &h.duplex_bytes_per_s, false},
          {"pageable_bytes_per_s", &h.pageable_bytes_per_s, false},
          {"latency_s", &h.latency_s, false},
          {"submit_overhead_s", &h.submit_overhead_s, false},
          {"switch_uplink_bytes_per_s", &h.switch_uplink_bytes_per_s, false},
          {"root_complex_bytes_per_s", &h.root_complex_bytes_per_s, false}};
}
std::vector<FigureField> fields(HostFigures& h) {
  return {{"dram_bytes_per_s_per_socket", &h.dram_bytes_per_s_per_socket, false},
          {"cores_per_socket", &h.cores_per_socket, false},
          {"adam_bytes_per_s_per_core", &h.adam_bytes_per_s_per_core, false},
          {"flops_per_s_per_core", &h.flops_per_s_per_core, false},
          {"remote_dram_time_ratio", &h.remote_dram_time_ratio, false}};
}
std::vector<FigureField> fields(NvlinkFigures& n) {
  return {{"bytes_per_s_per_gpu", &n.bytes_per_s_per_gpu, false},
          {"ring_all_gather_bus_bytes_per_s", &n.ring_all_gather_bus_bytes_per_s, false},
          {"ring_reduce_scatter_bus_bytes_per_s", &n.ring_reduce_scatter_bus_bytes_per_s, false},
          {"ring_all_reduce_bus_bytes_per_s", &n.ring_all_reduce_bus_bytes_per_s, false},
          {"nvls_all_reduce_bus_bytes_per_s", &n.nvls_all_reduce_bus_bytes_per_s, false},
          {"latency_s", &n.latency_s, false}};
}
std::vector<FigureField> fields(InterNodeFigures& n) {
  return {{"nic_bytes_per_s_per_gpu", &n.nic_bytes_per_s_per_gpu, false},
          {"efficiency", &n.efficiency, true},
          {"hop_latency_s", &n.hop_latency_s, false}};
}
std::vector<FigureField> fields(InterferenceFigures& i) {
  return {{"copy_hbm_bytes_per_byte", &i.copy_hbm_bytes_per_byte, false},
          {"nccl_compute_slowdown", &i.nccl_compute_slowdown, true}};
}
std::vector<FigureField> fields(AllocatorFigures& a) {
  return {{"overhead_fraction", &a.overhead_fraction, false},
          {"fixed_bytes", &a.fixed_bytes, false}};
}

// The figure sections of a profile, in file order.
template <class Fn>
void for_each_section(CalibrationProfile& p, Fn&& fn) {
  fn("gpu", fields(p.gpu));
  fn("attention", fields(p.attention));
  fn("host_link", fields(p.host_link));
  fn("host", fields(p.host));
  fn("nvlink", fields(p.nvlink));
  fn("inter_node", fields(p.inter_node));
  fn("interference", fields(p.interference));
  fn("allocator", fields(p.allocator));
}

json figure_to_json(const Figure& f) {
  return json{{"value", f.value}, {"origin", to_string(f.origin)}, {"source", f.source}};
}

json knots_to_json(const std::vector<CurveKnot>& knots) {
  json j = json::array();
  for (const CurveKnot& k : knots) {
    j.push_back(json{{"size", k.size}, {"efficiency", figure_to_json(k.efficiency)}});
  }
  return j;
}

json provenance_to_json(const Provenance& p) {
  return json{{"profile_name", p.profile_name},
              {"gpu_name", p.gpu_name},
              {"gpu_count", p.gpu_count},
              {"driver_version", p.driver_version},
              {"cuda_version", p.cuda_version},
              {"cublas_version", p.cublas_version},
              {"nccl_version", p.nccl_version},
              {"clocks", p.clocks},
              {"date", p.date},
              {"command_line", p.command_line},
              {"measured", p.measured}};
}

// ---------------------------------------------------------------------------------------------
// The physically plausible range of every profile figure, in one table. A figure outside its
// range is refused as "FILE: $.section.key.value: value X is outside [lo, hi] (what it is)".
// Lookup: the exact "section.key" first, then the first rule whose key pattern matches (so that
// a new figure named like its kind, e.g. "..._bytes_per_s", is checked without a new entry).
// Bounds are an order of magnitude or more outside every GPU and host of
// docs/reference hardware figures (shared reference hardware.md): they catch typos and units
// mistakes, not unusual machines.

struct FigureRange {
  const char* pattern;  // "section.key", or "*suffix" / "*infix*" on the key
  double lo;
  double hi;
  bool zero_ok;  // 0 means "absent" (no NVLink, no latency modelled, ...)
  const char* what;
};

constexpr FigureRange kFigureRanges[] = {
    // Exact keys.
    {"gpu.hbm_usable_bytes", 1e9, 1e13, false,
     "GPU memory in bytes; the largest GPUs have under 3e11"},
    {"gpu.dense_flops_bf16", 1e12, 1e17, false,
     "dense FLOP/s of one GPU; B200 is 2.25e15 in bf16, 4.5e15 in fp8"},
    {"gpu.dense_flops_fp16", 1e12, 1e17, false,
     "dense FLOP/s of one GPU; B200 is 2.25e15 in bf16, 4.5e15 in fp8"},
    {"gpu.dense_flops_fp8", 1e12, 1e17, false,
     "dense FLOP/s of one GPU; B200 is 2.25e15 in bf16, 4.5e15 in fp8"},
    {"gpu.dense_flops_fp32", 1e11, 1e17, false,
     "dense FLOP/s of one GPU; A100 fp32 without TF32 is 1.95e13"},
    {"gpu.compute_capability", 7.0, 12.9, false,
     "CUDA compute capability major.minor; A100 8.0, H100 9.0, B200 10.0, RTX 5090 12.0"},
    {"gpu.kernel_launch_s", 1e-8, 1e-2, true,
     "seconds between back-to-back kernels; measured 2-5 us on current GPUs"},
    {"host.cores_per_socket", 1.0, 1024.0, false,
     "CPU cores per socket; the largest server CPUs have under 300"},
    {"host.flops_per_s_per_core", 1e8, 1e13, false,
     "sustained fp32 FLOP/s of one CPU core; an AVX-512 core peaks near 1e11"},
    {"host.adam_bytes_per_s_per_core", 1e6, 1e12, false,
     "optimizer-state bytes per second one CPU core updates; measured 1e9-1e10"},
    {"host.remote_dram_time_ratio", 1.0, 10.0, false,
     "time per byte from another socket's DRAM over local DRAM; about 1.3-2 on servers"},
    {"interference.copy_hbm_bytes_per_byte", 0.0, 16.0, true,
     "HBM bytes that one copied byte costs; a read plus a write is 2"},
    {"interference.nccl_compute_slowdown", 0.0, 1.0, true,
     "fraction of SM throughput a collective takes"},
    {"allocator.overhead_fraction", 0.0, 1.0, true,
     "extra bytes per allocated byte; PyTorch's caching allocator wastes a few percent"},
    {"allocator.fixed_bytes", 0.0, 1e11, true,
     "bytes the CUDA context and libraries take; about 0.5-2 GiB"},
    {"gemm.tile_size", 1.0, 4096.0, false, "GEMM tile side in elements; 64-256 on current GPUs"},
    {"gemm.alignment_elements", 0.0, 4096.0, true,
     "GEMM dimension alignment in elements; 8 or 16 on current GPUs"},
    {"gemm.misaligned_factor", 1e-3, 1.0, false, "efficiency multiplier of a misaligned GEMM"},
    {"gemm.sm_count", 0.0, 4096.0, true, "streaming multiprocessors per GPU; B200 has 148"},
    {"gemm.wave_tile_m", 0.0, 4096.0, true, "output tile side of the wave model in elements"},
    {"gemm.wave_tile_n", 0.0, 4096.0, true, "output tile side of the wave model in elements"},
    {"gemm.k_overhead_elements", 0.0, 1e6, true, "GEMM depth-equivalent of a tile's prologue"},
    {"gemm.k_overhead_elements_fp8", 0.0, 1e6, true,
     "FP8 GEMM depth-equivalent of a tile's prologue"},
    {"gemm.reference_dim", 0.0, 1e6, true, "cube side of the curve's top GEMM, in elements"},
    {"gemm.stream_k", 0.0, 1.0, true, "1: stream-K tile scheduling, 0: whole waves of tiles"},
    {"gemm.curve.size", 1.0, 1e18, false, "GEMM FLOPs of a curve knot"},
    {"memory_bound.size", 1.0, 1e15, false, "bytes moved by a kernel at a curve knot"},
    {"attention_by_seq.flash_fwd.size", 1.0, 1e8, false, "a sequence length in tokens"},
    {"attention_by_seq.flash_bwd.size", 1.0, 1e8, false, "a sequence length in tokens"},
    {"attention_by_seq.flash2_fwd.size", 1.0, 1e8, false, "a sequence length in tokens"},
    {"attention_by_seq.flash2_bwd.size", 1.0, 1e8, false, "a sequence length in tokens"},
    // Kinds, by the key's name.
    {"*efficiency*", 1e-4, 1.0, false, "an efficiency: achieved over peak, in (0, 1]"},
    {"*_fwd", 1e-4, 1.0, false, "an efficiency: achieved over peak, in (0, 1]"},
    {"*_bwd", 1e-4, 1.0, false, "an efficiency: achieved over peak, in (0, 1]"},
    {"*bytes_per_s*", 1e6, 1e14, false,
     "a bandwidth in bytes/s; the fastest GPU memory (B200 HBM3e) is 8e12"},
    {"*flops*", 1e8, 1e17, false, "a FLOP rate in FLOP/s"},
    {"*latency_s", 1e-9, 1.0, true, "a latency in seconds; links and collectives take 1-100 us"},
    {"*overhead_s", 1e-9, 1.0, true, "a per-operation host cost in seconds; a few us"},
    {"*_s", 1e-9, 1e3, true, "a time in seconds"},
    {"*_bytes", 0.0, 1e15, true, "a byte count"},
    {"*fraction*", 0.0, 1.0, true, "a fraction in [0, 1]"},
};

// Zero is a valid value of these bandwidths: "absent" (no NVLink, no NVLink SHARP, no PCIe
// switch between the GPUs and the CPU).
bool zero_means_absent(std::string_view key) {
  return key == "nvlink.bytes_per_s_per_gpu" || key == "nvlink.nvls_all_reduce_bus_bytes_per_s" ||
         key == "nvlink.ring_all_gather_bus_bytes_per_s" ||
         key == "nvlink.ring_reduce_scatter_bus_bytes_per_s" ||
         key == "nvlink.ring_all_reduce_bus_bytes_per_s" ||
         key == "host_link.switch_uplink_bytes_per_s";
}

bool pattern_matches(std::string_view pattern, std::string_view key) {
  const auto name = key.substr(key.rfind('.') + 1);
  if (pattern.front() != '*') return pattern == key;
  pattern.remove_prefix(1);
  if (!pattern.empty() && pattern.back() == '*') {
    pattern.remove_suffix(1);
    return name.find(pattern) != std::string_view::npos;
  }
  return name.size() >= pattern.size() && name.substr(name.size() - pattern.size()) == pattern;
}

// "$.gemm.curve[3]" + "size" -> "gemm.curve.size"
std::string figure_key(const std::string& path, std::string_view key) {
  std::string out;
  for (std::size_t i = path.rfind("$.", 0) == 0 ? 2 : 0; i < path.size(); ++i) {
    if (path[i] == '[') {
      while (i < path.size() && path[i] != ']') ++i;
      continue;
    }
    out += path[i];
  }
  if (!out.empty()) out += '.';
  out += key;
  return out;
}

const FigureRange* figure_range(const std::string& key) {
  for (const FigureRange& r : kFigureRanges) {
    if (r.pattern[0] != '*' && key == r.pattern) return &r;
  }
  for (const FigureRange& r : kFigureRanges) {
    if (r.pattern[0] == '*' && pattern_matches(r.pattern, key)) return &r;
  }
  return nullptr;
}

std::string short_number(double x) { return fmt::format("{:.6g}", x); }

// The one check of a figure's value against its range; `path` is the JSON path of the value.
Status check_figure_range(const JsonReader& r, const std::string& key, const std::string& path,
                          double value) {
  const FigureRange* range = figure_range(key);
  if (range == nullptr) {
    // Not in the table: at least finite, non-negative and below 1e18.
    if (!(value >= 0.0 && value <= 1e18)) {
      return r.error(path, fmt::format("value {} is outside [0, 1e+18] (a profile figure)",
                                       short_number(value)));
    }
    return ok();
  }
  if (value == 0.0 && (range->zero_ok || zero_means_absent(key))) return ok();
  if (!(value >= range->lo && value <= range->hi)) {
    return r.error(
        path, fmt::format("value {} is outside [{}, {}]{} ({})", short_number(value),
                          short_number(range->lo), short_number(range->hi),
                          range->zero_ok || zero_means_absent(key) ? " or 0" : "", range->what));
  }
  return ok();
}

class ProfileReader {
 public:
  explicit ProfileReader(const std::string& source) : r_(source) {}

  // Every key of `allowed` is required except those in `optional`.
  Status keys(const json& object, const std::vector<std::string>& allowed, const std::string& path,
              const std::vector<std::string>& optional = {}) const {
    if (!object.is_object()) {
      return r_.error(path, fmt::format("expected an object, got {}", json_type_name(object)));
    }
    for (auto it = object.begin(); it != object.end(); ++it) {
      if (std::find(allowed.begin(), allowed.end(), it.key()) == allowed.end()) {
        return r_.error(path, fmt::format("unknown key '{}' (expected one of: {})", it.key(),
                                          fmt::join(allowed, ", ")));
      }
    }
    for (const std::string& key : allowed) {
      if (object.contains(key) ||
          std::find(optional.begin(), optional.end(), key) != optional.end()) {
        continue;
      }
      return r_.error(path, fmt::format("missing key '{}'", key));
    }
    return ok();
  }

  Result<Figure> figure(const json& parent, const char* key, const std::string& path,
                        bool is_fraction) const {
    const std::string p = path + "." + key;
    OFFSIM_ASSIGN_OR_RETURN(const json* j, r_.object(parent, key, path));
    OFFSIM_RETURN_IF_ERROR(keys(*j, {"value", "origin", "source"}, p));
    Figure f;
    OFFSIM_ASSIGN_OR_RETURN(f.value, r_.number(*j, "value", p));
    OFFSIM_RETURN_IF_ERROR(check_figure_range(r_, figure_key(path, key), p + ".value", f.value));
    if (f.value < 0.0) {
      return r_.error(p + ".value", fmt::format("expected a value >= 0, got {}", f.value));
    }
    if (is_fraction && f.value > 1.0) {
      return r_.error(p + ".value", fmt::format("expected a fraction in [0, 1], got {}", f.value));
    }
    OFFSIM_ASSIGN_OR_RETURN(std::string origin, r_.string(*j, "origin", p));
    const auto o = origin_from_string(origin);
    if (!o) {
      return r_.error(p + ".origin",
                      fmt::format("unknown origin '{}' (expected datasheet, published, "
                                  "assumption or measured)",
                                  origin));
    }
    f.origin = *o;
    OFFSIM_ASSIGN_OR_RETURN(f.source, r_.string(*j, "source", p));
    return f;
  }

  Result<std::vector<CurveKnot>> knots(const json& parent, const char* key,
                                       const std::string& path) const {
    const std::string p = path + "." + key;
    OFFSIM_ASSIGN_OR_RETURN(const json* arr, r_.array(parent, key, path));
    if (arr->empty()) return r_.error(p, "expected at least one knot");
    std::vector<CurveKnot> out;
    for (std::size_t i = 0; i < arr->size(); ++i) {
      const std::string kp = fmt::format("{}[{}]", p, i);
      const json& k = (*arr)[i];
      OFFSIM_RETURN_IF_ERROR(keys(k, {"size", "efficiency"}, kp));
      CurveKnot knot;
      OFFSIM_ASSIGN_OR_RETURN(knot.size, r_.number(k, "size", kp));
      OFFSIM_RETURN_IF_ERROR(
          check_figure_range(r_, figure_key(p, "size"), kp + ".size", knot.size));
      if (!(knot.size > 0.0)) {
        return r_.error(kp + ".size", fmt::format("expected a size > 0, got {}", knot.size));
      }
      if (!out.empty() && !(knot.size > out.back().size)) {
        return r_.error(kp + ".size",
                        fmt::format("expected sizes in increasing order ({} after {})", knot.size,
                                    out.back().size));
      }
      OFFSIM_ASSIGN_OR_RETURN(knot.efficiency, figure(k, "efficiency", kp, true));
      if (!(knot.efficiency.value > 0.0)) {
        return r_.error(kp + ".efficiency.value", "expected an efficiency > 0");
      }
      out.push_back(std::move(knot));
    }
    return out;
  }

  Result<std::vector<GemmPoint>> points(const json& parent, const std::string& path) const {
    const std::string p = path + ".points";
    OFFSIM_ASSIGN_OR_RETURN(const json* arr, r_.array(parent, "points", path));
    std::vector<GemmPoint> out;
    for (std::size_t i = 0; i < arr->size(); ++i) {
      const std::string pp = fmt::format("{}[{}]", p, i);
      const json& j = (*arr)[i];
      OFFSIM_RETURN_IF_ERROR(keys(j, {"m", "n", "k", "dtype", "efficiency"}, pp));
      GemmPoint g;
      OFFSIM_ASSIGN_OR_RETURN(g.m, r_.integer(j, "m", pp));
      OFFSIM_ASSIGN_OR_RETURN(g.n, r_.integer(j, "n", pp));
      OFFSIM_ASSIGN_OR_RETURN(g.k, r_.integer(j, "k", pp));
      if (g.m <= 0 || g.n <= 0 || g.k <= 0) {
        return r_.error(pp, fmt::format("expected m, n, k > 0, got {}x{}x{}", g.m, g.n, g.k));
      }
      OFFSIM_ASSIGN_OR_RETURN(std::string dtype, r_.string(j, "dtype", pp));
      const auto d = dtype_from_string(dtype);
      if (!d) {
        return r_.error(
            pp + ".dtype",
            fmt::format("unknown dtype '{}' (expected fp32, bf16, fp16 or fp8)", dtype));
      }
      g.dtype = *d;
      OFFSIM_ASSIGN_OR_RETURN(g.efficiency, figure(j, "efficiency", pp, true));
      if (!(g.efficiency.value > 0.0)) {
        return r_.error(pp + ".efficiency.value", "expected an efficiency > 0");
      }
      out.push_back(std::move(g));
    }
    return out;
  }

  Result<Provenance> provenance(const json& root) const {
    const std::string p = "$.provenance";
    OFFSIM_ASSIGN_OR_RETURN(const json* j, r_.object(root, "provenance", "$"));
    OFFSIM_RETURN_IF_ERROR(
        keys(*j,
             {"profile_name", "gpu_name", "gpu_count", "driver_version", "cuda_version",
              "cublas_version", "nccl_version", "clocks", "date", "command_line", "measured"},
             p));
    Provenance out;
    OFFSIM_ASSIGN_OR_RETURN(out.profile_name, r_.string(*j, "profile_name", p));
    OFFSIM_ASSIGN_OR_RETURN(out.gpu_name, r_.string(*j, "gpu_name", p));
    OFFSIM_ASSIGN_OR_RETURN(const std::int64_t count, r_.integer(*j, "gpu_count", p));
    if (count < 0 || count > 1'000'000) {
      return r_.error(p + ".gpu_count", fmt::format("expected a count >= 0, got {}", count));
    }
    out.gpu_count = static_cast<int>(count);
    OFFSIM_RETURN_IF_ERROR(versions(*j, p, out));
    OFFSIM_ASSIGN_OR_RETURN(const json* measured, r_.array(*j, "measured", p));
    for (std::size_t i = 0; i < measured->size(); ++i) {
      OFFSIM_ASSIGN_OR_RETURN(std::string m,
                              r_.as_string((*measured)[i], fmt::format("{}.measured[{}]", p, i)));
      out.measured.push_back(std::move(m));
    }
    return out;
  }

  const JsonReader& reader() const { return r_; }

 private:
  // The software versions, clocks, date and command line of a provenance block.
  Status versions(const json& j, const std::string& p, Provenance& out) const {
    OFFSIM_ASSIGN_OR_RETURN(out.driver_version, r_.string(j, "driver_version", p));
    OFFSIM_ASSIGN_OR_RETURN(out.cuda_version, r_.string(j, "cuda_version", p));
    OFFSIM_ASSIGN_OR_RETURN(out.cublas_version, r_.string(j, "cublas_version", p));
    OFFSIM_ASSIGN_OR_RETURN(out.nccl_version, r_.string(j, "nccl_version", p));
    OFFSIM_ASSIGN_OR_RETURN(out.clocks, r_.string(j, "clocks", p));
    OFFSIM_ASSIGN_OR_RETURN(out.date, r_.string(j, "date", p));
    OFFSIM_ASSIGN_OR_RETURN(out.command_line, r_.string(j, "command_line", p));
    return ok();
  }

 private:
  JsonReader r_;
};

}  // namespace

json profile_to_json(const CalibrationProfile& profile) {
  CalibrationProfile& p = const_cast<CalibrationProfile&>(profile);  // fields() is read-only here
  json j;
  j["format"] = "offsim-profile";
  j["format_version"] = kProfileFormatVersion;
  j["provenance"] = provenance_to_json(p.provenance);
  for_each_section(p, [&](const char* section, const std::vector<FigureField>& fs) {
    json s = json::object();
    for (const FigureField& f : fs) s[f.key] = figure_to_json(*f.figure);
    j[section] = std::move(s);
  });
  json points = json::array();
  for (const GemmPoint& g : p.gemm.points) {
    points.push_back(json{{"m", g.m},
                          {"n", g.n},
                          {"k", g.k},
                          {"dtype", to_string(g.dtype)},
                          {"efficiency", figure_to_json(g.efficiency)}});
  }
  j["gemm"] = json{{"points", std::move(points)},
                   {"curve", knots_to_json(p.gemm.curve)},
                   {"tile_size", figure_to_json(p.gemm.tile_size)},
                   {"alignment_elements", figure_to_json(p.gemm.alignment_elements)},
                   {"misaligned_factor", figure_to_json(p.gemm.misaligned_factor)},
                   {"sm_count", figure_to_json(p.gemm.sm_count)},
                   {"wave_tile_m", figure_to_json(p.gemm.wave_tile_m)},
                   {"wave_tile_n", figure_to_json(p.gemm.wave_tile_n)},
                   {"k_overhead_elements", figure_to_json(p.gemm.k_overhead_elements)},
                   {"k_overhead_elements_fp8", figure_to_json(p.gemm.k_overhead_elements_fp8)},
                   {"reference_dim", figure_to_json(p.gemm.reference_dim)},
                   {"stream_k", figure_to_json(p.gemm.stream_k)}};
  j["memory_bound"] = knots_to_json(p.memory_bound);
  if (!p.attention.flash_fwd_by_seq.empty() || !p.attention.flash_bwd_by_seq.empty()) {
    j["attention_by_seq"] = json{{"flash_fwd", knots_to_json(p.attention.flash_fwd_by_seq)},
                                 {"flash_bwd", knots_to_json(p.attention.flash_bwd_by_seq)}};
    if (!p.attention.flash2_fwd_by_seq.empty() || !p.attention.flash2_bwd_by_seq.empty()) {
      j["attention_by_seq"]["flash2_fwd"] = knots_to_json(p.attention.flash2_fwd_by_seq);
      j["attention_by_seq"]["flash2_bwd"] = knots_to_json(p.attention.flash2_bwd_by_seq);
    }
  }
  return j;
}

namespace {

// The document kind, top-level keys, format name and version.
Status read_header(const ProfileReader& pr, const json& root, CalibrationProfile& out) {
  const JsonReader& r = pr.reader();
  // Another of offsim's files given where a profile is expected: say which.
  if (const std::string kind = json_document_kind(root);
      !kind.empty() && kind.rfind("a calibration profile", 0) != 0) {
    return r.error("$", fmt::format("this is {}, expected a calibration profile (write one with "
                                    "offsim calibrate --out)",
                                    kind));
  }
  std::vector<std::string> top = {"format", "format_version", "provenance",
                                  "gemm",   "memory_bound",   "attention_by_seq"};
  for_each_section(out, [&](const char* section, const std::vector<FigureField>&) {
    top.emplace_back(section);
  });
  // Added after format 1 was first written: optional (the single flash figures when absent).
  OFFSIM_RETURN_IF_ERROR(pr.keys(root, top, "$", {"attention_by_seq"}));
  OFFSIM_ASSIGN_OR_RETURN(const std::string format, r.string(root, "format", "$"));
  if (format != "offsim-profile") {
    return r.error("$.format", fmt::format("expected \"offsim-profile\", got \"{}\"", format));
  }
  OFFSIM_ASSIGN_OR_RETURN(const std::int64_t version, r.integer(root, "format_version", "$"));
  if (version != kProfileFormatVersion) {
    return r.error("$.format_version",
                   fmt::format("expected {}, got {}", kProfileFormatVersion, version));
  }
  return ok();
}

// One figure section (gpu, host_link, ...): its keys and every figure.
Status read_section(const ProfileReader& pr, const json& root, const char* section,
                    const std::vector<FigureField>& fs) {
  const std::string path = std::string("$.") + section;
  OFFSIM_ASSIGN_OR_RETURN(const json* obj, pr.reader().object(root, section, "$"));
  std::vector<std::string> allowed;
  for (const FigureField& f : fs) allowed.emplace_back(f.key);
  // Added after format 1 was first written: optional, 1 (no remote-DRAM penalty) when absent.
  const std::vector<std::string> optional = {"remote_dram_time_ratio"};
  OFFSIM_RETURN_IF_ERROR(pr.keys(*obj, allowed, path, optional));
  for (const FigureField& f : fs) {
    if (!obj->contains(f.key) && f.key == std::string_view("remote_dram_time_ratio")) {
      *f.figure = Figure{.value = 1.0,
                         .origin = Origin::kAssumption,
                         .source = "absent from the profile: no remote-DRAM penalty"};
      continue;
    }
    OFFSIM_ASSIGN_OR_RETURN(*f.figure, pr.figure(*obj, f.key, path, f.is_fraction));
  }
  return ok();
}

Status read_sections(const ProfileReader& pr, const json& root, CalibrationProfile& out) {
  Status status = ok();
  for_each_section(out, [&](const char* section, const std::vector<FigureField>& fs) {
    if (status) status = read_section(pr, root, section, fs);
  });
  return status;
}

// The GEMM efficiency points and curve, and the tile, alignment and wave-quantization figures.
Status read_gemm(const ProfileReader& pr, const json& root, GemmEfficiency& out) {
  const JsonReader& r = pr.reader();
  OFFSIM_ASSIGN_OR_RETURN(const json* gemm, r.object(root, "gemm", "$"));
  OFFSIM_RETURN_IF_ERROR(
      pr.keys(*gemm,
              {"points", "curve", "tile_size", "alignment_elements", "misaligned_factor",
               "sm_count", "wave_tile_m", "wave_tile_n", "k_overhead_elements",
               "k_overhead_elements_fp8", "reference_dim", "stream_k"},
              "$.gemm",
              {"sm_count", "wave_tile_m", "wave_tile_n", "k_overhead_elements",
               "k_overhead_elements_fp8", "reference_dim", "stream_k"}));
  OFFSIM_ASSIGN_OR_RETURN(out.points, pr.points(*gemm, "$.gemm"));
  OFFSIM_ASSIGN_OR_RETURN(out.curve, pr.knots(*gemm, "curve", "$.gemm"));
  OFFSIM_ASSIGN_OR_RETURN(out.tile_size, pr.figure(*gemm, "tile_size", "$.gemm", false));
  if (!(out.tile_size.value >= 1.0)) {
    return r.error("$.gemm.tile_size.value", "expected a tile size >= 1 element");
  }
  OFFSIM_ASSIGN_OR_RETURN(out.alignment_elements,
                          pr.figure(*gemm, "alignment_elements", "$.gemm", false));
  OFFSIM_ASSIGN_OR_RETURN(out.misaligned_factor,
                          pr.figure(*gemm, "misaligned_factor", "$.gemm", true));
  if (!(out.misaligned_factor.value > 0.0)) {
    return r.error("$.gemm.misaligned_factor.value", "expected a factor in (0, 1]");
  }
  // Added after format 1 was first written: optional, 0 (the older model) when absent.
  for (const auto& [key, figure] :
       {std::pair("sm_count", &out.sm_count), std::pair("wave_tile_m", &out.wave_tile_m),
        std::pair("wave_tile_n", &out.wave_tile_n),
        std::pair("k_overhead_elements", &out.k_overhead_elements),
        std::pair("k_overhead_elements_fp8", &out.k_overhead_elements_fp8),
        std::pair("reference_dim", &out.reference_dim), std::pair("stream_k", &out.stream_k)}) {
    if (!gemm->contains(key)) continue;
    OFFSIM_ASSIGN_OR_RETURN(*figure, pr.figure(*gemm, key, "$.gemm", false));
    // Counts and tile sides are converted to integers: keep them in a sane range.
    if (!(figure->value <= 1e6)) {
      return r.error(fmt::format("$.gemm.{}.value", key), "expected a value <= 1e6");
    }
  }
  return ok();
}

// Figures a model divides by must be positive; a GPU with NVLink needs its ring bandwidths.
Status check_positive(const JsonReader& r, const CalibrationProfile& out) {
  const std::pair<const char*, double> positive[] = {
      {"$.gpu.hbm_usable_bytes", out.gpu.hbm_usable_bytes.value},
      {"$.gpu.hbm_peak_bytes_per_s", out.gpu.hbm_peak_bytes_per_s.value},
      {"$.gpu.hbm_achievable_bytes_per_s", out.gpu.hbm_achievable_bytes_per_s.value},
      {"$.gpu.dense_flops_bf16", out.gpu.dense_flops_bf16.value},
      {"$.gpu.dense_flops_fp16", out.gpu.dense_flops_fp16.value},
      {"$.gpu.dense_flops_fp8", out.gpu.dense_flops_fp8.value},
      {"$.gpu.dense_flops_fp32", out.gpu.dense_flops_fp32.value},
      {"$.attention.flash_fwd", out.attention.flash_fwd.value},
      {"$.attention.flash_bwd", out.attention.flash_bwd.value},
      {"$.attention.classic_fwd", out.attention.classic_fwd.value},
      {"$.attention.classic_bwd", out.attention.classic_bwd.value},
      {"$.host_link.h2d_bytes_per_s", out.host_link.h2d_bytes_per_s.value},
      {"$.host_link.d2h_bytes_per_s", out.host_link.d2h_bytes_per_s.value},
      {"$.host_link.duplex_bytes_per_s", out.host_link.duplex_bytes_per_s.value},
      {"$.host_link.pageable_bytes_per_s", out.host_link.pageable_bytes_per_s.value},
      {"$.host_link.root_complex_bytes_per_s", out.host_link.root_complex_bytes_per_s.value},
      {"$.host.dram_bytes_per_s_per_socket", out.host.dram_bytes_per_s_per_socket.value},
      {"$.host.cores_per_socket", out.host.cores_per_socket.value},
      {"$.host.adam_bytes_per_s_per_core", out.host.adam_bytes_per_s_per_core.value},
      {"$.host.flops_per_s_per_core", out.host.flops_per_s_per_core.value},
      {"$.inter_node.nic_bytes_per_s_per_gpu", out.inter_node.nic_bytes_per_s_per_gpu.value},
      {"$.inter_node.efficiency", out.inter_node.efficiency.value},
  };
  for (const auto& [path, value] : positive) {
    if (!(value > 0.0)) return r.error(std::string(path) + ".value", "expected a value > 0");
  }
  if (out.nvlink.bytes_per_s_per_gpu.value > 0.0 &&
      !(out.nvlink.ring_all_gather_bus_bytes_per_s.value > 0.0 &&
        out.nvlink.ring_reduce_scatter_bus_bytes_per_s.value > 0.0 &&
        out.nvlink.ring_all_reduce_bus_bytes_per_s.value > 0.0)) {
    return r.error("$.nvlink", "a GPU with NVLink needs ring bus bandwidths > 0");
  }
  // major.minor with one digit of minor, as NVIDIA numbers its architectures.
  const double cc10 = out.gpu.compute_capability.value * 10.0;
  if (std::abs(cc10 - std::round(cc10)) > 1e-6) {
    return r.error("$.gpu.compute_capability.value",
                   fmt::format("expected major.minor with one digit of minor (8.0, 8.9, 9.0, "
                               "10.0), got {}",
                               short_number(out.gpu.compute_capability.value)));
  }
  return ok();
}

// Figures that cannot exceed another figure of the same profile (a rate above the peak it is
// measured against): refused with both key paths and the allowed range.
Status check_consistent(const JsonReader& r, const CalibrationProfile& out) {
  struct Bound {
    const char* path;
    double value;
    const char* limit_path;
    double limit;
    const char* what;
  };
  const auto& g = out.gpu;
  const auto& nv = out.nvlink;
  const double line = nv.bytes_per_s_per_gpu.value;
  std::vector<Bound> bounds = {
      {"$.gpu.hbm_achievable_bytes_per_s", g.hbm_achievable_bytes_per_s.value,
       "$.gpu.hbm_peak_bytes_per_s", g.hbm_peak_bytes_per_s.value,
       "an achieved HBM bandwidth cannot exceed the peak"},
      {"$.gpu.dense_flops_fp32", g.dense_flops_fp32.value, "$.gpu.dense_flops_bf16",
       g.dense_flops_bf16.value, "fp32 (TF32) tensor-core rates are at most the bf16 rate"},
  };
  if (line > 0.0) {
    // nccl-tests bus bandwidth of a ring counts the bytes each GPU sends per direction: at most
    // the NVLink line rate. NVLink SHARP's bus bandwidth is algbw · 2(n-1)/n with algbw at most
    // the line rate: below twice the line rate.
    bounds.push_back({"$.nvlink.ring_all_gather_bus_bytes_per_s",
                      nv.ring_all_gather_bus_bytes_per_s.value, "$.nvlink.bytes_per_s_per_gpu",
                      line, "a ring's bus bandwidth cannot exceed the NVLink line rate"});
    bounds.push_back({"$.nvlink.ring_reduce_scatter_bus_bytes_per_s",
                      nv.ring_reduce_scatter_bus_bytes_per_s.value, "$.nvlink.bytes_per_s_per_gpu",
                      line, "a ring's bus bandwidth cannot exceed the NVLink line rate"});
    bounds.push_back({"$.nvlink.ring_all_reduce_bus_bytes_per_s",
                      nv.ring_all_reduce_bus_bytes_per_s.value, "$.nvlink.bytes_per_s_per_gpu",
                      line, "a ring's bus bandwidth cannot exceed the NVLink line rate"});
    bounds.push_back({"$.nvlink.nvls_all_reduce_bus_bytes_per_s",
                      nv.nvls_all_reduce_bus_bytes_per_s.value, "2 x $.nvlink.bytes_per_s_per_gpu",
                      2.0 * line, "NVLink SHARP moves each byte over the line once"});
  }
  for (const Bound& b : bounds) {
    if (b.value > b.limit * (1.0 + 1e-12)) {
      return r.error(
          std::string(b.path) + ".value",
          fmt::format("value {} is outside [0, {}] (at most {}: {})", short_number(b.value),
                      short_number(b.limit), b.limit_path, b.what));
    }
  }
  return ok();
}

}  // namespace

Result<CalibrationProfile> profile_from_json(const json& root, const std::string& source) {
  ProfileReader pr(source);
  CalibrationProfile out;
  OFFSIM_RETURN_IF_ERROR(read_header(pr, root, out));
  OFFSIM_ASSIGN_OR_RETURN(out.provenance, pr.provenance(root));
  OFFSIM_RETURN_IF_ERROR(read_sections(pr, root, out));
  OFFSIM_RETURN_IF_ERROR(read_gemm(pr, root, out.gemm));
  OFFSIM_ASSIGN_OR_RETURN(out.memory_bound, pr.knots(root, "memory_bound", "$"));
  if (root.contains("attention_by_seq")) {
    const std::string p = "$.attention_by_seq";
    OFFSIM_ASSIGN_OR_RETURN(const json* a, pr.reader().object(root, "attention_by_seq", "$"));
    // The FlashAttention-2 curves came later: optional, both or neither.
    OFFSIM_RETURN_IF_ERROR(pr.keys(*a, {"flash_fwd", "flash_bwd", "flash2_fwd", "flash2_bwd"}, p,
                                   {"flash2_fwd", "flash2_bwd"}));
    OFFSIM_ASSIGN_OR_RETURN(out.attention.flash_fwd_by_seq, pr.knots(*a, "flash_fwd", p));
    OFFSIM_ASSIGN_OR_RETURN(out.attention.flash_bwd_by_seq, pr.knots(*a, "flash_bwd", p));
    if (a->contains("flash2_fwd") != a->contains("flash2_bwd")) {
      return pr.reader().error(p, "flash2_fwd and flash2_bwd go together: give both or neither");
    }
    if (a->contains("flash2_fwd")) {
      OFFSIM_ASSIGN_OR_RETURN(out.attention.flash2_fwd_by_seq, pr.knots(*a, "flash2_fwd", p));
      OFFSIM_ASSIGN_OR_RETURN(out.attention.flash2_bwd_by_seq, pr.knots(*a, "flash2_bwd", p));
    }
  }
  OFFSIM_RETURN_IF_ERROR(check_positive(pr.reader(), out));
  OFFSIM_RETURN_IF_ERROR(check_consistent(pr.reader(), out));
  return out;
}

Result<CalibrationProfile> profile_from_json_text(const std::string& text,
                                                  const std::string& source) {
  OFFSIM_ASSIGN_OR_RETURN(const json root, parse_json_text(text, source));
  return profile_from_json(root, source);
}

Result<CalibrationProfile> read_profile_file(const std::string& path) {
  OFFSIM_ASSIGN_OR_RETURN(const std::string text, read_input_file(path, kProfileInput));
  return profile_from_json_text(text, path);
}

Status write_profile_file(const std::string& path, const CalibrationProfile& profile) {
  return write_text_file_atomic(path, profile_to_json(profile).dump(2) + "\n");
}

namespace {

// Sweeps ask for the same default profile thousands of times: keep parsed files, keyed by path
// and re-read when the file's size or modification time changes.
Result<CalibrationProfile> read_profile_cached(const std::filesystem::path& path) {
  struct Entry {
    std::filesystem::file_time_type mtime;
    std::uintmax_t size = 0;
    CalibrationProfile profile;
  };
  static std::mutex mutex;
  static std::map<std::string, Entry> cache;
  std::error_code ec;
  const auto mtime = std::filesystem::last_write_time(path, ec);
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return read_profile_file(path.string());
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(path.string());
    if (it != cache.end() && it->second.mtime == mtime && it->second.size == size) {
      return it->second.profile;
    }
  }
  OFFSIM_ASSIGN_OR_RETURN(CalibrationProfile loaded, read_profile_file(path.string()));
  std::lock_guard<std::mutex> lock(mutex);
  cache[path.string()] = Entry{mtime, size, loaded};
  return loaded;
}

}  // namespace

Result<CalibrationProfile> default_profile(std::string_view gpu_kind) {
  OFFSIM_ASSIGN_OR_RETURN(CalibrationProfile builtin, builtin_profile(gpu_kind));
  std::vector<std::filesystem::path> dirs;
  if (const char* env = std::getenv("OFFSIM_PROFILE_DIR"); env != nullptr && *env != '\0') {
    dirs.emplace_back(env);
  }
#ifdef OFFSIM_SOURCE_DIR
  dirs.push_back(std::filesystem::path(OFFSIM_SOURCE_DIR) / "calibrate" / "profiles");
#endif
#ifdef OFFSIM_INSTALL_PROFILE_DIR
  dirs.emplace_back(OFFSIM_INSTALL_PROFILE_DIR);
#endif
  // An installed tree: <prefix>/bin/offsim next to <prefix>/share/offsim/profiles.
  {
    std::error_code ec;
    const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (!ec) dirs.push_back(exe.parent_path().parent_path() / "share" / "offsim" / "profiles");
  }
  const std::string file = std::string(gpu_kind) + ".json";
  for (const auto& dir : dirs) {
    std::error_code ec;
    const auto path = dir / file;
    if (std::filesystem::is_regular_file(path, ec)) {
      OFFSIM_ASSIGN_OR_RETURN(CalibrationProfile loaded, read_profile_cached(path));
      if (loaded.provenance.profile_name != gpu_kind) {
        return fail(ErrorCode::kInvalidInput,
                    "{}: $.provenance.profile_name: expected \"{}\" (the file name), got \"{}\"",
                    path.string(), gpu_kind, loaded.provenance.profile_name);
      }
      return loaded;
    }
  }
  return builtin;
}

}  // namespace offsim::sim::platform
