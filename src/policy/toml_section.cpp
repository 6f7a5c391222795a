#include "policy/toml_section.h"

#include <fmt/format.h>

#include "base/names.h"

namespace ckpt::policy {

std::string Known(const std::vector<std::string>& names, std::string_view got) {
  std::string best = ClosestName(names, got);
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  if (list.empty()) list = "none";
  return best.empty() ? fmt::format("(known: {})", list)
                      : fmt::format("(did you mean '{}'? known: {})", best, list);
}

const char* TypeName(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a number";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    default:
      return "nothing";
  }
}

}  // namespace ckpt::policy
