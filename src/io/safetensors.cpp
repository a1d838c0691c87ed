#include "io/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

#include "bevformer/error.h"

namespace bev {
namespace {

constexpr uint64_t kMaxHeader = 100ull << 20;  // the reference implementation's limit
constexpr int kMaxJsonDepth = 16;

Error bad_header(const ByteSource& src, const std::string& key, std::string problem) {
  Error e(ErrorKind::kInvalidInput, std::move(problem));
  e.where(src.name() + (key.empty() ? std::string(": header") : ": header entry '" + key + "'"));
  return e;
}

// The header is untrusted: refuse absurd nesting before handing it to the JSON parser.
void check_depth(const ByteSource& src, std::string_view text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') {
      if (++depth > kMaxJsonDepth) {
        throw Error(ErrorKind::kInvalidInput, "header JSON nests deeper than " + std::to_string(kMaxJsonDepth))
            .where(src.name())
            .at_offset(8 + i);
      }
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

}  // namespace

Checkpoint read_safetensors(std::shared_ptr<const ByteSource> source) {
  const ByteSource& src = *source;
  const uint64_t n = src.size();
  if (n < 8) {
    throw Error(ErrorKind::kInvalidInput, "file of " + std::to_string(n) + " bytes is too short for a safetensors header")
        .where(src.name())
        .expected("8-byte header length, JSON header, data");
  }
  const uint64_t header_len = read_le64(src.data());
  if (header_len > kMaxHeader) {
    throw Error(ErrorKind::kInvalidInput, "header length " + std::to_string(header_len) + " is over the 100 MiB limit")
        .where(src.name())
        .at_offset(0)
        .hint("the file is not safetensors or its first 8 bytes are corrupt");
  }
  if (header_len > n - 8) {
    throw Error(ErrorKind::kInvalidInput, "header of " + std::to_string(header_len) + " bytes runs past the end of the file (" +
                                              std::to_string(n) + " bytes)")
        .where(src.name())
        .at_offset(0)
        .hint("the file is truncated");
  }
  const std::string_view text(reinterpret_cast<const char*>(src.data() + 8), static_cast<size_t>(header_len));
  check_depth(src, text);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(ErrorKind::kInvalidInput, std::string("header is not valid JSON: ") + e.what())
        .where(src.name())
        .at_offset(8 + e.byte);
  } catch (const nlohmann::json::exception& e) {  // e.g. a number too large for a double
    throw Error(ErrorKind::kInvalidInput, std::string("header JSON cannot be read: ") + e.what()).where(src.name());
  }
  if (!header.is_object()) throw bad_header(src, "", "header is not a JSON object");

  Checkpoint ck;
  ck.path = src.name();
  ck.format = CheckpointFormat::kSafetensors;
  ck.file_bytes = n;
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = n - data_start;

