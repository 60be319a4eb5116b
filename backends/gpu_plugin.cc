#include "backends/gpu_plugin.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

#include <fmt/format.h>

namespace offsim::backends {
namespace {

namespace fs = std::filesystem;

constexpr const char* kModuleName = "liboffsim_gpu.so";
constexpr const char* kEntryName = "offsim_gpu_plugin_v1";

#define OFFSIM_STRINGIFY_(x) #x
#define OFFSIM_STRINGIFY(x) OFFSIM_STRINGIFY_(x)

std::vector<fs::path> candidates() {
  std::vector<fs::path> out;
  if (const char* env = std::getenv("OFFSIM_GPU_PLUGIN"); env != nullptr && *env != '\0') {
    out.emplace_back(env);
    return out;  // an explicit choice is the only one tried
  }
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path dir = exe.parent_path();
    out.push_back(dir / kModuleName);
    out.push_back(dir / ".." / "lib" / kModuleName);
    out.push_back(dir / ".." / "lib" / "offsim" / kModuleName);
  }
#ifdef OFFSIM_GPU_PLUGIN_BUILD_PATH
  out.emplace_back(OFFSIM_GPU_PLUGIN_BUILD_PATH);
#endif
  return out;
}

struct Loaded {
  void* handle = nullptr;
  const GpuPlugin* plugin = nullptr;
  std::string error;
};

// Loads one file: empty `error` on success, else what went wrong with it.
Loaded load_file(const fs::path& path) {
  Loaded loaded;
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    loaded.error = fmt::format(
        "cannot load the GPU module {}: {} (the CUDA 13 runtime, cuBLASLt and NCCL libraries "
        "must be on the library path, e.g. LD_LIBRARY_PATH=/usr/local/cuda/lib64)",
        path.string(), why != nullptr ? why : "unknown error");
    return loaded;
  }
  void* entry = dlsym(handle, kEntryName);
  if (entry == nullptr) {
    loaded.error = fmt::format("{} is not an offsim GPU module (it has no {} entry point)",
                               path.string(), kEntryName);
    dlclose(handle);
    return loaded;
  }
  using EntryFn = const GpuPlugin* (*)();
  EntryFn fn = nullptr;
  static_assert(sizeof fn == sizeof entry);
  std::memcpy(&fn, &entry, sizeof fn);
  const GpuPlugin* plugin = fn();
  if (plugin == nullptr || plugin->build_tag == nullptr ||
      std::strcmp(plugin->build_tag, gpu_plugin_build_tag()) != 0) {
    loaded.error = fmt::format(
        "{} comes from another build of offsim (module '{}', this program '{}'); use the "
        "module built with this offsim",
        path.string(), plugin != nullptr && plugin->build_tag != nullptr ? plugin->build_tag : "?",
        gpu_plugin_build_tag());
    dlclose(handle);
    return loaded;
  }
  loaded.handle = handle;
  loaded.plugin = plugin;
  return loaded;
}

Loaded load_once() {
  Loaded loaded;
  if (!gpu_plugin_built()) {
    loaded.error =
        "offsim was built without CUDA, so it has no GPU module (rebuild with nvcc available and "
        "OFFSIM_WITH_CUDA=AUTO or ON)";
    return loaded;
  }
  std::vector<std::string> tried;
  for (const fs::path& path : candidates()) {
    std::error_code ec;
    if (fs::is_regular_file(path, ec)) return load_file(path);
    tried.push_back(path.string());
  }
  std::string list;
  for (const std::string& t : tried) list += (list.empty() ? "" : ", ") + t;
  loaded.error = fmt::format(
      "the GPU module {} was not found (looked for: {}); set OFFSIM_GPU_PLUGIN to its path",
      kModuleName, list.empty() ? std::string("nowhere") : list);
  return loaded;
}

const Loaded& loaded() {
  static const Loaded instance = load_once();  // thread-safe initialisation, once
  return instance;
}

}  // namespace

const char* gpu_plugin_build_tag() {
  return "offsim " OFFSIM_STRINGIFY(OFFSIM_VERSION_STRING) " / " __VERSION__
#ifdef _GLIBCXX_RELEASE
                                                           " / libstdc++ " OFFSIM_STRINGIFY(
                                                               _GLIBCXX_RELEASE)
#endif
                                                               ;
}

bool gpu_plugin_built() {
#ifdef OFFSIM_GPU_PLUGIN_BUILT
  return true;
#else
  return false;
#endif
}

sim::Result<const GpuPlugin*> load_gpu_plugin() {
  const Loaded& l = loaded();
  if (l.plugin == nullptr) {
    return sim::fail(gpu_plugin_built() ? sim::ErrorCode::kNoDevice : sim::ErrorCode::kUnsupported,
                     "{}", l.error);
  }
  return l.plugin;
}

sim::Result<void*> gpu_plugin_symbol(const std::string& name) {
  if (auto plugin = load_gpu_plugin(); !plugin) return sim::fail(plugin.error());
  void* entry = dlsym(loaded().handle, name.c_str());
  if (entry == nullptr) {
    return sim::fail(sim::ErrorCode::kUnsupported, "the GPU module has no entry point {}", name);
  }
  return entry;
}

namespace detail {

sim::Result<const GpuPlugin*> load_gpu_plugin_file(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    return sim::fail(sim::ErrorCode::kNotFound, "the GPU module {} does not exist", path);
  }
  Loaded l = load_file(path);  // a successfully loaded module stays loaded
  if (l.plugin == nullptr) return sim::fail(sim::ErrorCode::kNoDevice, "{}", l.error);
  return l.plugin;
}

}  // namespace detail
}  // namespace offsim::backends
