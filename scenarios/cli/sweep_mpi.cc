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
  std::int64_t first = 0;
  int open_code = 0;
  std::optional<scenarios::ResultsFile> out;
  if (rank == 0) {
    if (p.to_stdout) {
      std::fputs((p.header + "\n").c_str(), stdout);
    } else if (auto f = scenarios::ResultsFile::open(p.file_spec, p.mode)) {
      first = f->rows_done();
      out.emplace(std::move(*f));
    } else {
      fmt::print(stderr, "offsim: error: {}\n", f.error().message);
      open_code = exit_code(f.error());
      first = -1;
    }
  }
  MPI_Bcast(&first, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  if (first < 0) return finish(rank == 0 ? open_code : 1);

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
  sim::Status status = sim::ok();
  for (std::int64_t k = 0; k < n; ++k) {
    const int owner = static_cast<int>(k % size);
    std::string row;
    if (owner == 0) {
      row = local.pop();
    } else {
      MPI_Status st;
      MPI_Probe(owner, kRowTag, MPI_COMM_WORLD, &st);
      int bytes = 0;
      MPI_Get_count(&st, MPI_CHAR, &bytes);
      row.resize(static_cast<std::size_t>(bytes));
      MPI_Recv(row.data(), bytes, MPI_CHAR, owner, kRowTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    if (status) {
      if (out) {
        std::vector<std::string> one = {std::move(row)};
        status = out->append(one);
      } else {
        std::fputs((row + "\n").c_str(), stdout);
      }
    }
    progress.update(k + 1);
  }
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
