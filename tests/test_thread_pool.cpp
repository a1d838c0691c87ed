#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

namespace bev {
namespace {

// Every test runs on both kinds: threads of the pool's own, and the caller's OpenMP team.
class ThreadPoolKinds : public ::testing::TestWithParam<ThreadPool::Threads> {};

TEST_P(ThreadPoolKinds, CoversEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads, GetParam());
    for (int64_t n : {1, 2, 7, 1000, 100003}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_for(n, 3, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << threads << " " << n;
    }
  }
}

TEST_P(ThreadPoolKinds, RethrowsAndStaysUsable) {
  ThreadPool pool(3, GetParam());
  EXPECT_THROW(pool.parallel_for(100, 1, [](int64_t b, int64_t) {
    if (b >= 50) throw std::runtime_error("chunk failed");
  }), std::runtime_error);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(100, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 4950);
}

TEST_P(ThreadPoolKinds, IndexedChunksRunOnePerParticipantAtATime) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads, GetParam());
    std::vector<std::atomic<int>> busy(static_cast<size_t>(pool.size()));
    std::atomic<int64_t> covered{0};
    std::atomic<bool> ok{true};
    pool.parallel_for_indexed(10000, 7, [&](int64_t b, int64_t e, int participant) {
      if (participant < 0 || participant >= pool.size()) {
        ok = false;
        return;
      }
      // Per-participant scratch is safe only if no two chunks share a participant at once.
      if (busy[static_cast<size_t>(participant)].fetch_add(1) != 0) ok = false;
      std::this_thread::yield();  // give another participant the chance to collide
      covered += e - b;
      busy[static_cast<size_t>(participant)].fetch_sub(1);
    });
    EXPECT_TRUE(ok.load()) << threads;
    EXPECT_EQ(covered.load(), 10000) << threads;
  }
}

TEST(FunctionRef, CallsTheReferencedCallable) {
  int calls = 0;
  auto add = [&calls](int a, int b) {
    ++calls;
    return a + b;
  };
  const FunctionRef<int(int, int)> f = add;
  EXPECT_EQ(f(2, 3), 5);
  const std::function<int(int, int)> g = [](int a, int b) { return a * b; };
  const FunctionRef<int(int, int)> h = g;  // a std::function is a callable too
  EXPECT_EQ(h(2, 3), 6);
  const FunctionRef<int(int, int)> copy = f;  // copies refer to the same callable
  EXPECT_EQ(copy(1, 1), 2);
  EXPECT_EQ(calls, 2);
}

TEST_P(ThreadPoolKinds, ManyShortJobs) {
  ThreadPool pool(2, GetParam());
  std::atomic<int64_t> total{0};
  for (int r = 0; r < 2000; ++r) {
    pool.parallel_for(16, 1, [&](int64_t b, int64_t e) { total += e - b; });
  }
  EXPECT_EQ(total.load(), 2000 * 16);
}

// Several threads share one pool (frames of different streams preparing at once): each job still
// covers its own range exactly once, and nobody hangs.
TEST_P(ThreadPoolKinds, ConcurrentCallersTakeTurns) {
  ThreadPool pool(3, GetParam());
  constexpr int kCallers = 4, kJobs = 300;
  std::vector<std::atomic<int64_t>> sums(kCallers);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int r = 0; r < kJobs; ++r) {
        pool.parallel_for(37 + c, 1, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) sums[static_cast<size_t>(c)] += i + 1;
        });
      }
    });
  }
  for (auto& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) {
    const int64_t n = 37 + c;
    EXPECT_EQ(sums[static_cast<size_t>(c)].load(), kJobs * n * (n + 1) / 2) << "caller " << c;
  }
}

}  // namespace
INSTANTIATE_TEST_SUITE_P(Kinds, ThreadPoolKinds, ::testing::Values(ThreadPool::Threads::kOwn, ThreadPool::Threads::kOpenMP),
                         [](const auto& p) { return std::string(p.param == ThreadPool::Threads::kOwn ? "own" : "openmp"); });

}  // namespace bev
