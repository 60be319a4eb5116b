#include "models/runtime.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>

namespace offsim::models {

namespace {

constexpr std::int64_t kKiB = 1024;
constexpr std::int64_t kMiB = 1024 * kKiB;

std::int64_t round_up(std::int64_t v, std::int64_t to) { return (v + to - 1) / to * to; }

// --- Figures ------------------------------------------------------------------------------------

// CUDA context (driver state and the module images loaded so far) with lazy module loading, the
// default since CUDA 11.7: "~300MB" (PyTorch maintainer, pytorch/pytorch#107667, 2023); before
// lazy loading it was over 1000 MB. No per-generation breakdown is published; the same figure is
// used for every GPU until `offsim calibrate` measures it.
constexpr std::int64_t kCudaContextBytes = 300 * kMiB;

// NCCL buffers of one connection (one peer on one channel), NCCL src/init.cc defaults:
// Simple NCCL_BUFFSIZE = 1 << 22 (4 MiB); LL = 8 lines × 512 threads × 8 steps × 16 B
// = 524,288 B; LL128 = 120 elements × 640 threads × 8 steps × 8 B = 4,915,200 B.
constexpr std::int64_t kNcclSimpleBytes = 4 * kMiB;
constexpr std::int64_t kNcclLlBytes = 8 * 512 * 8 * 16;
constexpr std::int64_t kNcclLl128Bytes = 120 * 640 * 8 * 8;
constexpr std::int64_t kNcclConnectionBytes = kNcclSimpleBytes + kNcclLlBytes + kNcclLl128Bytes;
// Channels NCCL opens per communicator: it picks them from the topology (NCCL_MIN_NCHANNELS /
// NCCL_MAX_NCHANNELS); assumed 16 inside an NVLink domain and 2 over PCIe or the network, with a
// ring's one receiving connection per channel on each GPU.
constexpr int kNcclChannelsNvlink = 16;
constexpr int kNcclChannelsOther = 2;

// PyTorch's cuBLAS workspace per handle and stream (aten/src/ATen/cuda/CublasHandlePool.cpp,
// CUBLAS_WORKSPACE_CONFIG defaults): ":4096:8" = 8 × 4 MiB = 32 MiB on Hopper and later (the
// cuBLAS documentation asks for 32 MiB there), ":4096:2:16:8" = 2 × 4 MiB + 8 × 16 KiB otherwise.
// GEMMs run on one stream (the compute lane), so one workspace.
constexpr std::int64_t kCublasWorkspaceHopper = 8 * 4 * kMiB;
constexpr std::int64_t kCublasWorkspaceOlder = 2 * 4 * kMiB + 8 * 16 * kKiB;

// PyTorch CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp): every size rounded up to
// a multiple of 512 B; requests up to 1 MiB come from 2 MiB segments (small pool), requests up
// to 10 MiB from 20 MiB segments, larger ones from segments of their size rounded up to 2 MiB; a
// cached block is split when the rest is at least 512 B (small) or more than 1 MiB (large).
// With expandable_segments one segment per pool grows in pages of 2 MiB (small) or 20 MiB
// (large).
constexpr std::int64_t kMinBlockSize = 512;
constexpr std::int64_t kSmallSize = 1 * kMiB;
constexpr std::int64_t kSmallBuffer = 2 * kMiB;
constexpr std::int64_t kLargeBuffer = 20 * kMiB;
constexpr std::int64_t kMinLargeAlloc = 10 * kMiB;
constexpr std::int64_t kRoundLarge = 2 * kMiB;

// JAX: "JAX will preallocate 75% of the total GPU memory" (XLA_PYTHON_CLIENT_MEM_FRACTION,
// docs.jax.dev GPU memory allocation); the pool is XLA's BFC allocator, whose allocations are
// multiples of 256 B (tsl BFCAllocator kMinAllocationSize).
constexpr double kJaxMemFraction = 0.75;
constexpr std::int64_t kBfcMinAllocation = 256;

// PyTorch takes the 32 MiB workspace on compute capability majors 9, 10, 11 and 12 (Hopper and
// every Blackwell part; CublasHandlePool.cpp `use32mb`), the smaller one before Hopper.
constexpr int kCublasWorkspaceHopperMajor = 9;

// --- Allocator replay ---------------------------------------------------------------------------

struct BlockRef {
  int pool = 0;
  std::size_t segment = 0;
  std::int64_t offset = 0;
  std::int64_t size = 0;
};

// One pool of segments with best-fit blocks, splitting and coalescing (the structure shared by
// the caching allocator and BFC).
class BlockPool {
 public:
  BlockPool(bool small, bool expandable, std::int64_t granularity)
      : small_(small), expandable_(expandable), granularity_(granularity) {}

