#include "io/pickle.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <deque>
#include <string_view>
#include <unordered_map>

#include "bevformer/error.h"
#include "io/byte_source.h"

namespace bev::pickle {
namespace {

// Opcode bytes, named as in CPython's Lib/pickle.py.
namespace op {
constexpr uint8_t kMark = '(', kStop = '.', kPop = '0', kPopMark = '1', kDup = '2', kFloat = 'F';
constexpr uint8_t kInt = 'I', kBinInt = 'J', kBinInt1 = 'K', kLong = 'L', kBinInt2 = 'M', kNone = 'N';
constexpr uint8_t kPersId = 'P', kBinPersId = 'Q', kReduce = 'R', kString = 'S', kBinString = 'T';
constexpr uint8_t kShortBinString = 'U', kUnicode = 'V', kBinUnicode = 'X', kAppend = 'a', kBuild = 'b';
constexpr uint8_t kGlobal = 'c', kDict = 'd', kEmptyDict = '}', kAppends = 'e', kGet = 'g', kBinGet = 'h';
constexpr uint8_t kInst = 'i', kLongBinGet = 'j', kList = 'l', kEmptyList = ']', kObj = 'o', kPut = 'p';
constexpr uint8_t kBinPut = 'q', kLongBinPut = 'r', kSetItem = 's', kTuple = 't', kEmptyTuple = ')';
constexpr uint8_t kSetItems = 'u', kBinFloat = 'G', kBinBytes = 'B', kShortBinBytes = 'C';
constexpr uint8_t kProto = 0x80, kNewObj = 0x81, kExt1 = 0x82, kExt2 = 0x83, kExt4 = 0x84;
constexpr uint8_t kTuple1 = 0x85, kTuple2 = 0x86, kTuple3 = 0x87, kNewTrue = 0x88, kNewFalse = 0x89;
constexpr uint8_t kLong1 = 0x8a, kLong4 = 0x8b, kShortBinUnicode = 0x8c, kBinUnicode8 = 0x8d;
constexpr uint8_t kBinBytes8 = 0x8e, kEmptySet = 0x8f, kAddItems = 0x90, kFrozenSet = 0x91;
constexpr uint8_t kNewObjEx = 0x92, kStackGlobal = 0x93, kMemoize = 0x94, kFrame = 0x95;
constexpr uint8_t kByteArray8 = 0x96, kNextBuffer = 0x97, kReadonlyBuffer = 0x98;
}  // namespace op

// The length-prefixed string opcodes. Protocol-2 BINSTRINGs are Python 2 str, which torch.load
// decodes as UTF-8, so they become kStr like BINUNICODE.
struct StringOp {
  uint8_t code;
  uint8_t len_bytes;
  bool len_signed;
  Kind kind;
  const char* name;
};
constexpr StringOp kStringOps[] = {
    {op::kBinUnicode, 4, false, Kind::kStr, "BINUNICODE"},
    {op::kShortBinUnicode, 1, false, Kind::kStr, "SHORT_BINUNICODE"},
    {op::kBinUnicode8, 8, false, Kind::kStr, "BINUNICODE8"},
    {op::kBinString, 4, true, Kind::kStr, "BINSTRING"},
    {op::kShortBinString, 1, false, Kind::kStr, "SHORT_BINSTRING"},
    {op::kBinBytes, 4, false, Kind::kBytes, "BINBYTES"},
    {op::kShortBinBytes, 1, false, Kind::kBytes, "SHORT_BINBYTES"},
    {op::kBinBytes8, 8, false, Kind::kBytes, "BINBYTES8"},
    {op::kByteArray8, 8, false, Kind::kBytes, "BYTEARRAY8"},
};

// Real tensors have a handful of dimensions; the cap keeps one shape tuple, shared through the
// memo by many rebuild calls, from turning into quadratic work.
constexpr size_t kMaxDims = 64;

// Strict UTF-8 (no overlongs, no surrogates) so that every kStr can go into JSON as is.
bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<uint8_t>(s[i]);
    const size_t len = c < 0x80             ? 1
                       : (c & 0xE0) == 0xC0 ? 2
                       : (c & 0xF0) == 0xE0 ? 3
                       : (c & 0xF8) == 0xF0 ? 4
                                            : 0;
    if (len == 0 || s.size() - i < len) return false;
    uint32_t cp = len == 1 ? c : c & (0x7Fu >> len);
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<uint8_t>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3Fu);
    }
    const uint32_t min_cp = len == 1 ? 0 : len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
    if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

