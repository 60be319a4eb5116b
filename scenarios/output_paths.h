// Output files of a command, checked and reserved before any work.
//
// reserve() refuses, naming the option and the user's path: a directory, an existing file that
// is not a regular file (a device, a FIFO), an extension the output's format does not have,
// the same file as one of the command's inputs (compared by device and inode, so that
// "x.yaml", "./x.yaml" and a hard link all match) or as another output of the same command; then
// it creates the output's temporary file beside it, so that an unwritable folder fails before
// simulating. write() fills a temporary, commit() renames every temporary into place only after
// all were written, and the destructor removes the temporaries of an output set that was not
// committed: a failed second output leaves no first output behind. Errors name the user's path,
// never the temporary file.
//
//   scenarios::OutputFiles outputs({"ex.yaml"});
//   OFFSIM_RETURN_IF_ERROR(outputs.reserve("--trace", "step.json", {".json"}));
//   ... simulate ...
//   OFFSIM_RETURN_IF_ERROR(outputs.write("step.json", trace_text));
//   OFFSIM_RETURN_IF_ERROR(outputs.commit());
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "sim/core/result.h"

namespace offsim::scenarios {

// Checks an output path without creating anything: the checks of OutputFiles::reserve. For
// outputs that their writer creates itself (the sweep result file). `extensions` empty: any.
sim::Status check_output_path(const std::string& flag, const std::string& path,
                              std::initializer_list<std::string_view> extensions,
                              const std::vector<std::string>& inputs);

class OutputFiles {
 public:
  // `inputs`: the files the command reads; an output may not be one of them.
  explicit OutputFiles(std::vector<std::string> inputs);
  ~OutputFiles();
  OutputFiles(const OutputFiles&) = delete;
  OutputFiles& operator=(const OutputFiles&) = delete;

  // Checks `path` (given with option `flag`) and creates its temporary file. An empty path is
  // no output and is accepted without effect.
  sim::Status reserve(const std::string& flag, const std::string& path,
                      std::initializer_list<std::string_view> extensions);
  // Writes `contents` into the reserved output's temporary file and flushes it to disk.
  sim::Status write(const std::string& path, const std::string& contents);
  // Renames every written temporary into place; outputs never written are dropped.
  sim::Status commit();

 private:
  struct Output {
    std::string flag;
    std::string path;
    std::string tmp;
    int fd = -1;
    bool written = false;
  };
  void discard();

  std::vector<std::string> inputs_;
  std::vector<Output> outputs_;
};

}  // namespace offsim::scenarios
