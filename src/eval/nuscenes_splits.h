// The nuScenes split names and their scene names (the devkit's create_splits_scenes()).
#pragma once

#include <string_view>
#include <vector>

namespace bev::eval {

// The scene names of an official split — train, val, test, mini_train, mini_val, train_detect,
// train_track — or nullptr for any other name (a custom split, from the database's splits.json).
const std::vector<std::string_view>* official_split(std::string_view name);

}  // namespace bev::eval
