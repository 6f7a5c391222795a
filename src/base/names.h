// Matching names the same way in every command: shell globs (fnmatch, no flags: '*' also
// crosses '.' and '/') and dotted key paths ("optimizer.state.0" is below "optimizer").
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ckpt {

bool MatchesAnyGlob(const std::vector<std::string>& globs, const std::string& name);

// Could `glob` match some key path strictly below `path` (path + "." + more)? The shell
// glob syntax of fnmatch: '*', '?', bracket sets with '!' or '^', ranges and backslash
// escapes ("[[:alpha:]]" classes are read as plain sets of characters).
bool GlobCanMatchBelow(std::string_view glob, std::string_view path);

// Is `name` strictly below the dotted path `path` ("a.b.c" below "a.b"; "a.bc" and "a.b"
// itself are not)?
bool IsBelowKeyPath(std::string_view name, std::string_view path);

// Natural order: "rank_2" before "rank_10" (runs of digits compare as numbers).
bool DigitAwareLess(const std::string& a, const std::string& b);

// Levenshtein distance.
size_t EditDistance(std::string_view a, std::string_view b);
// The name in `names` closest to `got` when it is within two edits ("shrnk" -> "shrink"), for
// a did-you-mean; "" when none is that close.
std::string ClosestName(const std::vector<std::string>& names, std::string_view got);

}  // namespace ckpt
