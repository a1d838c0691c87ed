#include "io/pickle.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "bevformer/error.h"
#include "pickle_builder.h"

namespace bev::pickle {
namespace {

const Value* load(Unpickler& u) { return u.load(); }

// Expects load() to throw bev::Error with an offset; returns it for further checks.
Error load_error(const std::vector<uint8_t>& bytes, Limits limits = {}) {
  Unpickler u(bytes, "test.pkl", limits);
  try {
    u.load();
  } catch (const Error& e) {
    EXPECT_TRUE(e.offset().has_value()) << e.what();
    EXPECT_EQ(e.place(), "test.pkl");
    return e;
  }
  ADD_FAILURE() << "load() did not throw";
  return Error(ErrorKind::kInternal, "no error");
}

TEST(Pickle, Scalars) {
  Pk p;
  p.proto().mark().none().boolean(true).boolean(false).int1(200).int4(-7);
  p.op('M').le(0xBEEF, 2);
  p.op(0x8a).raw({2, 0x00, 0x80});                         // LONG1 -32768
  p.op(0x8a).raw({9, 1, 0, 0, 0, 0, 0, 0, 0, 0});          // LONG1, 9 bytes of redundant sign
  p.op(0x8b).le(0, 4);                                     // LONG4 of zero bytes = 0
  p.op('G').raw({0x3F, 0xF8, 0, 0, 0, 0, 0, 0});          // BINFLOAT 1.5, big-endian
  p.op('U').raw({2, 'h', 'i'});                            // SHORT_BINSTRING
  p.op('C').raw({3, 0, 0xFF, 'a'});                        // SHORT_BINBYTES
  p.op(0x8c).raw({2, 0xC3, 0xA9});                         // SHORT_BINUNICODE "é"
  p.tuple().stop();
  Unpickler u(p.bytes, "t");
  const Value* v = u.load();
  ASSERT_EQ(v->kind, Kind::kTuple);
  ASSERT_EQ(v->items.size(), 13u);
  EXPECT_EQ(v->items[0]->kind, Kind::kNone);
  EXPECT_TRUE(v->items[1]->b);
  EXPECT_FALSE(v->items[2]->b);
  EXPECT_EQ(v->items[3]->i, 200);
  EXPECT_EQ(v->items[4]->i, -7);
  EXPECT_EQ(v->items[5]->i, 0xBEEF);
  EXPECT_EQ(v->items[6]->i, -32768);
  EXPECT_EQ(v->items[7]->i, 1);
  EXPECT_EQ(v->items[8]->i, 0);
  EXPECT_EQ(v->items[9]->f, 1.5);
  EXPECT_EQ(v->items[10]->text, "hi");
  EXPECT_EQ(v->items[11]->kind, Kind::kBytes);
  EXPECT_EQ(v->items[11]->text, std::string("\0\xFF" "a", 3));
  EXPECT_EQ(v->items[12]->text, "\xC3\xA9");
  EXPECT_EQ(repr(v), "(None, True, False, 200, -7, 48879, -32768, 1, 0, 1.5, 'hi', b'\\x00\\xffa', '\xC3\xA9')");
  EXPECT_EQ(load(u), v) << "a second load returns the same root";
}

TEST(Pickle, ContainersMemoAndDuplicateKeys) {
  Pk p;
  p.proto().op('}').put(0).mark();
  p.str("a").int1(1).str("b").op(']').put(1).mark().int1(1).int1(2).op('e');  // APPENDS
  p.str("a").int1(3);                                                           // later 'a' wins
  p.op('u');                                                                     // SETITEMS
  p.str("c").get(1).op('s');                                                     // same list again
  p.str("d").int1(5).int1(6).op(0x86).op('s');                                   // TUPLE2
  p.op(0x94).op(0x8f).op(0x94).mark().int1(9).op(0x90).op('0');                  // set, POP it
  p.stop();
  Unpickler u(p.bytes, "t");
  const Value* d = u.load();
  ASSERT_EQ(d->kind, Kind::kDict);
  ASSERT_EQ(d->entries.size(), 4u);
  EXPECT_EQ(d->entries[0].first->text, "a") << "replaced in place, order kept";
  EXPECT_EQ(d->get("a")->i, 3);
  EXPECT_EQ(d->get("b"), d->get("c"));
  EXPECT_EQ(d->get("b")->items.size(), 2u);
  EXPECT_EQ(d->get("d")->kind, Kind::kTuple);
  EXPECT_EQ(d->get("zz"), nullptr);
  EXPECT_EQ(to_json(d).dump(), R"({"a":3,"b":[1,2],"c":[1,2],"d":[5,6]})");
  EXPECT_EQ(repr(d), "{'a': 3, 'b': [1, 2], 'c': [1, 2], 'd': (5, 6)}");
}

TEST(Pickle, Protocol4Basics) {
  Pk p;
  p.proto(4).op(0x95).le(100, 8);  // FRAME: only its length is consumed
  p.op(0x8c).raw({8, 'b', 'u', 'i', 'l', 't', 'i', 'n', 's'}).op(0x94);
  p.op(0x8c).raw({3, 's', 'e', 't'}).op(0x94).op(0x93).op(0x94);  // STACK_GLOBAL builtins.set
  p.op(']').mark().int1(1).int1(2).op('e').op(0x85).reduce();      // set([1, 2])
  p.op(0x8f).op(0x94).mark().int1(4).op(0x90);                     // EMPTY_SET, ADDITEMS
  p.mark().int1(3).op(0x91);                                       // FROZENSET
  p.op(0x8e).le(2, 8).raw({7, 8});                                 // BINBYTES8
  p.op(0x8d).le(1, 8).raw({'z'});                                  // BINUNICODE8
  p.op(0x87).op(0x87).stop();
  Unpickler u(p.bytes, "t");
  const Value* v = u.load();
  ASSERT_EQ(v->kind, Kind::kTuple);
  EXPECT_EQ(v->items[0]->kind, Kind::kSet);
  EXPECT_EQ(repr(v), "({1, 2}, {4}, ({3}, b'\\x07\\x08', 'z'))");
  EXPECT_EQ(to_json(v).dump(), R"([[1,2],[4],[[3],"<2 bytes>","z"]])");
}

TEST(Pickle, TextMemoOpcodes) {
  Pk p;
  p.op(']').op('p').raw({'1', '2', '\n'}).op('0').op('g').raw({'1', '2', '\n'}).stop();
  Unpickler u(p.bytes, "t");
  EXPECT_EQ(u.load()->kind, Kind::kList);
}

TEST(Pickle, TensorsAndStorages) {
  Pk p;
  p.proto().mark();
  p.tensor("0", {2, 3}, {3, 1});
  // _rebuild_parameter(tensor, True, OrderedDict())
  p.global("torch._utils", "_rebuild_parameter").mark().tensor("1", {4}, {1}).boolean(true);
  p.global("collections", "OrderedDict").op(')').reduce().tuple().reduce();
  // _rebuild_tensor(LongStorage, 0, (), ())
  p.global("torch._utils", "_rebuild_tensor").mark().storage("LongStorage", "2", 1);
  p.int1(0).op(')').op(')').tuple().reduce();
  // _rebuild_from_type_v2(_rebuild_tensor, Tensor, (HalfStorage, 2, (3,), (1,)), {})
  p.global("torch._tensor", "_rebuild_from_type_v2").mark();
  p.global("torch._utils", "_rebuild_tensor").global("torch", "Tensor");
  p.mark().storage("HalfStorage", "3", 8).int1(2).int1(3).op(0x85).int1(1).op(0x85).tuple();
  p.op('}').tuple().reduce();
  p.tuple().stop();
  Unpickler u(p.bytes, "t");
  const Value* v = u.load();
  ASSERT_EQ(v->items.size(), 4u);
  for (const Value* t : v->items) ASSERT_EQ(t->kind, Kind::kTensor) << repr(t);
  const TensorRef& a = v->items[0]->tensor;
  EXPECT_EQ(a.size, (Shape{2, 3}));
  EXPECT_EQ(a.stride, (Shape{3, 1}));
  EXPECT_FALSE(a.requires_grad);
  ASSERT_EQ(a.storage->kind, Kind::kStorage);
  EXPECT_EQ(a.storage->storage.key, "0");
  EXPECT_EQ(a.storage->storage.location, "cpu");
  EXPECT_EQ(a.storage->storage.numel, 64);
  EXPECT_EQ(a.storage->storage.dtype, DType::kF32);
  EXPECT_TRUE(v->items[1]->tensor.requires_grad);
  EXPECT_EQ(v->items[1]->tensor.storage->storage.key, "1");
  EXPECT_EQ(v->items[2]->tensor.storage->storage.dtype, DType::kI64);
  EXPECT_TRUE(v->items[2]->tensor.size.empty());
  EXPECT_EQ(v->items[3]->tensor.storage->storage.dtype, DType::kF16);
  EXPECT_EQ(v->items[3]->tensor.storage_offset, 2);
  EXPECT_EQ(to_json(v).dump(),
            R"(["<tensor f32[2, 3]>","<tensor f32[4]>","<tensor i64[]>","<tensor f16[3]>"])");
}

TEST(Pickle, UnknownGlobalsBecomePlaceholders) {
  Pk p;
  p.proto().op('}').str("obj");
  p.global("numpy.core.multiarray", "scalar").mark().int1(1).str("x").tuple().reduce();
  p.op('}').str("k").int1(2).op('s').op('b').op('s');           // BUILD keeps the state
  p.str("new").global("mmcv.utils", "ConfigDict").op(')').op(0x81);
  p.mark().str("lr").int1(1).op('u').op('s');                    // dict subclass items
  p.str("g").global("os", "system").op('s').stop();
  Unpickler u(p.bytes, "t");
  const Value* d = u.load();
  const Value* o = d->get("obj");
  ASSERT_EQ(o->kind, Kind::kObject);
  EXPECT_EQ(o->text, "numpy.core.multiarray.scalar");
  ASSERT_EQ(o->items.size(), 2u);
  ASSERT_NE(o->state, nullptr);
  EXPECT_EQ(o->state->get("k")->i, 2);
  const Value* n = d->get("new");
  EXPECT_EQ(n->text, "mmcv.utils.ConfigDict");
  ASSERT_EQ(n->entries.size(), 1u);
  EXPECT_EQ(d->get("g")->kind, Kind::kGlobal);
  EXPECT_EQ(repr(d),
            "{'obj': <numpy.core.multiarray.scalar(1, 'x')>, 'new': <mmcv.utils.ConfigDict()>, "
            "'g': <os.system>}");
  EXPECT_EQ(to_json(d).dump(),
            R"({"g":"<os.system>","new":"<mmcv.utils.ConfigDict()>",)"
            R"("obj":"<numpy.core.multiarray.scalar(...)>"})");
}

TEST(Pickle, OrderedDictFromPairsAndBuildMetadata) {
  Pk p;
  p.proto().global("collections", "OrderedDict").op(']').mark();
  p.str("x").int1(1).op(0x86).int1(7).str("y").op(0x86).str("x").int1(2).op(0x86);
  p.op('e').op(0x85).reduce();
  p.op('}').str("_metadata").op('}').op('s').op('b').stop();
  Unpickler u(p.bytes, "t");
  const Value* d = u.load();
  ASSERT_EQ(d->kind, Kind::kDict);
  ASSERT_EQ(d->entries.size(), 2u);
  EXPECT_EQ(d->get("x")->i, 2);
  EXPECT_EQ(d->entries[1].first->i, 7);
  ASSERT_NE(d->state, nullptr);
  EXPECT_NE(d->state->get("_metadata"), nullptr);
  EXPECT_EQ(to_json(d).dump(), R"([["x",2],[7,"y"]])") << "non-string keys give pairs";
}

TEST(Pickle, CyclesAreSafe) {
  Pk p;
  p.proto().op(']').put(0).get(0).op('a');                // l.append(l)
  p.op('}').put(1).str("self").get(1).op('s').op('a');    // d['self'] = d; l.append(d)
  p.stop();
  Unpickler u(p.bytes, "t");
  const Value* l = u.load();
  ASSERT_EQ(l->items.size(), 2u);
  EXPECT_EQ(l->items[0], l);
  EXPECT_EQ(repr(l), "[..., {'self': ...}]");
  EXPECT_EQ(to_json(l).dump(), R"(["<cycle>",{"self":"<cycle>"}])");
}

TEST(Pickle, DeepAndSharedGraphsRenderBounded) {
  Pk p;
  p.proto().none();
  for (int i = 0; i < 5000; ++i) p.op(0x85);                // 5000 nested 1-tuples
  p.put(0).get(0).get(0).op(0x86);
  for (int i = 0; i < 60; ++i) p.op('2').op(0x86);          // (x, x) 60 deep: 2^60 leaves
  p.stop();
  Unpickler u(p.bytes, "t");
  const Value* v = u.load();
  const std::string r = repr(v);
  EXPECT_LT(r.size(), 10000u);
  const nlohmann::json j = to_json(v, 64, 10000);
  EXPECT_LT(j.dump().size(), 200000u);
  EXPECT_NE(j.dump().find("<truncated>"), std::string::npos);
}

TEST(Pickle, Errors) {
  // here() marks the opcode that must be blamed: the error offset is that opcode's first byte.
  const auto expect = [](const Pk& p, ErrorKind kind, const char* text) {
    const Error e = load_error(p.bytes);
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_EQ(e.offset(), p.at) << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  };
  const auto k_bad = ErrorKind::kInvalidInput;
  expect(Pk().proto().here().get(3).stop(), k_bad, "memo index 3 was never stored");
  expect(Pk().proto().here().op('0'), k_bad, "POP without a MARK");
  expect(Pk().proto().here().op('a'), k_bad, "stack underflow in APPEND");
  expect(Pk().proto().op(']').mark().here().op('a'), k_bad, "stack underflow");  // list is below the MARK
  expect(Pk().proto().here().op('t'), k_bad, "TUPLE without a MARK");
  expect(Pk().proto().here().op(0x86), k_bad, "stack underflow");
  expect(Pk().proto().here().op('.'), k_bad, "STOP");
  expect(Pk().proto().none().here(), k_bad, "input ends before STOP");
  expect(Pk().here().proto(6), ErrorKind::kUnsupported, "protocol 6");
  expect(Pk().here().op('I').raw({'1', '\n'}).stop(), ErrorKind::kUnsupported, "text-protocol opcode 'I'");
  expect(Pk().here().op(0x82).raw({1}).stop(), ErrorKind::kUnsupported, "extension registry");
  expect(Pk().here().op(0xFF), k_bad, "unknown opcode 0xff");
  expect(Pk().proto().here().op('X').le(0xFFFFFFF0u, 4).raw({'a'}), k_bad, "BINUNICODE of 4294967280 bytes exceeds");
  expect(Pk().proto().here().op('X').le(0x10000000u, 4).raw({'a'}), k_bad,
         "truncated BINUNICODE: needs 268435456 bytes, 1 left");
  expect(Pk().proto().here().op(0x8d).le(~0ull, 8), k_bad, "exceeds the limit");
  expect(Pk().proto().here().op('X').le(2, 4).raw({0xC0, 0x80}).stop(), k_bad, "not valid UTF-8");
  expect(Pk().proto().here().op('X').le(3, 4).raw({0xED, 0xA0, 0x80}).stop(), k_bad, "not valid UTF-8");
  expect(Pk().proto().here().op(0x8a).raw({9, 0, 0, 0, 0, 0, 0, 0, 0x80, 0}).stop(), ErrorKind::kUnsupported,
         "beyond the int64 range");
  expect(Pk().proto().here().op(0x8a).raw({16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}).stop(),
         ErrorKind::kUnsupported, "16-byte integer");
  expect(Pk().proto().here().op(0x8b).le(0x80000000u, 4), k_bad, "LONG4 length is negative");
  expect(Pk().proto().here().op('T').le(0xFFFFFFFFu, 4), k_bad, "BINSTRING length is negative");
  expect(Pk().proto().op('}').mark().int1(1).here().op('u'), k_bad, "odd number (1)");
  expect(Pk().proto().op('}').mark().int1(1).int1(2).int1(3).here().op('d'), k_bad, "odd number (3)");
  expect(Pk().proto().int1(1).int1(1).int1(1).here().op('s'), k_bad, "SETITEM on an int");
  expect(Pk().proto().op(')').int1(1).here().op('a'), k_bad, "APPEND on a tuple");
  expect(Pk().proto().here().op('g').raw({'x', '\n'}), k_bad, "not a memo index");
  expect(Pk().proto().here().op('g').raw({'1', '2'}), k_bad, "truncated GET");
  expect(Pk().proto().here().op('c').raw({'a', '\n', 'b'}), k_bad, "truncated GLOBAL name");
  expect(Pk().proto().int1(1).op(')').here().reduce(), k_bad, "REDUCE calls an int");
  expect(Pk().proto().global("a", "b").int1(1).here().reduce(), k_bad, "REDUCE arguments are an int");
  expect(Pk().proto().int1(1).str("x").here().op(0x93), k_bad, "STACK_GLOBAL operands are int and str");
  expect(Pk().proto().global("collections", "OrderedDict").int1(1).op(0x85).here().reduce(), k_bad,
         "OrderedDict argument 1 (items) is an int");
  // Persistent ids: wrong shape, wrong element kinds, unknown storage type, negative numel.
  expect(Pk().proto().str("storage").here().op('Q'), k_bad, "persistent id is a str");
  expect(Pk().proto().str("storage").str("x").op(0x86).here().op('Q'), k_bad, "persistent id is a tuple of 2 items");
  expect(Pk().proto().mark().str("storage").str("torch.FloatStorage").str("0").str("cpu").int1(1).tuple()
             .here().op('Q'),
         k_bad, "persistent id has the shape (str, str, str, str, int)");
  expect(Pk().proto().mark().str("blob").global("torch", "FloatStorage").str("0").str("cpu").int1(1).tuple()
             .here().op('Q'),
         k_bad, "persistent id has the shape");
  expect(Pk().proto().mark().str("storage").global("torch", "ComplexFloatStorage").str("0").str("cpu").int1(1).tuple()
             .here().op('Q').stop(),
         ErrorKind::kUnsupported, "'torch.ComplexFloatStorage' is not supported");
  expect(Pk().proto().mark().str("storage").global("numpy", "FloatStorage").str("0").str("cpu").int1(1).tuple()
             .here().op('Q').stop(),
         ErrorKind::kUnsupported, "'numpy.FloatStorage'");
  expect(Pk().proto().mark().str("storage").global("torch", "FloatStorage").str("0").str("cpu").int4(-5).tuple()
             .here().op('Q').stop(),
         k_bad, "numel is negative");
  // Rebuild arguments: `fill` writes what follows the storage; the REDUCE gets the blame.
  const auto rebuild = [](auto&& fill) {
    Pk p;
    p.proto().global("torch._utils", "_rebuild_tensor_v2").mark().storage("FloatStorage", "0", 4);
    fill(p);
    p.tuple().here().reduce().stop();
    return p;
  };
  const auto tail = [](Pk& p) { p.boolean(false).op('}'); };
  expect(rebuild([&](Pk& p) { p.int1(0).mark().int4(-2).tuple().mark().int1(1).tuple(); tail(p); }), k_bad,
         "size element is -2");
  expect(rebuild([&](Pk& p) { p.int1(0).mark().int1(2).tuple().mark().int4(-1).tuple(); tail(p); }), k_bad,
         "stride element is -1");
  expect(rebuild([&](Pk& p) { p.int4(-1).op(')').op(')'); tail(p); }), k_bad,
         "argument 2 (storage_offset) is negative");
  expect(rebuild([&](Pk& p) { p.none().op(')').op(')'); tail(p); }), k_bad, "argument 2 (storage_offset) is None");
  expect(rebuild([&](Pk& p) { p.int1(0).mark().str("2").tuple().mark().int1(1).tuple(); tail(p); }), k_bad,
         "size element is a str");
  expect(rebuild([&](Pk& p) { p.int1(0).op(0x8c).raw({0}).op(')'); tail(p); }), k_bad, "argument 3 (size) is a str");
  expect(rebuild([&](Pk& p) { p.int1(0).op(']').op(')'); tail(p); }), k_bad, "argument 3 (size) is a list");
  expect(rebuild([&](Pk& p) { p.int1(0).int1(2).op(0x85).op(')'); tail(p); }), k_bad, "differ in length");
  expect(rebuild([&](Pk& p) { p.int1(0).op(')').op(')').int1(1).op('}'); }), k_bad,
         "argument 5 (requires_grad) is an int");
  expect(rebuild([&](Pk& p) { p.int1(0).op(')'); }), k_bad, "called with 3 arguments");
  Pk many_dims;
  many_dims.proto().global("torch._utils", "_rebuild_tensor_v2").mark().storage("FloatStorage", "0", 4).int1(0).mark();
  for (int i = 0; i < 65; ++i) many_dims.int1(1);
  many_dims.tuple().op(')');
  tail(many_dims);
  expect(many_dims.tuple().here().reduce(), k_bad, "65 dimensions");
  Pk not_storage;
  not_storage.proto().global("torch._utils", "_rebuild_tensor").mark().str("0").int1(0).op(')').op(')');
  not_storage.tuple().here().reduce();
  expect(not_storage, k_bad, "argument 1 (storage) is a str");
  Pk param;
  param.proto().global("torch._utils", "_rebuild_parameter").mark().int1(3).boolean(true).op('}');
  param.tuple().here().reduce();
  expect(param, k_bad, "argument 1 (data) is an int");
}

TEST(Pickle, LimitsAreEnforced) {
  Limits small;
  small.max_stack = 4;
  small.max_memo = 2;
  small.max_values = 10;
  small.max_nesting = 3;
  small.max_string_bytes = 4;
  const auto expect = [&](const std::vector<uint8_t>& b, const char* text) {
    const Error e = load_error(b, small);
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  };
  expect(Pk().none().none().none().none().none().bytes, "stack holds more than 4");
  expect(Pk().none().put(0).put(1).put(2).bytes, "memo holds more than 2");
  Pk many;
  many.op(']');
  for (int i = 0; i < 5; ++i) many.mark().none().none().op('e');
  expect(many.bytes, "too many values");
  expect(Pk().mark().mark().mark().mark().bytes, "deeper than 3");
  expect(Pk().str("hello").bytes, "5 bytes exceeds");
  // Slots copied out of existing containers are charged too: a placeholder built from an
  // 8-tuple makes 4 values but costs 12.
  small.max_stack = 100;
  Pk shared;
  shared.global("a", "b").mark().none();
  for (int i = 0; i < 7; ++i) shared.op('2');  // DUP
  expect(shared.tuple().reduce().bytes, "too many values");
}

// A tiny complete checkpoint pickle: every strict prefix must fail cleanly with an offset.
TEST(Pickle, EveryTruncationFails) {
  Pk p;
  p.proto().op('}').put(0).mark().str("meta").global("collections", "OrderedDict").put(1).op(')').reduce();
  p.mark().str("CLASSES").mark().str("car").str("bus").tuple().str("v").op('G').raw({0, 0, 0, 0, 0, 0, 0, 0}).op('u');
  p.str("state_dict").get(1).op(')').reduce().mark().str("w").tensor("0", {2, 2}, {2, 1}).op('u');
  p.op('}').str("_metadata").op('}').op('s').op('b').op('u').stop();
  {
    Unpickler u(p.bytes, "t");
    ASSERT_EQ(u.load()->get("state_dict")->get("w")->kind, Kind::kTensor);
  }
  for (size_t n = 0; n < p.bytes.size(); ++n) {
    std::vector<uint8_t> prefix(p.bytes.begin(), p.bytes.begin() + static_cast<std::ptrdiff_t>(n));
    const Error e = load_error(prefix);
    EXPECT_LE(*e.offset(), n) << e.what();
  }
}

// ---- the golden checkpoint ----

// torch writes its zip entries with data descriptors (general-purpose flag bit 3), so the local
// header's size fields are zero; the sizes come from the central directory record instead.
std::vector<uint8_t> extract_stored_entry(const std::string& zip_path, const std::string& name) {
  std::ifstream f(zip_path, std::ios::binary);
  const std::vector<uint8_t> zip((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto le16 = [&](size_t o) { return static_cast<size_t>(zip[o] | (zip[o + 1] << 8)); };
  const auto le32 = [&](size_t o) { return le16(o) | (le16(o + 2) << 16); };
  const auto name_at = [&](size_t o, size_t n) {
    return o + n <= zip.size() && std::string(zip.begin() + o, zip.begin() + o + n) == name;
  };
  for (size_t cd = 0; cd + 46 <= zip.size(); ++cd) {
    if (std::memcmp(&zip[cd], "PK\x01\x02", 4) != 0 || !name_at(cd + 46, le16(cd + 28))) continue;
    EXPECT_EQ(le16(cd + 10), 0u) << "entry is not stored uncompressed";
    const size_t size = le32(cd + 20), at = le32(cd + 42);
    if (at + 30 > zip.size() || std::memcmp(&zip[at], "PK\x03\x04", 4) != 0 || !name_at(at + 30, le16(at + 26))) break;
    const size_t data = at + 30 + le16(at + 26) + le16(at + 28);  // local name and extra lengths
    if (data + size > zip.size()) break;
    return {zip.begin() + static_cast<std::ptrdiff_t>(data), zip.begin() + static_cast<std::ptrdiff_t>(data + size)};
  }
  ADD_FAILURE() << name << " not found in " << zip_path;
  return {};
}

class PickleGolden : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = new std::vector<uint8_t>(
        extract_stored_entry(BEV_SHARED_DIR "/golden/micro/checkpoint.pth", "archive/data.pkl"));
  }
  static void TearDownTestSuite() {
    delete data_;
    data_ = nullptr;
  }
  static std::vector<uint8_t>* data_;
};
std::vector<uint8_t>* PickleGolden::data_ = nullptr;

TEST_F(PickleGolden, Structure) {
  ASSERT_EQ(data_->size(), 90801u);
  Unpickler u(*data_, "checkpoint.pth: archive/data.pkl");
  const Value* root = u.load();
  ASSERT_EQ(root->kind, Kind::kDict);
  const Value* meta = root->get("meta");
  const Value* sd = root->get("state_dict");
  ASSERT_NE(meta, nullptr);
  ASSERT_NE(sd, nullptr);
  ASSERT_EQ(sd->kind, Kind::kDict);
  EXPECT_EQ(sd->entries.size(), 493u);
  for (const auto& [k, v] : sd->entries) {
    ASSERT_EQ(k->kind, Kind::kStr);
    EXPECT_EQ(v->kind, Kind::kTensor) << k->text;
  }
  ASSERT_NE(sd->state, nullptr) << "OrderedDict _metadata arrives through BUILD";
  EXPECT_NE(sd->state->get("_metadata"), nullptr);

  const Value* classes = meta->get("CLASSES");
  ASSERT_NE(classes, nullptr);
  ASSERT_EQ(classes->kind, Kind::kTuple);
  ASSERT_EQ(classes->items.size(), 10u);
  for (const Value* c : classes->items) EXPECT_TRUE(c->is_str());
  EXPECT_EQ(classes->items[0]->text, "car");
  ASSERT_NE(meta->get("mmcv_version"), nullptr);
  EXPECT_EQ(meta->get("mmcv_version")->text, "1.4.0");
  EXPECT_EQ(meta->get("PALETTE")->kind, Kind::kNone);
  EXPECT_EQ(meta->get("epoch")->i, 24);

  const Value* cw = sd->get("pts_bbox_head.code_weights");
  ASSERT_NE(cw, nullptr);
  ASSERT_EQ(cw->kind, Kind::kTensor);
  EXPECT_EQ(cw->tensor.size, Shape{10});
  EXPECT_EQ(cw->tensor.stride, Shape{1});
  EXPECT_EQ(cw->tensor.storage_offset, 0);
  EXPECT_EQ(cw->tensor.storage->storage.dtype, DType::kF32);
  EXPECT_EQ(cw->tensor.storage->storage.numel, 10);
  EXPECT_EQ(cw->tensor.storage->storage.key, "0");

  const Value* nbt = sd->get("img_backbone.bn1.num_batches_tracked");
  ASSERT_NE(nbt, nullptr);
  ASSERT_EQ(nbt->kind, Kind::kTensor);
  EXPECT_EQ(nbt->tensor.storage->storage.dtype, DType::kI64);
  EXPECT_TRUE(nbt->tensor.size.empty());
  EXPECT_TRUE(nbt->tensor.stride.empty());

  const nlohmann::json j = to_json(meta);
  EXPECT_EQ(j["CLASSES"][9], "traffic_cone");
  EXPECT_EQ(j["mmcv_version"], "1.4.0");
  EXPECT_NO_THROW((void)j.dump());
  EXPECT_LT(repr(root).size(), 20000u);
}

TEST_F(PickleGolden, SampledTruncationsFail) {
  for (size_t n = 0; n < data_->size(); n += 997) {
    const Error e = load_error({data_->begin(), data_->begin() + static_cast<std::ptrdiff_t>(n)});
    EXPECT_LE(*e.offset(), n);
  }
}

}  // namespace
}  // namespace bev::pickle
