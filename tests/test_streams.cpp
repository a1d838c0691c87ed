// The stream registry: bounded (LRU past max_streams, TTL for idle streams), the reset rules
// (time gap, timestamp not increasing), and many streams from several threads, each with the
// history it would have had alone.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <cstring>
#include <thread>

#include "backend/backend.h"
#include "model/synthetic.h"
#include "runtime/streams.h"
#include "engine_test_util.h"

namespace bev {
namespace {

struct FakeClock {
  double now = 1000;
  std::function<double()> fn() {
    return [this] { return now; };
  }
};

bool has(const std::vector<StreamInfo>& list, const std::string& id) {
  for (const auto& s : list) {
    if (s.id == id) return true;
  }
  return false;
}

TEST(Streams, LeastRecentlyUsedIsEvictedPastTheLimit) {
  FakeClock clock;
  StreamRegistry reg({.max_streams = 3, .idle_ttl_seconds = 1e9, .max_gap_seconds = 10}, clock.fn());
  for (const char* id : {"a", "b", "c"}) {
    clock.now += 1;
    reg.acquire(id);
  }
  clock.now += 1;
  reg.acquire("a");  // a is now the most recent; b the least
  clock.now += 1;
  reg.acquire("d");
  const auto list = reg.list();
  EXPECT_EQ(list.size(), 3u);
  EXPECT_TRUE(has(list, "a") && has(list, "c") && has(list, "d"));
  EXPECT_FALSE(has(list, "b"));
  EXPECT_EQ(reg.stats().evicted_lru, 1u);
  EXPECT_EQ(reg.stats().created, 4u);
}

TEST(Streams, IdleStreamsExpire) {
  FakeClock clock;
  StreamRegistry reg({.max_streams = 10, .idle_ttl_seconds = 60, .max_gap_seconds = 10}, clock.fn());
  reg.acquire("old");
  clock.now += 30;
  reg.acquire("young");
  clock.now += 45;  // old idle 75 s, young 45 s
  reg.acquire("new");
  const auto list = reg.list();
  EXPECT_FALSE(has(list, "old"));
  EXPECT_TRUE(has(list, "young") && has(list, "new"));
  EXPECT_EQ(reg.stats().evicted_ttl, 1u);
}

TEST(Streams, BusyStreamsAreNeverEvictedAndAFullRegistrySaysSo) {
  FakeClock clock;
  StreamRegistry reg({.max_streams = 2, .idle_ttl_seconds = 0, .max_gap_seconds = 10}, clock.fn());
  auto a = reg.acquire("a");
  auto b = reg.acquire("b");
  clock.now += 100;
  try {
    reg.acquire("c");
    FAIL() << "a third stream fit into two busy slots";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBusy);
    EXPECT_NE(std::string(e.what()).find("busy"), std::string::npos) << e.what();
  }
  EXPECT_EQ(reg.list().size(), 2u);
}

TEST(Streams, GapsAndNonIncreasingTimestampsResetHistory) {
  StreamRegistry reg({.max_streams = 4, .idle_ttl_seconds = 1e9, .max_gap_seconds = 2.0});
  auto lease = reg.acquire("car");
  EXPECT_EQ(lease.begin_frame(10.0, "s"), "");
  lease.history().state.has_prev_bev = true;  // as a completed frame leaves it
  lease.end_frame(10.0);
  EXPECT_EQ(lease.begin_frame(11.5, "s"), "");
  EXPECT_TRUE(lease.history().state.has_prev_bev);
  lease.end_frame(11.5);
  EXPECT_NE(lease.begin_frame(14.0, "s").find("time gap"), std::string::npos);
  EXPECT_FALSE(lease.history().state.has_prev_bev);
  lease.history().state.has_prev_bev = true;
  lease.end_frame(14.0);
  EXPECT_NE(lease.begin_frame(13.0, "s").find("did not increase"), std::string::npos);
  EXPECT_FALSE(lease.history().state.has_prev_bev);
  EXPECT_EQ(reg.stats().resets_gap, 1u);
  EXPECT_EQ(reg.stats().resets_backwards, 1u);
}

// A stream past its TTL is gone from a listing at once, not only when another stream arrives.
TEST(Streams, ExpiredStreamsLeaveTheListingWithoutNewArrivals) {
  double now = 0;
  StreamRegistry reg({.max_streams = 4, .idle_ttl_seconds = 10, .max_gap_seconds = 2.0}, [&] { return now; });
  { auto lease = reg.acquire("car"); }
  EXPECT_EQ(reg.list().size(), 1u);
  now = 11;
  EXPECT_TRUE(reg.list().empty());
  EXPECT_EQ(reg.stats().evicted_ttl, 1u);
  EXPECT_EQ(reg.stats().active, 0u);
}

TEST(Streams, DropForgetsAStream) {
  StreamRegistry reg;
  reg.acquire("x");
  EXPECT_TRUE(reg.drop("x"));
  EXPECT_FALSE(reg.drop("x"));
  EXPECT_TRUE(reg.list().empty());
  EXPECT_THROW(reg.acquire(""), Error);
}

// A listing reads what the last lease published, so concurrent listings (a server's handoff
// handler beside a worker's sequence check) never see each other as a running frame, and a
// stream whose frame runs shows the frames it completed. Before, a listing that met another
// one's momentary hold reported the stream busy with 0 frames, and a fleet server refused a
// handed-over sequence as unknown.
TEST(Streams, ListingsNeverHideAStreamsFramesFromEachOther) {
  StreamRegistry reg;
  for (int k = 0; k < 3; ++k) {
    auto lease = reg.acquire("car");
    lease.begin_frame(k * 0.5, "s");
    lease.end_frame(k * 0.5);
  }
  std::atomic<int> wrong{0};
  auto lister = [&] {
    for (int i = 0; i < 20000; ++i) {
      for (const StreamInfo& s : reg.list()) {
        if (s.busy || s.frames != 3 || s.last_timestamp != 1.0) ++wrong;
      }
    }
  };
  std::thread a(lister), b(lister);
  lister();
  a.join();
  b.join();
  EXPECT_EQ(wrong.load(), 0);
  {
    auto lease = reg.acquire("car");  // a frame runs: busy, with the frames completed before it
    lease.begin_frame(1.5, "s");
    const std::vector<StreamInfo> during = reg.list();
    ASSERT_EQ(during.size(), 1u);
    EXPECT_TRUE(during[0].busy);
    EXPECT_EQ(during[0].frames, 3u);
    lease.end_frame(1.5);
  }
  const std::vector<StreamInfo> after = reg.list();
  ASSERT_EQ(after.size(), 1u);
  EXPECT_FALSE(after[0].busy);
  EXPECT_EQ(after[0].frames, 4u);
  EXPECT_EQ(after[0].last_timestamp, 1.5);
}

// Four streams of three frames each, from four threads through one model: every stream's BEV
// equals what it gives when run alone, in order.
TEST(Streams, ConcurrentStreamsKeepTheirOwnHistory) {
  const ModelConfig cfg = load_config(std::string(BEV_SHARED_DIR) + "/golden/micro/config.json");
  auto backend = make_cpu_backend(2, Precision::kF32);
  const Checkpoint ck = random_checkpoint(cfg, 21);
  testing::LoadedModel model(cfg, ck, *backend);
  constexpr int kStreams = 4, kFrames = 3;
  auto frame = [&](int s, int k) {
    FrameInput f = synthetic_frame(cfg, 100 + static_cast<uint64_t>(s), k);
    f.scene_token = "scene-" + std::to_string(s);
    return f;
  };
  std::vector<std::vector<Tensor>> alone(kStreams);
  for (int s = 0; s < kStreams; ++s) {
    StreamHistory h;
    for (int k = 0; k < kFrames; ++k) alone[s].push_back(model.forward(frame(s, k), h).bev_embed);
  }
  StreamRegistry reg;
  std::vector<std::vector<Tensor>> together(kStreams, std::vector<Tensor>(kFrames));
  std::vector<std::thread> threads;
  for (int s = 0; s < kStreams; ++s) {
    threads.emplace_back([&, s] {
      for (int k = 0; k < kFrames; ++k) {
        auto lease = reg.acquire("car-" + std::to_string(s));
        lease.begin_frame(k * 0.5, "scene-" + std::to_string(s));
        together[s][k] = model.forward(frame(s, k), lease.history()).bev_embed;
        lease.end_frame(k * 0.5);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int s = 0; s < kStreams; ++s) {
    for (int k = 0; k < kFrames; ++k) {
      ASSERT_EQ(together[s][k].shape(), alone[s][k].shape());
      EXPECT_EQ(std::memcmp(together[s][k].raw_data(), alone[s][k].raw_data(), alone[s][k].nbytes()), 0)
          << "stream " << s << " frame " << k;
    }
  }
  EXPECT_EQ(reg.stats().active, static_cast<size_t>(kStreams));
}

}  // namespace
}  // namespace bev

namespace bev {
namespace {

// A full table keeps every stream: N vehicles round after round in a table of N never evict
// (until 2026-12-07 an existing stream's frame evicted another: N - 1 were held, and a table of
// one answered its only client busy from the second frame).
TEST(Streams, AFullTableKeepsEveryStream) {
  for (const size_t n : {size_t{1}, size_t{2}, size_t{64}}) {
    FakeClock clock;
    StreamRegistry reg({.max_streams = n, .idle_ttl_seconds = 1e9, .max_gap_seconds = 10}, clock.fn());
    for (int round = 0; round < 5; ++round) {
      for (size_t v = 0; v < n; ++v) {
        clock.now += 0.01;
        StreamRegistry::Lease lease = reg.acquire("vehicle " + std::to_string(v));
        EXPECT_EQ(lease.frames(), static_cast<uint64_t>(round)) << n << " streams, round " << round << ", vehicle " << v;
        EXPECT_EQ(lease.begin_frame(100.0 + round, "scene"), "");
        lease.history().state.has_prev_bev = true;  // as the engine leaves it
        lease.end_frame(100.0 + round);
      }
    }
    EXPECT_EQ(reg.stats().evicted_lru, 0u) << n;
    EXPECT_EQ(reg.list().size(), n);
  }
}

// The registry against a few-line model of its documented rules, 10^5 random steps: frames of
// streams (scene changes, gaps, time going backwards), drops, lookups, time passing past the TTL,
// in tables of 1 to 8 streams with twice as many ids. After every step the same streams exist,
// with the same completed frames, and every frame keeps or drops its history as the model says;
// a stream's first frame after an eviction says so.
TEST(Streams, RandomStepsFollowTheDocumentedRules) {
  std::mt19937 rng(44);
  struct Model {
    double last_used = 0, last_ts = 0;
    uint64_t frames = 0;
    std::string scene;
  };
  int steps = 0;
  for (size_t cap = 1; cap <= 8; ++cap) {
    FakeClock clock;
    const double ttl = 5.0, gap = 2.0;
    StreamRegistry reg({.max_streams = cap, .idle_ttl_seconds = ttl, .max_gap_seconds = gap}, clock.fn());
    std::map<std::string, Model> model;
    std::set<std::string> lost;  // evicted, not yet told
    const auto expire = [&](const std::string& keep) {
      for (auto it = model.begin(); it != model.end();) {
        const bool gone = it->first != keep && clock.now - it->second.last_used > ttl;
        if (gone) lost.insert(it->first);
        it = gone ? model.erase(it) : std::next(it);
      }
    };
    for (int i = 0; i < 12500; ++i, ++steps) {
      clock.now += std::uniform_real_distribution<double>(0.0, 1.0)(rng) < 0.02 ? 6.0 : 0.1;
      const std::string id = "s" + std::to_string(std::uniform_int_distribution<size_t>(0, 2 * cap - 1)(rng));
      const int op = std::uniform_int_distribution<int>(0, 19)(rng);
      const std::string what = "cap " + std::to_string(cap) + ", step " + std::to_string(i) + ", " + id;
      if (op == 0) {
        expire("");  // drop: a stream past its TTL is already gone
        const bool dropped = model.erase(id) == 1;
        EXPECT_EQ(reg.drop(id), dropped) << what;
        if (dropped) lost.erase(id);
      } else if (op == 1) {
        expire("");
        const bool want = model.count(id) == 1;
        std::optional<StreamRegistry::Lease> l = reg.find(id);
        ASSERT_EQ(l.has_value(), want) << what;
        if (want) {
          EXPECT_EQ(l->frames(), model[id].frames) << what;
          l.reset();
          model[id].last_used = clock.now;
        }
      } else {
        // A frame: usually 0.5 s after the stream's last, sometimes a gap, backwards or a new scene.
        expire(id);
        if (model.count(id) == 0) {
          while (model.size() >= cap) {  // the least recently used goes
            auto oldest = model.begin();
            for (auto it = model.begin(); it != model.end(); ++it)
              if (it->second.last_used < oldest->second.last_used) oldest = it;
            lost.insert(oldest->first);
            model.erase(oldest);
          }
          model[id] = Model{};
        }
        const bool told = lost.erase(id) == 1;
        Model& m = model[id];
        const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
        const double ts = m.last_ts + (kind == 0 ? 3.0 : kind == 1 ? -0.5 : 0.5);
        const std::string scene = kind == 2 ? "scene " + std::to_string(i) : (m.scene.empty() ? "first" : m.scene);
        StreamRegistry::Lease lease = reg.acquire(id);
        ASSERT_EQ(lease.frames(), m.frames) << what;
        const bool keeps = m.frames > 0 && scene == m.scene && ts > m.last_ts && ts - m.last_ts <= gap;
        const std::string reason = lease.begin_frame(ts, scene);
        if (told) {  // a history the table threw away is said on the stream's next frame
          EXPECT_EQ(reason.rfind("history evicted: ", 0), 0u) << what << ": " << reason;
        } else {
          EXPECT_EQ(reason.empty(), keeps || m.frames == 0) << what << ": " << reason;
        }
        lease.history().state.has_prev_bev = true;
        lease.history().state.scene_token = scene;
        lease.end_frame(ts);
        ++m.frames;
        m.last_ts = ts;
        m.scene = scene;
        m.last_used = clock.now;
      }
      expire("");
      const std::vector<StreamInfo> list = reg.list();
      ASSERT_EQ(list.size(), model.size()) << what;
      for (const StreamInfo& s : list) {
        ASSERT_EQ(model.count(s.id), 1u) << what << ": " << s.id << " exists, the model has it evicted";
        EXPECT_EQ(s.frames, model[s.id].frames) << what << ": " << s.id;
      }
    }
  }
  EXPECT_EQ(steps, 100000);
}

}  // namespace
}  // namespace bev
