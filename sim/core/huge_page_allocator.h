// HugePageAllocator<T>: the allocator of the few arrays that grow with a step's size (a plan's
// ops, the engine's state per op). A step of a large pipeline holds hundreds of thousands of ops:
// a fresh plan is hundreds of MB that the kernel maps 4 KiB at a time on first touch, and those
// page faults were a quarter of a large step's evaluation. Blocks of at least 2 MiB are therefore
// 2 MiB-aligned and offered to the kernel as transparent huge pages (madvise MADV_HUGEPAGE on
// Linux, which takes effect where transparent huge pages are enabled or set to "madvise"), so
// that first touch costs one fault per 2 MiB. Smaller blocks, and other systems, use operator
// new. The contents are unaffected: only how the memory is mapped.
//
//   std::vector<Op, sim::HugePageAllocator<Op>> ops;
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace offsim::sim {

inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

template <class T>
class HugePageAllocator {
 public:
  using value_type = T;

  HugePageAllocator() noexcept = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>& /*other*/) noexcept {}  // NOLINT: rebinding

  T* allocate(std::size_t n) {
    // No object may exceed PTRDIFF_MAX bytes, rounded up to whole huge pages.
    constexpr std::size_t kMaxBytes =
        static_cast<std::size_t>(PTRDIFF_MAX) / kHugePageBytes * kHugePageBytes;
    if (n > kMaxBytes / sizeof(T)) throw std::bad_array_new_length();
    const std::size_t bytes = n * sizeof(T);
    if (bytes < kHugePageBytes) return static_cast<T*>(::operator new(bytes));
    const std::size_t rounded = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    void* p = std::aligned_alloc(kHugePageBytes, rounded);
    if (p == nullptr) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    // Advice only: where the kernel declines, the block is mapped in small pages as before.
    (void)::madvise(p, rounded, MADV_HUGEPAGE);
#endif
    return static_cast<T*>(p);
  }

  void deallocate(T* p, std::size_t n) noexcept {
    if (n * sizeof(T) < kHugePageBytes) {
      ::operator delete(p);
    } else {
      std::free(p);  // NOLINT(cppcoreguidelines-no-malloc): from std::aligned_alloc
    }
  }

  friend bool operator==(const HugePageAllocator& /*a*/, const HugePageAllocator& /*b*/) {
    return true;
  }
};

}  // namespace offsim::sim
