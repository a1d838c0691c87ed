// The op interface: every op runs eagerly and recorded, and a recorded sequence replays on new
// inputs (written in place) bit-identically to running those inputs eagerly.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <thread>

#include "backend/cpu/onednn.h"
#include "backend/ops.h"
#include "backend/recorded_stage.h"
#include "bevformer/error.h"
#include "precision_test_util.h"

namespace bev {
namespace {

Tensor random(const Shape& s, uint32_t seed, float scale = 1.0f) {
  Tensor t = Tensor::empty(s, DType::kF32);
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
  return t;
}

Tensor index_tensor(std::vector<int64_t> v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI64);
  std::memcpy(t.raw_data(), v.data(), v.size() * 8);
  return t;
}

// A small stand-in for a model stage that touches every op kind.
struct MiniStage {
  PreparedWeights conv_a, conv_b, conv_offset, dcn, fc1, fc2, fc3, fc4, fc5, fc6, fc7, fc8, blk1, blk2, blk3, block;
  Tensor gamma, beta, row, idx, idx_pad, idx_multi, slots;
  Tensor level_row0, level_row1, cams_embeds;  // feat_flatten's rows (6 channels, 2 cameras)
  Tensor pixels;                               // two cameras' u8 BGR pixels, 7 x 13

  explicit MiniStage(Ops& ops) {
    conv_a = ops.prepare_conv2d(random({6, 5, 3, 3}, 1, 0.3f), nullptr, {.stride_h = 1, .stride_w = 1, .pad_h = 1, .pad_w = 1, .relu = true});
    Conv2dAttrs res{};
    res.residual = true;
    res.relu = true;
    conv_b = ops.prepare_conv2d(random({6, 6, 1, 1}, 2, 0.3f), nullptr, res);
    // A stride-1 bottleneck 6 -> 3 -> 3 -> 6 as one op.
    Tensor bb = random({3}, 15, 0.1f);
    blk1 = ops.prepare_conv2d(random({3, 6, 1, 1}, 14, 0.3f), &bb, {.relu = true});
    blk2 = ops.prepare_conv2d(random({3, 3, 3, 3}, 16, 0.3f), nullptr, {.pad_h = 1, .pad_w = 1, .relu = true});
    blk3 = ops.prepare_conv2d(random({6, 3, 1, 1}, 17, 0.3f), nullptr, res);
    block = ops.prepare_bottleneck(blk1, blk2, blk3, nullptr, DType::kF32);
    Tensor ob = random({27}, 4, 0.1f);
    conv_offset = ops.prepare_conv2d(random({27, 6, 3, 3}, 3, 0.05f), &ob, {.pad_h = 1, .pad_w = 1});
    dcn = ops.prepare_deform_conv2d(random({7, 6, 3, 3}, 5, 0.2f), nullptr, {});
    Tensor b1 = random({16}, 7);
    fc1 = ops.prepare_linear(random({16, 7}, 6, 0.3f), &b1, {.relu = true});
    fc2 = ops.prepare_linear(random({8, 16}, 8, 0.3f), nullptr, {});
    fc3 = ops.prepare_linear(random({4, 16}, 12, 0.3f), nullptr, {});
    fc4 = ops.prepare_linear(random({3, 16}, 13, 0.3f), nullptr, {});
    fc5 = ops.prepare_linear(random({4, 16}, 14, 0.3f), nullptr, {});
    fc6 = ops.prepare_linear(random({8, 16}, 15, 0.3f), nullptr, {});
    fc7 = ops.prepare_linear(random({16, 8}, 16, 0.3f), &b1, {.relu = true});
    fc8 = ops.prepare_linear(random({1, 16}, 17, 0.3f), nullptr, {});
    gamma = random({8}, 9);
    beta = random({8}, 10);
    row = random({8}, 11);
    level_row0 = random({6}, 21);
    level_row1 = random({6}, 22);
    cams_embeds = random({2, 6}, 23);
    Tensor px = Tensor::empty({2, 7, 13, 3}, DType::kU8);
    for (int64_t i = 0; i < px.numel(); ++i) px.data<uint8_t>()[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
    pixels = ops.constant(px);
    idx = index_tensor({3, 0, 5, 1});
    idx_pad = index_tensor({-1, 7, 197, -1, 7});  // -1: padding (a zero row / a skipped row)
    idx_multi = index_tensor({gather_multi_index(1, 3), -1, gather_multi_index(0, 197), gather_multi_index(1, 0)});
    // SCA's slots: two cameras of 99, camera 0 sees cells 0, 2, ..., camera 1 cells 40..129 (some
    // seen by both), the rest padding.
    std::vector<int64_t> s(198, -1);
    for (int64_t j = 0; j < 80; ++j) s[static_cast<size_t>(j)] = 2 * j;
    for (int64_t j = 0; j < 90; ++j) s[static_cast<size_t>(99 + j)] = 40 + j;
    slots = index_tensor(s);
  }

  Tensor count;  // the last run's count_nonfinite of its attention rows

  Tensor run(Ops& ops, const Tensor& image /*[2, 9, 11, 5] NHWC*/) {
    // The test pipeline on pixels: 7 x 13 at 0.8 is 5 x 10, padded to 8 x 16.
    Tensor pre = ops.image_preprocess(pixels, {.mean = {100, 110, 120}, .std = {50, 55, 60}, .to_rgb = true,
                                               .resized_height = 5, .resized_width = 10, .padded_height = 8,
                                               .padded_width = 16},
                                      "preprocess");
    Tensor a = ops.conv2d(image, conv_a, nullptr, "conv_a");           // [2, 9, 11, 6]
    Tensor b = ops.conv2d(a, conv_b, &a, "conv_b");                    // residual
    Tensor blk = ops.bottleneck(b, block, DType::kF32, /*over_input=*/false, "block");
    Tensor p = ops.max_pool2d(blk, "pool");                            // [2, 5, 6, 6]
    Tensor f = ops.upsample_nearest_add(p, ops.relu(blk), "top_down"); // fine += up(coarse)
    Tensor om = ops.conv2d(f, conv_offset, nullptr, "offset");         // [2, 9, 11, 27]
    Tensor d = ops.deform_conv2d(f, om, dcn, "dcn");                   // [2, 9, 11, 7]
    // Two "levels" (the conv's map and the pool's) flattened as the image features are.
    Tensor flat = ops.feat_flatten({a.reshape({2, 99, 6}), p.reshape({2, 30, 6})}, {level_row0, level_row1},
                                   cams_embeds, "feat_flatten");        // [2, 129, 6]
    Tensor tokens = d.reshape({2 * 9 * 11, 7});
    Tensor h = ops.linear(tokens, fc1, "fc1");
    Tensor q = ops.linear(h, fc2, "fc2");                              // [198, 8]
    Tensor n0 = ops.add_layer_norm(ops.layer_norm(q, gamma, beta, 1e-5f, "norm0"), q, gamma, beta, 1e-5f, "norm1");
    // An FFN back to 8 channels (fc6 16 -> 8 after fc7 8 -> 16 with ReLU), its residual and norm.
    Tensor n = ops.ffn_norm(n0, fc7, fc6, gamma, beta, 1e-5f, DType::kF32, "ffn");
    Tensor s = ops.softmax(ops.add_rows(n, row), "softmax");
    Tensor sig = ops.sigmoid(s);
    Tensor inv = ops.inverse_sigmoid(sig);
    Tensor sum = ops.add(inv, n);
    Tensor scaled = ops.mul(sum, gamma.reshape({1, 8}), "scaled");     // broadcast b [1, 8]
    // Attention over the tokens: value [1, 198, 2, 4], 1 level of 18 x 11.
    Tensor value = ops.add(scaled.reshape({198, 2, 4}), row.reshape({1, 2, 4}), "value").reshape({1, 198, 2, 4});
    // Every value below comes from an op: anything computed outside Ops would not replay.
    Tensor offsets = ops.linear(h, fc2).reshape({198, 2, 1, 2, 2});   // [M, heads, L, P, 2]
    Tensor ref = ops.sigmoid(ops.linear(h, fc3)).reshape({198, 1, 2, 2});  // [M, 1, R = 2, 2]
    Tensor loc = ops.sampling_locations(offsets, ref, {.spatial_shapes = {{18, 11}}}, "loc")
                     .reshape({1, 198, 2, 1, 2, 2});
    Tensor w = ops.softmax(ops.linear(h, fc3).reshape({1, 198, 2, 1, 2}));
    MsdaAttrs ma;
    ma.spatial_shapes = {{18, 11}};
    ma.level_start = {0};
    Tensor att = ops.msda(value, loc, w, ma, "msda");                  // [1, 198, 8]
    // The same sampling from h on, as one op: offsets fc2 [8 = 2 heads x 2 points x xy], weights fc5.
    Tensor fused = ops.deformable_attention(h, ref, value, fc2, fc5, ma, /*softmax_per_level=*/false, "fused");
    // The same per camera of a cell and averaged (SCA): value as two cameras' maps of 9 x 11.
    Tensor sca = ops.spatial_cross_attention(h, slots, ref, ops.sigmoid(ops.linear(h, fc8)), value.reshape({2, 99, 2, 4}),
                                             fc2, fc5, {.spatial_shapes = {{9, 11}}, .level_start = {0}}, DType::kF32, "sca");
    // The head: refine a 3-d reference by reg [198, 8], then boxes in metres.
    Tensor reg = ops.linear(h, fc2, "reg");
    Tensor refined = ops.reference_refine(reg, ops.sigmoid(ops.linear(h, fc4)), "refine");
    Tensor boxes = ops.bbox_denormalize(reg, refined, {.scale = {102.4f, 102.4f, 8.0f}, .offset = {-51.2f, -51.2f, -5.0f}},
                                        "boxes");
    Tensor att2 = att.reshape({198, 8});
    Tensor heads = ops.batched_matmul(ops.permute(att.reshape({198, 2, 4}), {1, 0, 2}),
                                      ops.permute(att.reshape({198, 2, 4}), {1, 0, 2}), {.transpose_b = true, .scale = 0.5f});
    Tensor ctx = ops.attention(att.reshape({2, 99, 8}), att.reshape({2, 99, 8}), ops.relu(att2).reshape({2, 99, 8}),
                               {.heads = 2, .scale = 0.5f}, "attention");
    Tensor g = ops.gather_rows(att2, idx, "gather");
    Tensor acc = ops.scatter_add_rows(g, idx, ops.relu(att2), "scatter");
    // Padded gather and scatter into a fresh zeros: replay must zero it again before adding.
    Tensor g_pad = ops.gather_rows(att2, idx_pad, "gather_pad");      // rows 0 and 3 are zeros
    Tensor acc_pad = ops.scatter_add_rows(g_pad, idx_pad, ops.zeros({198, 8}, "zeros"), "scatter_pad");
    // The padded rows summed and scaled as one op, into 792 rows (most never hit).
    Tensor mean = ops.scatter_mean_rows(g_pad, idx_pad, ops.sigmoid(ops.linear(h, fc3)).reshape({792, 1}), "mean");
    Tensor gm = ops.gather_rows_multi({att2, g}, idx_multi, "gather_multi");  // rows of two sources
    Tensor cat = ops.concat({acc, att2, gm}, 0, "concat");
    auto [top, top_idx] = ops.topk(cat.reshape({-1}), 10, "topk");
    count = ops.count_nonfinite(cat, 2, "count");  // i64: kept beside the result
    return ops.concat({top, heads.reshape({-1}).slice(0, 0, 5).contiguous(), ctx.reshape({-1}), boxes.reshape({-1}),
                       g_pad.reshape({-1}), acc_pad.reshape({-1}), fused.reshape({-1}), sca.reshape({-1}), mean.reshape({-1}),
                       flat.reshape({-1}), pre.reshape({-1})},
                      0);
  }
};

bool identical(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

TEST(Ops, EveryOpHasANameAndTheStageUsesThemAll) {
  auto backend = make_cpu_backend(2, Precision::kF32);
  Ops ops(*backend, Ops::Mode::kPlan);
  MiniStage stage(ops);
  stage.run(ops, random({2, 9, 11, 5}, 20));
  std::set<OpKind> used;
  for (const OpNode& n : ops.nodes()) used.insert(n.kind);
  for (OpKind k : kAllOps) {
    EXPECT_NE(std::string(op_name(k)), "");
    EXPECT_TRUE(used.count(k)) << op_name(k) << " is not exercised by the replay test";
  }
}

TEST(Ops, ReplayOnNewInputsEqualsEager) {
  auto backend = make_cpu_backend(2, Precision::kF32);
  Ops rec(*backend, Ops::Mode::kPlan);
  MiniStage stage(rec);
  const Tensor input = backend->empty({2, 9, 11, 5}, DType::kF32);
  const Tensor out = stage.run(rec, input);
  const Tensor count = stage.count;
  const RecordedStage recorded("mini", rec.take_nodes(), {out, count}, *backend);
  for (const uint64_t seed : {30, 31}) {
    // A new frame: new pixels written into the recorded input, the same stage executed again.
    const Tensor pixels = random({2, 9, 11, 5}, seed);
    backend->write(input, pixels);
    backend->execute(recorded);
    Ops eager(*backend, Ops::Mode::kEager);
    EXPECT_TRUE(identical(out, stage.run(eager, pixels))) << "seed " << seed;
    EXPECT_TRUE(identical(count, stage.count)) << "seed " << seed;
    for (int64_t g = 0; g < 2; ++g) EXPECT_EQ(count.data<int64_t>()[g], 0) << "seed " << seed << " group " << g;
    EXPECT_TRUE(eager.nodes().empty());
  }
}

// Plan mode keeps the ops without running them: its outputs have no memory (reading one is an
// internal error, not garbage) until a RecordedStage places them, and its first execution equals an
// eager run, with the intermediates sharing one arena smaller than their sum.
TEST(Ops, PlannedWithoutRunningEqualsEager) {
  auto backend = make_cpu_backend(2, Precision::kF32);
  Ops rec(*backend, Ops::Mode::kPlan);
  MiniStage stage(rec);
  const Tensor input = random({2, 9, 11, 5}, 32);
  const Tensor out = stage.run(rec, input);
  ASSERT_TRUE(out.storage()->is_deferred());
  EXPECT_THROW((void)out.raw_data(), Error);
  const RecordedStage plan("mini", rec.take_nodes(), {out}, *backend);
  EXPECT_FALSE(out.storage()->is_deferred());
  EXPECT_LT(plan.arena_bytes(), plan.no_reuse_bytes());
  backend->execute(plan);
  Ops eager(*backend, Ops::Mode::kEager);
  EXPECT_TRUE(identical(out, stage.run(eager, input)));
}

// OpenMP's thread count belongs to each calling thread. A thread that never set it (a server
// worker, the pipelined image stage's thread) must still run the backend's ops, oneDNN's
// included, on the backend's `threads`, not on every hardware thread.
TEST(Ops, EveryCallingThreadRunsOnTheBackendsThreadCount) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "one hardware thread: nothing to tell apart";
  auto backend = make_cpu_backend(1, Precision::kF32);
  int before = 0, after = 0;
  Tensor y;
  std::thread worker([&] {
    before = cpu::num_threads();
    Ops ops(*backend);
    const PreparedWeights fc = ops.prepare_linear(random({7, 5}, 40), nullptr, {});
    y = ops.linear(random({3, 5}, 41), fc);
    after = cpu::num_threads();
  });
  worker.join();
  EXPECT_GT(before, 1) << "the new thread already ran on one thread: the check below proves nothing";
  EXPECT_EQ(after, 1);
  EXPECT_EQ(y.shape(), (Shape{3, 7}));
}

TEST(Ops, ShapeErrorsNameTheOpAndExpectation) {
  auto backend = make_cpu_backend(1, Precision::kF32);
  Ops ops(*backend);
  const PreparedWeights fc = ops.prepare_linear(random({4, 3}, 1), nullptr, {});
  try {
    ops.linear(random({5, 2}, 2), fc, "enc0.ffn");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear 'enc0.ffn'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[..., 3]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops.add(random({2, 3}, 1), random({3, 2}, 2)), Error);
  EXPECT_THROW(ops.relu(random({3, 4}, 1).permute({1, 0})), Error);  // strided views are refused
  EXPECT_THROW(ops.topk(random({5}, 1), 6), Error);
}

// Compact bf16 activations (model/attention.h) exist only in bf16 arithmetic (bf16 precision,
// or int8 precision where bf16 outruns f32, whose float parts then run in bf16): in f32 every op refuses a
// bf16 input or a requested bf16 output, naming what it expected; in bf16 the same calls run.
// Copies into bf16 take f32 only.
TEST(Ops, Bf16ActivationsOnlyInBf16Arithmetic) {
  for (const Precision p : bev::precision_test::precisions_here({Precision::kF32, Precision::kBF16, Precision::kInt8})) {
    auto backend = make_cpu_backend(1, p);
    Ops ops(*backend);
    EXPECT_EQ(backend->float_precision(), p == Precision::kInt8 ? (cpu::bf16_outruns_f32() ? Precision::kBF16 : Precision::kF32) : p);
    const bool ok = backend->float_precision() == Precision::kBF16;
    const PreparedWeights fc = ops.prepare_linear(random({4, 3}, 1), nullptr, {});
    const PreparedWeights dcn = ops.prepare_deform_conv2d(random({5, 3, 3, 3}, 2, 0.2f), nullptr, {.relu = true});
    const Tensor x = random({5, 3}, 3), x16 = x.to(DType::kBF16);
    const auto expect = [&](const char* what, const std::function<void()>& call) {
      if (ok) {
        EXPECT_NO_THROW(call()) << what;
        return;
      }
      try {
        call();
        ADD_FAILURE() << what << ": no error in f32 arithmetic (" << precision_name(p) << " precision)";
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << what;
        EXPECT_NE(std::string(e.what()).find("bf16 needs bf16 arithmetic"), std::string::npos) << e.what();
      }
    };
    expect("linear, bf16 x", [&] { ops.linear(x16, fc, "fc"); });
    expect("linear, bf16 y", [&] { ops.linear(x, fc, "fc", DType::kBF16); });
    expect("add_rows, bf16 y", [&] { ops.add_rows(x, random({3}, 4), "rows", DType::kBF16); });
    expect("add, bf16 y", [&] { ops.add(x, random({5, 3}, 4), "sum", DType::kBF16); });
    expect("scatter_mean_rows, bf16 y", [&] {
      ops.scatter_mean_rows(x, index_tensor({0, 1, -1, 1, 0}), random({2, 1}, 5), "mean", DType::kBF16);
    });
    expect("deform_conv2d, bf16 y", [&] {
      ops.deform_conv2d(random({1, 4, 4, 3}, 5), random({1, 4, 4, 27}, 6, 0.1f), dcn, "dcn", DType::kBF16);
    });
    const auto copy_refused = [&](const char* what, const std::function<void()>& call) {
      if (ok) {
        EXPECT_NO_THROW(call()) << what;
      } else {
        EXPECT_THROW(call(), Error) << what;
      }
    };
    copy_refused("concat into bf16", [&] { ops.concat({x, x}, 0, "cat", DType::kBF16); });
    copy_refused("gather_rows into bf16", [&] { ops.gather_rows(x, index_tensor({1, -1}), "g", DType::kBF16); });
    // Only f32 rounds into bf16, at any precision; bf16 never widens.
    EXPECT_THROW(ops.concat({x16, x16}, 0, "cat", DType::kF32), Error);
    EXPECT_THROW(ops.gather_rows(index_tensor({1, 2}).reshape({2, 1}), index_tensor({0}), "g", DType::kBF16), Error);
    const Tensor loc = random({1, 2, 1, 1, 1, 2}, 7), w = random({1, 2, 1, 1, 1}, 8);
    EXPECT_THROW(ops.msda(index_tensor({1, 2, 3, 4}).reshape({1, 4, 1, 1}), loc, w, {{{2, 2}}, {0}}, "msda"), Error);
  }
}

}  // namespace
}  // namespace bev
