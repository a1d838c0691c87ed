#include "bevformer/convert.h"

#include "io/nuscenes_info.h"

namespace bev {

std::vector<std::string> convert_nuscenes_info(const ConvertInfoRequest& r) {
  ConvertInfoOptions o;
  o.stream = r.stream;
  if (!r.scene.empty()) o.scene = r.scene;
  o.images_dir = r.images_dir;
  return convert_info(r.info_path, r.out_dir, o);
}

}  // namespace bev
