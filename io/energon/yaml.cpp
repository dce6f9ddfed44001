#include "io/energon/yaml.h"

#include <fstream>
#include <sstream>

#include "src/base/check.h"

namespace vlm::io {

YAML::Node load_yaml(const std::string& path, const std::string& what) {
  const std::string kind = what.empty() ? "" : what + " ";
  std::ifstream in(path, std::ios::binary);
  VLM_CHECK(in, "cannot read ", kind, "'", path, "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  try {
    return YAML::Load(ss.str());
  } catch (const YAML::Exception& e) {
    VLM_FAIL("cannot parse ", kind, "YAML '", path, "': ", e.what());
  }
}

std::string yaml_text(const YAML::Node& n) {
  if (n.IsNull()) return "null";
  if (n.IsScalar()) return n.Scalar();
  YAML::Emitter em;
  em << YAML::Flow << n;
  return em.c_str();
}

} // namespace vlm::io
