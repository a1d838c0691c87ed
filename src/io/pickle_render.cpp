// repr() and to_json() of unpickled values: bounded in depth and size and safe on cycles, because
// the input decides the shape of the graph (memo sharing can make a tiny pickle an exponential tree).
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <string>
#include <vector>

#include "io/pickle.h"

namespace bev::pickle {

namespace {

// Containers deeper than this render as "..."; the input decides nesting, so repr must not.
constexpr size_t kReprMaxDepth = 32;

bool on_path(const std::vector<const Value*>& path, const Value* v) {
  return std::find(path.begin(), path.end(), v) != path.end();
}

bool is_container(Kind k) {
  return k == Kind::kList || k == Kind::kTuple || k == Kind::kDict || k == Kind::kSet || k == Kind::kObject;
}

std::string float_text(double d) {
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, ec == std::errc() ? end : buf);
  if (s.find_first_of(".eni") == std::string::npos) s += ".0";  // Python's repr of 1.0
  return s;
}

std::string tensor_text(const Value* v) {
  const TensorRef& t = v->tensor;
  const char* dtype =
      t.storage && t.storage->kind == Kind::kStorage ? dtype_name(t.storage->storage.dtype) : "?";
  return std::string("<tensor ") + dtype + shape_str(t.size) + ">";
}

std::string storage_text(const Value* v) {
  return std::string("<storage ") + dtype_name(v->storage.dtype) + "[" + std::to_string(v->storage.numel) +
         "] key " + v->storage.key + " on " + v->storage.location + ">";
}

size_t output_budget(size_t max_chars, size_t max_items) {
  const size_t cap = size_t{1} << 24;  // saturate instead of wrapping when a caller passes SIZE_MAX
  if (max_items >= cap || (max_chars != 0 && max_items + 1 > cap / max_chars)) return cap;
  return std::max<size_t>(max_chars * (max_items + 1), 256);
}

class Repr {
 public:
  Repr(size_t max_chars, size_t max_items)
      : max_chars_(max_chars), max_items_(max_items), budget_(output_budget(max_chars, max_items)) {}

  std::string run(const Value* v) {
    value(v, 0);
    if (full_) out_ += "...";
    return std::move(out_);
  }

 private:
  // Each visit writes at least one byte before descending, so the budget also bounds the time
  // spent on a value graph that shares children many times over.
  void value(const Value* v, size_t depth) {
    if (out_.size() >= budget_) {
      full_ = true;
      return;
    }
    if (!v) {
      out_ += "<null>";
      return;
    }
    if (is_container(v->kind) && (depth >= kReprMaxDepth || on_path(path_, v))) {
      out_ += "...";
      return;
    }
    switch (v->kind) {
      case Kind::kNone: out_ += "None"; return;
      case Kind::kBool: out_ += v->b ? "True" : "False"; return;
      case Kind::kInt: out_ += std::to_string(v->i); return;
      case Kind::kFloat: out_ += float_text(v->f); return;
      case Kind::kStr: quoted(v->text, false); return;
      case Kind::kBytes: quoted(v->text, true); return;
      case Kind::kGlobal: out_ += "<" + v->text + ">"; return;
      case Kind::kStorage: out_ += storage_text(v); return;
      case Kind::kTensor: out_ += tensor_text(v); return;
      case Kind::kList:
      case Kind::kTuple:
      case Kind::kSet:
      case Kind::kObject:
      case Kind::kDict: break;
    }
    path_.push_back(v);
    if (v->kind == Kind::kDict) {
      out_ += "{";
      for (size_t i = 0; i < v->entries.size() && !cut(i, v->entries.size()); ++i) {
        value(v->entries[i].first, depth + 1);
        out_ += ": ";
        value(v->entries[i].second, depth + 1);
      }
      out_ += "}";
    } else {
      const bool empty_set = v->kind == Kind::kSet && v->items.empty();
      const char* open = v->kind == Kind::kList  ? "["
                         : v->kind == Kind::kSet ? (empty_set ? "set(" : "{")
                                                 : "(";
      const char* close = v->kind == Kind::kList ? "]" : v->kind == Kind::kSet && !empty_set ? "}" : ")";
      if (v->kind == Kind::kObject) out_ += "<" + v->text;
      out_ += open;
      for (size_t i = 0; i < v->items.size() && !cut(i, v->items.size()); ++i) value(v->items[i], depth + 1);
      if (v->kind == Kind::kTuple && v->items.size() == 1) out_ += ",";
      out_ += close;
      if (v->kind == Kind::kObject) out_ += ">";
    }
    path_.pop_back();
  }

