// bevformer convert-info INFO.json OUT/ [--stream ID] [--scene NAME] [--images DIR]: an
// mmdetection3d info file (format v1.1) becomes one frame JSON per sample, in timestamp order.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "commands.h"
#include "bevformer/convert.h"

namespace bev::cli {
namespace {

struct ConvertInfoArgs {
  std::string info;
  std::string out;
  std::string stream;
  std::string scene;
  std::string images;
};

}  // namespace

Runner add_convert_info(CLI::App& app) {
  auto a = std::make_shared<ConvertInfoArgs>();
  CLI::App* sub = app.add_subcommand(
      "convert-info", "Turn an mmdetection3d info file (v1.1, JSON) into frame JSONs, one per sample, in time order");
  sub->add_option("info", a->info, "The info file ({\"metainfo\": ..., \"data_list\": [...]})")->required();
  sub->add_option("out", a->out, "Output folder for frame_<k>.json (created if missing)")->required();
  sub->add_option("--stream", a->stream, "Stream id of every frame (default: the info file's stem)");
  sub->add_option("--scene", a->scene,
                  "Scene token of every frame (default: the entry's scene_token, else the nuScenes log name "
                  "plus a counter of runs without gaps over 2 s)");
  sub->add_option("--images", a->images,
                  "Folder with the images: img_path is looked up there, then under samples/<CAM>/ "
                  "(default: the info file's folder)");
  return [a]() {
    const std::vector<std::string> paths = convert_nuscenes_info({a->info, a->out, a->stream, a->scene, a->images});
    for (const std::string& p : paths) std::printf("%s\n", p.c_str());
    std::fflush(stdout);
    return 0;
  };
}

}  // namespace bev::cli
