// A restricted unpickler for what torch.save and mmcv checkpoints hold. It builds plain values
// (None, bool, int, float, str, bytes, list, tuple, dict) and recognises a short allow-list of
// globals: collections.OrderedDict, torch._utils._rebuild_tensor_v2 / _rebuild_tensor /
// _rebuild_parameter / _rebuild_parameter_with_state, torch._tensor._rebuild_from_type_v2 and the
// torch.*Storage classes. Every other global becomes an opaque placeholder object carrying its
// dotted name and arguments, so odd objects in a checkpoint's `meta` still load. Nothing is ever
// executed. All malformed input is reported as bev::Error with the byte offset of the opcode.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/tensor.h"

namespace bev::pickle {

enum class Kind : uint8_t {
  kNone,
  kBool,
  kInt,
  kFloat,
  kStr,
  kBytes,
  kList,
  kTuple,
  kDict,     // dicts and OrderedDicts, insertion order kept; keys may be any value
  kSet,      // set / frozenset, items in `items`
  kGlobal,   // a GLOBAL that was not applied: `text` = "module.name"
  kObject,   // result of calling/constructing a non-allow-listed global: `text` = "module.name",
             // `items` = positional args (may be empty) then any APPEND(S)ed items, `entries` =
             // any SETITEM(S) on it (dict subclasses), `state` = BUILD state or nullptr
  kStorage,  // a persistent-id storage reference (see StorageRef)
  kTensor,   // a rebuilt tensor reference (see TensorRef)
};

const char* kind_name(Kind k);
// With its article, for messages: "an int", "a dict", "None".
std::string a_kind(Kind k);

struct Value;

// ('storage', torch.<Type>Storage, key, location, numel) from BINPERSID.
struct StorageRef {
  DType dtype = DType::kF32;
  std::string key;       // opaque; names the archive entry <prefix>/data/<key>
  std::string location;  // "cpu", "cuda:0", ...
  int64_t numel = 0;     // in elements of dtype
};

// _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, hooks[, metadata]).
// Offsets and strides are in elements. Not validated against the storage here (the pth reader
// does that, it knows the entry sizes).
struct TensorRef {
  const Value* storage = nullptr;  // a kStorage value
  int64_t storage_offset = 0;
  Shape size;
  Shape stride;
  bool requires_grad = false;
};

struct Value {
  Kind kind = Kind::kNone;
  bool b = false;                                    // kBool
  int64_t i = 0;                                     // kInt
  double f = 0.0;                                    // kFloat
  std::string text;                                  // kStr / kBytes / kGlobal / kObject name
  std::vector<Value*> items;                         // kList / kTuple / kSet / kObject args
  std::vector<std::pair<Value*, Value*>> entries;    // kDict
  Value* state = nullptr;                            // kObject / kDict BUILD state (ignored)
  StorageRef storage;                                // kStorage
  TensorRef tensor;                                  // kTensor

  // Convenience lookups (nullptr when absent or when this is not a dict).
  const Value* get(std::string_view key) const;
  bool is_str() const { return kind == Kind::kStr; }
};

struct Limits {
  size_t max_stack = 1 << 20;        // values on the stack at once
  size_t max_memo = 1 << 22;         // memo entries
  size_t max_values = 1 << 24;       // values created in total, plus container slots that calls
                                     // copy out of shared values (OrderedDict(pairs), placeholders)
  size_t max_nesting = 512;          // MARK depth
  size_t max_string_bytes = 1u << 30;
};

class Unpickler {
 public:
  // `where` names the pickle in error messages ("model.pth: archive/data.pkl"). `bytes` must stay
  // valid until load() returns; the values copy what they keep.
  Unpickler(std::span<const uint8_t> bytes, std::string where, Limits limits = {});
  ~Unpickler();
  Unpickler(const Unpickler&) = delete;
  Unpickler& operator=(const Unpickler&) = delete;

  // Runs the pickle to STOP and returns the root. Values live as long as the Unpickler.
  // Throws bev::Error (kInvalidInput with the opcode's byte offset, or kUnsupported for a
  // protocol above 5 or an opcode outside the supported set).
  const Value* load();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A short human-readable rendering for reports: strings quoted and cut at `max_chars`, containers
// with at most `max_items` entries, placeholders as <module.name(...)>. Safe on cycles.
std::string repr(const Value* v, size_t max_chars = 200, size_t max_items = 20);

// Plain data as JSON (for checkpoint metadata): str/int/float/bool/None map directly, bytes as
// "<N bytes>", tuples/lists/sets as arrays, dicts as objects when every key is a string (else an
// array of [key, value] pairs), placeholders as "<module.name(...)>", tensors as "<tensor f32[..]>".
// Depth is capped at `max_depth` and cycles render as "<cycle>". At most `max_nodes` values and
// `max_text_bytes` of strings are rendered (the rest as "<truncated>"): memo sharing can make a
// 4 KiB pickle a tree of gigabytes. The defaults hold any real mmcv `meta` (its config text is
// tens of KiB) and keep the JSON to a few MiB.
nlohmann::json to_json(const Value* v, size_t max_depth = 64, size_t max_nodes = 1 << 16,
                       size_t max_text_bytes = 4u << 20);

}  // namespace bev::pickle