  std::vector<Entry> entries;
  entries.reserve(header.size());
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& key = it.key();
    const auto& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object()) throw bad_header(src, key, "__metadata__ is not an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) throw bad_header(src, key, "value of '" + m.key() + "' is not a string");
      }
      ck.meta.raw = v;
      continue;
    }
    if (!v.is_object()) throw bad_header(src, key, "entry is not an object");
    const auto dt = v.find("dtype");
    const auto sh = v.find("shape");
    const auto off = v.find("data_offsets");
    if (dt == v.end() || sh == v.end() || off == v.end() || v.size() != 3) {
      throw bad_header(src, key, "entry must have exactly dtype, shape and data_offsets");
    }
    Entry e;
    e.name = key;
    if (!dt->is_string() || !dtype_from_safetensors_name(dt->get<std::string>(), &e.dtype)) {
      throw Error(ErrorKind::kUnsupported, "dtype " + dt->dump() + " is not supported")
          .where(src.name() + ": header entry '" + key + "'")
          .expected("one of F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL");
    }
    if (!sh->is_array()) throw bad_header(src, key, "shape is not an array");
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        throw bad_header(src, key, "shape " + sh->dump() + " has an entry that is not a non-negative integer");
      }
      e.shape.push_back(d.get<int64_t>());
    }
    if (!off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned()) {
      throw bad_header(src, key, "data_offsets is not a pair of non-negative integers");
    }
    e.begin = (*off)[0].get<uint64_t>();
    e.end = (*off)[1].get<uint64_t>();
    if (e.begin > e.end || e.end > data_size) {
      throw bad_header(src, key, "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                                     "] fall outside the " + std::to_string(data_size) + " data bytes")
          .hint("the file is truncated or the header lies");
    }
    int64_t numel;
    try {
      numel = shape_numel(e.shape);
    } catch (const Error&) {
      throw bad_header(src, key, "shape " + sh->dump() + " overflows");
    }
    const uint64_t es = dtype_size(e.dtype);
    const bool past_64_bits = static_cast<uint64_t>(numel) > std::numeric_limits<uint64_t>::max() / es;
    if (past_64_bits || static_cast<uint64_t>(numel) * es != e.end - e.begin) {
      // The product is printed only when it is one: a wrapped one would read "needs 0 bytes".
      const std::string needs = past_64_bits ? "more than 2^64" : std::to_string(static_cast<uint64_t>(numel) * es);
      throw bad_header(src, key, std::string(dtype_safetensors_name(e.dtype)) + shape_str(e.shape) + " needs " + needs +
                                     " bytes but data_offsets span " + std::to_string(e.end - e.begin));
    }
    entries.push_back(std::move(e));
  }

  // The byte ranges must tile the data exactly: no gaps, no overlaps, nothing left over.
  std::vector<const Entry*> order;
  order.reserve(entries.size());
  for (const auto& e : entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t expect = 0;
  for (const Entry* e : order) {
    if (e->begin != expect) {
      throw bad_header(src, e->name, e->begin < expect ? "data overlaps the previous tensor's"
                                                       : "leaves a gap before its data")
          .expected("data_offsets that tile the data section without gaps or overlaps");
    }
    expect = e->end;
  }
  if (expect != data_size) {
    throw Error(ErrorKind::kInvalidInput, std::to_string(data_size - expect) + " bytes after the last tensor belong to none")
        .where(src.name())
        .at_offset(data_start + expect);
  }

  // JSON objects do not keep order; present tensors in file (data) order.
  for (const Entry* e : order) {
    ck.add(e->name, tensor_over_source(source, data_start + e->begin, e->end - e->begin, e->dtype, e->shape,
                                       contiguous_strides(e->shape), 0));
  }
  return ck;
}

std::vector<uint8_t> encode_safetensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                        const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  std::vector<Tensor> contiguous;
  contiguous.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") throw Error(ErrorKind::kInvalidInput, "a tensor may not be named __metadata__");
    if (header.contains(name)) throw Error(ErrorKind::kInvalidInput, "duplicate tensor name '" + name + "'");
    contiguous.push_back(t.contiguous());
    header[name] = {{"dtype", dtype_safetensors_name(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  std::vector<uint8_t> out(8 + text.size() + offset);
  const uint64_t len = text.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<uint8_t>(len >> (8 * i));
  std::memcpy(out.data() + 8, text.data(), text.size());
  uint8_t* p = out.data() + 8 + text.size();
  for (const Tensor& t : contiguous) {
    if (t.nbytes()) std::memcpy(p, t.raw_data(), t.nbytes());
    p += t.nbytes();
  }
  return out;
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::vector<uint8_t> bytes = encode_safetensors(tensors, metadata);
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw Error(ErrorKind::kIo, "cannot create file").where(tmp);
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  if (std::fclose(f) != 0 || !ok) {
    std::remove(tmp.c_str());
    throw Error(ErrorKind::kIo, "cannot write file (disk full?)").where(tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(ErrorKind::kIo, "cannot rename into place").where(path);
  }
}

}  // namespace bev