std::string hex_byte(uint8_t b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", b);
  return buf;
}

bool is_tensor_rebuild(std::string_view name) {
  return name == "torch._utils._rebuild_tensor_v2" || name == "torch._utils._rebuild_tensor" ||
         name == "torch._utils._rebuild_parameter" || name == "torch._utils._rebuild_parameter_with_state";
}

bool is_set_type(std::string_view name) {
  // Protocol 2 writes Python 3's builtins under their Python 2 module name.
  return name == "builtins.set" || name == "builtins.frozenset" || name == "__builtin__.set" ||
         name == "__builtin__.frozenset";
}

}  // namespace

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kNone: return "None";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kStr: return "str";
    case Kind::kBytes: return "bytes";
    case Kind::kList: return "list";
    case Kind::kTuple: return "tuple";
    case Kind::kDict: return "dict";
    case Kind::kSet: return "set";
    case Kind::kGlobal: return "global";
    case Kind::kObject: return "object";
    case Kind::kStorage: return "storage";
    case Kind::kTensor: return "tensor";
  }
  return "?";
}

std::string a_kind(Kind k) {
  const std::string name = kind_name(k);
  if (k == Kind::kNone) return name;
  return (k == Kind::kInt || k == Kind::kObject ? "an " : "a ") + name;
}

const Value* Value::get(std::string_view key) const {
  if (kind != Kind::kDict) return nullptr;
  for (const auto& [k, v] : entries) {
    if (k->kind == Kind::kStr && k->text == key) return v;
  }
  return nullptr;
}

struct Unpickler::Impl {
  std::span<const uint8_t> bytes;
  std::string where;
  Limits limits;

  size_t pos = 0;
  size_t op_offset = 0;     // first byte of the opcode being run; every error points there
  std::deque<Value> arena;  // owns every value; a deque keeps addresses stable as it grows
  size_t work = 0;          // values made plus slots copied out of existing containers
  std::vector<Value*> stack;
  std::vector<size_t> marks;  // stack height at each open MARK
  std::unordered_map<uint64_t, Value*> memo;
  const Value* root = nullptr;

  // Index of string keys per dict, so that SETITEMS stays linear and a repeated key replaces the
  // value like Python does. The views point into arena values, whose text never changes.
  struct KeyRef {
    const Value* dict;
    std::string_view key;
    bool operator==(const KeyRef&) const = default;
  };
  struct KeyHash {
    size_t operator()(const KeyRef& k) const {
      return std::hash<std::string_view>{}(k.key) ^ (std::hash<const void*>{}(k.dict) * 0x9E3779B97F4A7C15ull);
    }
  };
  std::unordered_map<KeyRef, size_t, KeyHash> key_index;

  [[noreturn]] void fail(ErrorKind kind, std::string problem, std::string expected = {}) const {
    Error e(kind, std::move(problem));
    e.where(where).at_offset(op_offset);
    if (!expected.empty()) e.expected(std::move(expected));
    throw e;
  }
  [[noreturn]] void bad(std::string problem, std::string expected) const {
    fail(ErrorKind::kInvalidInput, std::move(problem), std::move(expected));
  }

  // ---- input ----

  size_t remaining() const { return bytes.size() - pos; }

  const uint8_t* take(size_t n, const char* what) {
    if (n > remaining()) {
      bad(std::string("truncated ") + what + ": needs " + std::to_string(n) + " bytes, " +
              std::to_string(remaining()) + " left",
          "a complete pickle ending in STOP");
    }
    pos += n;
    return bytes.data() + pos - n;
  }

