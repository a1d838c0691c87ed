// bevformer convert-info INFO.json OUT/ [--stream ID] [--scene NAME] [--images DIR]: an
// mmdetection3d info file (format v1.1) becomes one frame JSON per sample, in timestamp order.
// bevformer convert-pandaset SEQ/ OUT/ [--stream ID] [--size WxH|native]: a PandaSet sequence
// becomes one frame JSON per lidar frame.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "commands.h"
#include "bevformer/convert.h"
#include "bevformer/error.h"

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

Runner add_convert_pandaset(CLI::App& app) {
  auto a = std::make_shared<ConvertPandasetRequest>();
  auto size = std::make_shared<std::string>("1600x900");
  CLI::App* sub = app.add_subcommand(
      "convert-pandaset", "Turn a PandaSet sequence (devkit layout) into frame JSONs for a nuScenes-trained model");
  sub->add_option("sequence", a->sequence_dir, "The sequence folder (camera/, lidar/), e.g. pandaset/001")->required();
  sub->add_option("out", a->out_dir, "Output folder for frame_<k>.json (and images/ when resizing; created if missing)")
      ->required();
  sub->add_option("--stream", a->stream, "Stream id of every frame (default: the sequence folder's name)");
  sub->add_option("--size", *size,
                  "WxH of the images in the frames, written resized with K scaled (the nuScenes presets take "
                  "1600x900), or 'native' to reference the originals")
      ->capture_default_str();
  return [a, size]() {
    if (*size == "native") {
      a->width = a->height = 0;
    } else if (std::sscanf(size->c_str(), "%dx%d", &a->width, &a->height) != 2 || a->width <= 0 || a->height <= 0 ||
               a->width > 8192 || a->height > 8192) {
      throw Error(ErrorKind::kInvalidInput, "--size " + *size).expected("WxH (e.g. 1600x900) or native");
    }
    const std::vector<std::string> paths = convert_pandaset(*a);
    for (const std::string& p : paths) std::printf("%s\n", p.c_str());
    std::fflush(stdout);
    return 0;
  };
}

}  // namespace bev::cli
