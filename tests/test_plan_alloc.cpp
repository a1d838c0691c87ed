// A replayed plan allocates nothing of its own: every malloc in the process (ours, oneDNN's,
// OpenMP's) is counted while the recorded stages replay, and the engine's share must be zero.
// oneDNN 2.6 allocates small bookkeeping inside every primitive execution, with no API to avoid
// it; that share is printed, not asserted. malloc is interposed in this test binary only.
//
// For the diagnosis, each counted allocation is attributed to the op that was running and to
// where it was made: inside oneDNN (some frame of its call stack lies in libdnnl) or in the
// engine (everything else: our kernels, the thread pool, the plan). Under AddressSanitizer the
// hook is left out (ASan owns malloc) and the tests skip.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/onednn.h"
#include "backend/forwarding_backend.h"
#include "backend/ops.h"
#include "backend/recorded_stage.h"
#include "model/bevformer.h"
#include "model/synthetic.h"
#include "engine_test_util.h"
#include "kernel_test_util.h"
#include "precision_test_util.h"

#if defined(__SANITIZE_ADDRESS__)
#define BEV_ALLOC_HOOK 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BEV_ALLOC_HOOK 0
#endif
#endif
#ifndef BEV_ALLOC_HOOK
#define BEV_ALLOC_HOOK 1
#endif

#if BEV_ALLOC_HOOK
#include <dlfcn.h>
#include <execinfo.h>
#include <link.h>
#endif

namespace {

constexpr size_t kOps = std::size(bev::kAllOps);
constexpr int kNoOp = static_cast<int>(kOps);  // allocations made outside Backend::run

std::atomic<bool> g_counting{false};
std::atomic<long> g_allocs{0};
std::atomic<int> g_op{kNoOp};  // the op Backend::run is executing
// Per op (and kNoOp): [0] in the engine, [1] inside oneDNN.
std::array<std::array<std::atomic<long>, 2>, kOps + 1> g_by_op;
// The address range of libdnnl's loaded segments; empty until found.
uintptr_t g_dnnl_lo = 0, g_dnnl_hi = 0;
thread_local bool t_in_hook = false;

#if BEV_ALLOC_HOOK
bool called_from_onednn() {
  if (g_dnnl_lo == g_dnnl_hi) return false;
  void* frames[64];
  const int n = backtrace(frames, 64);
  for (int i = 0; i < n; ++i) {
    const auto pc = reinterpret_cast<uintptr_t>(frames[i]);
    if (pc >= g_dnnl_lo && pc < g_dnnl_hi) return true;
  }
  return false;
}

// Finds libdnnl's range (from any of its functions) and runs backtrace() once, so that loading
// the unwinder happens before counting.
void prepare_attribution() {
  void* warm[4];
  backtrace(warm, 4);
  struct Query {
    uintptr_t addr, lo, hi;
  } q{reinterpret_cast<uintptr_t>(&dnnl_primitive_execute), 0, 0};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* qq = static_cast<Query*>(data);
        uintptr_t lo = UINTPTR_MAX, hi = 0;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD) continue;
          lo = std::min<uintptr_t>(lo, info->dlpi_addr + ph.p_vaddr);
          hi = std::max<uintptr_t>(hi, info->dlpi_addr + ph.p_vaddr + ph.p_memsz);
        }
        if (qq->addr < lo || qq->addr >= hi) return 0;
        qq->lo = lo;
        qq->hi = hi;
        return 1;
      },
      &q);
  g_dnnl_lo = q.lo;
  g_dnnl_hi = q.hi;
}
#endif

[[maybe_unused]] inline void count() {  // unused where the hook is off (sanitizers)
  if (!g_counting.load(std::memory_order_relaxed) || t_in_hook) return;
  t_in_hook = true;
  g_allocs.fetch_add(1, std::memory_order_relaxed);
#if BEV_ALLOC_HOOK
  const int where = called_from_onednn() ? 1 : 0;
  g_by_op[static_cast<size_t>(g_op.load(std::memory_order_relaxed))][static_cast<size_t>(where)].fetch_add(
      1, std::memory_order_relaxed);
#endif
  t_in_hook = false;
}

}  // namespace

#if BEV_ALLOC_HOOK
extern "C" void* __libc_malloc(size_t);
extern "C" void* __libc_calloc(size_t, size_t);
extern "C" void* __libc_realloc(void*, size_t);
extern "C" void* __libc_memalign(size_t, size_t);

extern "C" {
void* malloc(size_t n) {
  count();
  return __libc_malloc(n);
}
void* calloc(size_t a, size_t b) {
  count();
  return __libc_calloc(a, b);
}
void* realloc(void* p, size_t n) {
  count();
  return __libc_realloc(p, n);
}
void* memalign(size_t a, size_t n) {
  count();
  return __libc_memalign(a, n);
}
void* aligned_alloc(size_t a, size_t n) {
  count();
  return __libc_memalign(a, n);
}
int posix_memalign(void** out, size_t a, size_t n) {
  count();
  *out = __libc_memalign(a, n);
  return *out ? 0 : 12;
}
}
#endif

