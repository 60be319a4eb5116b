// The GPU module loader (backends/gpu_plugin.h): every way a module can fail to load gives an
// error that names the file and the reason, and the module of this build loads where it exists.
#include "backends/gpu_plugin.h"

#include <dlfcn.h>
#include <elf.h>
#include <gtest/gtest.h>
#include <link.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

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

// DT_NEEDED entries of an ELF64 shared object, read from the file: PT_DYNAMIC gives the dynamic
// section, DT_STRTAB its string table (a virtual address, mapped back through PT_LOAD).
std::vector<std::string> needed_libraries(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> out;
  if (bytes.size() < sizeof(Elf64_Ehdr)) return out;
  const char* base = bytes.data();
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(base);
  if (std::memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0) return out;
  const auto* ph = reinterpret_cast<const Elf64_Phdr*>(base + eh->e_phoff);
  auto file_offset = [&](Elf64_Addr vaddr) -> std::size_t {
    for (int i = 0; i < eh->e_phnum; ++i) {
      if (ph[i].p_type == PT_LOAD && vaddr >= ph[i].p_vaddr &&
          vaddr < ph[i].p_vaddr + ph[i].p_filesz) {
        return static_cast<std::size_t>(vaddr - ph[i].p_vaddr + ph[i].p_offset);
      }
    }
    return 0;
  };
  for (int i = 0; i < eh->e_phnum; ++i) {
    if (ph[i].p_type != PT_DYNAMIC) continue;
    const auto* dyn = reinterpret_cast<const Elf64_Dyn*>(base + ph[i].p_offset);
    const std::size_t count = ph[i].p_filesz / sizeof(Elf64_Dyn);
    std::size_t strtab = 0;
    for (std::size_t d = 0; d < count && dyn[d].d_tag != DT_NULL; ++d) {
      if (dyn[d].d_tag == DT_STRTAB) strtab = file_offset(dyn[d].d_un.d_ptr);
    }
    for (std::size_t d = 0; strtab && d < count && dyn[d].d_tag != DT_NULL; ++d) {
      if (dyn[d].d_tag == DT_NEEDED) out.emplace_back(base + strtab + dyn[d].d_un.d_val);
    }
  }
  return out;
}

bool process_has_loaded(const std::string& fragment) {
  struct Search {
    std::string fragment;
    bool found = false;
  } search{fragment};
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* arg) {
        auto* s = static_cast<Search*>(arg);
        if (info->dlpi_name && std::string(info->dlpi_name).find(s->fragment) != std::string::npos)
          s->found = true;
        return 0;
      },
      &search);
  return search.found;
}

TEST(GpuPlugin, ModuleNeedsNeitherNcclNorCudnnToLoad) {
  if (!gpu_plugin_built()) GTEST_SKIP() << "built without CUDA: no module";
  auto r = load_gpu_plugin();
  ASSERT_TRUE(r) << r.error().message;
  auto entry = gpu_plugin_symbol("offsim_gpu_plugin_v1");
  ASSERT_TRUE(entry);
  Dl_info info{};
  ASSERT_NE(dladdr(*entry, &info), 0);
  const std::vector<std::string> needed = needed_libraries(info.dli_fname);
  ASSERT_FALSE(needed.empty()) << "no DT_NEEDED read from " << info.dli_fname;
  bool cudart = false;
  for (const std::string& lib : needed) {
    EXPECT_EQ(lib.find("libnccl"), std::string::npos) << info.dli_fname << " needs " << lib;
    EXPECT_EQ(lib.find("libcudnn"), std::string::npos) << info.dli_fname << " needs " << lib;
    EXPECT_EQ(lib.find("libnvidia-ml"), std::string::npos) << info.dli_fname << " needs " << lib;
    if (lib.find("libcudart") != std::string::npos) cudart = true;
  }
  EXPECT_TRUE(cudart) << "the reader found no libcudart among " << needed.size() << " entries";
  // Loading the module (and listing devices, none here) opened no NCCL either.
  (*r)->list_cuda_devices();
  EXPECT_FALSE(process_has_loaded("libnccl"));
}

}  // namespace
}  // namespace offsim::backends
