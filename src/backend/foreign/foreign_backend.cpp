#include "backend/foreign/foreign_backend.h"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/recorded_stage.h"
#include "bevformer/error.h"

namespace bev {
namespace {

// Flipping bit 62 turns a user-space address (below 2^47) into a non-canonical one: any load or
// store through it faults, and adding an offset below 2^47 commutes with the flip, so arena
// slices and views still address the right bytes once decoded.
constexpr uintptr_t kTag = uintptr_t{1} << 62;
void* encode(void* p) { return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) ^ kTag); }
void* decode(void* p) { return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) ^ kTag); }

int delay_from_environment() {
  const char* v = std::getenv("BEV_FOREIGN_DELAY_US");
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  const long us = std::strtol(v, &end, 10);
  if (*end != '\0' || us < 0 || us > 10'000'000) {
    throw Error(ErrorKind::kInvalidInput, std::string("BEV_FOREIGN_DELAY_US=") + v)
        .expected("microseconds per queued item, 0 to 10000000");
  }
  return static_cast<int>(us);
}

// One in-order queue and the thread that runs it. Items that throw record the first error (for
// the next wait) and the queue goes on: nothing waits forever behind a failed item.
class Queue {
 public:
  explicit Queue(int delay_us) : delay_us_(delay_us), thread_([this] { loop(); }) {}
  ~Queue() {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Queue(const Queue&) = delete;
  Queue& operator=(const Queue&) = delete;

  void push(std::function<void()> item) {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      items_.push_back(std::move(item));
      ++issued_;
    }
    cv_.notify_all();
  }
  // Until everything issued so far has run; then the first error since the last wait, if any.
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t target = issued_;
    done_cv_.wait(lock, [&] { return done_ >= target; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }
  bool on_queue_thread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !items_.empty(); });
      if (items_.empty()) return;  // stopping, and drained
      std::function<void()> item = std::move(items_.front());
      items_.pop_front();
      lock.unlock();
      if (delay_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us_));
      std::exception_ptr failed;
      try {
        item();
      } catch (...) {
        failed = std::current_exception();
      }
      item = nullptr;  // what it held (host tensors, bindings) goes before the wait returns
      lock.lock();
      if (failed && !error_) error_ = failed;
      ++done_;
      done_cv_.notify_all();
    }
  }

  const int delay_us_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::function<void()>> items_;
  uint64_t issued_ = 0, done_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;  // last: it starts running loop() once everything above exists
};

class ForeignBackend final : public Backend {
 public:
  ForeignBackend(int threads, Precision precision, int delay_us)
      : cpu_(make_cpu_backend(threads, precision)), queue_(delay_us < 0 ? delay_from_environment() : delay_us) {}
  ~ForeignBackend() override {
    try {
      queue_.wait();  // nothing issued may outlive the kernels it runs on
    } catch (...) {
      // An error nobody waited for: the backend is going away, and destructors do not throw.
    }
  }

  const char* name() const override { return "foreign"; }
  Device device() const override { return Device::kForeign; }
  Precision precision() const override { return cpu_->precision(); }
  Precision float_precision() const override { return cpu_->float_precision(); }
  BackendInfo info() const override {
    BackendInfo i = cpu_->info();
    i.backend = name();
    i.device += " (memory guarded from the host, run late on a queue of its own: a test backend)";
    return i;
  }

  std::shared_ptr<Storage> allocate(size_t bytes) override {
    std::shared_ptr<Storage> host = Storage::allocate(bytes);
    void* tagged = encode(host->data());
    // The deleter owns the host memory: it goes when the last view of the foreign storage does
    // (a queued item holds its tensors, so memory outlives the work that uses it).
    return Storage::adopt(tagged, bytes, Device::kForeign, [host](void*) mutable { host.reset(); });
  }

  // As a device: per-frame inputs cross in staging memory (the runtime's StagingBuffers, frames
  // decoded into it), so a runtime that writes from elsewhere shows in the tests that count it.
  bool wants_staging() const override { return true; }

  void write(const Tensor& dst, const Tensor& host_src) override {
    check_write(dst, host_src);
    issue([dst, host_src] {
      const Tensor d = host_view(dst, "write");
      std::memcpy(d.raw_data(), host_src.contiguous().raw_data(), host_src.nbytes());
    });
  }

  void read_into(const Tensor& host_dst, const Tensor& src) override {
    check_read(host_dst, src);
    issue([host_dst, src] {
      const Tensor s = host_view(src, "read").contiguous();
      std::memcpy(host_dst.raw_data(), s.raw_data(), s.nbytes());
    });
  }

  void copy(const Tensor& dst, const Tensor& src) override {
    check_copy(dst, src);
    issue([this, dst, src] { cpu_->copy(host_view(dst, "copy"), host_view(src, "copy")); });
  }

  // On the queue's own thread (a stage's execute, run there) everything issued before the item
  // running now has run already.
  void synchronize() override {
    if (!queue_.on_queue_thread()) queue_.wait();
  }

  double measure_peak_gflops() override {
    synchronize();
    return cpu_->measure_peak_gflops();
  }

  std::shared_ptr<const void> prepare(OpKind kind, const OpAttrs& attrs, const Tensor& weight,
                                      const Tensor* bias) override {
    // Weights arrive as host tensors from the checkpoint by contract; the packed copies the CPU
    // backend makes are this backend's private memory.
    return cpu_->prepare(kind, attrs, weight, bias);
  }

