#include "io/volume.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "base/error.h"

namespace ckpt {

namespace fs = std::filesystem;

namespace {

NodeType TypeOfStatus(const fs::file_status& s) {
  switch (s.type()) {
    case fs::file_type::not_found:
    case fs::file_type::none:
      return NodeType::kMissing;
    case fs::file_type::regular:
      return NodeType::kFile;
    case fs::file_type::directory:
      return NodeType::kFolder;
    case fs::file_type::symlink:
      return NodeType::kSymlink;
    default:
      return NodeType::kOther;
  }
}

class DiskVolume : public Volume {
 public:
  MappedFile Open(const std::string& path) const override { return MappedFile::Open(path); }

  NodeType TypeOf(const std::string& path) const override {
    std::error_code ec;
    return TypeOfStatus(fs::status(path, ec));
  }

  NodeType LinkTypeOf(const std::string& path) const override {
    std::error_code ec;
    return TypeOfStatus(fs::symlink_status(path, ec));
  }

  std::vector<Node> List(const std::string& path) const override {
    std::error_code ec;
    std::vector<Node> out;
    fs::directory_iterator it(path, fs::directory_options::skip_permission_denied, ec);
    if (ec) Fail("{}: cannot list folder: {}", path, ec.message());
    for (; it != fs::directory_iterator(); it.increment(ec)) {
      if (ec) Fail("{}: cannot list folder: {}", path, ec.message());
      std::error_code type_ec;
      out.push_back({it->path().string(), TypeOfStatus(it->symlink_status(type_ec))});
    }
    if (ec) Fail("{}: cannot list folder: {}", path, ec.message());
    std::sort(out.begin(), out.end(), [](const Node& a, const Node& b) { return a.path < b.path; });
    return out;
  }
};

}  // namespace

void Volume::Walk(const std::string& folder, const std::function<void(const Node&)>& visit,
                  const std::function<bool(const Node&)>& descend) const {
  for (const Node& n : List(folder)) {
    visit(n);
    if (n.type == NodeType::kFolder && (!descend || descend(n))) Walk(n.path, visit, descend);
  }
}

std::string Volume::ReadText(const std::string& path, uint64_t limit) const {
  MappedFile f = Open(path);
  if (f.size() > limit)
    Fail("{}: {} bytes, more than the {} a text file here may have", path, f.size(), limit);
  std::string text(f.size(), '\0');
  f.Read(0, reinterpret_cast<uint8_t*>(text.data()), f.size());
  return text;
}

const Volume& Disk() {
  static const DiskVolume disk;
  return disk;
}

}  // namespace ckpt
