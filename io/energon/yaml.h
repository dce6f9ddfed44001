// YAML helpers shared by the Energon readers (.nv-meta files, metadatasets).
#pragma once

#include <string>

#include <yaml-cpp/yaml.h>

namespace vlm::io {

// Parses the file; errors name `what` and the path ("cannot parse metadataset YAML 'x': ...").
YAML::Node load_yaml(const std::string& path, const std::string& what = "");

// A YAML scalar as text; collections are written in flow style (subflavor values may be any).
std::string yaml_text(const YAML::Node& n);

} // namespace vlm::io
