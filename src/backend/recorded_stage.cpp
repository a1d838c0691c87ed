#include "backend/recorded_stage.h"

#include <algorithm>
#include <atomic>
#include <sstream>
#include <unordered_set>

#include "backend/backend.h"
#include "bevformer/error.h"

namespace bev {
namespace {

constexpr size_t kAlign = 64;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

uint64_t next_stage_id() {
  static std::atomic<uint64_t> next{0};
  return ++next;
}

}  // namespace

RecordedStage::RecordedStage(std::string name, std::vector<OpNode> nodes, const std::vector<Tensor>& keep,
                             Backend& backend, const std::vector<Tensor>& bindable)
    : name_(std::move(name)), id_(next_stage_id()), nodes_(std::move(nodes)) {
  std::unordered_set<const Storage*> pinned;
  for (const Tensor& t : keep) {
    if (t.defined()) pinned.insert(t.storage().get());
  }
  for (const Tensor& t : bindable) {
    if (!t.defined()) continue;
    pinned.insert(t.storage().get());
    bindable_.push_back(t.storage().get());
  }
  // Buffers the stage owns: storages some node writes, unless pinned. Their lives run from the
  // first write to the last read or write.
  for (size_t i = 0; i < nodes_.size(); ++i) {
    for (const Tensor& t : nodes_[i].outputs) {
      const Storage* s = t.storage().get();
      if (pinned.count(s)) continue;
      if (!s->is_deferred()) {
        throw Error(ErrorKind::kInternal, "stage '" + name_ + "': node " + std::to_string(i) + " (" +
                                              op_name(nodes_[i].kind) + ") writes memory the recording did not plan")
            .hint("record with Ops::Mode::kPlan; in-place outputs must be planned buffers or kept tensors");
      }
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
        throw Error(ErrorKind::kInternal, "stage '" + name_ + "': node " + std::to_string(i) +
                                              " reads a planned buffer before any node writes it");
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
  arena_ = backend.allocate(std::max<size_t>(arena_bytes_, kAlign));
  for (auto& [s, p] : placements_) moved_[s] = Storage::slice(arena_, p.offset, s->bytes());
  // Point every node at the arena. Deferred buffers that stay outside it (kept and bindable
  // tensors) get backend memory of their own now; the first execution computes every value.
  auto place_own = [&backend](const Tensor& t) {
    if (t.defined() && t.storage()->is_deferred()) t.storage()->place(backend.allocate(t.storage()->bytes()));
  };
  for (OpNode& n : nodes_) {
    for (std::vector<Tensor>* ts : {&n.inputs, &n.outputs}) {
      for (Tensor& t : *ts) {
        t = resolve(t);
        place_own(t);
      }
    }
  }
  for (const Tensor& t : keep) place_own(t);
  for (const Tensor& t : bindable) place_own(t);
}

Tensor RecordedStage::resolve(const Tensor& t) const {
  if (!t.defined()) return t;
  auto it = moved_.find(t.storage().get());
  if (it == moved_.end()) return t;
  return Tensor::view_of(it->second, t.dtype(), t.shape(), t.strides(), t.offset());
}

bool RecordedStage::is_bindable(const Tensor& t) const {
  return t.defined() && std::find(bindable_.begin(), bindable_.end(), t.storage().get()) != bindable_.end();
}

bool RecordedStage::reads(const Tensor& t) const {
  for (const OpNode& n : nodes_) {
    for (const Tensor& x : n.inputs) {
      if (x.defined() && x.storage() == t.storage()) return true;
    }
  }
  return false;
}

bool RecordedStage::writes(const Tensor& t) const {
  for (const OpNode& n : nodes_) {
    for (const Tensor& x : n.outputs) {
      if (x.defined() && x.storage() == t.storage()) return true;
    }
  }
  return false;
}

void RecordedStage::check_binding(const StageBinding& b) const {
  if (!is_bindable(b.slot)) {
    throw Error(ErrorKind::kInternal, "stage '" + name_ + "': " + b.slot.describe() + " is not bindable");
  }
  if (!b.target.defined() || b.target.shape() != b.slot.shape() || b.target.dtype() != b.slot.dtype() ||
      !b.target.is_contiguous() || b.target.device() != b.slot.device() || b.slot.offset() != 0 ||
      b.target.nbytes() < b.slot.storage()->bytes()) {
    throw Error(ErrorKind::kInternal, "stage '" + name_ + "': binding " + b.slot.describe() + " to " +
                                          (b.target.defined() ? b.target.describe() : std::string("nothing")))
        .expected("a contiguous tensor of the same shape, dtype and device");
  }
}

bool RecordedStage::reads_before_writes(const Tensor& input, const Tensor& output) const {
  const Storage* in = input.storage().get();
  const Storage* out = output.storage().get();
  size_t first_write = nodes_.size(), last_read = 0;
  bool read = false;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    for (const Tensor& t : nodes_[i].outputs) {
      if (t.storage().get() == out) first_write = std::min(first_write, i);
    }
    for (const Tensor& t : nodes_[i].inputs) {
      if (t.storage().get() == in) {
        last_read = i;
        read = true;
      }
    }
  }
  return !read || last_read < first_write;
}

std::vector<RecordedStage::ArenaBuffer> RecordedStage::arena_buffers() const {
  std::vector<ArenaBuffer> out;
  for (const auto& [old, p] : placements_) out.push_back({p.offset, p.bytes, p.first, p.last, moved_.at(old).get()});
  std::sort(out.begin(), out.end(), [](const ArenaBuffer& a, const ArenaBuffer& b) {
    return a.first != b.first ? a.first < b.first : a.offset < b.offset;
  });
  return out;
}

std::string RecordedStage::describe() const {
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
      // Compared as addresses only (never dereferenced): the arena may be device memory.
      const auto base = reinterpret_cast<uintptr_t>(arena_ ? arena_->data() : nullptr);
      const auto p = reinterpret_cast<uintptr_t>(t.storage()->data());
      if (base && p >= base && p < base + arena_bytes_) os << "@arena+" << (p - base);
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace bev
