// test_backend_ops: every op of BEV_OPS on one backend against a reference backend (as ggml's
// test-backend-ops), or timed on one backend.
//
//   test_backend_ops [--backend NAME] [--reference cpu] [--shapes awkward,tiny,base]
//                    [--op NAME[,NAME]] [--precision f32|bf16] [--threads N]
//                    [--reference-threads N] [--exact] [--perf [--repeats N]] [--list]
//
// Correctness (default): each case (backend_ops.h) runs on both backends from the same host
// inputs and weights; the outputs are read back with Backend::read and compared. Tolerances:
//   f32 outputs at f32 precision      relative L2 <= 1e-5
//   bf16 outputs, or bf16 precision   relative L2 <= 2e-2 (bf16 keeps 8 significant bits)
//   integer outputs (topk's indices)  exact: the engine's top-k order is total (equal scores
//                                     keep the lower index first, cpu/select.h), so a backend
//                                     that orders ties otherwise is wrong, not just different
//   --exact                           identical bytes (a backend that runs the CPU's kernels)
// --reference-threads N runs the reference on N threads (default: --threads): with --backend cpu
// --reference cpu --exact, every op's bits must not depend on the thread count (ctest
// backend_ops_threads, and under ONEDNN_MAX_CPU_ISA=AVX2 in scripts/test.sh).
// Non-finite values must match in place and kind on both sides (NaN where NaN, +inf where +inf).
// Exit 0 when every case passes, 1 when one fails (or an op lacks awkward or tiny cases), 2 on a
// usage error (an unknown backend prints the registry's message).
//
// --perf: each case once as a warm-up (primitives created, weights packed), then its node
// --repeats times on the target alone, synchronize() before each clock read; the median, with
// GFLOP/s (Profiler's op_flops) and GB/s (op_bytes), and % of the backend's measured peak (best
// of three measure_peak_gflops calls) for the matmul-class ops.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backend/forwarding_backend.h"
#include "backend/registry.h"
#include "backend_ops.h"
#include "bevformer/error.h"
#include "profile/profiler.h"

namespace bev::op_harness {
namespace {

// Forwards everything and keeps the nodes it runs: the harness needs the one node a case made,
// to read all its outputs (top-k has two, in-place ops write an input) and to time it again.
class NodeTap final : public ForwardingBackend {
 public:
  explicit NodeTap(Backend& inner) : ForwardingBackend(inner) {}
  void run(const OpNode& node) override {
    inner_.run(node);
    nodes_.push_back(node);
  }
  std::vector<OpNode>& nodes() { return nodes_; }

 private:
  std::vector<OpNode> nodes_;
};

struct Options {
  std::string backend = "cpu", reference = "cpu";
  std::vector<ShapeSet> sets = {ShapeSet::kAwkward, ShapeSet::kTiny};
  std::set<OpKind> ops;  // empty: all
  Precision precision = Precision::kF32;
  int threads = 0;
  std::optional<int> reference_threads;  // default: threads
  bool exact = false, perf = false, list = false;
  int repeats = 5;
  std::optional<OpKind> inject;  // hidden: corrupt one output byte of this op on the target
};

struct UsageError {
  std::string message;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

OpKind parse_op(const std::string& name) {
  for (OpKind k : kAllOps) {
    if (name == op_name(k)) return k;
  }
  throw UsageError{"unknown op '" + name + "' (--list shows the cases)"};
}

int parse_int(const std::string& flag, const std::string& v, int lo) {
  char* end = nullptr;
  const long n = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n < lo || n > 1 << 20) {
    throw UsageError{flag + " " + v + ": expected an integer >= " + std::to_string(lo)};
  }
  return static_cast<int>(n);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError{a + " needs a value"};
      return argv[++i];
    };
    if (a == "--backend") {
      o.backend = value();
    } else if (a == "--reference") {
      o.reference = value();
    } else if (a == "--shapes") {
      o.sets.clear();
      for (const std::string& s : split(value())) {
        bool found = false;
        for (ShapeSet set : kAllSets) {
          if (s == set_name(set)) {
            o.sets.push_back(set);
            found = true;
          }
        }
        if (!found) throw UsageError{"unknown shape set '" + s + "': expected awkward, tiny or base"};
      }
      if (o.sets.empty()) throw UsageError{"--shapes names no set"};
    } else if (a == "--op") {
      for (const std::string& s : split(value())) o.ops.insert(parse_op(s));
    } else if (a == "--precision") {
      const std::string p = value();
      if (p != "f32" && p != "bf16") throw UsageError{"--precision " + p + ": expected f32 or bf16"};
      o.precision = p == "f32" ? Precision::kF32 : Precision::kBF16;
    } else if (a == "--threads") {
      o.threads = parse_int(a, value(), 0);
    } else if (a == "--reference-threads") {
      o.reference_threads = parse_int(a, value(), 0);
    } else if (a == "--repeats") {
      o.repeats = parse_int(a, value(), 1);
    } else if (a == "--inject-error") {
      o.inject = parse_op(value());
    } else if (a == "--exact") {
      o.exact = true;
    } else if (a == "--perf") {
      o.perf = true;
    } else if (a == "--list") {
      o.list = true;
    } else {
      throw UsageError{"unknown argument '" + a + "'"};
    }
  }
  return o;
}

