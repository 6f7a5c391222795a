#include "base/size_parse.h"

#include <array>
#include <cctype>
#include <charconv>
#include <string>

#include "base/checked.h"
#include "base/error.h"

namespace ckpt {

uint64_t ParseSize(std::string_view text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  double value = 0;
  size_t number_end = digits;
  if (number_end < text.size() && text[number_end] == '.') {
    ++number_end;
    while (number_end < text.size() && std::isdigit(static_cast<unsigned char>(text[number_end])))
      ++number_end;
  }
  if (digits == 0) Fail("'{}' is not a size (examples: 5GB, 500MiB, 1048576B)", text);
  std::string number(text.substr(0, number_end));
  value = std::stod(number);
  std::string unit;
  for (char c : text.substr(number_end))
    unit.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  struct Unit {
    const char* name;
    double factor;
  };
  // A number alone is refused: "5" meant 5 bytes to some and 5 GB to others.
  if (unit.empty()) Fail("size '{}' needs a unit: 5GB, 500MiB, {}B", text, text);
  static const std::array<Unit, 9> kUnits = {{{"b", 1},
                                              {"kb", 1e3},
                                              {"mb", 1e6},
                                              {"gb", 1e9},
                                              {"tb", 1e12},
                                              {"kib", 1024.0},
                                              {"mib", 1048576.0},
                                              {"gib", 1073741824.0},
                                              {"tib", 1099511627776.0}}};
  for (const Unit& u : kUnits) {
    if (unit == u.name) {
      double bytes = value * u.factor;
      if (bytes < 1 || bytes > 1.8e19) Fail("size '{}' is out of range", text);
      return static_cast<uint64_t>(bytes);
    }
  }
  Fail("'{}': unknown size unit (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)", text);
}

}  // namespace ckpt
