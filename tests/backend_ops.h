// The op harness's case tables (tests/backend_ops.cpp runs them): per OpKind, calls of that op
// through Ops, each on inputs generated on the host from the case's seed, so that any backend
// and the reference get the same bytes. Three sets of shapes: awkward (odd and degenerate sizes,
// special values), tiny and base (the op shapes of those presets' recorded stages).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "backend/ops.h"

namespace bev::op_harness {

using SpatialShapes = std::vector<std::pair<int64_t, int64_t>>;  // (H, W) per level

enum class ShapeSet : uint8_t { kAwkward, kTiny, kBase };
inline constexpr ShapeSet kAllSets[] = {ShapeSet::kAwkward, ShapeSet::kTiny, ShapeSet::kBase};
const char* set_name(ShapeSet s);

struct OpCase {
  OpKind op = OpKind::relu;
  ShapeSet set = ShapeSet::kAwkward;
  std::string tag;  // where the shape comes from ("img.layer1.0.conv1") or what is odd about it
  // Makes the inputs (host generation, upload, weight preparation) and makes exactly one call of
  // `op` on `ops` (eager): the runner reads the node's outputs, or runs the node again to time it.
  std::function<void(Ops&)> run;
};

// Every case of `op` in `set`. Cases with bf16 activations exist only for precision kBF16 (Ops
// refuses them in f32); the tiny and base convs take the model's activation dtype at `precision`.
// A new OpKind without an entry here does not compile (-Werror=switch).
std::vector<OpCase> make_cases(OpKind op, ShapeSet set, Precision precision);

// ---- what the tables are built with (backend_ops_cases*.cpp) ----

// Host tensors from (seed, element index) through a counter hash: no state between tensors, so a
// table's inputs do not depend on which cases ran before.
float unit_value(uint64_t seed, int64_t i);  // uniform in (-1, 1), never 0
Tensor uniform(const Shape& s, uint64_t seed, float lo, float hi);
// scale * unit, and every 13th element (by hash) times `large`: negatives and large magnitudes.
Tensor values(const Shape& s, uint64_t seed, float scale = 1.0f, float large = 1.0f);
// A weight with fan_in inputs: uniform with variance 1 / fan_in, so outputs stay O(1).
Tensor weight(const Shape& s, uint64_t seed, int64_t fan_in);
// Linear weights as host tensors in PyTorch's [out, in] layout, prepared; a bias when `bias`.
PreparedWeights linear_weights(Ops& ops, int64_t in, int64_t out, bool relu, bool bias, uint64_t seed);
// count indices in [0, rows), every `pad_every`-th -1 (0: none), repeats allowed.
Tensor indices(int64_t count, int64_t rows, uint64_t seed, int pad_every);
Tensor index_tensor(const std::vector<int64_t>& v);
Tensor to_bf16(const Tensor& t);
// A host tensor in the backend's memory (Backend::upload).
inline Tensor up(Ops& ops, const Tensor& host) { return ops.backend().upload(host); }

// The transformer's dimensions in tiny or base (the bev stage's op shapes follow from them).
struct Graph {
  int64_t bev = 0, hw = 0;  // BEV side and cells
  int64_t c = 256, heads = 8, hd = 32, ffn = 512, queries = 900, cams = 6, classes = 10, code = 10;
  int64_t max_len = 0;  // SCA slots per camera: the most BEV cells one camera of the rig sees
  SpatialShapes sca_levels;  // (H, W) of each FPN level
  int64_t sca_points = 8, tsa_points = 4, dec_points = 4, queue = 2, top = 300;
  int64_t slots() const { return cams * max_len; }
  int64_t lv() const {
    int64_t n = 0;
    for (const auto& [h, w] : sca_levels) n += h * w;
    return n;
  }
  int64_t levels() const { return static_cast<int64_t>(sca_levels.size()); }
};
Graph graph(ShapeSet s);  // tiny or base

// The cases of one (op, set), each with its own seed.
class CaseList {
 public:
  CaseList(OpKind op, ShapeSet set, Precision precision) : op_(op), set_(set), precision_(precision) {}
  OpKind op() const { return op_; }
  ShapeSet set() const { return set_; }
  bool bf16() const { return precision_ == Precision::kBF16; }
  // The dtype the model keeps activations in between convs at this precision.
  DType act() const { return bf16() ? DType::kBF16 : DType::kF32; }
  // fn(ops, seed): seed is fixed per (op, set, position in the table).
  void add(std::string tag, std::function<void(Ops&, uint64_t)> fn);
  std::vector<OpCase> take() { return std::move(cases_); }

 private:
  OpKind op_;
  ShapeSet set_;
  Precision precision_;
  std::vector<OpCase> cases_;
};

// The tables, one function per op (or per family of ops with one signature).
// backend_ops_cases.cpp
void image_preprocess_cases(CaseList& l);
void conv2d_cases(CaseList& l);
void bottleneck_cases(CaseList& l);
void deform_conv2d_cases(CaseList& l);
void max_pool2d_cases(CaseList& l);
void upsample_nearest_add_cases(CaseList& l);
// backend_ops_cases_bev.cpp
void linear_cases(CaseList& l);
void ffn_norm_cases(CaseList& l);
void batched_matmul_cases(CaseList& l);
void attention_cases(CaseList& l);
void layer_norm_cases(CaseList& l);
void softmax_cases(CaseList& l);
void unary_cases(CaseList& l);  // relu, sigmoid, inverse_sigmoid
void binary_cases(CaseList& l);  // add, mul
void add_rows_cases(CaseList& l);
void feat_flatten_cases(CaseList& l);
void zeros_cases(CaseList& l);
// backend_ops_cases_attn.cpp
void sampling_locations_cases(CaseList& l);
void msda_cases(CaseList& l);
void deformable_attention_cases(CaseList& l);
void spatial_cross_attention_cases(CaseList& l);
void head_cases(CaseList& l);  // reference_refine, bbox_denormalize
void topk_cases(CaseList& l);
void gather_rows_cases(CaseList& l);
void scatter_add_rows_cases(CaseList& l);
void scatter_mean_rows_cases(CaseList& l);
void concat_cases(CaseList& l);
void permute_cases(CaseList& l);
void count_nonfinite_cases(CaseList& l);
void gather_rows_multi_cases(CaseList& l);

}  // namespace bev::op_harness
