#include "eval/shard.h"

#include <algorithm>
#include <charconv>
#include <unordered_map>

#include "bevformer/error.h"

namespace bev::eval {

ShardSpec parse_shard(std::string_view text) {
  const size_t slash = text.find('/');
  size_t k = 0, n = 0;
  bool ok = slash != std::string_view::npos;
  if (ok) {
    const auto a = std::from_chars(text.data(), text.data() + slash, k);
    const auto b = std::from_chars(text.data() + slash + 1, text.data() + text.size(), n);
    ok = a.ec == std::errc() && a.ptr == text.data() + slash && b.ec == std::errc() &&
         b.ptr == text.data() + text.size() && n >= 1 && k >= 1 && k <= n;
  }
  if (!ok) {
    throw Error(ErrorKind::kInvalidInput, "shard '" + std::string(text) + "' is not K/N")
        .expected("K/N with 1 <= K <= N, e.g. 1/4 for the first of four machines");
  }
  return {k - 1, n};
}

std::vector<size_t> shard_by_scene(const std::vector<std::string>& scene_of_frame, size_t index, size_t count) {
  if (count == 0 || index >= count) {
    throw Error(ErrorKind::kInvalidInput, "shard " + std::to_string(index) + " of " + std::to_string(count))
        .expected("0 <= index < count");
  }
  // Scenes by first appearance, with their frame counts.
  std::unordered_map<std::string, size_t> scene_id;
  std::vector<size_t> scene_of(scene_of_frame.size()), scene_size;
  for (size_t f = 0; f < scene_of_frame.size(); ++f) {
    const std::string key = scene_of_frame[f].empty() ? "\x01" + std::to_string(f) : scene_of_frame[f];
    const auto [it, fresh] = scene_id.emplace(key, scene_size.size());
    if (fresh) scene_size.push_back(0);
    scene_of[f] = it->second;
    ++scene_size[it->second];
  }
  std::vector<size_t> load(count, 0), shard_of_scene(scene_size.size());
  for (size_t s = 0; s < scene_size.size(); ++s) {
    const size_t target = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    shard_of_scene[s] = target;
    load[target] += scene_size[s];
  }
  std::vector<size_t> frames;
  for (size_t f = 0; f < scene_of_frame.size(); ++f) {
    if (shard_of_scene[scene_of[f]] == index) frames.push_back(f);
  }
  return frames;
}

}  // namespace bev::eval
