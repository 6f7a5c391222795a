// A typed reader over toml++ tables: every value read through it that has the wrong type or
// range, and every key that nothing asked for, becomes a PolicyProblem naming the file, line,
// column and dotted key (with the closest known name), so that one pass reports them all.
#pragma once

#include <fmt/format.h>
#include <toml++/toml.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "policy/policy.h"

namespace ckpt::policy {

// "a table", "an integer"...: what a node is, for messages.
const char* TypeName(const toml::node& n);
// "(did you mean 'x'? known: a, b)" for an unknown name.
std::string Known(const std::vector<std::string>& names, std::string_view got);

// Collects problems; each names the file and the position toml++ recorded for the node.
class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}

  void Problem(const toml::source_region& at, const std::string& key, std::string what) {
    problems_.push_back({file_, at.begin.line, at.begin.column, key, std::move(what)});
  }
  std::vector<PolicyProblem>& problems() { return problems_; }

 private:
  std::string file_;
  std::vector<PolicyProblem> problems_;
};

// One table of the policy: typed getters that record a problem (and return nothing) when a
// value has the wrong type or range, and a check that every key present was asked for.
class Section {
 public:
  Section(Reader& r, const toml::table& t, std::string prefix, std::vector<std::string> known)
      : r_(r), t_(t), prefix_(std::move(prefix)), known_(std::move(known)) {}

  std::string Key(const std::string& name) const {
    return prefix_.empty() ? name : prefix_ + "." + name;
  }

  const toml::node* Get(const std::string& name) {
    if (std::find(known_.begin(), known_.end(), name) == known_.end())
      throw std::logic_error("policy: key not declared: " + name);
    return t_.get(name);
  }

  std::optional<uint64_t> UInt(const std::string& name, uint64_t min) {
    const toml::node* n = Get(name);
    if (!n) return std::nullopt;
    std::optional<int64_t> v = n->value_exact<int64_t>();
    if (!n->is_integer() || !v) {
      r_.Problem(n->source(), Key(name),
                 fmt::format("must be an integer >= {}, not {}", min, TypeName(*n)));
      return std::nullopt;
    }
    if (*v < 0 || static_cast<uint64_t>(*v) < min) {
      r_.Problem(n->source(), Key(name), fmt::format("must be an integer >= {} (got {})", min, *v));
      return std::nullopt;
    }
    return static_cast<uint64_t>(*v);
  }

  std::optional<double> Seconds(const std::string& name) {
    const toml::node* n = Get(name);
    if (!n) return std::nullopt;
    if (!n->is_number()) {
      r_.Problem(n->source(), Key(name),
                 fmt::format("must be a number of seconds >= 0, not {}", TypeName(*n)));
      return std::nullopt;
    }
    double v = n->is_integer() ? static_cast<double>(*n->value<int64_t>()) : *n->value<double>();
    if (!(v >= 0) || v > 86400.0 * 365) {
      r_.Problem(n->source(), Key(name),
                 fmt::format("must be a number of seconds between 0 and one year (got {})", v));
      return std::nullopt;
    }
    return v;
  }

  std::optional<bool> Bool(const std::string& name) {
    const toml::node* n = Get(name);
    if (!n) return std::nullopt;
    if (!n->is_boolean()) {
      r_.Problem(n->source(), Key(name),
                 fmt::format("must be true or false, not {}", TypeName(*n)));
      return std::nullopt;
    }
    return *n->value<bool>();
  }

  // A string; when `allowed` is not empty, one of those.
  std::optional<std::string> String(const std::string& name,
                                    const std::vector<std::string>& allowed = {}) {
    const toml::node* n = Get(name);
    if (!n) return std::nullopt;
    std::string list;
    for (const std::string& a : allowed) list += (list.empty() ? "\"" : ", \"") + a + "\"";
    if (!n->is_string()) {
      r_.Problem(n->source(), Key(name),
                 allowed.empty() ? fmt::format("must be a string, not {}", TypeName(*n))
                                 : fmt::format("must be one of {}, not {}", list, TypeName(*n)));
      return std::nullopt;
    }
    std::string v = *n->value<std::string>();
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
      r_.Problem(n->source(), Key(name), fmt::format("must be one of {} (got \"{}\")", list, v));
      return std::nullopt;
    }
    return v;
  }

  // An array of non-empty strings (globs).
  std::optional<std::vector<std::string>> Globs(const std::string& name) {
    const toml::node* n = Get(name);
    if (!n) return std::nullopt;
    const toml::array* a = n->as_array();
    if (!a) {
      r_.Problem(n->source(), Key(name),
                 fmt::format("must be an array of glob strings, not {}", TypeName(*n)));
      return std::nullopt;
    }
    std::vector<std::string> out;
    bool ok = true;
    for (size_t i = 0; i < a->size(); ++i) {
      const toml::node& e = *a->get(i);
      std::string key = fmt::format("{}[{}]", Key(name), i);
      if (!e.is_string()) {
        r_.Problem(e.source(), key, fmt::format("must be a glob string, not {}", TypeName(e)));
        ok = false;
      } else if (e.value<std::string>()->empty()) {
        r_.Problem(e.source(), key, "an empty glob matches nothing");
        ok = false;
      } else {
        out.push_back(*e.value<std::string>());
      }
    }
    if (!ok) return std::nullopt;
    return out;
  }

  // Every key present must be known.
  void CheckKeys() {
    for (auto&& [k, v] : t_) {
      std::string name(k.str());
      if (std::find(known_.begin(), known_.end(), name) == known_.end()) {
        r_.Problem(k.source(), Key(name), "unknown key " + Known(known_, name));
      }
    }
  }

 private:
  Reader& r_;
  const toml::table& t_;
  std::string prefix_;
  std::vector<std::string> known_;
};

}  // namespace ckpt::policy
