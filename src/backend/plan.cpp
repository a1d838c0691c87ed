#include "backend/plan.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <unordered_set>

#include "bevformer/error.h"

namespace bev {
namespace {

constexpr size_t kAlign = 64;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

Plan::Plan(std::string name, std::vector<OpNode> nodes, const std::vector<Tensor>& keep)
    : name_(std::move(name)), nodes_(std::move(nodes)) {
  std::unordered_set<const Storage*> pinned;
  for (const Tensor& t : keep) {
    if (t.defined()) pinned.insert(t.storage().get());
  }
  // Buffers the plan owns: storages some node writes, unless pinned. Their lives run from the
  // first write to the last read or write.
  for (size_t i = 0; i < nodes_.size(); ++i) {
    for (const Tensor& t : nodes_[i].outputs) {
      const Storage* s = t.storage().get();
      if (pinned.count(s) || s->device() != Device::kCpu) continue;
      auto [it, fresh] = placements_.try_emplace(s);
      if (fresh) {
        it->second.bytes = align_up(s->bytes());
        it->second.first = i;
      }
      it->second.last = i;
    }
  }
  for (size_t i = 0; i < nodes_.size(); ++i) {
    for (const Tensor& t : nodes_[i].inputs) {
      auto it = placements_.find(t.storage().get());
      if (it == placements_.end()) continue;
      if (i < it->second.first) {
        // Read before any node writes it: an input of the stage that a later node overwrites
        // in place. Its contents matter, so it cannot move.
        if (t.storage()->is_deferred()) {
          throw Error(ErrorKind::kInternal, "plan '" + name_ + "': node " + std::to_string(i) +
                                                " reads a planned buffer before any node writes it");
        }
        placements_.erase(it);
        continue;
      }
      it->second.last = std::max(it->second.last, i);
    }
  }
  // Greedy placement, largest first: each buffer takes the lowest offset that does not collide
  // with an already placed buffer whose life overlaps.
  std::vector<std::pair<const Storage*, Placement*>> order;
  for (auto& [s, p] : placements_) {
    order.emplace_back(s, &p);
    no_reuse_bytes_ += p.bytes;
  }
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.second->bytes != b.second->bytes ? a.second->bytes > b.second->bytes : a.second->first < b.second->first;
  });
  std::vector<const Placement*> placed;
  for (auto& [s, p] : order) {
    std::vector<std::pair<size_t, size_t>> busy;  // [begin, end) of overlapping lives
    for (const Placement* q : placed) {
      if (q->first <= p->last && p->first <= q->last) busy.emplace_back(q->offset, q->offset + q->bytes);
    }
    std::sort(busy.begin(), busy.end());
    size_t offset = 0;
    for (const auto& [b, e] : busy) {
      if (offset + p->bytes <= b) break;
      offset = std::max(offset, e);
    }
    p->offset = offset;
    arena_bytes_ = std::max(arena_bytes_, offset + p->bytes);
    placed.push_back(p);
  }
  arena_ = Storage::allocate(std::max<size_t>(arena_bytes_, kAlign));
  for (auto& [s, p] : placements_) {
    moved_[s] = Storage::borrow(static_cast<char*>(arena_->data()) + p.offset, s->bytes(), arena_);
  }
  // Point every node at the arena. The recording's values are not carried over: replay
  // recomputes every moved buffer before it is read. Deferred buffers that stay outside the
  // arena (the pinned outputs) get their own memory now.
  for (OpNode& n : nodes_) {
    for (std::vector<Tensor>* ts : {&n.inputs, &n.outputs}) {
      for (Tensor& t : *ts) {
        t = resolve(t);
        if (t.defined()) t.storage()->materialize();
      }
    }
  }
  for (const Tensor& t : keep) {
    if (t.defined()) t.storage()->materialize();
  }
}

Tensor Plan::resolve(const Tensor& t) const {
  if (!t.defined()) return t;
  auto it = moved_.find(t.storage().get());
  if (it == moved_.end()) return t;
  return Tensor::view_of(it->second, t.dtype(), t.shape(), t.strides(), t.offset());
}

void Plan::replay(Backend& backend) const {
  for (const OpNode& n : nodes_) backend.run(n);
}

std::string Plan::describe() const {
  std::ostringstream os;
  os << name_ << ": " << nodes_.size() << " ops, " << placements_.size() << " buffers, arena "
     << arena_bytes_ << " B (without reuse " << no_reuse_bytes_ << " B)\n";
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const OpNode& n = nodes_[i];
    os << "  " << i << "  " << (n.stage.empty() ? "-" : n.stage) << "  " << op_name(n.kind) << "  "
       << (n.label.empty() ? "-" : n.label) << "  in";
    for (const Tensor& t : n.inputs) os << " " << t.describe();
    os << "  out";
    for (const Tensor& t : n.outputs) {
      os << " " << t.describe();
      const auto* base = static_cast<const char*>(arena_ ? arena_->data() : nullptr);
      const auto* p = static_cast<const char*>(t.storage()->data());
      if (base && p >= base && p < base + arena_bytes_) os << "@arena+" << (p - base);
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace bev
