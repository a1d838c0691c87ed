#include "io/pth_writer.h"

#include <zlib.h>

#include <cstdio>
#include <cstring>
#include <limits>

#include "bevformer/error.h"

namespace bev {
namespace {

class PickleOut {
 public:
  std::vector<uint8_t> bytes;

  void op(uint8_t o) { bytes.push_back(o); }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void str(const std::string& s) {
    op('X');  // BINUNICODE
    u32(static_cast<uint32_t>(s.size()));
    bytes.insert(bytes.end(), s.begin(), s.end());
  }
  void integer(int64_t v) {
    if (v >= 0 && v < 256) {
      op('K');
      op(static_cast<uint8_t>(v));
    } else if (v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max()) {
      op('J');
      u32(static_cast<uint32_t>(static_cast<int32_t>(v)));
    } else {
      op(0x8a);  // LONG1, 8 bytes two's complement little-endian
      op(8);
      for (int i = 0; i < 8; ++i) op(static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i)));
    }
  }
  void real(double d) {
    op('G');  // BINFLOAT, big-endian
    uint64_t u;
    std::memcpy(&u, &d, 8);
    for (int i = 7; i >= 0; --i) op(static_cast<uint8_t>(u >> (8 * i)));
  }
  void global(const char* module, const char* name) {
    op('c');
    for (const char* p = module; *p; ++p) op(static_cast<uint8_t>(*p));
    op('\n');
    for (const char* p = name; *p; ++p) op(static_cast<uint8_t>(*p));
    op('\n');
  }
  void int_tuple(const Shape& v) {
    op('(');
    for (int64_t x : v) integer(x);
    op('t');
  }
  void json(const nlohmann::json& j) {
    switch (j.type()) {
      case nlohmann::json::value_t::null: op('N'); break;
      case nlohmann::json::value_t::boolean: op(j.get<bool>() ? 0x88 : 0x89); break;
      case nlohmann::json::value_t::number_integer:
      case nlohmann::json::value_t::number_unsigned: integer(j.get<int64_t>()); break;
      case nlohmann::json::value_t::number_float: real(j.get<double>()); break;
      case nlohmann::json::value_t::string: str(j.get<std::string>()); break;
      case nlohmann::json::value_t::array:
        op(']');
        op('(');
        for (const auto& x : j) json(x);
        op('e');  // APPENDS
        break;
      case nlohmann::json::value_t::object:
        op('}');
        op('(');
        for (auto it = j.begin(); it != j.end(); ++it) {
          str(it.key());
          json(it.value());
        }
        op('u');  // SETITEMS
        break;
      default: throw Error(ErrorKind::kInvalidInput, "cannot pickle JSON value " + j.dump());
    }
  }
};

struct ZipOut {
  std::vector<uint8_t> bytes;
  struct Central {
    std::string name;
    uint32_t crc;
    uint32_t size;
    uint32_t offset;
  };
  std::vector<Central> central;
  bool align = true;

  void le16(uint16_t v) {
    bytes.push_back(static_cast<uint8_t>(v));
    bytes.push_back(static_cast<uint8_t>(v >> 8));
  }
  void le32(uint32_t v) {
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void add(const std::string& name, const uint8_t* data, size_t size) {
    if (bytes.size() + size + 4096 > 0xffffffffu) {
      throw Error(ErrorKind::kUnsupported, "checkpoints over 4 GiB need ZIP64, which this writer does not produce");
    }
    const uint32_t crc = static_cast<uint32_t>(crc32(crc32(0L, Z_NULL, 0), data, static_cast<uInt>(size)));
    const uint32_t offset = static_cast<uint32_t>(bytes.size());
    // Like torch: pad the local header's extra field so the data starts on a 64-byte boundary.
    size_t extra = 0;
    if (align) {
      const size_t start = bytes.size() + 30 + name.size() + 4;
      extra = 4 + (64 - start % 64) % 64;
    }
    le32(0x04034b50);
    le16(20);
    le16(0);
    le16(0);  // stored
    le16(0);
    le16(0);
    le32(crc);
    le32(static_cast<uint32_t>(size));
    le32(static_cast<uint32_t>(size));
    le16(static_cast<uint16_t>(name.size()));
    le16(static_cast<uint16_t>(extra));
    bytes.insert(bytes.end(), name.begin(), name.end());
    if (extra) {
      le16(0x4246);  // "FB", torch's padding field
      le16(static_cast<uint16_t>(extra - 4));
      bytes.insert(bytes.end(), extra - 4, 'Z');
    }
    bytes.insert(bytes.end(), data, data + size);
    central.push_back({name, crc, static_cast<uint32_t>(size), offset});
  }
  void finish() {
    const uint32_t cd_offset = static_cast<uint32_t>(bytes.size());
    for (const auto& c : central) {
      le32(0x02014b50);
      le16(20);
      le16(20);
      le16(0);
      le16(0);
      le16(0);
      le16(0);
      le32(c.crc);
      le32(c.size);
      le32(c.size);
      le16(static_cast<uint16_t>(c.name.size()));
      le16(0);
      le16(0);
      le16(0);
      le16(0);
      le32(0);
      le32(c.offset);
      bytes.insert(bytes.end(), c.name.begin(), c.name.end());
    }
    const uint32_t cd_size = static_cast<uint32_t>(bytes.size()) - cd_offset;
    le32(0x06054b50);
    le16(0);
    le16(0);
    le16(static_cast<uint16_t>(central.size()));
    le16(static_cast<uint16_t>(central.size()));
    le32(cd_size);
    le32(cd_offset);
    le16(0);
  }
};

}  // namespace

