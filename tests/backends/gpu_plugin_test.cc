// The GPU module loader (backends/gpu_plugin.h): every way a module can fail to load gives an
// error that names the file and the reason, and the module of this build loads where it exists.
#include "backends/gpu_plugin.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

namespace offsim::backends {
namespace {

namespace fs = std::filesystem;

TEST(GpuPlugin, MissingFileIsNamed) {
  auto r = detail::load_gpu_plugin_file("/nonexistent/liboffsim_gpu.so");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, sim::ErrorCode::kNotFound);
  EXPECT_NE(r.error().message.find("/nonexistent/liboffsim_gpu.so"), std::string::npos);
}

TEST(GpuPlugin, NotASharedObjectIsRefused) {
  const fs::path path = fs::temp_directory_path() / "offsim_gpu_plugin_test_not_elf.so";
  {
    std::ofstream f(path);
    f << "this is not an ELF file\n";
  }
  auto r = detail::load_gpu_plugin_file(path.string());
  fs::remove(path);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("cannot load the GPU module"), std::string::npos);
  EXPECT_NE(r.error().message.find(path.string()), std::string::npos);
}

TEST(GpuPlugin, LibraryWithoutEntryPointIsRefused) {
  // libm is a real shared object with no offsim entry point.
  Dl_info info{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(static_cast<double (*)(double)>(&std::cos)), &info), 0);
  ASSERT_NE(info.dli_fname, nullptr);
  auto r = detail::load_gpu_plugin_file(info.dli_fname);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("is not an offsim GPU module"), std::string::npos)
      << r.error().message;
}

TEST(GpuPlugin, AnswersAccordingToTheBuild) {
  auto r = load_gpu_plugin();
  if (!gpu_plugin_built()) {
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, sim::ErrorCode::kUnsupported);
    EXPECT_NE(r.error().message.find("without CUDA"), std::string::npos);
    return;
  }
  // Built with CUDA: the module of this build tree loads (the CUDA libraries are where the
  // build found them) and carries this build's tag; without a GPU it lists no device.
  ASSERT_TRUE(r) << r.error().message;
  const GpuPlugin* plugin = *r;
  EXPECT_STREQ(plugin->build_tag, gpu_plugin_build_tag());
  ASSERT_NE(plugin->make_cuda_device, nullptr);
  ASSERT_NE(plugin->list_cuda_devices, nullptr);
  EXPECT_TRUE(gpu_plugin_symbol("offsim_gpu_plugin_v1"));
  EXPECT_FALSE(gpu_plugin_symbol("offsim_no_such_entry"));
}

}  // namespace
}  // namespace offsim::backends
