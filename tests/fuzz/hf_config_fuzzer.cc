// Fuzzes the Hugging Face config.json importer.
#include <cstddef>
#include <cstdint>
#include <string>

#include "models/scenario.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto model = offsim::models::model_from_hf_config(text, "config.json");
  if (model) (void)offsim::models::parameter_count(*model);
  return 0;
}