namespace bev {
namespace {

struct Counts {
  long total = 0;
  std::array<std::array<long, 2>, kOps + 1> by_op{};
  long in_engine() const {
    long n = 0;
    for (const auto& c : by_op) n += c[0];
    return n;
  }
  long in_onednn() const {
    long n = 0;
    for (const auto& c : by_op) n += c[1];
    return n;
  }
  // "conv2d 3 (engine 0, oneDNN 3), ..." for the ops that allocated.
  std::string breakdown() const {
    std::ostringstream os;
    for (size_t k = 0; k <= kOps; ++k) {
      const long e = by_op[k][0], d = by_op[k][1];
      if (e + d == 0) continue;
      os << "\n  " << (k == kOps ? "(outside ops)" : op_name(kAllOps[k])) << ": " << e + d << " (engine " << e
         << ", oneDNN " << d << ")";
    }
    return os.str();
  }
};

Counts allocations_during(const std::function<void()>& fn) {
  g_allocs = 0;
  for (auto& c : g_by_op) c[0] = c[1] = 0;
  g_counting = true;
  fn();
  g_counting = false;
  Counts out;
  out.total = g_allocs.load();
  for (size_t k = 0; k <= kOps; ++k) out.by_op[k] = {g_by_op[k][0].load(), g_by_op[k][1].load()};
  return out;
}

// Forwards to a backend and tells the hook which op runs (attribution only; it allocates nothing).
class AttributingBackend final : public ForwardingBackend {
 public:
  explicit AttributingBackend(Backend& inner) : ForwardingBackend(inner) {}
  void run(const OpNode& node) override {
    g_op = static_cast<int>(node.kind);
    inner_.run(node);
    g_op = kNoOp;
  }
};

class PlanAllocations : public ::testing::Test {
 protected:
  void SetUp() override {
#if BEV_ALLOC_HOOK
    prepare_attribution();
#else
    GTEST_SKIP() << "malloc is not interposed under AddressSanitizer (it owns malloc); run the non-ASan build";
#endif
  }
};

TEST_F(PlanAllocations, TheHookSeesAllocations) {
  const Counts n = allocations_during([] {
    std::vector<int> v(1000);
    void* p = std::malloc(10);
    std::free(p);
    std::thread([] { delete new int(1); }).join();  // other threads count too
    (void)v;
  });
  EXPECT_GE(n.total, 3);
  EXPECT_EQ(n.in_onednn(), 0) << n.breakdown();
}

TEST_F(PlanAllocations, TheHookAttributesOneDnnAllocations) {
  ASSERT_NE(g_dnnl_lo, g_dnnl_hi) << "libdnnl's segments were not found";
  const dnnl::memory::desc md({4, 4}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::ab);
  const Counts n = allocations_during([&] { const dnnl::memory m(md, cpu::engine()); });
  EXPECT_GE(n.in_onednn(), 1) << n.breakdown();
}

TEST_F(PlanAllocations, ReplayedStagesAllocateNothingOutsideOneDnn) {
  const ModelConfig cfg = load_config(std::string(BEV_SHARED_DIR) + "/golden/micro/config.json");
  const Checkpoint ck = random_checkpoint(cfg, 17);
  for (Precision precision : bev::precision_test::precisions_here({Precision::kF32, Precision::kBF16})) {
    SCOPED_TRACE(precision_name(precision));
    auto cpu = make_cpu_backend(2, precision);
    AttributingBackend backend(*cpu);
    testing::LoadedModel model(cfg, ck, backend);
    for (int k = 0; k < 3; ++k) model.forward(synthetic_frame(cfg, 17, k));  // records both bev variants
    const Counts n = allocations_during([&] { model.runner().replay_recorded_stages(); });
    EXPECT_EQ(n.in_engine(), 0) << "heap allocations made by the engine while replaying the recorded image and "
                                   "bev stages, per op:"
                                << n.breakdown();
    // oneDNN 2.6 allocates inside dnnl_primitive_execute (its argument map, a scratchpad
    // grantor, some kernels' std::function loops) and offers no way to avoid it; those are
    // reported, not asserted (docs/PERF.md: 1411 in f32, 2485 in bf16 on the micro model).
    std::printf("[ %s ] allocations during replay: engine %ld, inside oneDNN %ld\n", precision_name(precision),
                static_cast<long>(n.in_engine()), static_cast<long>(n.in_onednn()));
    RecordProperty(std::string("onednn_allocations_") + precision_name(precision), static_cast<int>(n.in_onednn()));
  }
}

// A with-history bev stage executes with five bindings (its new BEV, three SCA lists, the
// previous BEV): binding them allocates nothing either. Before, the bindings' bookkeeping held
// four inline and every with-history frame allocated (replay_recorded_stages binds only four).
TEST_F(PlanAllocations, FiveBindingsAllocateNothing) {
  auto cpu = make_cpu_backend(1, Precision::kF32);
  constexpr int kInputs = 5;
  constexpr int64_t kN = 37;
  std::vector<Tensor> slots, targets;
  float want[kN] = {};
  for (int i = 0; i < kInputs; ++i) {
    slots.push_back(cpu->empty({kN}, DType::kF32));
    Tensor host = Tensor::empty({kN}, DType::kF32);
    for (int64_t j = 0; j < kN; ++j) {
      host.data<float>()[j] = 0.25f * static_cast<float>(i + 1) + 0.01f * static_cast<float>(j);
      want[j] += host.data<float>()[j];
    }
    targets.push_back(cpu->upload(host));
  }
  Ops rec(*cpu, Ops::Mode::kPlan);
  Tensor sum = rec.add(slots[0], slots[1], "sum1");
  for (int i = 2; i < kInputs; ++i) sum = rec.add(sum, slots[static_cast<size_t>(i)], "sum" + std::to_string(i));
  const RecordedStage stage("five bindings", rec.take_nodes(), {sum}, *cpu, slots);
  std::array<StageBinding, kInputs> bound;
  for (size_t i = 0; i < bound.size(); ++i) bound[i] = StageBinding{slots[i], targets[i]};
  cpu->execute(stage, bound);  // first execution: primitives created
  const Counts n = allocations_during([&] { cpu->execute(stage, bound); });
  EXPECT_EQ(n.in_engine(), 0) << "heap allocations made by the engine while executing with five bindings:" << n.breakdown();
  const Tensor got = cpu->read(stage.resolve(sum));
  for (int64_t j = 0; j < kN; ++j) EXPECT_FLOAT_EQ(got.data<float>()[j], want[j]) << j;
}

// spatial_cross_attention sorts each frame's slots by cell into a buffer it keeps for the next
// frames: sized by the slot count, which a plan fixes, not by the slots in use, which change from
// frame to frame. Before, a frame using more slots than any before it grew the buffer.
TEST_F(PlanAllocations, MoreSlotsInUseThanBeforeAllocateNothing) {
  auto cpu = make_cpu_backend(1, Precision::kF32);
  Ops rec(*cpu, Ops::Mode::kPlan);
  constexpr int64_t kCells = 5, kCams = 2, kMaxLen = 6, kC = 4;  // 1 head of 4, 1 level of 3 x 3, 2 points
  using kernel_test::random_tensor;
  const PreparedWeights offsets = rec.prepare_linear(random_tensor({4, kC}, 1, -0.5f, 0.5f), nullptr, {});
  const PreparedWeights weights = rec.prepare_linear(random_tensor({2, kC}, 2, -0.5f, 0.5f), nullptr, {});
  const Tensor query = cpu->upload(random_tensor({kCells, kC}, 3));
  const Tensor value = cpu->upload(random_tensor({kCams, 9, 1, kC}, 4));
  const Tensor reference = cpu->upload(random_tensor({kCams * kMaxLen, 1, 1, 2}, 5, 0.0f, 1.0f));
  const Tensor inv_count = cpu->upload(random_tensor({kCells, 1}, 6, 0.5f, 1.0f));
  const Tensor index = cpu->empty({kCams * kMaxLen}, DType::kI64);
  const Tensor y = rec.spatial_cross_attention(query, index, reference, inv_count, value, offsets, weights,
                                               {.spatial_shapes = {{3, 3}}, .level_start = {0}}, DType::kF32, "sca");
  const RecordedStage stage("sca", rec.take_nodes(), {y}, *cpu, {index});
  const auto slots = [&](const std::vector<int64_t>& v) {
    Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI64);
    for (size_t i = 0; i < v.size(); ++i) t.data<int64_t>()[i] = v[i];
    return cpu->upload(t);
  };
  const Tensor few = slots({0, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1});
  const Tensor many = slots({0, 1, 2, 3, 4, -1, 0, 1, 2, 3, 4, -1});
  Counts n;
  // A thread of its own: the buffer is the calling thread's, and this one has never run the op.
  std::thread([&] {
    const std::array<StageBinding, 1> first{StageBinding{index, few}}, second{StageBinding{index, many}};
    cpu->execute(stage, first);  // primitives created, the buffer sized
    n = allocations_during([&] { cpu->execute(stage, second); });
  }).join();
  EXPECT_EQ(n.in_engine(), 0) << "heap allocations made by the engine on a frame with more slots in use:" << n.breakdown();
}

}  // namespace
}  // namespace bev
