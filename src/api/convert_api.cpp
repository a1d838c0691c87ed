#include "bevformer/convert.h"

#include "io/nuscenes_info.h"
#include "io/pandaset.h"

namespace bev {

std::vector<std::string> convert_nuscenes_info(const ConvertInfoRequest& r) {
  ConvertInfoOptions o;
  o.stream = r.stream;
  if (!r.scene.empty()) o.scene = r.scene;
  o.images_dir = r.images_dir;
  return convert_info(r.info_path, r.out_dir, o);
}

std::vector<std::string> convert_pandaset(const ConvertPandasetRequest& r) {
  PandasetOptions o;
  o.stream = r.stream;
  o.width = r.width;
  o.height = r.height;
  return convert_pandaset_sequence(r.sequence_dir, r.out_dir, o);
}

}  // namespace bev
