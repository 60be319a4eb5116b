// Fuzzes the two readers of sweep result files: `offsim sweep --resume` (which must refuse or
// continue, never crash) and the GUI's sweep explorer parsers (JSON lines and CSV).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "gui/model/sweep_model.h"
#include "scenarios/results_file.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace offsim;
  const std::string text(reinterpret_cast<const char*>(data), size);
  (void)gui::parse_sweep_jsonl(text, "fuzz.jsonl");
  (void)gui::parse_sweep_csv(text, "fuzz.csv");

  char path[] = "/tmp/offsim-sweep-fuzz-XXXXXX";
  const int fd = ::mkstemp(path);
  if (fd < 0) return 0;
  if (::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    ::close(fd);
    ::unlink(path);
    return 0;
  }
  ::close(fd);
  scenarios::ResultsFile::Spec spec;
  spec.path = path;
  spec.expected_rows = 4;
  spec.expected_key = [](std::int64_t row) {
    return "{\"axes\":{\"training.micro_batch\":" + std::to_string(row + 1) +
           "},\"index\":" + std::to_string(row) + "}";
  };
  spec.row_key = scenarios::jsonl_row_key();
  {
    auto file = scenarios::ResultsFile::open(spec, scenarios::OpenMode::kResume);
    if (file && file->rows_done() < 4) (void)file->append({"{\"index\": 99}"});
  }
  ::unlink(path);
  return 0;
}
