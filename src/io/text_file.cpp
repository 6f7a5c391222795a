#include "io/text_file.h"

#include <cctype>
#include <fstream>
#include <iterator>

namespace ckpt {

std::string ReadMarkerFile(const std::string& path) {
  std::ifstream in(path);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return MarkerText(s);
}

std::string MarkerText(std::string_view s) {
  size_t begin = 0, end = s.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(s[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(s[end - 1]))) --end;
  return std::string(s.substr(begin, end - begin));
}

}  // namespace ckpt