  std::optional<BlockRef> take(std::int64_t size) {
    auto it = free_.lower_bound({size, 0, 0});
    if (it == free_.end()) return std::nullopt;
    const auto [block, seg, off] = *it;
    free_.erase(it);
    std::map<std::int64_t, Block>& blocks = segments_[seg].blocks;
    const std::int64_t rest = block - size;
    const bool split = small_ ? rest >= kMinBlockSize : rest > kSmallSize;
    const std::int64_t used = split || expandable_ ? size : block;
    blocks[off] = Block{used, true};
    if (used < block) {
      blocks[off + used] = Block{block - used, false};
      free_.insert({block - used, seg, off + used});
    }
    return BlockRef{0, seg, off, used};
  }

  void give_back(const BlockRef& p) {
    std::map<std::int64_t, Block>& blocks = segments_[p.segment].blocks;
    auto it = blocks.find(p.offset);
    it->second.used = false;
    // Coalesce with free neighbours of the same segment.
    if (auto next = std::next(it); next != blocks.end() && !next->second.used) {
      free_.erase({next->second.size, p.segment, next->first});
      it->second.size += next->second.size;
      blocks.erase(next);
    }
    if (it != blocks.begin()) {
      auto prev = std::prev(it);
      if (!prev->second.used) {
        free_.erase({prev->second.size, p.segment, prev->first});
        prev->second.size += it->second.size;
        blocks.erase(it);
        it = prev;
      }
    }
    free_.insert({it->second.size, p.segment, it->first});
  }

  // Bytes the pool must get from the driver to serve `size` now.
  std::int64_t growth_for(std::int64_t size) const {
    if (!expandable_) {
      if (small_) return kSmallBuffer;
      return size < kMinLargeAlloc ? kLargeBuffer : round_up(size, kRoundLarge);
    }
    const std::int64_t tail = tail_free();
    return round_up(size - tail, granularity_);
  }

  void grow(std::int64_t size) {
    const std::int64_t bytes = growth_for(size);
    reserved_ += bytes;
    if (!expandable_) {
      const std::size_t seg = segments_.size();
      segments_.push_back(Segment{bytes, {{0, Block{bytes, false}}}});
      free_.insert({bytes, seg, 0});
      return;
    }
    if (segments_.empty()) segments_.push_back(Segment{0, {}});
    Segment& s = segments_[0];
    std::map<std::int64_t, Block>& blocks = s.blocks;
    if (!blocks.empty() && !blocks.rbegin()->second.used) {
      auto last = std::prev(blocks.end());
      free_.erase({last->second.size, 0, last->first});
      last->second.size += bytes;
      free_.insert({last->second.size, 0, last->first});
    } else {
      blocks[s.size] = Block{bytes, false};
      free_.insert({bytes, 0, s.size});
    }
    s.size += bytes;
  }

  // Returns cached memory to the driver, as the allocator does before reporting out of memory:
  // whole free segments, or the free pages at the end of an expandable segment.
  void release_cached() {
    if (!expandable_) {
      for (std::size_t seg = 0; seg < segments_.size(); ++seg) {
        Segment& s = segments_[seg];
        if (s.size == 0 || s.blocks.size() != 1 || s.blocks.begin()->second.used) continue;
        free_.erase({s.size, seg, 0});
        reserved_ -= s.size;
        s.size = 0;
        s.blocks.clear();
      }
      return;
    }
    if (segments_.empty()) return;
    Segment& s = segments_[0];
    if (s.blocks.empty() || s.blocks.rbegin()->second.used) return;
    auto last = std::prev(s.blocks.end());
    const std::int64_t drop = last->second.size / granularity_ * granularity_;
    if (drop == 0) return;
    free_.erase({last->second.size, 0, last->first});
    last->second.size -= drop;
    if (last->second.size == 0) {
      s.blocks.erase(last);
    } else {
      free_.insert({last->second.size, 0, last->first});
    }
    s.size -= drop;
    reserved_ -= drop;
  }

  std::int64_t reserved() const { return reserved_; }

 private:
  struct Block {
    std::int64_t size = 0;
    bool used = false;
  };
  struct Segment {
    std::int64_t size = 0;
    std::map<std::int64_t, Block> blocks;  // by offset
  };
  std::int64_t tail_free() const {
    if (segments_.empty() || segments_[0].blocks.empty()) return 0;
    const Block& last = segments_[0].blocks.rbegin()->second;
    return last.used ? 0 : last.size;
  }

