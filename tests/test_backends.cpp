// Backends behind one interface: the registry, and the foreign-memory backend, whose memory the
// host must not touch. A run on it that gives the CPU backend's bits proves that the runtime and
// the model reach memory only through the Backend interface (allocation, upload, write, read,
// copy, execute), as a device backend needs: every golden frame replayed and eager, a full-size
// tiny sequence, and the pipelined path.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "backend/foreign/foreign_backend.h"
#include "backend/ops.h"
#include "backend/recorded_stage.h"
#include "backend/registry.h"
#include "io/golden_set.h"
#include "model/synthetic.h"
#include "runtime/engine.h"
#include "engine_test_util.h"
#include "error_test_util.h"
#include "precision_test_util.h"

namespace bev {
namespace {

using testing::expect_same_output;
using testing::identical;
using testing::LoadedModel;

const std::string kMicro = std::string(BEV_SHARED_DIR) + "/golden/micro";

TEST(Registry, ListsTheBuiltBackendsAndNamesWhatIsMissing) {
  const std::vector<std::string> names = available_backends();
  ASSERT_GE(names.size(), 2u);
  EXPECT_EQ(names[0], "cpu");
  EXPECT_NE(std::find(names.begin(), names.end(), "foreign"), names.end());
  for (const std::string& n : names) {
    const auto b = make_backend(n, {1, Precision::kF32, 0});
    EXPECT_EQ(b->name(), n);
    EXPECT_FALSE(b->info().device.empty());
    EXPECT_EQ(b->info().threads, 1);
  }
  // No CUDA device on this machine (the CUDA tests skip the same way): the error says what is
  // missing, whether or not the build has CUDA.
  test::expect_error(ErrorKind::kUnsupported, [] { make_backend("cuda", {}); }, "backend 'cuda'");
  test::expect_invalid_input([] { make_backend("tpu", {}); }, "one of: cpu, foreign");
}

TEST(ForeignBackend, HostAccessOutsideTheBackendFails) {
  const auto foreign = make_backend("foreign", {1, Precision::kF32, 0});
  const Tensor host = Tensor::from_floats({2, 3}, std::vector<float>{1, 2, 3, 4, 5, 6});
  const Tensor t = foreign->upload(host);
  EXPECT_EQ(t.device(), Device::kForeign);
  test::expect_error(ErrorKind::kInternal, [&] { (void)t.raw_data(); }, "foreign memory");
  test::expect_error(ErrorKind::kInternal, [&] { (void)t.data<float>(); }, "foreign memory");
  test::expect_error(ErrorKind::kInternal, [&] { (void)t.clone(); }, "foreign memory");
  // Its pointers are not host addresses at all: a stray dereference faults instead of reading.
  EXPECT_NE(t.device_ptr(), nullptr);
  EXPECT_NE(reinterpret_cast<uintptr_t>(t.device_ptr()) >> 47, 0u);
  // Through the backend, bytes round-trip, views included.
  EXPECT_TRUE(identical(foreign->read(t), host));
  EXPECT_TRUE(identical(foreign->read(t.permute({1, 0})), host.permute({1, 0}).contiguous()));
  const Tensor u = foreign->empty({2, 3}, DType::kF32);
  foreign->copy(u, t);
  EXPECT_TRUE(identical(foreign->read(u), host));
  // An op given host memory (a constant that skipped upload) is refused with the op named, by
  // Ops before anything runs and by the backend itself.
  Ops ops(*foreign);
  test::expect_invalid_input([&] { ops.relu(host, "x.relu"); }, "relu 'x.relu'");
  OpNode n{OpKind::relu, "x.relu", {}, {host}, {u}, nullptr};
  test::expect_error(ErrorKind::kInternal, [&] { foreign->run(n); }, "op relu 'x.relu' input");
  // A result computed on it is read back as the CPU computes it.
  EXPECT_TRUE(identical(foreign->read(ops.relu(t)), host));
}

// The foreign backend runs its queue late (here 20 ms an item), as a device does: a host that
// skips a wait reads what is not there yet, and host memory given to the backend is read when
// the queue reaches it, not when the call returns. This is what makes every other foreign test
// fail where the runtime forgets a wait.
TEST(ForeignBackend, AMissingWaitReadsNothingYet) {
  const auto foreign = make_foreign_backend(1, Precision::kF32, /*delay_us=*/20000);
  Tensor host = Tensor::from_floats({2, 3}, std::vector<float>{-1, 2, -3, 4, -5, 6});
  const Tensor x = foreign->empty({2, 3}, DType::kF32);
  foreign->write(x, host);
  Ops ops(*foreign);
  const Tensor y = ops.relu(x);
  Tensor got = Tensor::from_floats({2, 3}, std::vector<float>(6, 42.0f));
  foreign->read_into(got, y);
  // The wait dropped on purpose: the result is not there, and the input is not yet read.
  EXPECT_TRUE(identical(got, Tensor::from_floats({2, 3}, std::vector<float>(6, 42.0f))));
  host.data<float>()[0] = 7;  // changed before the queue reached the write: the backend sees 7
  foreign->synchronize();
  EXPECT_TRUE(identical(got, Tensor::from_floats({2, 3}, std::vector<float>{7, 2, 0, 4, 0, 6})));
}

// An op that fails on the queue fails the next wait, once; the queue drains past it, so nothing
// waits forever, and the backend goes on computing right.
TEST(ForeignBackend, AFailingOpFailsTheNextWaitAndTheQueueDrains) {
  const auto foreign = make_foreign_backend(1, Precision::kF32, /*delay_us=*/1000);
  const Tensor host = Tensor::from_floats({2, 3}, std::vector<float>{-1, 2, -3, 4, -5, 6});
  const Tensor x = foreign->upload(host);
  // count_nonfinite of an i64 tensor: the CPU kernel refuses it when the queue runs it.
  const Tensor ints = foreign->empty({4}, DType::kI64);
  const Tensor count = foreign->empty({1}, DType::kI64);
  foreign->run(OpNode{OpKind::count_nonfinite, "bad", {}, {ints}, {count}, nullptr});
  Ops ops(*foreign);
  const Tensor y = ops.relu(x);  // issued after the failure, run all the same
  test::expect_invalid_input([&] { foreign->synchronize(); }, "count_nonfinite");
  EXPECT_TRUE(identical(foreign->read(y), Tensor::from_floats({2, 3}, std::vector<float>{0, 2, 0, 4, 0, 6})));
  foreign->synchronize();  // the error was told once
}

// A recorded stage runs on the foreign backend as a captured device graph does: at the addresses
// of its first execution. Bindings are copies into and out of the stage's own buffers; a stage
// whose memory moved between executions (a binding done by moving storage) is refused.
TEST(ForeignBackend, AStageReplaysAtItsCapturedAddressesAndBindsByCopying) {
  const auto foreign = make_foreign_backend(1, Precision::kF32, /*delay_us=*/200);
  const Tensor x = foreign->empty({2, 3}, DType::kF32);
  Ops rec(*foreign, Ops::Mode::kPlan);
  const Tensor y = rec.relu(x, "y");
  const RecordedStage stage("relu", rec.take_nodes(), {y}, *foreign, {x, y});
  const Tensor a = foreign->upload(Tensor::from_floats({2, 3}, std::vector<float>{-1, 2, -3, 4, -5, 6}));
  const Tensor b = foreign->empty({2, 3}, DType::kF32);
  const std::vector<StageBinding> bound = {{x, a}, {y, b}};
  foreign->execute(stage, bound);
  EXPECT_TRUE(identical(foreign->read(b), Tensor::from_floats({2, 3}, std::vector<float>{0, 2, 0, 4, 0, 6})));
  // The stage's own buffers hold the copies: unbound, it computes on what was bound last.
  foreign->execute(stage);
  EXPECT_TRUE(identical(foreign->read(stage.resolve(y)), Tensor::from_floats({2, 3}, std::vector<float>{0, 2, 0, 4, 0, 6})));
  // Moving the input's storage (as a pointer-swapping binding would) is caught at the replay.
  x.storage()->bind_to(*a.storage(), 0);
  foreign->execute(stage);
  test::expect_error(ErrorKind::kInternal, [&] { foreign->synchronize(); }, "other addresses than it was captured at");
  x.storage()->unbind();
  foreign->execute(stage);  // back where it was captured
  foreign->synchronize();
}

// Every frame of the micro golden set, replayed and eager, f32 and bf16, with every tap: the
// foreign backend's bits are the CPU backend's.
TEST(ForeignBackend, GoldenMicroGivesTheCpuBits) {
  const GoldenSetFiles set = find_golden_set(kMicro);
  const ModelConfig cfg = load_config(set.config_path);
  const Checkpoint ck = load_checkpoint(set.checkpoint_path);
  for (const Precision precision : bev::precision_test::precisions_here({Precision::kF32, Precision::kBF16}))
  for (const bool replay : {true, false}) {
    EngineOptions cpu_options, foreign_options;
    cpu_options.backend_options = foreign_options.backend_options = {2, precision, 0};
    cpu_options.replay = foreign_options.replay = replay;
    foreign_options.backend = "foreign";
    const auto cpu = Engine::create(cfg, ck, cpu_options);
    const auto foreign = Engine::create(cfg, ck, foreign_options);
    for (size_t k = 0; k < set.num_frames(); ++k) {
      const GoldenFrame g = load_golden_frame(set, k);
      FrameInput f;
      f.img = g.img.permute({0, 2, 3, 1}).contiguous();
      f.lidar2img = g.lidar2img;
      f.can_bus = g.can_bus;
      f.scene_token = g.scene_token;
      Taps ta, tb;
      const FrameOutput a = cpu->runner().forward(f, {&ta, true});
      const FrameOutput b = foreign->runner().forward(f, {&tb, true});
      const std::string what = std::string(precision == Precision::kBF16 ? "bf16 " : "f32 ") +
                               (replay ? "replay" : "eager") + ", frame " + std::to_string(k);
      expect_same_output(a, b, what);
      ASSERT_EQ(ta.all().size(), tb.all().size()) << what;
      EXPECT_GE(ta.all().size(), 25u) << what;  // every stage of the golden set
      for (const auto& [name, t] : ta.all()) {
        const Tensor* u = tb.find(name);
        ASSERT_NE(u, nullptr) << name;
        EXPECT_TRUE(identical(t, *u)) << name << ", " << what;
      }
    }
  }
}

// One stream through a pipelined model: a second thread stages frame k+1 while this thread runs
// frame k's bev stage.
std::vector<FrameOutput> run_pipelined(LoadedModel& model, const std::vector<FrameInput>& frames) {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<StagedFrame> ready;
  std::thread producer([&] {
    for (const FrameInput& f : frames) {
      StagedFrame s = model.run_image(f);
      const std::lock_guard<std::mutex> lock(mu);
      ready.push_back(std::move(s));
      cv.notify_all();
    }
  });
  std::vector<FrameOutput> out;
  for (const FrameInput& f : frames) {
    StagedFrame s;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return !ready.empty(); });
      s = std::move(ready.front());
      ready.pop_front();
    }
    out.push_back(model.run_bev(f, std::move(s)));
  }
  producer.join();
  return out;
}

TEST(ForeignBackend, PipelinedGivesTheCpuBits) {
  const ModelConfig cfg = load_config(kMicro + "/config.json");
  const Checkpoint ck = random_checkpoint(cfg, 61);
  std::vector<FrameInput> frames;
  for (int k = 0; k < 6; ++k) {
    FrameInput f = synthetic_frame(cfg, 61, k);
    if (k == 3) f.scene_token = "another scene";  // back to the first-frame stage mid-run
    frames.push_back(std::move(f));
  }
  const auto cpu = make_backend("cpu", {2, Precision::kF32, 0});
  const auto foreign = make_backend("foreign", {2, Precision::kF32, 0});
  LoadedModel plain(cfg, ck, *cpu), piped(cfg, ck, *foreign, /*replay=*/true, /*pipelined=*/true);
  const std::vector<FrameOutput> got = run_pipelined(piped, frames);
  for (size_t k = 0; k < frames.size(); ++k) expect_same_output(plain.forward(frames[k]), got[k], "frame " + std::to_string(k));
}

}  // namespace
}  // namespace bev
