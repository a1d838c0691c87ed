// Splitting a dataset run over N machines by scene: a scene's frames carry temporal history from
// one to the next, so they must run in order on one machine. Scenes go whole to shards.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace bev::eval {

struct ShardSpec {
  size_t index = 0;  // 0-based
  size_t count = 1;
};

// "K/N" with 1 <= K <= N (the K-th of N shards); Error(kInvalidInput) otherwise.
ShardSpec parse_shard(std::string_view text);

// The frames of shard `index` of `count`, as indices into scene_of_frame, in their input order.
// Scenes are taken in order of first appearance and each goes whole to the shard with the fewest
// frames so far (the lowest index on a tie), so every shard gets about 1/N of the frames and the
// split depends only on the frame list. A frame with an empty scene is a scene of its own.
std::vector<size_t> shard_by_scene(const std::vector<std::string>& scene_of_frame, size_t index, size_t count);

}  // namespace bev::eval
