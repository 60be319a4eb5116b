#include "scenarios/cli/sweep_mpi.h"

#include <mpi.h>

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "scenarios/progress.h"

namespace offsim::cli {
namespace {

constexpr int kRowTag = 1;

int exit_code(const sim::Error& error) {
  return error.code == sim::ErrorCode::kInvalidInput || error.code == sim::ErrorCode::kNotFound ||
                 error.code == sim::ErrorCode::kLimitExceeded
             ? 2
             : 1;
}

// Rank 0's own rows, produced on a background thread and consumed in order by the writer.
class LocalRows {
 public:
  void push(std::vector<std::string>& rows) {
    {
      std::lock_guard lock(mu_);
      for (std::string& r : rows) rows_.push_back(std::move(r));
    }
    cv_.notify_one();
  }
  std::string pop() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !rows_.empty(); });
    std::string row = std::move(rows_.front());
    rows_.pop_front();
    return row;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> rows_;
};

// Rank 0's output: the results file (opened or resumed) or stdout, and the first row to
// evaluate; first is -1 when the file could not be opened (code: the exit code).
struct Output {
  std::int64_t first = 0;
  int code = 0;
  std::optional<scenarios::ResultsFile> file;
};

Output open_output(const scenarios::PreparedSweep& p) {
  Output out;
  if (p.to_stdout) {
    std::fputs((p.header + "\n").c_str(), stdout);
  } else if (auto f = scenarios::ResultsFile::open(p.file_spec, p.mode)) {
    out.first = f->rows_done();
    out.file.emplace(std::move(*f));
  } else {
    fmt::print(stderr, "offsim: error: {}\n", f.error().message);
    out.code = exit_code(f.error());
    out.first = -1;
  }
  return out;
}

// A row sent by another rank (its length from the probe).
std::string receive_row(int owner) {
  MPI_Status st;
  MPI_Probe(owner, kRowTag, MPI_COMM_WORLD, &st);
  int bytes = 0;
  MPI_Get_count(&st, MPI_CHAR, &bytes);
  std::string row(static_cast<std::size_t>(bytes), '\0');
  MPI_Recv(row.data(), bytes, MPI_CHAR, owner, kRowTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  return row;
}

// Rank 0 writes the n rows in order: its own from `local`, the others' as they arrive. After a
// write error the remaining rows are still received (the other ranks block on their sends).
sim::Status write_rows(std::int64_t n, int size, LocalRows& local, Output& out,
                       scenarios::Progress& progress) {
  sim::Status status = sim::ok();
  for (std::int64_t k = 0; k < n; ++k) {
    const int owner = static_cast<int>(k % size);
    std::string row = owner == 0 ? local.pop() : receive_row(owner);
    if (status) {
      if (out.file) {
        std::vector<std::string> one = {std::move(row)};
        status = out.file->append(one);
      } else {
        std::fputs((row + "\n").c_str(), stdout);
      }
    }
    progress.update(k + 1);
  }
  return status;
}

}  // namespace

int run_sweep_mpi(const scenarios::ScenarioFile& file, const scenarios::SweepRunOptions& options) {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  auto finish = [](int code) {
    MPI_Finalize();
    return code;
  };

  auto prepared = scenarios::prepare_sweep(file, options);
  if (!prepared) {
    if (rank == 0) fmt::print(stderr, "offsim: error: {}\n", prepared.error().message);
    return finish(exit_code(prepared.error()));
  }
  const scenarios::PreparedSweep& p = *prepared;
  const auto total = static_cast<std::int64_t>(p.points.size());

  // Rank 0 opens or resumes the file and tells everyone where to start (-1: it failed).
  Output out = rank == 0 ? open_output(p) : Output{};
  std::int64_t first = out.first;
  MPI_Bcast(&first, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  if (first < 0) return finish(rank == 0 ? out.code : 1);

  // Row k (0-based after the resumed ones) belongs to rank k % size.
  const std::int64_t n = total - first;
  std::vector<std::int64_t> mine;
  for (std::int64_t k = rank; k < n; k += size) mine.push_back(first + k);
  auto work = [&](std::int64_t j) { return p.row(mine[static_cast<std::size_t>(j)]); };
  const auto count = static_cast<std::int64_t>(mine.size());

  if (rank != 0) {
    auto send = [&](std::int64_t, std::vector<std::string>& rows) -> sim::Status {
      for (const std::string& row : rows) {
        MPI_Send(row.data(), static_cast<int>(row.size()), MPI_CHAR, 0, kRowTag, MPI_COMM_WORLD);
      }
      return sim::ok();
    };
    auto st = scenarios::run_ordered(count, options.jobs, work, send);
    return finish(st ? 0 : 1);
  }

  LocalRows local;
  std::thread producer([&] {
    auto keep = [&](std::int64_t, std::vector<std::string>& rows) -> sim::Status {
      local.push(rows);
      return sim::ok();
    };
    (void)scenarios::run_ordered(count, options.jobs, work, keep);
  });
  scenarios::Progress progress(n, options.progress, options.progress_interval_s);
  const sim::Status status = write_rows(n, size, local, out, progress);
  producer.join();
  progress.finish(n);
  if (!status) {
    fmt::print(stderr, "offsim: error: {}\n", status.error().message);
    return finish(1);
  }
  if (options.progress) {
    fmt::print(stderr, "offsim: sweep over {} MPI ranks: {} already done, {} evaluated\n", size,
               first, n);
  }
  return finish(0);
}

}  // namespace offsim::cli
