// The case tables of deformable attention's ops, the head's box ops and the index-driven ops
// (top-k, gathers, scatters, concat, permute).
#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include "backend_ops.h"

namespace bev::op_harness {
namespace {

std::vector<int64_t> level_starts(const SpatialShapes& shapes) {
  std::vector<int64_t> s;
  int64_t at = 0;
  for (const auto& [h, w] : shapes) {
    s.push_back(at);
    at += h * w;
  }
  return s;
}

// SCA's rebatch: camera k's visible cells fill the first count_k of its max_len slots, in cell
// order, the rest are -1 (padding); neighbouring cameras overlap, so scatters meet repeats.
Tensor rebatch_index(const Graph& g) {
  Tensor t = Tensor::empty({g.slots()}, DType::kI64);
  int64_t* p = t.data<int64_t>();
  for (int64_t k = 0; k < g.cams; ++k) {
    const int64_t count = g.max_len * (5 + k) / 10, first = k * g.hw / g.cams - g.max_len / 8;
    for (int64_t j = 0; j < g.max_len; ++j) p[k * g.max_len + j] = j < count ? ((first + j) % g.hw + g.hw) % g.hw : -1;
  }
  return t;
}

void add_locations(CaseList& l, std::string tag, Shape offsets, Shape reference, SpatialShapes shapes,
                   float large = 1.0f) {
  l.add(std::move(tag), [offsets, reference, shapes, large](Ops& ops, uint64_t seed) {
    ops.sampling_locations(up(ops, values(offsets, seed, 4.0f, large)), up(ops, uniform(reference, seed + 1, 0.0f, 1.0f)),
                           {.spatial_shapes = shapes}, "x");
  });
}

// value [bs, Lv, heads, hd]; queries Lq with `points` per level; locations in [-0.1, 1.1] (some
// samples off the map), weights as a softmax gives them unless `signed_weights`.
// value: bf16 with `bf16_value` (bf16 precision only: the model's compact values, attention.h).
void add_msda(CaseList& l, std::string tag, int64_t bs, int64_t lq, int64_t heads, int64_t hd, SpatialShapes shapes,
              int64_t points, bool signed_weights = false, bool bf16_value = false) {
  l.add(std::move(tag), [=](Ops& ops, uint64_t seed) {
    int64_t lv = 0;
    for (const auto& [h, w] : shapes) lv += h * w;
    const auto levels = static_cast<int64_t>(shapes.size());
    const Tensor host_value = values({bs, lv, heads, hd}, seed, 2.0f);
    const Tensor value = up(ops, bf16_value ? to_bf16(host_value) : host_value);
    const Tensor loc = up(ops, uniform({bs, lq, heads, levels, points, 2}, seed + 1, -0.1f, 1.1f));
    const Shape ws = {bs, lq, heads, levels, points};
    const float mean = 1.0f / static_cast<float>(levels * points);
    const Tensor weights = up(ops, signed_weights ? values(ws, seed + 2) : uniform(ws, seed + 2, 0.0f, 2 * mean));
    ops.msda(value, loc, weights, {.spatial_shapes = shapes, .level_start = level_starts(shapes)}, "x");
  });
}

// Deformable attention from the query: query [bs * lq, c] (bf16 with `bf16_in`), reference
// [bs * lq, lr, r, d], value [bs, Lv, heads, hd] (bf16 with `bf16_value`).
void add_deformable_attention(CaseList& l, std::string tag, int64_t bs, int64_t lq, int64_t c, int64_t heads, int64_t hd,
                              SpatialShapes shapes, int64_t points, Shape ref_tail, bool per_level, bool bf16_in = false,
                              bool bf16_value = false) {
  l.add(std::move(tag), [=](Ops& ops, uint64_t seed) {
    int64_t lv = 0;
    for (const auto& [h, w] : shapes) lv += h * w;
    const auto levels = static_cast<int64_t>(shapes.size());
    const int64_t samples = heads * levels * points, rows = bs * lq;
    const PreparedWeights offsets = linear_weights(ops, c, 2 * samples, false, true, seed);
    const PreparedWeights weights = linear_weights(ops, c, samples, false, true, seed + 1);
    const Tensor q = values({rows, c}, seed + 2, 4.0f);
    const Tensor value = values({bs, lv, heads, hd}, seed + 3, 2.0f);
    Shape ref_shape{rows};
    ref_shape.insert(ref_shape.end(), ref_tail.begin(), ref_tail.end());
    ops.deformable_attention(up(ops, bf16_in ? to_bf16(q) : q), up(ops, uniform(ref_shape, seed + 4, 0.0f, 1.0f)),
                             up(ops, bf16_value ? to_bf16(value) : value), offsets, weights,
                             {.spatial_shapes = shapes, .level_start = level_starts(shapes)}, per_level, "x");
  });
}

// SCA's sampling and mean as one op: query [cells, c] f32, index [cams * max_len], reference
// [slots, 1, 4, 2], value [cams, Lv, heads, hd] (bf16 with `compact`, and then the query's rows
// and the mean in bf16 as the model asks).
void add_spatial_cross_attention(CaseList& l, std::string tag, int64_t cells, Tensor index, int64_t cams, int64_t c,
                                 int64_t heads, int64_t hd, SpatialShapes shapes, int64_t points, bool compact) {
  l.add(std::move(tag), [=](Ops& ops, uint64_t seed) {
    int64_t lv = 0;
    for (const auto& [h, w] : shapes) lv += h * w;
    const int64_t samples = heads * static_cast<int64_t>(shapes.size()) * points, slots = index.size(0);
    const PreparedWeights offsets = linear_weights(ops, c, 2 * samples, false, true, seed);
    const PreparedWeights weights = linear_weights(ops, c, samples, false, true, seed + 1);
    const Tensor value = values({cams, lv, heads, hd}, seed + 3, 2.0f);
    const DType dtype = compact ? DType::kBF16 : DType::kF32;
    ops.spatial_cross_attention(up(ops, values({cells, c}, seed + 2, 4.0f)), up(ops, index),
                                up(ops, uniform({slots, 1, 4, 2}, seed + 4, 0.0f, 1.0f)),
                                up(ops, uniform({cells, 1}, seed + 5, 0.1f, 1.0f)),
                                up(ops, compact ? to_bf16(value) : value), offsets, weights,
                                {.spatial_shapes = shapes, .level_start = level_starts(shapes)}, dtype, "x", dtype);
  });
}

}  // namespace

void spatial_cross_attention_cases(CaseList& l) {
  if (l.set() == ShapeSet::kAwkward) {
    add_spatial_cross_attention(l, "1 cell, 1 camera, 1 slot", 1, index_tensor({0}), 1, 3, 1, 1, {{1, 1}}, 4, false);
    add_spatial_cross_attention(l, "3 cameras, repeats, every 4th padding, cells never seen", 57,
                                indices(3 * 31, 57, 77, 4), 3, 24, 3, 17, {{9, 14}, {5, 7}}, 4, false);
    if (l.bf16())
      add_spatial_cross_attention(l, "bf16 rows, value and mean", 301, indices(2 * 200, 301, 79, 7), 2, 32, 8, 32,
                                  {{13, 11}, {7, 6}, {4, 3}}, 8, true);
    return;
  }
  const Graph g = graph(l.set());
  add_spatial_cross_attention(l, "sca.deformable_attention", g.hw, rebatch_index(g), g.cams, g.c, g.heads, g.hd,
                              g.sca_levels, g.sca_points, l.bf16());
}

void deformable_attention_cases(CaseList& l) {
  if (l.set() == ShapeSet::kAwkward) {
    add_deformable_attention(l, "1 of everything", 1, 1, 3, 1, 1, {{1, 1}}, 1, {1, 1, 2}, false);
    add_deformable_attention(l, "2 levels per level, hd 17, bs 2", 2, 53, 24, 3, 17, {{5, 7}, {3, 4}}, 4, {2, 1, 2}, true);
    add_deformable_attention(l, "3 levels, R 4, 8 heads", 3, 41, 32, 8, 32, {{6, 9}, {3, 5}, {1, 2}}, 8, {1, 4, 2}, false);
    if (l.bf16()) {
      add_deformable_attention(l, "bf16 query and value, D 3", 1, 77, 16, 2, 33, {{13, 11}}, 4, {1, 1, 3}, false, true,
                               true);
    }
    return;
  }
  const Graph g = graph(l.set());
  const int64_t b = g.bev;
  const bool compact = l.bf16();  // the model's queries and values are bf16 in bf16 precision
  add_deformable_attention(l, "tsa.deformable_attention", 1, g.hw, 2 * g.c, g.heads, g.hd, {{b, b}, {b, b}}, g.tsa_points,
                           {g.queue, 1, 2}, true, compact, compact);
  add_deformable_attention(l, "sca.deformable_attention", g.cams, g.max_len, g.c, g.heads, g.hd, g.sca_levels,
                           g.sca_points, {1, 4, 2}, false, compact, compact);
  add_deformable_attention(l, "dec.deformable_attention", 1, g.queries, g.c, g.heads, g.hd, {{b, b}}, g.dec_points,
                           {1, 1, 3}, false, false, compact);
}

void sampling_locations_cases(CaseList& l) {
  if (l.set() == ShapeSet::kAwkward) {
    add_locations(l, "1 point", {1, 1, 1, 1, 2}, {1, 1, 1, 2}, {{1, 1}});
    add_locations(l, "reference per level", {7, 3, 2, 4, 2}, {7, 2, 2, 3}, {{5, 7}, {3, 4}}, 100.0f);
    add_locations(l, "pillar anchors, 1-wide map", {9, 2, 1, 8, 2}, {9, 1, 4, 2}, {{13, 1}});
    add_locations(l, "3 levels, R 3", {37, 8, 3, 3, 2}, {37, 1, 3, 2}, {{11, 13}, {6, 7}, {3, 4}});
    return;
  }
  const Graph g = graph(l.set());
  const int64_t b = g.bev;
  add_locations(l, "tsa.sampling_locations", {g.hw, g.heads, g.queue, g.tsa_points, 2}, {g.hw, g.queue, 1, 2},
                {{b, b}, {b, b}});
  add_locations(l, "sca.sampling_locations", {g.slots(), g.heads, g.levels(), g.sca_points, 2}, {g.slots(), 1, 4, 2},
                g.sca_levels);
  add_locations(l, "dec.sampling_locations", {g.queries, g.heads, 1, g.dec_points, 2}, {g.queries, 1, 1, 3}, {{b, b}});
}

void msda_cases(CaseList& l) {
  if (l.set() == ShapeSet::kAwkward) {
    add_msda(l, "1 of everything", 1, 1, 1, 1, {{1, 1}}, 1);
    add_msda(l, "2 levels hd 5 bs 2", 2, 11, 3, 5, {{5, 7}, {3, 4}}, 4, true);
    add_msda(l, "3 levels hd 17", 1, 37, 2, 17, {{6, 9}, {3, 5}, {1, 2}}, 3);
    add_msda(l, "8 heads hd 32, 29 queries", 1, 29, 8, 32, {{13, 11}}, 4, true);
    if (l.bf16()) {
      add_msda(l, "bf16 value, 3 levels hd 17", 1, 37, 2, 17, {{6, 9}, {3, 5}, {1, 2}}, 3, false, true);
      add_msda(l, "bf16 value, hd 33 bs 2", 2, 11, 3, 33, {{5, 7}, {3, 4}}, 4, true, true);
    }
    return;
  }
  const Graph g = graph(l.set());
  const int64_t b = g.bev;
  const bool compact = l.bf16();  // the model's values are bf16 in bf16 precision
  add_msda(l, "tsa.msda", 1, g.hw, g.heads, g.hd, {{b, b}, {b, b}}, g.tsa_points, false, compact);
  add_msda(l, "sca.msda", g.cams, g.max_len, g.heads, g.hd, g.sca_levels, g.sca_points, false, compact);
  add_msda(l, "dec.msda", 1, g.queries, g.heads, g.hd, {{b, b}}, g.dec_points, false, compact);
}

void head_cases(CaseList& l) {
  const OpKind op = l.op();
  auto add = [&](std::string tag, int64_t m, int64_t code, float large) {
    l.add(std::move(tag), [op, m, code, large](Ops& ops, uint64_t seed) {
      const Tensor reg = up(ops, values({m, code}, seed, 3.0f, large));
      // References in sigmoid space, exact 0 and 1 included (inverse_sigmoid's clamps).
      Tensor ref = uniform({m, 3}, seed + 1, 0.0f, 1.0f);
      ref.data<float>()[0] = 0.0f;
      if (m > 1) ref.data<float>()[4] = 1.0f;
      if (op == OpKind::reference_refine) ops.reference_refine(reg, up(ops, ref), "x");
      if (op == OpKind::bbox_denormalize) {
        ops.bbox_denormalize(reg, up(ops, ref), {.scale = {102.4f, 102.4f, 8.0f}, .offset = {-51.2f, -51.2f, -5.0f}},
                             "x");
      }
    });
  };
  if (l.set() == ShapeSet::kAwkward) {
    add("1 row, code 5", 1, 5, 1.0f);
    add("37 rows, magnitudes 60", 37, 10, 20.0f);
    add("3 rows, code 11", 3, 11, 1.0f);
    return;
  }
  const Graph g = graph(l.set());
  add(op == OpKind::reference_refine ? "reg_branches.refine" : "bbox_preds", g.queries, g.code, 1.0f);
}

void topk_cases(CaseList& l) {
  // Scores rounded to multiples of `step`: ties, including across the k-th place.
  auto add = [&](std::string tag, int64_t n, int64_t k, float step, bool with_inf = false) {
    l.add(std::move(tag), [n, k, step, with_inf](Ops& ops, uint64_t seed) {
      Tensor s = uniform({n}, seed, -1.0f, 1.0f);
      float* p = s.data<float>();
      for (int64_t i = 0; i < n; ++i) p[i] = step > 0 ? std::round(p[i] / step) * step : p[i];
      if (with_inf) {
        p[0] = -std::numeric_limits<float>::infinity();
        p[n / 2] = std::numeric_limits<float>::infinity();
      }
      ops.topk(up(ops, s), k, "x");
    });
  };
  if (l.set() == ShapeSet::kAwkward) {
    add("1 of 1", 1, 1, 0.0f);
    add("0 of 5", 5, 0, 0.0f);
    add("ties across k", 37, 10, 0.25f);
    add("all of 100, infinities", 100, 100, 0.125f, true);
    add("300 of 1000, 33 levels", 1000, 300, 1.0f / 16);
    return;
  }
  const Graph g = graph(l.set());
  add("dec.pack.topk", g.queries * g.classes, g.top, 1.0f / 4096);
}

void gather_rows_cases(CaseList& l) {
  // out: the output's dtype (f32 rows into bf16 only in bf16 precision); unset, the source's.
  auto add = [&](std::string tag, Shape src, Tensor idx, DType dtype = DType::kF32, std::optional<DType> out = {}) {
    l.add(std::move(tag), [src, idx, dtype, out](Ops& ops, uint64_t seed) {
      Tensor s = values(src, seed, 1.0f, 100.0f);
      if (dtype != DType::kF32) s = dtype == DType::kBF16 ? to_bf16(s) : s.to(dtype);
      ops.gather_rows(up(ops, s), up(ops, idx), "x", out);
    });
  };
  if (l.set() == ShapeSet::kAwkward) {
    add("1x1, padding and repeats", {1, 1}, index_tensor({-1, 0, 0}));
    add("odd, every 4th padding", {17, 5}, indices(23, 17, 41, 4));
    add("bf16 rows", {9, 7}, indices(11, 9, 42, 3), DType::kBF16);
    add("i64 rows", {5, 3}, indices(8, 5, 43, 5), DType::kI64);
    add("1 wide row", {1, 300}, index_tensor({0, -1, 0}));
    if (l.bf16()) add("f32 rows into bf16, padding", {17, 5}, indices(23, 17, 46, 4), DType::kF32, DType::kBF16);
    return;
  }
  const Graph g = graph(l.set());
  add("enc.prev_bev_rotated", {g.hw, g.c}, indices(g.hw, g.hw, 44, 9));
  add("sca.rebatch", {g.hw, g.c}, rebatch_index(g), DType::kF32, l.act());  // compact rows (attention.h)
}

void scatter_add_rows_cases(CaseList& l) {
  auto add = [&](std::string tag, Shape src, Tensor idx, Shape dst) {
    l.add(std::move(tag), [src, idx, dst](Ops& ops, uint64_t seed) {
      ops.scatter_add_rows(up(ops, values(src, seed, 1.0f, 100.0f)), up(ops, idx), up(ops, values(dst, seed + 1)), "x");
    });
  };
  if (l.set() == ShapeSet::kAwkward) {
    add("repeats into 1 row", {3, 1}, index_tensor({-1, 0, 0}), {1, 1});
    add("odd, every 4th padding", {23, 5}, indices(23, 17, 45, 4), {17, 5});
    add("1 wide row", {1, 300}, index_tensor({1}), {2, 300});
    return;
  }
  const Graph g = graph(l.set());
  add("sca.scatter", {g.slots(), g.c}, rebatch_index(g), {g.hw, g.c});
}

void scatter_mean_rows_cases(CaseList& l) {
  auto add = [&](std::string tag, Shape src, Tensor idx, int64_t rows, DType out = DType::kF32) {
    l.add(std::move(tag), [src, idx, rows, out](Ops& ops, uint64_t seed) {
      ops.scatter_mean_rows(up(ops, values(src, seed, 1.0f, 100.0f)), up(ops, idx),
                            up(ops, uniform({rows, 1}, seed + 1, 0.1f, 1.0f)), "x", out);
    });
  };
  if (l.set() == ShapeSet::kAwkward) {
    add("repeats into 1 row", {3, 1}, index_tensor({-1, 0, 0}), 1);
    add("odd, every 4th padding", {23, 5}, indices(23, 17, 45, 4), 17);
    add("1 wide row, rows never hit", {1, 300}, index_tensor({1}), 3);
    add("blocks of rows, repeats across them", {700, 3}, indices(700, 5000, 7919, 9), 5000);
    if (l.bf16()) add("bf16 out, blocks of rows", {700, 33}, indices(700, 900, 7919, 9), 900, DType::kBF16);
    return;
  }
  const Graph g = graph(l.set());
  // Only output_proj reads the mean: compact (bf16) in bf16 precision.
  add("sca.count_mean", {g.slots(), g.c}, rebatch_index(g), g.hw, l.act());
}

void concat_cases(CaseList& l) {
  auto add = [&](std::string tag, std::vector<Shape> parts, int64_t axis, DType dtype = DType::kF32,
                 std::optional<DType> out = {}) {
    l.add(std::move(tag), [parts, axis, dtype, out](Ops& ops, uint64_t seed) {
      std::vector<Tensor> ts;
      for (const Shape& s : parts) {
        Tensor t = values(s, seed + ts.size(), 1.0f, 100.0f);
        if (dtype != DType::kF32) t = dtype == DType::kBF16 ? to_bf16(t) : t.to(dtype);
        ts.push_back(up(ops, t));
      }
      ops.concat(ts, axis, "x", out);
    });
  };
  if (l.set() == ShapeSet::kAwkward) {
    add("1 part", {{3, 5}}, 0);
    add("3 parts axis 1", {{2, 3, 4}, {2, 1, 4}, {2, 5, 4}}, 1);
    add("axis -1", {{3, 2}, {3, 7}}, -1);
    add("bf16 axis 0", {{1, 5}, {4, 5}}, 0, DType::kBF16);
    add("i64", {{2, 3}, {1, 3}}, 0, DType::kI64);
    if (l.bf16()) {
      add("f32 into bf16, 3 parts axis 1", {{2, 3, 4}, {2, 1, 4}, {2, 5, 4}}, 1, DType::kF32, DType::kBF16);
      add("f32 into bf16, axis 0 past a piece", {{300, 300}, {1, 300}}, 0, DType::kF32, DType::kBF16);
    }
    return;
  }
  const Graph g = graph(l.set());
  // The model's TSA values and query_cat are compact (attention.h): bf16 in bf16 precision.
  add("tsa.value", {{g.hw, g.c}, {g.hw, g.c}}, 0, DType::kF32, l.act());
  add("tsa.query_cat", {{g.hw, g.c}, {g.hw, g.c}}, 1, DType::kF32, l.act());
  add("dec.pack.all_cls_scores", std::vector<Shape>(6, Shape{1, g.queries, g.classes}), 0);
  if (g.levels() > 1) {
    std::vector<Shape> parts;
    for (const auto& [h, w] : g.sca_levels) parts.push_back({g.cams, h * w, g.c});
    add("img.values.feat_flatten", parts, 1);
  }
}

void permute_cases(CaseList& l) {
  auto add = [&](std::string tag, Shape x, std::vector<int64_t> order, DType dtype = DType::kF32) {
    l.add(std::move(tag), [x, order, dtype](Ops& ops, uint64_t seed) {
      Tensor t = values(x, seed, 1.0f, 100.0f);
      if (dtype == DType::kBF16) t = to_bf16(t);
      ops.permute(up(ops, t), order, "x");
    });
  };
  if (l.set() == ShapeSet::kAwkward) {
    add("1 element", {1, 1, 1}, {2, 0, 1});
    add("2x3 transpose", {2, 3}, {1, 0});
    add("NHWC to NCHW", {2, 5, 7, 3}, {0, 3, 1, 2});
    add("rank 5", {2, 3, 1, 5, 7}, {4, 2, 0, 3, 1});
    add("identity", {3, 4}, {0, 1});
    add("bf16 67x129 transpose", {67, 129}, {1, 0}, DType::kBF16);
    return;
  }
  const Graph g = graph(l.set());
  add("query heads shape", {g.queries, g.heads, g.hd}, {1, 0, 2});
  add("heads merged shape", {g.heads, g.queries, g.hd}, {1, 0, 2});
}

// What the stages hand on (the image stage's flattened features, the new BEV), with NaN, +inf and
// -inf planted at the ends and at odd strides (a vector loop's tail and head), or none.
void count_nonfinite_cases(CaseList& l) {
  auto add = [&](std::string tag, Shape x, int64_t every, DType dtype = DType::kF32) {
    l.add(std::move(tag), [x, every, dtype](Ops& ops, uint64_t seed) {
      Tensor t = values(x, seed, 1.0f, 1e30f);
      if (every > 0) {
        float* p = t.data<float>();
        const float bad[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity()};
        p[t.numel() - 1] = bad[0];
        for (int64_t i = 0; i < t.numel() - 1; i += every) p[i] = bad[(i / every) % 3];
      }
      if (dtype == DType::kBF16) t = to_bf16(t);
      ops.count_nonfinite(up(ops, t), x[0], "x");  // a count per leading index (per sample)
    });
  };
  if (l.set() == ShapeSet::kAwkward) {
    add("1 element, none", {1}, 0);
    add("1 element, NaN", {1}, 1);
    add("17x3, every 5th", {17, 3}, 5);
    add("16385 (a chunk and one), every 997th", {16385}, 997);
    add("bf16 67x129, every 13th", {67, 129}, 13, DType::kBF16);
    return;
  }
  const Graph g = graph(l.set());
  // The model's inputs: the image features in the activations' dtype (bf16 in bf16 precision),
  // one count per sample.
  add("img.values.feat_flatten", {g.cams, g.lv(), g.c}, 0, l.act());
  add("img.values.feat_flatten (NaN planted)", {g.cams, g.lv(), g.c}, 100003, l.act());
  add("enc.out.bev_embed (NaN planted)", {1, g.hw, g.c}, 4099);
  add("enc.out.bev_embed, batch of 3 (NaN planted)", {3, g.hw, g.c}, 4099);
}

// Rows from several sources by (source, row): a batch's TSA value stack reads each sample's
// previous BEV from its own stream buffer, the queries and the layer input; -1 rows are zeros.
void gather_rows_multi_cases(CaseList& l) {
  auto add = [&](std::string tag, std::vector<int64_t> rows, int64_t c, int64_t count, int pad_every,
                 DType dtype = DType::kF32) {
    l.add(std::move(tag), [rows, c, count, pad_every, dtype](Ops& ops, uint64_t seed) {
      std::vector<Tensor> srcs;
      for (size_t s = 0; s < rows.size(); ++s) {
        Tensor t = values({rows[s], c}, seed + s, 1.0f, 50.0f);
        if (dtype == DType::kBF16) t = to_bf16(t);
        srcs.push_back(up(ops, t));
      }
      std::vector<int64_t> index(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) {
        const int64_t s = (i * 7 + static_cast<int64_t>(seed % 5)) % static_cast<int64_t>(rows.size());
        index[static_cast<size_t>(i)] = pad_every > 0 && i % pad_every == pad_every - 1
                                            ? -1
                                            : gather_multi_index(s, (i * 13) % rows[static_cast<size_t>(s)]);
      }
      ops.gather_rows_multi(srcs, up(ops, index_tensor(index)), "x");
    });
  };
  if (l.set() == ShapeSet::kAwkward) {
    add("1 source, 1 row", {1}, 1, 1, 0);
    add("3 sources of 5, 1, 9 rows, 7 wide", {5, 1, 9}, 7, 23, 4);
    add("2 sources, all padding", {3, 3}, 5, 4, 1);
    add("bf16, 4 sources, 129 wide", {17, 2, 33, 8}, 129, 61, 6, DType::kBF16);
    return;
  }
  const Graph g = graph(l.set());
  // A batch of 2: two previous BEVs, the queries and the layer input of both samples.
  add("tsa.value_stack, batch of 2", {g.hw, g.hw, 2 * g.hw, 2 * g.hw}, g.c, 4 * g.hw, 0);
}

}  // namespace bev::op_harness