  bool fuses_bottleneck(const Shape& x_nhwc, const BottleneckAttrs& attrs) const override {
    return cpu_->fuses_bottleneck(x_nhwc, attrs);
  }
  bool fuses_deformable_attention() const override { return cpu_->fuses_deformable_attention(); }
  bool fuses_spatial_cross_attention() const override { return cpu_->fuses_spatial_cross_attention(); }
  bool fuses_ffn() const override { return cpu_->fuses_ffn(); }

  void run(const OpNode& node) override {
    if (queue_.on_queue_thread()) return run_now(node);  // a stage's node, as execute() runs it
    // Host memory among its tensors is refused now, naming the op, not at the next wait.
    const std::string what = std::string("op ") + op_name(node.kind) + (node.label.empty() ? "" : " '" + node.label + "'");
    for (const Tensor& t : node.inputs) check_foreign(t, what + " input");
    for (const Tensor& t : node.outputs) check_foreign(t, what + " output");
    issue([this, node] { run_now(node); });
  }

  // The whole stage as one queued item, run as a device runs a captured graph: at the addresses
  // it had when first executed. So bindings are not pointer swaps here but copies, on the queue,
  // into the stage's own buffers before it runs (the bound tensors it reads) and out of them
  // after (those it writes); a replay whose nodes would address other memory than at capture is
  // refused. A runtime that worked only because a binding aliased memory gives other bits here.
  // A profiled run is waited for: the times are the queue thread's, which the caller reads.
  void execute(const RecordedStage& stage, std::span<const StageBinding> bindings,
               std::vector<OpTime>* times) override {
    for (const StageBinding& b : bindings) {
      stage.check_binding(b);
      check_foreign(b.target, "stage '" + stage.name() + "' binding");
    }
    std::vector<StageBinding> bound(bindings.begin(), bindings.end());
    issue([this, &stage, bound = std::move(bound), times] {
      for (const StageBinding& b : bound) {
        if (b.target.storage() != b.slot.storage() && stage.reads(b.slot)) cpu_->copy(host_view(b.slot, "bind"), host_view(b.target, "bind"));
      }
      check_capture(stage);
      Backend::execute(stage, {}, times);
      for (const StageBinding& b : bound) {
        if (b.target.storage() != b.slot.storage() && stage.writes(b.slot)) cpu_->copy(host_view(b.target, "bind"), host_view(b.slot, "bind"));
      }
    });
    if (times) synchronize();
  }
  OpTime run_timed(const OpNode& node) override {
    if (queue_.on_queue_thread()) return Backend::run_timed(node);
    OpTime t;
    issue([this, node, &t] { t = Backend::run_timed(node); });
    synchronize();
    return t;
  }

 private:
  void issue(std::function<void()> item) { queue_.push(std::move(item)); }

  void run_now(const OpNode& node) {
    OpNode host = node;
    const std::string what = std::string("op ") + op_name(node.kind) + (node.label.empty() ? "" : " '" + node.label + "'");
    for (Tensor& t : host.inputs) t = host_view(t, what + " input");
    for (Tensor& t : host.outputs) t = host_view(t, what + " output");
    cpu_->run(host);
  }

  // The host view of one of this backend's tensors; anything else is a host tensor that reached
  // the backend without Backend::upload or write: the bug this backend exists to catch.
  // Every address a stage's nodes touch, in order (on the queue thread: no lock needed).
  static std::vector<const void*> addresses(const RecordedStage& stage) {
    std::vector<const void*> a;
    for (const OpNode& n : stage.nodes()) {
      for (const std::vector<Tensor>* ts : {&n.inputs, &n.outputs}) {
        for (const Tensor& t : *ts) {
          a.push_back(t.defined() ? static_cast<const char*>(t.storage()->data()) + t.offset() * static_cast<int64_t>(dtype_size(t.dtype()))
                                  : nullptr);
        }
      }
    }
    return a;
  }
  // The first execution of a stage captures its addresses; each later one must find them again.
  void check_capture(const RecordedStage& stage) {
    std::vector<const void*> now = addresses(stage);
    const auto [it, first] = captures_.try_emplace(stage.id(), now);
    if (!first && it->second != now) {
      throw Error(ErrorKind::kInternal, "stage '" + stage.name() + "' replayed at other addresses than it was captured at")
          .hint("a device replays a captured graph at fixed addresses: bind by copying, never by moving storage");
    }
  }

  static void check_foreign(const Tensor& t, const std::string& what) {
    if (t.defined() && t.device() != Device::kForeign) {
      throw Error(ErrorKind::kInternal, what + " " + t.describe() + " is " + device_name(t.device()) +
                                            " memory, not the foreign backend's")
          .hint("constants go through Backend::upload and frame inputs through Backend::write");
    }
  }
  static Tensor host_view(const Tensor& t, const std::string& what) {
    if (!t.defined()) return t;
    check_foreign(t, what);
    const std::shared_ptr<Storage>& s = t.storage();
    auto view = Storage::borrow(decode(s->data()), s->bytes(), s, Device::kCpu);
    return Tensor::view_of(std::move(view), t.dtype(), t.shape(), t.strides(), t.offset());
  }

  std::unique_ptr<Backend> cpu_;
  std::unordered_map<uint64_t, std::vector<const void*>> captures_;  // by RecordedStage::id; queue thread only
  Queue queue_;  // after cpu_: destroyed first, so that its thread stops before the kernels go
};

}  // namespace

std::unique_ptr<Backend> make_foreign_backend(int threads, Precision precision, int delay_us) {
  return std::make_unique<ForeignBackend>(threads, precision, delay_us);
}

}  // namespace bev
