#include "io/pth_reader.h"

#include <unordered_map>

#include "bevformer/error.h"
#include "core/log.h"
#include "io/pickle.h"
#include "io/zip_reader.h"

namespace bev {
namespace {

using pickle::Kind;
using pickle::Value;

// The legacy (pre-1.6) format starts with a pickled magic number: PROTO 2, LONG1 of 10 bytes.
bool looks_like_legacy_torch(std::span<const uint8_t> b) {
  return b.size() >= 4 && b[0] == 0x80 && b[1] == 0x02 && b[2] == 0x8a && b[3] == 0x0a;
}

std::string find_prefix(const ZipReader& zip, const std::string& where) {
  std::string prefix;
  for (const auto& e : zip.entries()) {
    const auto slash = e.name.find('/');
    if (slash != std::string::npos && e.name.compare(slash, std::string::npos, "/data.pkl") == 0) {
      if (!prefix.empty()) {
        throw Error(ErrorKind::kInvalidInput, "more than one data.pkl in the archive ('" + prefix +
                                                  "/data.pkl' and '" + e.name + "')")
            .where(where);
      }
      prefix = e.name.substr(0, slash);
    }
  }
  if (prefix.empty()) {
    throw Error(ErrorKind::kInvalidInput, "the ZIP archive has no <prefix>/data.pkl")
        .where(where)
        .expected("a checkpoint written by torch.save");
  }
  return prefix;
}

const Value* find_state_dict(const Value* root, std::string* key) {
  for (const char* k : {"state_dict", "model"}) {
    const Value* v = root->get(k);
    if (v && v->kind == Kind::kDict) {
      *key = k;
      return v;
    }
  }
  for (const auto& [k, v] : root->entries) {
    if (v->kind == Kind::kTensor) {
      *key = "";
      return root;
    }
  }
  return nullptr;
}

void fill_meta(const Value* root, CheckpointMeta* meta) {
  for (const auto& [k, v] : root->entries) {
    if (k->is_str()) meta->top_level_keys.push_back(k->text);
  }
  const Value* m = root->get("meta");
  if (!m) return;
  meta->raw = pickle::to_json(m);
  if (const Value* c = m->get("CLASSES"); c && (c->kind == Kind::kTuple || c->kind == Kind::kList)) {
    for (const Value* item : c->items) {
      if (item->is_str()) meta->classes.push_back(item->text);
    }
  }
  if (const Value* v = m->get("mmcv_version"); v && v->is_str()) meta->mmcv_version = v->text;
  if (const Value* v = m->get("config"); v && v->is_str()) meta->config_text = v->text;
}

}  // namespace

Checkpoint read_pth(std::shared_ptr<const ByteSource> source, const LoadOptions& options) {
  const std::string& where = source->name();
  if (!looks_like_zip(source->span())) {
    if (looks_like_legacy_torch(source->span())) {
      throw Error(ErrorKind::kUnsupported, "legacy (pre-1.6) PyTorch serialization format")
          .where(where)
          .expected("the zip format of torch >= 1.6")
          .hint("re-save it once with a current torch: python -c \"import torch; "
                "torch.save(torch.load('old.pth', map_location='cpu'), 'new.pth')\"");
    }
    throw Error(ErrorKind::kInvalidInput, "not a PyTorch checkpoint (no ZIP signature)")
        .where(where)
        .at_offset(0)
        .expected("a .pth written by torch.save, or a .safetensors file");
  }
  ZipReader zip(source);
  const std::string prefix = find_prefix(zip, where);

  if (const ZipEntry* bo = zip.find(prefix + "/byteorder")) {
    const auto d = zip.data(*bo);
    const std::string order(d.begin(), d.end());
    if (order != "little") {
      throw Error(ErrorKind::kUnsupported, "byte order '" + order.substr(0, 16) + "'")
          .where(where + ": " + bo->name)
          .expected("little-endian storages")
          .hint("re-save the checkpoint on a little-endian machine");
    }
  }

  const ZipEntry& pkl_entry = *zip.find(prefix + "/data.pkl");
  zip.verify_crc(pkl_entry);
  pickle::Unpickler unpickler(zip.data(pkl_entry), where + ": " + pkl_entry.name);
  const Value* root = unpickler.load();
  if (root->kind != Kind::kDict) {
    throw Error(ErrorKind::kInvalidInput, std::string("the pickled object is ") + pickle::a_kind(root->kind))
        .where(where)
        .expected("a dict (a state_dict, or mmcv's {'meta', 'state_dict'})");
  }

  Checkpoint ck;
  ck.path = where;
  ck.format = CheckpointFormat::kPyTorch;
  ck.file_bytes = source->size();
  fill_meta(root, &ck.meta);
  const Value* sd = find_state_dict(root, &ck.meta.state_dict_key);
  if (!sd) {
    std::string keys;
    for (const auto& k : ck.meta.top_level_keys) keys += (keys.empty() ? "" : ", ") + k;
    throw Error(ErrorKind::kInvalidInput, "no state_dict in the checkpoint (top-level keys: " + keys + ")")
        .where(where)
        .expected("a 'state_dict' or 'model' dict of tensors, or a dict of tensors");
  }

  // One Storage per archive entry, however many tensors view it.
  std::unordered_map<std::string, std::shared_ptr<Storage>> storages;
  std::vector<std::string> skipped;
  for (const auto& [k, v] : sd->entries) {
    if (!k->is_str()) {
      throw Error(ErrorKind::kInvalidInput, std::string("state_dict key is ") + pickle::a_kind(k->kind))
          .where(where)
          .expected("string keys");
    }
    const std::string& name = k->text;
    if (v->kind != Kind::kTensor) {
      skipped.push_back(name);
      continue;
    }
    const pickle::TensorRef& tr = v->tensor;
    const pickle::StorageRef& sr = tr.storage->storage;
    const std::string entry_name = prefix + "/data/" + sr.key;
    const ZipEntry* entry = zip.find(entry_name);
    if (!entry) {
      throw Error(ErrorKind::kInvalidInput, "tensor '" + name + "' refers to storage '" + sr.key +
                                                "' but the archive has no entry " + entry_name)
          .where(where);
    }
    const uint64_t es = dtype_size(sr.dtype);
    if (sr.numel < 0 || static_cast<uint64_t>(sr.numel) > entry->size / es) {
      throw Error(ErrorKind::kInvalidInput, "storage '" + sr.key + "' claims " + std::to_string(sr.numel) + " " +
                                                dtype_name(sr.dtype) + " elements but its entry holds " +
                                                std::to_string(entry->size) + " bytes")
          .where(where + ": " + entry_name)
          .expected(std::to_string(entry->size / es) + " elements at most");
    }
    auto it = storages.find(sr.key);
    if (it == storages.end()) {
      if (options.verify_crc) zip.verify_crc(*entry);
      it = storages.emplace(sr.key, storage_over_source(source, entry->data_offset,
                                                         static_cast<uint64_t>(sr.numel) * es, sr.dtype)).first;
    } else if (it->second->bytes() != static_cast<uint64_t>(sr.numel) * es) {
      throw Error(ErrorKind::kInvalidInput, "storage '" + sr.key + "' is referenced with two different sizes")
          .where(where);
    }
    Tensor t;
    try {
      t = Tensor::view_of(it->second, sr.dtype, tr.size, tr.stride, tr.storage_offset);
    } catch (const Error& e) {
      throw Error(ErrorKind::kInvalidInput, "tensor '" + name + "': " + e.problem()).where(where);
    }
    ck.add(name, std::move(t));
  }
  if (!skipped.empty()) {
    log_warn(where, ": skipped ", skipped.size(), " state_dict entries that are not tensors (first: '",
             skipped.front(), "')");
    // `meta` may be any picklable value (a string, a list): only an object takes a key.
    if (ck.meta.raw.is_object()) ck.meta.raw["skipped_entries"] = skipped;
    ck.meta.skipped_entries = std::move(skipped);
  }
  return ck;
}

}  // namespace bev
