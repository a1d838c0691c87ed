// The case tables of the transformer's ops (the bev stage, and the image stage's value
// projection). tiny and base differ in the BEV size, the camera feature levels SCA reads and
// SCA's rebatched slot count (per camera max_len, fixed by the rig: the synthetic nuScenes rig
// of `bevformer describe`), so both come from one description of the graph.
#include <cmath>
#include <limits>
#include <utility>

#include "backend_ops.h"

namespace bev::op_harness {

Graph graph(ShapeSet s) {
  Graph g;
  if (s == ShapeSet::kTiny) {
    g.bev = 50;
    g.hw = 50 * 50;
    g.max_len = 511;  // `bevformer describe --config tiny`: gather_rows i64[3066]
    g.sca_levels = {{15, 25}};
  } else {
    g.bev = 200;
    g.hw = 200 * 200;
    g.max_len = 8179;  // `bevformer describe --config base`: gather_rows i64[49074]
    g.sca_levels = {{116, 200}, {58, 100}, {29, 50}, {15, 25}};
  }
  return g;
}

PreparedWeights linear_weights(Ops& ops, int64_t in, int64_t out, bool relu, bool bias, uint64_t seed) {
  const Tensor b = values({out}, seed + 1, 0.5f);
  return ops.prepare_linear(weight({out, in}, seed + 2, in), bias ? &b : nullptr, {.relu = relu});
}

namespace {

// x_dtype and y_dtype: bf16 only in bf16 precision (the model's compact activations).
void add_linear(CaseList& l, std::string tag, Shape x, int64_t out, bool relu = false, bool bias = true,
                float large = 1.0f, DType x_dtype = DType::kF32, DType y_dtype = DType::kF32) {
  l.add(std::move(tag), [x, out, relu, bias, large, x_dtype, y_dtype](Ops& ops, uint64_t seed) {
    const PreparedWeights w = linear_weights(ops, x.back(), out, relu, bias, seed);
    const Tensor xs = values(x, seed + 3, 1.0f, large);
    ops.linear(up(ops, x_dtype == DType::kBF16 ? to_bf16(xs) : xs), w, "x", y_dtype);
  });
}

}  // namespace

void ffn_norm_cases(CaseList& l) {
  auto add = [&](std::string tag, int64_t rows, int64_t c, int64_t h) {
    l.add(std::move(tag), [rows, c, h, bf16 = l.bf16()](Ops& ops, uint64_t seed) {
      const PreparedWeights fc1 = linear_weights(ops, c, h, true, true, seed);
      const PreparedWeights fc2 = linear_weights(ops, h, c, false, true, seed + 10);
      ops.ffn_norm(up(ops, values({rows, c}, seed + 20, 2.0f)), fc1, fc2, up(ops, values({c}, seed + 21, 2.0f)),
                   up(ops, values({c}, seed + 22)), 1e-5f, bf16 ? DType::kBF16 : DType::kF32, "x");
    });
  };
  if (l.set() == ShapeSet::kAwkward) {
    add("1 row, 1 channel", 1, 1, 3);
    add("517 rows, 24 -> 40", 517, 24, 40);
    add("33 channels, 64 hidden", 100, 33, 64);
    return;
  }
  const Graph g = graph(l.set());
  add("enc.ffn_norm", g.hw, g.c, g.ffn);
  add("dec.ffn_norm", g.queries, g.c, g.ffn);
}

void linear_cases(CaseList& l) {
  if (l.set() == ShapeSet::kAwkward) {
    add_linear(l, "1 row", {1, 7}, 3, true);
    add_linear(l, "rank 1", {9}, 4);
    add_linear(l, "odd 13x33 -> 17 no bias", {13, 33}, 17, false, false, 100.0f);
    add_linear(l, "rank 3", {2, 5, 19}, 65, true);
    add_linear(l, "257x129 -> 255", {257, 129}, 255, true, true, 100.0f);
    add_linear(l, "1 output", {31, 64}, 1);
    if (l.bf16()) {
      add_linear(l, "bf16 x, bf16 y, 257x129 -> 255", {257, 129}, 255, true, true, 100.0f, DType::kBF16, DType::kBF16);
      add_linear(l, "bf16 x 3x5 -> 2", {3, 5}, 2, false, true, 1.0f, DType::kBF16, DType::kF32);
      add_linear(l, "bf16 y, rank 3", {2, 5, 19}, 65, false, false, 1.0f, DType::kF32, DType::kBF16);
    }
    return;
  }
  const Graph g = graph(l.set());
  const int64_t hw = g.hw, c = g.c, q = g.queries;
  add_linear(l, "can_bus_mlp.0", {1, 18}, c / 2, true);
  add_linear(l, "can_bus_mlp.2", {1, c / 2}, c, true);
  // The value projections and the FFN's hidden layer in the model's compact dtype (attention.h).
  const DType compact = l.act();
  add_linear(l, "img.values.value_proj", {g.cams, g.lv(), c}, c, false, true, 1.0f, DType::kF32, compact);
  add_linear(l, "tsa.value_proj", {g.queue * hw, c}, c, false, true, 1.0f, DType::kF32, compact);
  add_linear(l, "tsa.sampling_offsets", {hw, 2 * c}, g.heads * g.queue * g.tsa_points * 2);
  add_linear(l, "tsa.attention_weights", {hw, 2 * c}, g.heads * g.queue * g.tsa_points);
  add_linear(l, "sca.sampling_offsets", {g.slots(), c}, g.heads * g.levels() * g.sca_points * 2);
  add_linear(l, "sca.attention_weights", {g.slots(), c}, g.heads * g.levels() * g.sca_points);
  add_linear(l, "enc.output_proj", {hw, c}, c);
  add_linear(l, "enc.ffn.0", {hw, c}, g.ffn, true, true, 1.0f, DType::kF32, compact);
  add_linear(l, "enc.ffn.1", {hw, g.ffn}, c, false, true, 1.0f, compact, DType::kF32);
  add_linear(l, "dec.reference_points", {q, c}, 3);
  add_linear(l, "dec.q_proj", {q, c}, c);
  add_linear(l, "dec.sampling_offsets", {q, c}, g.heads * g.dec_points * 2);
  add_linear(l, "dec.attention_weights", {q, c}, g.heads * g.dec_points);
  add_linear(l, "dec.ffn.0", {q, c}, g.ffn, true, true, 1.0f, DType::kF32, compact);
  add_linear(l, "dec.ffn.1", {q, g.ffn}, c, false, true, 1.0f, compact, DType::kF32);
  add_linear(l, "reg_branches.4", {q, c}, g.code);
}

namespace {

void add_bmm(CaseList& l, std::string tag, Shape a, Shape b, BatchedMatmulAttrs attrs) {
  l.add(std::move(tag), [a, b, attrs](Ops& ops, uint64_t seed) {
    ops.batched_matmul(up(ops, values(a, seed)), up(ops, values(b, seed + 1)), attrs, "x");
  });
}

}  // namespace

void batched_matmul_cases(CaseList& l) {
  if (l.set() == ShapeSet::kAwkward) {
    add_bmm(l, "1x1x1", {1, 1, 1}, {1, 1, 1}, {});
    add_bmm(l, "odd", {3, 5, 7}, {3, 7, 9}, {.scale = 0.5f});
    add_bmm(l, "odd transposed", {2, 13, 17}, {2, 11, 17}, {.transpose_b = true, .scale = 0.25f});
    add_bmm(l, "8 heads 33x65x31", {8, 33, 65}, {8, 65, 31}, {});
    return;
  }
  const Graph g = graph(l.set());
  const float scale = 1.0f / std::sqrt(static_cast<float>(g.hd));
  // The decoder's self-attention shapes (the model runs them as one attention op since 2026-12-04).
  add_bmm(l, "self-attention scores shape", {g.heads, g.queries, g.hd}, {g.heads, g.queries, g.hd},
          {.transpose_b = true, .scale = scale});
  add_bmm(l, "self-attention context shape", {g.heads, g.queries, g.queries}, {g.heads, g.queries, g.hd}, {});
}

namespace {

void add_attention(CaseList& l, std::string tag, Shape q, int64_t k_len, AttentionAttrs attrs) {
  l.add(std::move(tag), [q, k_len, attrs](Ops& ops, uint64_t seed) {
    const Shape kv = {q[0], k_len, q[2]};
    ops.attention(up(ops, values(q, seed, 2.0f)), up(ops, values(kv, seed + 1, 2.0f)), up(ops, values(kv, seed + 2)),
                  attrs, "x");
  });
}

}  // namespace

void attention_cases(CaseList& l) {
  if (l.set() == ShapeSet::kAwkward) {
    add_attention(l, "1 query 1 key", {1, 1, 1}, 1, {});
    add_attention(l, "3 heads of 5, 37x29", {2, 37, 15}, 29, {.heads = 3, .scale = 0.4f});
    add_attention(l, "8 heads, 1000 queries x 7 keys", {1, 1000, 64}, 7, {.heads = 8, .scale = 0.35f});
    return;
  }
  const Graph g = graph(l.set());
  const float scale = 1.0f / std::sqrt(static_cast<float>(g.hd));
  add_attention(l, "dec.self_attn", {1, g.queries, g.c}, g.queries, {.heads = static_cast<int>(g.heads), .scale = scale});
  add_attention(l, "dec.self_attn, 3 vehicles", {3, g.queries, g.c}, g.queries,
                {.heads = static_cast<int>(g.heads), .scale = scale});
}

namespace {

// With `residual`: layer_norm(x + residual) as one op (the post-norm layers' add and norm).
void add_layer_norm(CaseList& l, std::string tag, Shape x, float mean = 0.0f, float eps = 1e-5f, bool residual = false) {
  l.add(std::move(tag), [x, mean, eps, residual](Ops& ops, uint64_t seed) {
    Tensor h = values(x, seed, 2.0f);
    float* p = h.data<float>();
    for (int64_t i = 0; i < h.numel(); ++i) p[i] += mean;
    const int64_t c = x.back();
    const Tensor gamma = up(ops, values({c}, seed + 1, 2.0f)), beta = up(ops, values({c}, seed + 2));
    if (residual)
      ops.add_layer_norm(up(ops, h), up(ops, values(x, seed + 3, 3.0f)), gamma, beta, eps, "x");
    else
      ops.layer_norm(up(ops, h), gamma, beta, eps, "x");
  });
}

void add_softmax(CaseList& l, std::string tag, Shape x, float scale, bool minus_inf = false) {
  l.add(std::move(tag), [x, scale, minus_inf](Ops& ops, uint64_t seed) {
    Tensor h = values(x, seed, scale);
    if (minus_inf) h.data<float>()[1] = -std::numeric_limits<float>::infinity();
    ops.softmax(up(ops, h), "x");
  });
}

}  // namespace

void layer_norm_cases(CaseList& l) {
  if (l.set() == ShapeSet::kAwkward) {
    add_layer_norm(l, "1 channel", {3, 1});
    add_layer_norm(l, "1 row", {1, 7});
    // A mean 2000 times the spread: a one-pass variance (E[x^2] - E[x]^2) cancels to noise.
    add_layer_norm(l, "mean 4e3, 257 ch", {13, 257}, 4000.0f);
    add_layer_norm(l, "rank 3, eps 1e-6", {2, 3, 33}, -3.0f, 1e-6f);
    add_layer_norm(l, "residual, 1 channel", {5, 1}, 0.0f, 1e-5f, true);
    add_layer_norm(l, "residual, mean 4e3, 257 ch", {13, 257}, 4000.0f, 1e-5f, true);
    add_layer_norm(l, "residual, rank 3", {2, 3, 33}, -3.0f, 1e-6f, true);
    return;
  }
  const Graph g = graph(l.set());
  add_layer_norm(l, "can_bus_mlp.norm", {1, g.c});
  add_layer_norm(l, "enc.norms (residual)", {g.hw, g.c}, 0.0f, 1e-5f, true);
  add_layer_norm(l, "dec.norms (residual)", {g.queries, g.c}, 0.0f, 1e-5f, true);
}

void softmax_cases(CaseList& l) {
  if (l.set() == ShapeSet::kAwkward) {
    add_softmax(l, "1 element", {1, 1}, 1.0f);
    // exp(+-200) overflows f32: only a max-subtracted softmax gets these rows right.
    add_softmax(l, "magnitudes 200", {5, 7}, 200.0f);
    add_softmax(l, "-inf entry", {3, 5}, 3.0f, true);
    add_softmax(l, "1000 wide", {3, 1000}, 10.0f);
    add_softmax(l, "rank 3 odd", {2, 3, 17}, 3.0f);
    return;
  }
  const Graph g = graph(l.set());
  add_softmax(l, "tsa.attention_softmax", {g.hw * g.heads * g.queue, g.tsa_points}, 3.0f);
  add_softmax(l, "sca.attention_softmax", {g.slots() * g.heads, g.levels() * g.sca_points}, 3.0f);
  add_softmax(l, "self-attention scores shape", {g.heads, g.queries, g.queries}, 3.0f);
  add_softmax(l, "dec.attention_softmax", {g.queries * g.heads, g.dec_points}, 3.0f);
}

namespace {

// relu, sigmoid or inverse_sigmoid (the list's op) on x.
void add_unary(CaseList& l, std::string tag, Tensor (*make)(const Shape&, uint64_t), Shape x) {
  const OpKind op = l.op();
  l.add(std::move(tag), [op, make, x](Ops& ops, uint64_t seed) {
    const Tensor t = up(ops, make(x, seed));
    if (op == OpKind::relu) ops.relu(t, "x");
    if (op == OpKind::sigmoid) ops.sigmoid(t, "x");
    if (op == OpKind::inverse_sigmoid) ops.inverse_sigmoid(t, 1e-5f, "x");
  });
}

Tensor wide(const Shape& s, uint64_t seed) { return values(s, seed, 4.0f, 30.0f); }  // up to +-120
Tensor plain(const Shape& s, uint64_t seed) { return values(s, seed, 2.0f); }
// Around [0, 1] and past it, with exact 0, 1, -0 and values below eps: every clamp of
// inverse_sigmoid, and relu's and sigmoid's signed zeros, infinities and NaN.
Tensor specials(const Shape& s, uint64_t seed) {
  Tensor t = uniform(s, seed, -0.5f, 1.5f);
  float* p = t.data<float>();
  const float inf = std::numeric_limits<float>::infinity();
  const float special[] = {0.0f, 1.0f, -0.0f, 1e-7f, 1.0f - 1e-7f, inf, -inf, std::nanf(""), 0.5f};
  for (int64_t i = 0; i < t.numel(); i += 3) p[i] = special[(i / 3) % 9];
  return t;
}
Tensor probabilities(const Shape& s, uint64_t seed) { return uniform(s, seed, 0.0f, 1.0f); }

}  // namespace

void unary_cases(CaseList& l) {
  if (l.set() == ShapeSet::kAwkward) {
    add_unary(l, "1 element", plain, {1});
    add_unary(l, "magnitudes 120", wide, {7, 13});
    add_unary(l, "specials", specials, {2, 3, 1, 5, 7});
    add_unary(l, "1001 elements", plain, {1001});
    return;
  }
  const Graph g = graph(l.set());
  if (l.op() == OpKind::relu) {
    // The head's branches; base adds the DCN blocks' ReLU after deform_conv2d.
    add_unary(l, "cls_branches.relu", plain, {g.queries, g.c});
    if (l.set() == ShapeSet::kBase) add_unary(l, "img.layer3.1.relu2", plain, {6, 58, 100, 256});
  } else if (l.op() == OpKind::sigmoid) {
    add_unary(l, "dec.init_reference", plain, {g.queries, 3});
    add_unary(l, "dec.pack.scores", wide, {g.queries * g.classes});
  } else {
    // Not in the graph (reference_refine fuses it): the decoder's reference shape stands in.
    add_unary(l, "reference shape (not in graph)", probabilities, {g.queries, 3});
  }
}

namespace {

// out: add's output dtype (bf16 only in bf16 precision).
void add_binary(CaseList& l, std::string tag, Shape a, Shape b, float large = 1.0f, DType out = DType::kF32) {
  const OpKind op = l.op();
  l.add(std::move(tag), [op, a, b, large, out](Ops& ops, uint64_t seed) {
    const Tensor x = up(ops, values(a, seed, 1.0f, large)), y = up(ops, values(b, seed + 1, 1.0f, large));
    if (op == OpKind::add) ops.add(x, y, "x", out);
    if (op == OpKind::mul) ops.mul(x, y, "x");
  });
}

}  // namespace

void binary_cases(CaseList& l) {
  if (l.set() == ShapeSet::kAwkward) {
    add_binary(l, "1 element", {1}, {1});
    add_binary(l, "equal odd", {7, 13}, {7, 13}, 1e4f);
    add_binary(l, "row broadcast", {7, 13}, {1, 13});
    add_binary(l, "column broadcast", {7, 13}, {7, 1}, 1e4f);
    add_binary(l, "rank 4 mixed", {2, 3, 5, 7}, {2, 1, 5, 1});
    add_binary(l, "scalar", {3, 33}, {1, 1});
    if (l.op() == OpKind::add && l.bf16()) {
      add_binary(l, "equal odd, bf16 out", {7, 13}, {7, 13}, 1e4f, DType::kBF16);
      add_binary(l, "row broadcast, 300 columns, bf16 out", {5, 300}, {1, 300}, 1.0f, DType::kBF16);
    }
    return;
  }
  const Graph g = graph(l.set());
  if (l.op() == OpKind::add) {
    add_binary(l, "enc residual", {g.hw, g.c}, {g.hw, g.c});
    add_binary(l, "dec residual", {g.queries, g.c}, {g.queries, g.c});
    // TSA's query (x + bev_pos), which only its projections read: compact in bf16 precision.
    add_binary(l, "enc.tsa.query", {g.hw, g.c}, {g.hw, g.c}, 1.0f, l.act());
  } else {
    add_binary(l, "BEV x scalar", {g.hw, g.c}, {1, 1});
    add_binary(l, "sca.count_mean", {g.hw, g.c}, {g.hw, 1});
  }
}

void feat_flatten_cases(CaseList& l) {
  // levels: (images, hw) per level; cams: rows of cams_embeds (0: use_cams_embeds false).
  auto add = [&](std::string tag, int64_t images, std::vector<int64_t> hws, int64_t c, int64_t cams, DType out,
                 float large = 1.0f) {
    l.add(std::move(tag), [=](Ops& ops, uint64_t seed) {
      std::vector<Tensor> maps, rows;
      for (size_t i = 0; i < hws.size(); ++i) {
        maps.push_back(up(ops, values({images, hws[i], c}, seed + 2 * i, 1.0f, large)));
        rows.push_back(up(ops, values({c}, seed + 2 * i + 1)));
      }
      const Tensor cam = cams > 0 ? up(ops, values({cams, c}, seed + 100)) : Tensor();
      ops.feat_flatten(maps, rows, cam, "x", out);
    });
  };
  if (l.set() == ShapeSet::kAwkward) {
    add("one level, 1x1, no cams_embeds", 1, {1}, 1, 0, DType::kF32);
    add("three levels, C 37, 2 cams of 4 images", 4, {5, 1, 3}, 37, 2, DType::kF32, 1e4f);
    if (l.bf16()) {
      add("bf16 out, C 300", 3, {7, 2}, 300, 3, DType::kBF16, 1e4f);
      add("bf16 out, C 17, no cams_embeds", 2, {4}, 17, 0, DType::kBF16);
    }
    return;
  }
  const Graph g = graph(l.set());
  std::vector<int64_t> hws;
  for (const auto& [h, w] : g.sca_levels) hws.push_back(h * w);
  // The image features only the value projections read: compact (bf16) in bf16 precision.
  add("img.values.feat_flatten", g.cams, hws, g.c, g.cams, l.act());
  add("img.values.feat_flatten, batch of 2", 2 * g.cams, hws, g.c, g.cams, l.act());
}

void add_rows_cases(CaseList& l) {
  auto add = [&](std::string tag, Shape a, float large = 1.0f, DType out = DType::kF32) {
    l.add(std::move(tag), [a, large, out](Ops& ops, uint64_t seed) {
      ops.add_rows(up(ops, values(a, seed, 1.0f, large)), up(ops, values({a.back()}, seed + 1)), "x", out);
    });
  };
  if (l.set() == ShapeSet::kAwkward) {
    add("1x1", {1, 1});
    add("odd", {13, 7}, 1e4f);
    add("rank 3", {2, 5, 33});
    add("rank 1", {17});
    if (l.bf16()) {
      add("bf16 out, odd", {13, 7}, 1e4f, DType::kBF16);
      add("bf16 out, 300 columns", {3, 300}, 1.0f, DType::kBF16);  // past the kernel's 256-column block
    }
    return;
  }
  const Graph g = graph(l.set());
  add("enc.bev_queries", {g.hw, g.c});
}

void zeros_cases(CaseList& l) {
  auto add = [&](std::string tag, Shape s) { l.add(std::move(tag), [s](Ops& ops, uint64_t) { ops.zeros(s, "x"); }); };
  if (l.set() == ShapeSet::kAwkward) {
    add("1 element", {1});
    add("odd", {7, 13});
    add("rank 3", {3, 5, 7});
    return;
  }
  add("sca.slots", {graph(l.set()).hw, 256});
}

}  // namespace bev::op_harness