std::vector<uint8_t> encode_pth(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                const PthWriteOptions& options) {
  if (tensors.size() >= 0xffff) throw Error(ErrorKind::kUnsupported, "too many tensors for a non-ZIP64 archive");
  PickleOut pk;
  pk.op(0x80);
  pk.op(2);
  if (options.mmcv_layout) {
    pk.op('}');
    pk.op('(');
    pk.str("meta");
    pk.json(options.meta);
    pk.str("state_dict");
  }
  pk.global("collections", "OrderedDict");
  pk.op(')');
  pk.op('R');
  pk.op('(');
  std::vector<Tensor> contiguous;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor t = tensors[i].second.contiguous();
    contiguous.push_back(t);
    pk.str(tensors[i].first);
    pk.global("torch._utils", "_rebuild_tensor_v2");
    pk.op('(');
    pk.op('(');
    pk.str("storage");
    pk.global("torch", dtype_torch_storage_name(t.dtype()));
    pk.str(std::to_string(i));
    pk.str("cpu");
    pk.integer(t.numel());
    pk.op('t');
    pk.op('Q');  // BINPERSID
    pk.integer(0);
    pk.int_tuple(t.shape());
    pk.int_tuple(t.strides());
    pk.op(0x89);  // requires_grad False
    pk.global("collections", "OrderedDict");
    pk.op(')');
    pk.op('R');
    pk.op('t');
    pk.op('R');
  }
  pk.op('u');
  if (options.mmcv_layout) pk.op('u');
  pk.op('.');

  ZipOut zip;
  zip.align = options.align_data;
  const std::string& p = options.prefix;
  zip.add(p + "/data.pkl", pk.bytes.data(), pk.bytes.size());
  static const char kOrder[] = "little";
  zip.add(p + "/byteorder", reinterpret_cast<const uint8_t*>(kOrder), 6);
  for (size_t i = 0; i < contiguous.size(); ++i) {
    const auto* d = static_cast<const uint8_t*>(contiguous[i].raw_data());
    zip.add(p + "/data/" + std::to_string(i), d, contiguous[i].nbytes());
  }
  static const char kVersion[] = "3\n";
  zip.add(p + "/version", reinterpret_cast<const uint8_t*>(kVersion), 2);
  zip.finish();
  return std::move(zip.bytes);
}

std::vector<uint8_t> encode_stored_zip(const std::vector<std::pair<std::string, std::vector<uint8_t>>>& entries,
                                       bool align_data) {
  ZipOut zip;
  zip.align = align_data;
  for (const auto& [name, data] : entries) zip.add(name, data.data(), data.size());
  zip.finish();
  return std::move(zip.bytes);
}

void write_pth(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
               const PthWriteOptions& options) {
  const std::vector<uint8_t> bytes = encode_pth(tensors, options);
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw Error(ErrorKind::kIo, "cannot create file").where(path);
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  if (std::fclose(f) != 0 || !ok) throw Error(ErrorKind::kIo, "cannot write file (disk full?)").where(path);
}

}  // namespace bev