// "[6,480,800,3]": the console lines stay one line per case.
std::string dims(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

std::string describe(const OpNode& n) {
  std::string s;
  for (const Tensor& t : n.inputs) s += (s.empty() ? "" : " ") + std::string(dtype_name(t.dtype())) + dims(t.shape());
  if (!n.weight_shape.empty()) s += " w" + dims(n.weight_shape);
  if (const auto* b = std::get_if<BottleneckAttrs>(&n.attrs)) {  // channels in -> planes -> out
    s += " " + std::to_string(b->weight_shapes[0][1]) + "->" + std::to_string(b->weight_shapes[0][0]) + "->" +
         std::to_string(b->weight_shapes[2][0]) + (b->weight_shapes.size() > 3 ? "+ds" : "");
  }
  s += " ->";
  for (const Tensor& t : n.outputs) s += " " + std::string(dtype_name(t.dtype())) + dims(t.shape());
  return s;
}

bool is_float(DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16 || d == DType::kF64; }

struct Verdict {
  double rel_l2 = 0, max_abs = 0;
  bool pass = true;
  std::string why;
};

// Relative L2 and max abs over the finite elements; a non-finite element must be the same kind
// on both sides (compare() in core/ would turn one NaN into a NaN error and lose which it was).
void check_output(const Tensor& got, const Tensor& want, bool exact, double tol, Verdict& v) {
  if (got.shape() != want.shape() || got.dtype() != want.dtype()) {
    v.pass = false;
    v.why = "output " + got.describe() + ", reference " + want.describe();
    return;
  }
  const bool same_bytes = got.nbytes() == 0 || std::memcmp(got.raw_data(), want.raw_data(), got.nbytes()) == 0;
  if (exact && !same_bytes) {
    v.pass = false;
    v.why = "bytes differ";
  }
  const Tensor a = got.to(DType::kF64), b = want.to(DType::kF64);
  const double* pa = a.data<double>();
  const double* pb = b.data<double>();
  double num = 0, den = 0;
  int64_t nonfinite = 0, first = -1;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (!std::isfinite(pa[i]) || !std::isfinite(pb[i])) {
      const bool same = (std::isnan(pa[i]) && std::isnan(pb[i])) || pa[i] == pb[i];
      if (!same && nonfinite++ == 0) first = i;
      continue;
    }
    const double e = pa[i] - pb[i];
    num += e * e;
    den += pb[i] * pb[i];
    v.max_abs = std::max(v.max_abs, std::fabs(e));
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  v.rel_l2 = std::max(v.rel_l2, rel);
  if (nonfinite) {
    v.pass = false;
    v.why = std::to_string(nonfinite) + " non-finite mismatch(es), first at " + std::to_string(first) + ": " +
            std::to_string(pa[first]) + " vs " + std::to_string(pb[first]);
  } else if (!is_float(got.dtype()) && !same_bytes) {
    v.pass = false;
    v.why = "integer output differs";
  } else if (is_float(got.dtype()) && !(rel <= tol)) {
    v.pass = false;
    if (v.why.empty()) v.why = "over tolerance";
  }
}

double tolerance(DType out, Precision p) { return out == DType::kBF16 || p == Precision::kBF16 ? 2e-2 : 1e-5; }

// The case's single node, run on `backend` through Ops.
OpNode run_case(const OpCase& c, Backend& backend) {
  NodeTap tap(backend);
  Ops ops(tap);
  c.run(ops);
  if (tap.nodes().size() != 1 || tap.nodes()[0].kind != c.op) {
    throw Error(ErrorKind::kInternal, "case made " + std::to_string(tap.nodes().size()) + " node(s)")
        .expected(std::string("exactly one ") + op_name(c.op));
  }
  return std::move(tap.nodes()[0]);
}

void corrupt(Tensor& host) {
  if (host.nbytes() == 0) return;
  // The top byte of element 0: sign and exponent of a float, the high bits of an integer.
  auto* p = static_cast<uint8_t*>(host.raw_data());
  p[dtype_size(host.dtype()) - 1] ^= 0x40;
}

std::string name_of(const OpCase& c) { return std::string(op_name(c.op)) + "/" + set_name(c.set) + "/" + c.tag; }

std::string dtype_of(const OpNode& n) {
  std::string s;
  for (const Tensor& t : n.outputs) s += (s.empty() ? "" : "+") + std::string(dtype_name(t.dtype()));
  return s;
}

bool matmul_class(OpKind k) {
  return k == OpKind::conv2d || k == OpKind::bottleneck || k == OpKind::deform_conv2d || k == OpKind::linear ||
         k == OpKind::batched_matmul || k == OpKind::attention;
}

int check_cases(const Options& o, const std::vector<OpCase>& cases) {
  const BackendOptions bo{o.threads, o.precision, 0};
  const auto target = make_backend(o.backend, bo);
  const auto reference = make_backend(o.reference, {o.reference_threads.value_or(o.threads), o.precision, 0});
  std::printf("backend %s against %s, %s precision, %s\n", target->info().summary().c_str(), o.reference.c_str(),
              precision_name(o.precision),
              o.exact ? "identical bytes required (--exact)"
                      : "tolerance: rel L2 <= 1e-5 (f32), <= 2e-2 (bf16 output or precision), integers exact");
  int failed = 0;
  for (const OpCase& c : cases) {
    Verdict v;
    std::string shapes = "-", dtype = "-";
    try {
      const OpNode got_node = run_case(c, *target);
      shapes = describe(got_node);
      dtype = dtype_of(got_node);
      std::vector<Tensor> got;
      for (const Tensor& t : got_node.outputs) got.push_back(target->read(t));
      if (o.inject == c.op) corrupt(got[0]);
      const OpNode want_node = run_case(c, *reference);
      for (size_t i = 0; i < got.size(); ++i) {
        const Tensor want = reference->read(want_node.outputs[i]);
        check_output(got[i], want, o.exact, tolerance(want.dtype(), o.precision), v);
      }
    } catch (const std::exception& e) {
      v.pass = false;
      v.why = e.what();
    }
    failed += v.pass ? 0 : 1;
    std::printf("%-20s %-7s %-26s %-52s %-8s rel_l2 %.2e  max_abs %.2e  %s%s%s\n", op_name(c.op), set_name(c.set),
                c.tag.c_str(), shapes.c_str(), dtype.c_str(), v.rel_l2, v.max_abs, v.pass ? "PASS" : "FAIL",
                v.why.empty() ? "" : ": ", v.why.c_str());
    std::fflush(stdout);
  }
  std::printf("%zu cases: %zu passed, %d failed\n", cases.size(), cases.size() - static_cast<size_t>(failed), failed);
  return failed ? 1 : 0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int time_cases(const Options& o, const std::vector<OpCase>& cases) {
  const auto target = make_backend(o.backend, {o.threads, o.precision, 0});
  // Best of three: another process on the cores only ever lowers a measurement.
  double peak = 0;
  for (int i = 0; i < 3; ++i) peak = std::max(peak, target->measure_peak_gflops());
  std::printf("backend %s, %s precision; measured peak %.0f GFLOP/s (best of 3); median of %d run(s) after a warm-up\n",
              target->info().summary().c_str(), precision_name(o.precision), peak, o.repeats);
  std::printf("%-20s %-7s %-26s %-52s %-8s %10s %9s %8s %7s\n", "op", "set", "case", "shapes", "dtype", "ms",
              "GFLOP/s", "GB/s", "%peak");
  int failed = 0;
  for (const OpCase& c : cases) {
    try {
      const OpNode node = run_case(c, *target);
      std::vector<double> ms;
      for (int r = 0; r < o.repeats; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        target->run(node);
        target->synchronize();
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      const double m = median(ms), flops = op_flops(node), bytes = op_bytes(node, o.precision);
      const double gflops = flops / (m * 1e6), gbps = bytes / (m * 1e6);
      char pct[16] = "-";
      if (matmul_class(c.op) && peak > 0) std::snprintf(pct, sizeof pct, "%.0f%%", 100 * gflops / peak);
      std::printf("%-20s %-7s %-26s %-52s %-8s %10.3f %9.1f %8.1f %7s\n", op_name(c.op), set_name(c.set), c.tag.c_str(),
                  describe(node).c_str(), dtype_of(node).c_str(), m, gflops, gbps, pct);
    } catch (const std::exception& e) {
      ++failed;
      std::printf("%-20s %-7s %-26s FAIL: %s\n", op_name(c.op), set_name(c.set), c.tag.c_str(), e.what());
    }
    std::fflush(stdout);
  }
  return failed ? 1 : 0;
}

// Every op needs awkward and tiny cases; base lists the ops its graph uses (the others are named).
bool coverage_ok(Precision precision) {
  bool ok = true;
  std::string base_missing;
  for (OpKind k : kAllOps) {
    for (ShapeSet s : kAllSets) {
      if (!make_cases(k, s, precision).empty()) continue;
      if (s == ShapeSet::kBase) {
        base_missing += (base_missing.empty() ? "" : ", ") + std::string(op_name(k));
      } else {
        std::fprintf(stderr, "FAIL coverage: op %s has no %s case\n", op_name(k), set_name(s));
        ok = false;
      }
    }
  }
  if (!base_missing.empty()) std::printf("base has no case for: %s\n", base_missing.c_str());
  return ok;
}

int run(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
    require_backend(o.backend, {o.threads, o.precision, 0});
    require_backend(o.reference, {o.threads, o.precision, 0});
  } catch (const UsageError& e) {
    std::fprintf(stderr, "test_backend_ops: %s\n", e.message.c_str());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "test_backend_ops: %s\n", e.what());
    return 2;
  }
  const bool covered = coverage_ok(o.precision);
  std::vector<OpCase> cases;
  for (OpKind k : kAllOps) {
    if (!o.ops.empty() && !o.ops.count(k)) continue;
    for (ShapeSet s : o.sets) {
      for (OpCase& c : make_cases(k, s, o.precision)) cases.push_back(std::move(c));
    }
  }
  if (o.list) {
    for (const OpCase& c : cases) std::printf("%s\n", name_of(c).c_str());
    return covered ? 0 : 1;
  }
  const int rc = o.perf ? time_cases(o, cases) : check_cases(o, cases);
  return covered ? rc : 1;
}

}  // namespace
}  // namespace bev::op_harness

int main(int argc, char** argv) {
  try {
    return bev::op_harness::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "test_backend_ops: %s\n", e.what());
    return 1;
  }
}
