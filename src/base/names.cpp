#include "base/names.h"

#include <cctype>

#include <fnmatch.h>

#include <algorithm>
#include <utility>

namespace ckpt {

bool MatchesAnyGlob(const std::vector<std::string>& globs, const std::string& name) {
  for (const std::string& g : globs) {
    if (::fnmatch(g.c_str(), name.c_str(), 0) == 0) return true;
  }
  return false;
}

namespace {

// One element of a glob: a literal, '?', '*' or a bracket set.
struct GlobElement {
  enum Kind { kLiteral, kAny, kStar, kSet } kind = kLiteral;
  char literal = 0;
  bool negated = false;
  std::vector<std::pair<char, char>> ranges;  // kSet: inclusive ranges

  bool Matches(char c) const {
    switch (kind) {
      case kLiteral:
        return c == literal;
      case kAny:
        return true;
      case kStar:
        return true;
      case kSet: {
        bool in = false;
        for (auto [lo, hi] : ranges) in = in || (c >= lo && c <= hi);
        return in != negated;
      }
    }
    return false;
  }
};

std::vector<GlobElement> ParseGlob(std::string_view g) {
  std::vector<GlobElement> out;
  for (size_t i = 0; i < g.size(); ++i) {
    GlobElement e;
    char c = g[i];
    if (c == '*') {
      e.kind = GlobElement::kStar;
    } else if (c == '?') {
      e.kind = GlobElement::kAny;
    } else if (c == '\\' && i + 1 < g.size()) {
      e.literal = g[++i];
    } else if (c == '[') {
      size_t j = i + 1;
      GlobElement set;
      set.kind = GlobElement::kSet;
      if (j < g.size() && (g[j] == '!' || g[j] == '^')) {
        set.negated = true;
        ++j;
      }
      bool first = true, closed = false;
      for (; j < g.size(); ++j) {
        char lo = g[j];
        if (lo == ']' && !first) {
          closed = true;
          break;
        }
        first = false;
        if (lo == '\\' && j + 1 < g.size()) lo = g[++j];
        char hi = lo;
        if (j + 2 < g.size() && g[j + 1] == '-' && g[j + 2] != ']') {
          hi = g[j + 2];
          j += 2;
          if (hi == '\\' && j + 1 < g.size()) hi = g[++j];
        }
        set.ranges.emplace_back(lo, hi);
      }
      if (closed) {
        e = std::move(set);
        i = j;
      } else {
        e.literal = '[';  // an unclosed '[' is itself
      }
    } else {
      e.literal = c;
    }
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace

bool GlobCanMatchBelow(std::string_view glob, std::string_view path) {
  std::vector<GlobElement> elements = ParseGlob(glob);
  const size_t n = elements.size();
  // states[k]: the glob's first k elements can match what was read so far.
  std::vector<char> states(n + 1, 0), next(n + 1, 0);
  auto close = [&](std::vector<char>& s) {  // a star may match nothing
    for (size_t k = 0; k < n; ++k) {
      if (s[k] && elements[k].kind == GlobElement::kStar) s[k + 1] = 1;
    }
  };
  states[0] = 1;
  close(states);
  auto feed = [&](char c) {
    std::fill(next.begin(), next.end(), 0);
    for (size_t k = 0; k < n; ++k) {
      if (!states[k] || !elements[k].Matches(c)) continue;
      if (elements[k].kind == GlobElement::kStar) next[k] = 1;
      next[k + 1] = 1;
    }
    close(next);
    states.swap(next);
  };
  for (char c : path) feed(c);
  feed('.');
  // What is left of the glob must match the rest, which is not empty: any element can.
  for (size_t k = 0; k < n; ++k) {
    if (states[k]) return true;
  }
  return false;
}

bool IsBelowKeyPath(std::string_view name, std::string_view path) {
  return name.size() > path.size() && name.starts_with(path) && name[path.size()] == '.';
}

bool DigitAwareLess(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) &&
        std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t i2 = i, j2 = j;
      while (i2 < a.size() && std::isdigit(static_cast<unsigned char>(a[i2]))) ++i2;
      while (j2 < b.size() && std::isdigit(static_cast<unsigned char>(b[j2]))) ++j2;
      std::string_view x = std::string_view(a).substr(i, i2 - i),
                       y = std::string_view(b).substr(j, j2 - j);
      while (x.size() > 1 && x[0] == '0') x.remove_prefix(1);
      while (y.size() > 1 && y[0] == '0') y.remove_prefix(1);
      if (x.size() != y.size()) return x.size() < y.size();
      if (x != y) return x < y;
      i = i2;
      j = j2;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j;
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string ClosestName(const std::vector<std::string>& names, std::string_view got) {
  std::string best;
  size_t best_d = 3;
  for (const std::string& n : names) {
    size_t d = EditDistance(got, n);
    if (d < best_d) best_d = d, best = n;
  }
  return best;
}

}  // namespace ckpt