  uint64_t take_uint(size_t n, const char* what) {
    const uint8_t* p = take(n, what);
    return n == 1 ? p[0] : n == 2 ? read_le16(p) : n == 4 ? read_le32(p) : read_le64(p);
  }

  // Both checks come before any allocation: a forged length must not reserve memory.
  std::string take_string(uint64_t n, const char* what, bool utf8) {
    if (n > limits.max_string_bytes) {
      bad(std::string(what) + " of " + std::to_string(n) + " bytes exceeds the limit",
          "at most " + std::to_string(limits.max_string_bytes) + " bytes");
    }
    const uint8_t* p = take(static_cast<size_t>(n), what);
    std::string s(reinterpret_cast<const char*>(p), static_cast<size_t>(n));
    if (utf8 && !valid_utf8(s)) bad(std::string(what) + " is not valid UTF-8", "UTF-8 text");
    return s;
  }

  std::string take_line(const char* what) {
    const void* nl = std::memchr(bytes.data() + pos, '\n', remaining());
    if (!nl) bad(std::string("truncated ") + what, "a line ending in \\n");
    std::string s =
        take_string(static_cast<size_t>(static_cast<const uint8_t*>(nl) - (bytes.data() + pos)), what, true);
    ++pos;
    return s;
  }

  uint64_t take_decimal_line(const char* what) {
    const std::string s = take_line(what);
    uint64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v > 0xFFFFFFFFu) {
      bad(std::string(what) + " '" + s.substr(0, 32) + "' is not a memo index", "a decimal number below 2^32");
    }
    return v;
  }

  // A length that CPython reads as a signed int32 (BINSTRING, LONG4).
  size_t take_signed_len(const char* what) {
    const auto n = static_cast<int32_t>(take_uint(4, what));
    if (n < 0) bad(std::string(what) + " length is negative", "a length >= 0");
    return static_cast<size_t>(n);
  }

  // Little-endian two's complement of n bytes; wider than 8 bytes only if the rest is sign fill.
  int64_t take_long(size_t n, const char* what) {
    const uint8_t* p = take(n, what);
    if (n == 0) return 0;
    const size_t k = std::min<size_t>(n, 8);
    uint64_t u = 0;
    for (size_t i = 0; i < k; ++i) u |= static_cast<uint64_t>(p[i]) << (8 * i);
    const bool neg = (p[k - 1] & 0x80) != 0;
    if (k < 8 && neg) u |= ~uint64_t{0} << (8 * k);
    for (size_t i = 8; i < n; ++i) {
      if (p[i] != (neg ? 0xFF : 0x00)) {
        fail(ErrorKind::kUnsupported,
             std::string(what) + " holds a " + std::to_string(n) + "-byte integer beyond the int64 range",
             "an integer between -2^63 and 2^63-1");
      }
    }
    return static_cast<int64_t>(u);
  }

  // ---- values, stack, memo ----

  void charge(size_t n) {
    work += n;
    if (work > limits.max_values) {
      bad("too many values (more than " + std::to_string(limits.max_values) + ")",
          "a smaller pickle, or a larger Limits::max_values");
    }
  }

  Value* make(Kind kind, std::string text = {}) {
    charge(1);
    Value& v = arena.emplace_back();
    v.kind = kind;
    v.text = std::move(text);
    return &v;
  }

  Value* make_seq(Kind kind, std::vector<Value*> items) {
    Value* v = make(kind);
    v->items = std::move(items);
    return v;
  }

  size_t base() const { return marks.empty() ? 0 : marks.back(); }

  Value* push(Value* v) {
    if (stack.size() >= limits.max_stack) {
      bad("stack holds more than " + std::to_string(limits.max_stack) + " values",
          "a smaller pickle, or a larger Limits::max_stack");
    }
    stack.push_back(v);
    return v;
  }

  // As in CPython, values below the innermost MARK are out of reach until an opcode consumes it.
  Value* top(const char* what) {
    if (stack.size() <= base()) bad(std::string("stack underflow in ") + what, "a value on the stack");
    return stack.back();
  }

  Value* pop(const char* what) {
    Value* v = top(what);
    stack.pop_back();
    return v;
  }

  std::vector<Value*> pop_mark(const char* what) {
    if (marks.empty()) bad(std::string(what) + " without a MARK", "a MARK before it");
    const size_t m = marks.back();
    marks.pop_back();
    std::vector<Value*> items(stack.begin() + static_cast<std::ptrdiff_t>(m), stack.end());
    stack.resize(m);
    return items;
  }

  void memo_put(uint64_t index) {
    Value* v = top("memo put");
    if (!memo.contains(index) && memo.size() >= limits.max_memo) {
      bad("memo holds more than " + std::to_string(limits.max_memo) + " entries",
          "a smaller pickle, or a larger Limits::max_memo");
    }
    memo[index] = v;
  }

  void memo_get(uint64_t index) {
    auto it = memo.find(index);
    if (it == memo.end()) {
      bad("memo index " + std::to_string(index) + " was never stored", "an index PUT earlier");
    }
    push(it->second);
  }

  void set_items(Value* dict, const std::vector<Value*>& kv, const char* what) {
    if (kv.size() % 2 != 0) {
      bad(std::string(what) + " has an odd number (" + std::to_string(kv.size()) + ") of keys and values",
          "key, value pairs");
    }
    // Placeholders take items too: dict subclasses in `meta` (mmcv's ConfigDict) arrive that way.
    if (dict->kind != Kind::kDict && dict->kind != Kind::kObject) {
      bad(std::string(what) + " on " + a_kind(dict->kind), "a dict");
    }
    for (size_t i = 0; i < kv.size(); i += 2) {
      if (kv[i]->kind == Kind::kStr) {
        auto [it, inserted] = key_index.try_emplace(KeyRef{dict, kv[i]->text}, dict->entries.size());
        if (!inserted) {
          dict->entries[it->second].second = kv[i + 1];
          continue;
        }
      }
      dict->entries.emplace_back(kv[i], kv[i + 1]);
    }
  }

  // Placeholders collect appended items after their constructor arguments (list subclasses).
  void append_items(Value* target, const std::vector<Value*>& items, const char* what, Kind kind) {
    if (target->kind != kind && target->kind != Kind::kObject) {
      bad(std::string(what) + " on " + a_kind(target->kind), a_kind(kind));
    }
    target->items.insert(target->items.end(), items.begin(), items.end());
  }

  // ---- calls to globals ----

  [[noreturn]] void bad_arg(std::string_view fn, size_t i, const char* name, const Value* v,
                            const char* expected) {
    bad(std::string(fn) + " argument " + std::to_string(i + 1) + " (" + name + ") is " + a_kind(v->kind),
        expected);
  }

  void expect_arity(std::string_view fn, const Value* args, size_t lo, size_t hi) {
    const size_t n = args->items.size();
    if (n < lo || n > hi) {
      bad(std::string(fn) + " called with " + std::to_string(n) + " arguments",
          std::to_string(lo) + (lo == hi ? "" : " to " + std::to_string(hi)) + " arguments");
    }
  }

  Shape shape_arg(std::string_view fn, const Value* args, size_t i, const char* name) {
    const Value* t = args->items[i];
    if (t->kind != Kind::kTuple) bad_arg(fn, i, name, t, "a tuple of ints");
    if (t->items.size() > kMaxDims) {
      bad(std::string(fn) + " " + name + " has " + std::to_string(t->items.size()) + " dimensions",
          "at most " + std::to_string(kMaxDims));
    }
    charge(t->items.size());
    Shape s;
    for (const Value* e : t->items) {
      if (e->kind != Kind::kInt || e->i < 0) {
        bad(std::string(fn) + " " + name + " element is " +
                (e->kind == Kind::kInt ? std::to_string(e->i) : a_kind(e->kind)),
            "a tuple of ints >= 0");
      }
      s.push_back(e->i);
    }
    return s;
  }

  Value* placeholder(const std::string& name, const Value* args) {
    Value* o = make(Kind::kObject, name);
    charge(args->items.size());
    o->items = args->items;
    return o;
  }

  Value* rebuild_tensor(std::string_view fn, const Value* args, bool v2) {
    expect_arity(fn, args, v2 ? 6 : 4, v2 ? 7 : 4);
    const Value* storage = args->items[0];
    if (storage->kind != Kind::kStorage) bad_arg(fn, 0, "storage", storage, "a storage (persistent id)");
    const Value* offset = args->items[1];
    if (offset->kind != Kind::kInt) bad_arg(fn, 1, "storage_offset", offset, "an int");
    if (offset->i < 0) bad(std::string(fn) + " argument 2 (storage_offset) is negative", "an int >= 0");
    TensorRef t{storage, offset->i, shape_arg(fn, args, 2, "size"), shape_arg(fn, args, 3, "stride"), false};
    if (t.size.size() != t.stride.size()) {
      bad(std::string(fn) + " size " + shape_str(t.size) + " and stride " + shape_str(t.stride) +
              " differ in length",
          "one stride per dimension");
    }
    if (v2) {
      const Value* rg = args->items[4];
      if (rg->kind != Kind::kBool) bad_arg(fn, 4, "requires_grad", rg, "a bool");
      t.requires_grad = rg->b;
    }
    Value* v = make(Kind::kTensor);
    v->tensor = std::move(t);
    return v;
  }

  // A Parameter is its data tensor plus requires_grad. Placeholder data passes through, so an
  // exotic tensor type in an optimizer state does not fail the whole load.
  Value* rebuild_parameter(std::string_view fn, const Value* args, bool with_state) {
    expect_arity(fn, args, with_state ? 4 : 3, with_state ? 4 : 3);
    Value* data = args->items[0];
    const Value* rg = args->items[1];
    if (data->kind != Kind::kTensor && data->kind != Kind::kObject) bad_arg(fn, 0, "data", data, "a tensor");
    if (rg->kind != Kind::kBool) bad_arg(fn, 1, "requires_grad", rg, "a bool");
    if (data->kind != Kind::kTensor) return data;
    Value* v = make(Kind::kTensor);
    v->tensor = data->tensor;
    v->tensor.requires_grad = rg->b;
    return v;
  }

  Value* rebuild_any_tensor(std::string_view fn, const Value* args) {
    const std::string_view short_name = fn.substr(fn.rfind('.') + 1);
    if (short_name == "_rebuild_tensor_v2") return rebuild_tensor(short_name, args, true);
    if (short_name == "_rebuild_tensor") return rebuild_tensor(short_name, args, false);
    return rebuild_parameter(short_name, args, short_name == "_rebuild_parameter_with_state");
  }

  Value* ordered_dict(const Value* args) {
    expect_arity("OrderedDict", args, 0, 1);
    Value* d = make(Kind::kDict);
    if (args->items.empty()) return d;
    const Value* src = args->items[0];
    charge(src->items.size() + src->entries.size());
    std::vector<Value*> kv;
    if (src->kind == Kind::kDict) {
      for (const auto& [k, v] : src->entries) kv.insert(kv.end(), {k, v});
    } else if (src->kind == Kind::kList || src->kind == Kind::kTuple) {
      for (const Value* pair : src->items) {
        if ((pair->kind != Kind::kTuple && pair->kind != Kind::kList) || pair->items.size() != 2) {
          bad(std::string("OrderedDict item is ") + a_kind(pair->kind) + " of " +
                  std::to_string(pair->items.size()) + " values",
              "(key, value) pairs");
        }
        kv.insert(kv.end(), {pair->items[0], pair->items[1]});
      }
    } else {
      bad_arg("OrderedDict", 0, "items", src, "a list of (key, value) pairs");
    }
    set_items(d, kv, "OrderedDict");
    return d;
  }

  Value* make_set(const std::string& fn, const Value* args) {
    expect_arity(fn, args, 0, 1);
    Value* s = make(Kind::kSet);
    if (args->items.empty()) return s;
    const Value* src = args->items[0];
    if (src->kind != Kind::kList && src->kind != Kind::kTuple && src->kind != Kind::kSet) {
      bad_arg(fn, 0, "iterable", src, "a list, tuple or set");
    }
    charge(src->items.size());
    s->items = src->items;
    return s;
  }

  // What REDUCE, NEWOBJ and NEWOBJ_EX produce. Only allow-listed names are interpreted.
  Value* call(const Value* callable, const Value* args, const char* what) {
    if (callable->kind != Kind::kGlobal && callable->kind != Kind::kObject) {
      bad(std::string(what) + " calls " + a_kind(callable->kind), "a global");
    }
    if (args->kind != Kind::kTuple) {
      bad(std::string(what) + " arguments are " + a_kind(args->kind), "a tuple");
    }
    const std::string& fn = callable->text;
    if (callable->kind == Kind::kObject) return placeholder(fn, args);
    if (fn == "collections.OrderedDict") {
      // NEWOBJ runs only OrderedDict.__new__, which ignores its arguments.
      return what == std::string_view("REDUCE") ? ordered_dict(args) : make(Kind::kDict);
    }
    if (is_tensor_rebuild(fn)) return rebuild_any_tensor(fn, args);
    if (is_set_type(fn)) return make_set(fn, args);
    if (fn == "torch._tensor._rebuild_from_type_v2") {
      // (func, type, args, state), applied one level deep only: a func that is itself
      // _rebuild_from_type_v2 stays a placeholder, so the input cannot drive recursion.
      expect_arity(fn, args, 4, 4);
      const Value* func = args->items[0];
      const Value* inner = args->items[2];
      if (func->kind == Kind::kGlobal && is_tensor_rebuild(func->text)) {
        if (inner->kind != Kind::kTuple) bad_arg("_rebuild_from_type_v2", 2, "args", inner, "a tuple");
        return rebuild_any_tensor(func->text, inner);
      }
    }
    return placeholder(fn, args);
  }

  void persistent_load() {
    const Value* pid = pop("BINPERSID");
    const char* shape = "('storage', torch.<Type>Storage, key: str, location: str, numel: int)";
    if (pid->kind != Kind::kTuple || pid->items.size() != 5) {
      bad(std::string("persistent id is ") + a_kind(pid->kind) + " of " +
              std::to_string(pid->items.size()) + " items",
          shape);
    }
    const auto& it = pid->items;
    if (it[0]->kind != Kind::kStr || it[0]->text != "storage" || it[1]->kind != Kind::kGlobal ||
        it[2]->kind != Kind::kStr || it[3]->kind != Kind::kStr || it[4]->kind != Kind::kInt) {
      std::string kinds;
      for (const Value* v : it) kinds += std::string(kinds.empty() ? "" : ", ") + kind_name(v->kind);
      bad("persistent id has the shape (" + kinds + ")", shape);
    }
    const std::string& type = it[1]->text;
    DType dtype{};
    if (!type.starts_with("torch.") ||
        !dtype_from_torch_storage_name(std::string_view(type).substr(6), &dtype)) {
      fail(ErrorKind::kUnsupported, "storage type '" + type + "' is not supported",
           "torch.FloatStorage, HalfStorage, BFloat16Storage, DoubleStorage, LongStorage, IntStorage, "
           "ShortStorage, CharStorage, ByteStorage or BoolStorage");
    }
    if (it[4]->i < 0) bad("storage numel is negative: " + std::to_string(it[4]->i), "an int >= 0");
    Value* s = make(Kind::kStorage);
    s->storage = StorageRef{dtype, it[2]->text, it[3]->text, it[4]->i};
    push(s);
  }

  // ---- the opcode loop ----

  void run_op(uint8_t code) {
    for (const StringOp& s : kStringOps) {
      if (s.code != code) continue;
      const uint64_t n = s.len_signed ? take_signed_len(s.name) : take_uint(s.len_bytes, s.name);
      push(make(s.kind, take_string(n, s.name, s.kind == Kind::kStr)));
      return;
    }
    switch (code) {
      case op::kProto: {
        const auto proto = static_cast<uint8_t>(take_uint(1, "PROTO"));
        if (proto > 5) {
          fail(ErrorKind::kUnsupported, "pickle protocol " + std::to_string(proto), "protocol 0 to 5");
        }
        return;
      }
      case op::kFrame: take(8, "FRAME"); return;  // frames only help streaming readers
      case op::kStop: root = pop("STOP"); return;
      case op::kMark:
        if (marks.size() >= limits.max_nesting) {
          bad("MARKs nest deeper than " + std::to_string(limits.max_nesting),
              "a shallower pickle, or a larger Limits::max_nesting");
        }
        marks.push_back(stack.size());
        return;
      case op::kPop:  // as in CPython, POP with nothing above the MARK discards the MARK
        if (stack.size() > base()) {
          stack.pop_back();
        } else {
          pop_mark("POP");
        }
        return;
      case op::kPopMark: pop_mark("POP_MARK"); return;
      case op::kDup: push(top("DUP")); return;
      case op::kNone: push(make(Kind::kNone)); return;
      case op::kNewTrue:
      case op::kNewFalse: push(make(Kind::kBool))->b = code == op::kNewTrue; return;
      case op::kBinInt: push(make(Kind::kInt))->i = static_cast<int32_t>(take_uint(4, "BININT")); return;
      case op::kBinInt1: push(make(Kind::kInt))->i = static_cast<int64_t>(take_uint(1, "BININT1")); return;
      case op::kBinInt2: push(make(Kind::kInt))->i = static_cast<int64_t>(take_uint(2, "BININT2")); return;
      case op::kLong1: push(make(Kind::kInt))->i = take_long(take_uint(1, "LONG1"), "LONG1"); return;
      case op::kLong4: push(make(Kind::kInt))->i = take_long(take_signed_len("LONG4"), "LONG4"); return;
      case op::kBinFloat: {
        const uint8_t* p = take(8, "BINFLOAT");
        uint64_t u = 0;
        for (int i = 0; i < 8; ++i) u = (u << 8) | p[i];  // big-endian, unlike everything else
        push(make(Kind::kFloat))->f = std::bit_cast<double>(u);
        return;
      }
      case op::kEmptyDict: push(make(Kind::kDict)); return;
      case op::kEmptyList: push(make(Kind::kList)); return;
      case op::kEmptyTuple: push(make(Kind::kTuple)); return;
      case op::kEmptySet: push(make(Kind::kSet)); return;
      case op::kTuple: push(make_seq(Kind::kTuple, pop_mark("TUPLE"))); return;
      case op::kList: push(make_seq(Kind::kList, pop_mark("LIST"))); return;
      case op::kFrozenSet: push(make_seq(Kind::kSet, pop_mark("FROZENSET"))); return;
      case op::kTuple1:
      case op::kTuple2:
      case op::kTuple3: {
        std::vector<Value*> items(static_cast<size_t>(code - op::kTuple1) + 1);
        for (size_t i = items.size(); i-- > 0;) items[i] = pop("TUPLE1/2/3");
        push(make_seq(Kind::kTuple, std::move(items)));
        return;
      }
      case op::kDict: {
        const std::vector<Value*> kv = pop_mark("DICT");
        set_items(push(make(Kind::kDict)), kv, "DICT");
        return;
      }
      case op::kAppend: {
        Value* v = pop("APPEND");
        append_items(top("APPEND"), {v}, "APPEND", Kind::kList);
        return;
      }
      case op::kAppends: {
        const std::vector<Value*> items = pop_mark("APPENDS");
        append_items(top("APPENDS"), items, "APPENDS", Kind::kList);
        return;
      }
      case op::kAddItems: {
        const std::vector<Value*> items = pop_mark("ADDITEMS");
        append_items(top("ADDITEMS"), items, "ADDITEMS", Kind::kSet);
        return;
      }
      case op::kSetItem: {
        Value* v = pop("SETITEM");
        Value* k = pop("SETITEM");
        set_items(top("SETITEM"), {k, v}, "SETITEM");
        return;
      }
      case op::kSetItems: {
        const std::vector<Value*> kv = pop_mark("SETITEMS");
        set_items(top("SETITEMS"), kv, "SETITEMS");
        return;
      }
      case op::kBinPut: memo_put(take_uint(1, "BINPUT")); return;
      case op::kLongBinPut: memo_put(take_uint(4, "LONG_BINPUT")); return;
      case op::kPut: memo_put(take_decimal_line("PUT")); return;
      case op::kMemoize: memo_put(memo.size()); return;
      case op::kBinGet: memo_get(take_uint(1, "BINGET")); return;
      case op::kLongBinGet: memo_get(take_uint(4, "LONG_BINGET")); return;
      case op::kGet: memo_get(take_decimal_line("GET")); return;
      case op::kGlobal: {
        const std::string module = take_line("GLOBAL module");
        push(make(Kind::kGlobal, module + "." + take_line("GLOBAL name")));
        return;
      }
      case op::kStackGlobal: {
        const Value* name = pop("STACK_GLOBAL");
        const Value* module = pop("STACK_GLOBAL");
        if (module->kind != Kind::kStr || name->kind != Kind::kStr) {
          bad(std::string("STACK_GLOBAL operands are ") + kind_name(module->kind) + " and " +
                  kind_name(name->kind),
              "two strings");
        }
        push(make(Kind::kGlobal, module->text + "." + name->text));
        return;
      }
      case op::kReduce: {
        const Value* args = pop("REDUCE");
        push(call(pop("REDUCE"), args, "REDUCE"));
        return;
      }
      case op::kNewObj:
      case op::kNewObjEx: {
        const char* what = code == op::kNewObj ? "NEWOBJ" : "NEWOBJ_EX";
        if (code == op::kNewObjEx) {
          const Value* kwargs = pop(what);  // not kept: placeholders record positional args only
          if (kwargs->kind != Kind::kDict) {
            bad(std::string("NEWOBJ_EX kwargs are ") + a_kind(kwargs->kind), "a dict");
          }
        }
        const Value* args = pop(what);
        push(call(pop(what), args, what));
        return;
      }
      case op::kBuild: {
        Value* state = pop("BUILD");
        Value* obj = top("BUILD");
        // Kept, never applied: an OrderedDict's _metadata and placeholder __dict__s arrive here.
        if (obj->kind == Kind::kDict || obj->kind == Kind::kObject) obj->state = state;
        return;
      }
      case op::kBinPersId: persistent_load(); return;
      case op::kInt:
      case op::kLong:
      case op::kString:
      case op::kUnicode:
      case op::kFloat:
      case op::kPersId:
      case op::kInst:
      case op::kObj:
        fail(ErrorKind::kUnsupported,
             "text-protocol opcode '" + std::string(1, static_cast<char>(code)) + "' (pickle protocol 0/1)",
             "a binary pickle (protocol 2 or later)");
      case op::kExt1:
      case op::kExt2:
      case op::kExt4:
      case op::kNextBuffer:
      case op::kReadonlyBuffer:
        fail(ErrorKind::kUnsupported,
             "opcode " + hex_byte(code) + " (extension registry or out-of-band buffer)",
             "the opcodes torch.save writes");
      default: bad("unknown opcode " + hex_byte(code), "a pickle opcode");
    }
  }

  const Value* load() {
    if (root) return root;
    pos = 0;
    work = 0;
    key_index.clear();
    arena.clear();
    stack.clear();
    marks.clear();
    memo.clear();
    while (!root) {
      op_offset = pos;
      if (pos >= bytes.size()) bad("input ends before STOP", "a STOP opcode");
      run_op(bytes[pos++]);
    }
    return root;
  }
};

Unpickler::Unpickler(std::span<const uint8_t> bytes, std::string where, Limits limits)
    : impl_(std::make_unique<Impl>()) {
  impl_->bytes = bytes;
  impl_->where = std::move(where);
  impl_->limits = limits;
}

Unpickler::~Unpickler() = default;

const Value* Unpickler::load() { return impl_->load(); }

}  // namespace bev::pickle
