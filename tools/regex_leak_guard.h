// A guard against a memory leak in the system libgit2 (regex_leak_guard.cpp says which and why).
#pragma once

#include <cstdint>

namespace kiln::tools {

// Resolves the guard's pointers to the real pcre2 functions and libgit2's load address; called
// once before libgit2 is used (git.cpp's init_once), which also links the guard into every
// program that uses git.
void install_regex_leak_guard();

// Match data that libgit2 created: how many, how many were freed (by libgit2 itself or by the
// guard), and how many of those the guard freed because libgit2 had left them behind.
struct RegexLeakGuardStats {
  int64_t created = 0, freed = 0, reclaimed = 0;
};
RegexLeakGuardStats regex_leak_guard_stats();

}  // namespace kiln::tools
