// Pk: pickle opcodes emitted by hand, so each test shows exactly the bytes it feeds the reader.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace bev::pickle {

class Pk {
 public:
  Pk& op(uint8_t c) { return raw({c}); }
  Pk& raw(std::initializer_list<uint8_t> b) {
    bytes.insert(bytes.end(), b.begin(), b.end());
    return *this;
  }
  Pk& le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) bytes.push_back(static_cast<uint8_t>(v >> (8 * i)));
    return *this;
  }
  Pk& proto(uint8_t p = 2) { return op(0x80).le(p, 1); }
  Pk& mark() { return op('('); }
  Pk& stop() { return op('.'); }
  Pk& none() { return op('N'); }
  Pk& boolean(bool b) { return op(b ? 0x88 : 0x89); }
  Pk& int1(uint8_t v) { return op('K').le(v, 1); }
  Pk& int4(int32_t v) { return op('J').le(static_cast<uint32_t>(v), 4); }
  Pk& str(const std::string& s) {
    op('X').le(s.size(), 4);
    bytes.insert(bytes.end(), s.begin(), s.end());
    return *this;
  }
  Pk& global(const std::string& module, const std::string& name) {
    op('c');
    for (char c : module + "\n" + name + "\n") bytes.push_back(static_cast<uint8_t>(c));
    return *this;
  }
  Pk& put(uint8_t i) { return op('q').le(i, 1); }
  Pk& get(uint8_t i) { return op('h').le(i, 1); }
  Pk& tuple() { return op('t'); }
  Pk& reduce() { return op('R'); }
  // ('storage', torch.<type>, key, 'cpu', numel) BINPERSID
  Pk& storage(const std::string& type, const std::string& key, uint8_t numel) {
    return mark().str("storage").global("torch", type).str(key).str("cpu").int1(numel).tuple().op('Q');
  }
  // _rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())
  Pk& tensor(const std::string& key, std::initializer_list<uint8_t> size,
             std::initializer_list<uint8_t> stride) {
    global("torch._utils", "_rebuild_tensor_v2").mark().storage("FloatStorage", key, 64).int1(0);
    mark();
    for (uint8_t s : size) int1(s);
    tuple().mark();
    for (uint8_t s : stride) int1(s);
    tuple().boolean(false).global("collections", "OrderedDict").op(')').reduce();
    return tuple().reduce();
  }
  Pk& here() {
    at = bytes.size();
    return *this;
  }
  std::vector<uint8_t> bytes;
  size_t at = 0;
};

}  // namespace bev::pickle
