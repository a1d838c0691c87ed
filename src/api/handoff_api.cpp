// Model's part in fleet serving: the fingerprint computed at load, and one stream's history out
// of and into the engine (runtime/stream_handoff.h holds the format and the checks).
#include "api/model_impl.h"
#include "bevformer/error.h"
#include "bevformer/model.h"
#include "runtime/stream_handoff.h"

namespace bev {

const std::string& Model::fingerprint() const { return impl_->fingerprint; }

std::optional<std::string> Model::export_stream(const std::string& id) {
  std::optional<StreamSnapshot> s = bev::export_stream(*impl_->engine, id, impl_->fingerprint);
  if (!s) return std::nullopt;
  return encode_stream_handoff(*s);
}

std::pair<std::string, bool> Model::import_stream(std::string_view bytes,
                                                  const std::function<void(const std::string&)>& accept_id) {
  const StreamSnapshot s = decode_stream_handoff(bytes);
  if (accept_id) accept_id(s.stream);
  const bool imported = bev::import_stream(*impl_->engine, s, impl_->fingerprint);
  return {s.stream, imported};
}

}  // namespace bev
