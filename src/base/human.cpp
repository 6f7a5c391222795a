#include "base/human.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string_view>

namespace ckpt {

std::string HumanBytes(uint64_t bytes) {
  static const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double v = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (v >= 1024 && unit < 4) {
    v /= 1024;
    ++unit;
  }
  return fmt::format("{:.2f} {}", v, kUnits[unit]);
}

std::string Percent(uint64_t part, uint64_t whole) {
  if (whole == 0) return "0.0%";
  return fmt::format("{:.1f}%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

std::string Count(uint64_t n, const std::string& noun) {
  if (n == 1) return "1 " + noun;
  // English plurals of the nouns ckptool counts: entry -> entries, file -> files.
  if (noun.size() > 1 && noun.ends_with('y') &&
      std::string_view("aeiou").find(noun[noun.size() - 2]) == std::string_view::npos)
    return std::to_string(n) + " " + noun.substr(0, noun.size() - 1) + "ies";
  return std::to_string(n) + " " + noun + "s";
}

}  // namespace ckpt
