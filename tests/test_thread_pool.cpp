#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "core/thread_pool.h"

namespace bev {
namespace {

TEST(ThreadPool, CoversEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 2, 7, 1000, 100003}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_for(n, 3, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << threads << " " << n;
    }
  }
}

TEST(ThreadPool, RethrowsAndStaysUsable) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for(100, 1, [](int64_t b, int64_t) {
    if (b >= 50) throw std::runtime_error("chunk failed");
  }), std::runtime_error);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(100, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 4950);
}

TEST(ThreadPool, ManyShortJobs) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  for (int r = 0; r < 2000; ++r) {
    pool.parallel_for(16, 1, [&](int64_t b, int64_t e) { total += e - b; });
  }
  EXPECT_EQ(total.load(), 2000 * 16);
}

}  // namespace
}  // namespace bev
