#include "backends/cuda/dynlib.h"

#include <dlfcn.h>

namespace offsim::backends::cuda {

DynamicLibrary& DynamicLibrary::operator=(DynamicLibrary&& other) noexcept {
  if (this != &other) {
    if (handle_) dlclose(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
    file_ = std::move(other.file_);
    what_ = std::move(other.what_);
  }
  return *this;
}

DynamicLibrary::~DynamicLibrary() {
  if (handle_) dlclose(handle_);
}

sim::Result<DynamicLibrary> DynamicLibrary::open(const std::string& file, const std::string& what) {
  dlerror();  // clears an earlier message
  void* h = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* why = dlerror();
    return sim::fail(sim::ErrorCode::kUnsupported, "{} ({}) could not be loaded: {}", what, file,
                     why ? why : "unknown reason");
  }
  DynamicLibrary lib;
  lib.handle_ = h;
  lib.file_ = file;
  lib.what_ = what;
  return lib;
}

sim::Result<void*> DynamicLibrary::symbol(const char* name) const {
  if (!handle_) {
    return sim::fail(sim::ErrorCode::kInternal, "symbol {} looked up in an unopened library", name);
  }
  dlerror();
  void* p = dlsym(handle_, name);
  if (!p) {
    const char* why = dlerror();
    return sim::fail(sim::ErrorCode::kUnsupported,
                     "{} ({}) has no symbol {} (too old a version?): {}", what_, file_, name,
                     why ? why : "null symbol");
  }
  return p;
}

}  // namespace offsim::backends::cuda