  // Writes the separator before item i; true when the rest is elided.
  bool cut(size_t i, size_t n) {
    if (i > 0) out_ += ", ";
    if (i < max_items_ && !full_) return false;
    out_ += "... (" + std::to_string(n) + " total)";
    return true;
  }

  void quoted(const std::string& s, bool bytes) {
    size_t n = std::min(s.size(), max_chars_);
    if (!bytes) {
      while (n > 0 && n < s.size() && (static_cast<uint8_t>(s[n]) & 0xC0) == 0x80) --n;  // whole code points
    }
    out_ += bytes ? "b'" : "'";
    for (size_t i = 0; i < n; ++i) {
      const auto c = static_cast<uint8_t>(s[i]);
      if (c == '\\' || c == '\'') {
        out_ += '\\';
        out_ += static_cast<char>(c);
      } else if (c == '\n') {
        out_ += "\\n";
      } else if (c == '\t') {
        out_ += "\\t";
      } else if (c < 0x20 || c == 0x7F || (bytes && c >= 0x80)) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "\\x%02x", c);
        out_ += hex;
      } else {
        out_ += static_cast<char>(c);
      }
    }
    out_ += "'";
    if (n < s.size()) out_ += "... (" + std::to_string(s.size()) + " bytes)";
  }

  size_t max_chars_;
  size_t max_items_;
  size_t budget_;
  bool full_ = false;
  std::string out_;
  std::vector<const Value*> path_;
};

struct JsonWriter {
  size_t max_depth;
  size_t nodes_left;
  size_t text_left;  // string bytes: a shared 1 KiB string referenced a million times is 1 GiB of JSON
  std::vector<const Value*> path;

  nlohmann::json value(const Value* v, size_t depth) {
    if (!v) return nullptr;
    if (nodes_left == 0) return "<truncated>";
    --nodes_left;
    switch (v->kind) {
      case Kind::kNone: return nullptr;
      case Kind::kBool: return v->b;
      case Kind::kInt: return v->i;
      case Kind::kFloat: return v->f;
      case Kind::kStr:
        if (v->text.size() > text_left) {
          text_left = 0;
          return "<truncated>";
        }
        text_left -= v->text.size();
        return v->text;
      case Kind::kBytes: return "<" + std::to_string(v->text.size()) + " bytes>";
      case Kind::kGlobal: return "<" + v->text + ">";
      case Kind::kObject: return "<" + v->text + (v->items.empty() ? "()>" : "(...)>");
      case Kind::kStorage: return storage_text(v);
      case Kind::kTensor: return tensor_text(v);
      case Kind::kList:
      case Kind::kTuple:
      case Kind::kSet:
      case Kind::kDict: break;
    }
    if (on_path(path, v)) return "<cycle>";
    if (depth >= max_depth) return "<...>";
    path.push_back(v);
    nlohmann::json out;
    if (v->kind != Kind::kDict) {
      out = nlohmann::json::array();
      for (const Value* e : v->items) out.push_back(value(e, depth + 1));
    } else if (std::all_of(v->entries.begin(), v->entries.end(),
                           [](const auto& e) { return e.first->kind == Kind::kStr; })) {
      out = nlohmann::json::object();
      for (const auto& [k, e] : v->entries) {
        text_left -= std::min(text_left, k->text.size());
        out[k->text] = value(e, depth + 1);
      }
    } else {
      out = nlohmann::json::array();
      for (const auto& [k, e] : v->entries) {
        out.push_back(nlohmann::json::array({value(k, depth + 1), value(e, depth + 1)}));
      }
    }
    path.pop_back();
    return out;
  }
};

}  // namespace

std::string repr(const Value* v, size_t max_chars, size_t max_items) {
  return Repr(max_chars, max_items).run(v);
}

nlohmann::json to_json(const Value* v, size_t max_depth, size_t max_nodes, size_t max_text_bytes) {
  return JsonWriter{max_depth, max_nodes, max_text_bytes, {}}.value(v, 0);
}

}  // namespace bev::pickle
