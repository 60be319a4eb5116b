// DynamicLibrary: a shared library opened with dlopen on first use, whose symbols are looked up
// by name, with every failure returned as an error naming the library, the symbol and dlerror().
// The CUDA module loads NCCL (nccl_api.h) and cuDNN (cudnn_api.h) this way, so that
// liboffsim_gpu.so itself links neither and runs one-GPU replays where they are missing.
//
//   OFFSIM_ASSIGN_OR_RETURN(cuda::DynamicLibrary lib,
//                           cuda::DynamicLibrary::open("libnccl.so.2", "NCCL"));
//   ncclResult_t (*get_version)(int*) = nullptr;
//   OFFSIM_RETURN_IF_ERROR(lib.bind("ncclGetVersion", get_version));
#pragma once

#include <string>
#include <utility>

#include "sim/core/result.h"

namespace offsim::backends::cuda {

class DynamicLibrary {
 public:
  DynamicLibrary() = default;
  DynamicLibrary(DynamicLibrary&& other) noexcept
      : handle_(std::exchange(other.handle_, nullptr)),
        file_(std::move(other.file_)),
        what_(std::move(other.what_)) {}
  DynamicLibrary& operator=(DynamicLibrary&& other) noexcept;
  DynamicLibrary(const DynamicLibrary&) = delete;
  DynamicLibrary& operator=(const DynamicLibrary&) = delete;
  ~DynamicLibrary();

  // dlopen(file, RTLD_NOW | RTLD_LOCAL). `what` names the library in errors ("NCCL").
  // Not found: kUnsupported, "NCCL (libnccl.so.2) could not be loaded: <dlerror>".
  static sim::Result<DynamicLibrary> open(const std::string& file, const std::string& what);

  // Looks `name` up; kUnsupported naming the library and the symbol when it is missing.
  sim::Result<void*> symbol(const char* name) const;
  template <typename Fn>
  sim::Status bind(const char* name, Fn*& out) const {
    OFFSIM_ASSIGN_OR_RETURN(void* p, symbol(name));
    out = reinterpret_cast<Fn*>(p);
    return sim::ok();
  }

  const std::string& file() const { return file_; }
  bool loaded() const { return handle_ != nullptr; }

 private:
  void* handle_ = nullptr;
  std::string file_;
  std::string what_;
};

}  // namespace offsim::backends::cuda