  bool small_;
  bool expandable_;
  std::int64_t granularity_;
  std::vector<Segment> segments_;
  std::set<std::tuple<std::int64_t, std::size_t, std::int64_t>> free_;  // size, segment, offset
  std::int64_t reserved_ = 0;
};

}  // namespace

RuntimeModel runtime_model(HardwareConfig::Runtime runtime, int compute_capability_major,
                           std::int64_t hbm_bytes, const std::vector<NcclCommunicator>& comms) {
  RuntimeModel rt;
  rt.runtime = runtime;
  rt.allocator_limit_bytes = hbm_bytes;
  if (runtime == HardwareConfig::Runtime::kNone) return rt;
  rt.cuda_context_bytes = kCudaContextBytes;
  for (const NcclCommunicator& c : comms) {
    if (c.ranks <= 1) continue;
    const int channels = c.nvlink ? kNcclChannelsNvlink : kNcclChannelsOther;
    rt.nccl_bytes += channels * kNcclConnectionBytes;
  }
  if (runtime == HardwareConfig::Runtime::kJax) {
    // XLA's own GEMM workspace comes out of the BFC pool per op; the pool is 75% of the HBM and
    // the context and NCCL live in the rest.
    rt.block_rounding_bytes = kBfcMinAllocation;
    rt.allocator_limit_bytes =
        static_cast<std::int64_t>(kJaxMemFraction * static_cast<double>(hbm_bytes));
    rt.preallocated = true;
    if (rt.cuda_context_bytes + rt.nccl_bytes > hbm_bytes - rt.allocator_limit_bytes) {
      rt.notes.push_back(fmt::format(
          "jax: CUDA context and NCCL buffers ({} MiB) exceed the 25% of HBM left outside the "
          "preallocated pool; lower XLA_PYTHON_CLIENT_MEM_FRACTION",
          (rt.cuda_context_bytes + rt.nccl_bytes) / kMiB));
    }
    return rt;
  }
  rt.block_rounding_bytes = kMinBlockSize;
  rt.cublas_workspace_bytes = compute_capability_major >= kCublasWorkspaceHopperMajor
                                  ? kCublasWorkspaceHopper
                                  : kCublasWorkspaceOlder;
  rt.allocator_limit_bytes = hbm_bytes - rt.cuda_context_bytes - rt.nccl_bytes;
  return rt;
}

std::int64_t rounded_allocation(const RuntimeModel& rt, std::int64_t bytes) {
  if (bytes <= 0) return bytes;
  return round_up(bytes, std::max<std::int64_t>(1, rt.block_rounding_bytes));
}

AllocatorReplay replay_allocator(const RuntimeModel& rt, const std::vector<AllocEvent>& events,
                                 std::int64_t limit_bytes) {
  AllocatorReplay out;
  const bool jax = rt.runtime == HardwareConfig::Runtime::kJax;
  const bool expandable = rt.runtime == HardwareConfig::Runtime::kPytorchExpandable;
  // BFC inside the preallocated region: one region, best fit with coalescing; its high-water
  // mark is what must fit in the pool. The caching allocator: a small and a large pool per
  // stream.
  std::vector<BlockPool> pools;
  std::map<std::pair<std::uint32_t, bool>, int> pool_of;  // (stream, small) -> pools index
  const auto pool_for = [&](std::uint32_t stream, bool small) {
    const auto key = jax ? std::make_pair(0u, false) : std::make_pair(stream, small);
    auto [it, added] = pool_of.try_emplace(key, static_cast<int>(pools.size()));
    if (added) {
      if (jax) {
        pools.emplace_back(false, true, kBfcMinAllocation);
      } else {
        pools.emplace_back(small, expandable, small ? kSmallBuffer : kLargeBuffer);
      }
    }
    return it->second;
  };
  const auto reserved = [&] {
    std::int64_t r = 0;
    for (const BlockPool& p : pools) r += p.reserved();
    return r;
  };
  std::unordered_map<std::uint32_t, BlockRef> live;
  std::int64_t allocated = 0;
  for (std::size_t i = 0; i < events.size(); ++i) {
    const AllocEvent& e = events[i];
    if (e.free) {
      auto it = live.find(e.tensor);
      if (it == live.end()) continue;
      pools[static_cast<std::size_t>(it->second.pool)].give_back(it->second);
      allocated -= it->second.size;
      live.erase(it);
      continue;
    }
    if (e.bytes <= 0) continue;
    const std::int64_t size = rounded_allocation(rt, e.bytes);
    const int pool_index = pool_for(e.stream, size <= kSmallSize);
    BlockPool& pool = pools[static_cast<std::size_t>(pool_index)];
    std::optional<BlockRef> p = pool.take(size);
    if (!p) {
      if (reserved() + pool.growth_for(size) > limit_bytes) {
        for (BlockPool& q : pools) q.release_cached();
        if (reserved() + pool.growth_for(size) > limit_bytes && out.first_failure < 0) {
          out.first_failure = static_cast<std::int64_t>(i);
          out.reserved_at_failure_bytes = reserved();
        }
      }
      pool.grow(size);  // past the limit too: the replay measures the demand
      p = pool.take(size);
    }
    p->pool = pool_index;
    allocated += p->size;
    live[e.tensor] = *p;
    out.allocated_peak_bytes = std::max(out.allocated_peak_bytes, allocated);
    out.reserved_peak_bytes = std::max(out.reserved_peak_bytes, reserved());
  }
  return out;
}

}  // namespace offsim::models
