// libgit2 1.5 (Debian 12's libgit2-1.5 1.5.1) leaks on every regular expression that does not
// match. Its pcre2 backend's git_regexp_match returns on PCRE2_ERROR_NOMATCH before
// pcre2_match_data_free, losing the match data and the ~20 KB of heap frames pcre2 keeps in it.
// Config lookups by pattern run one such match for every entry they pass over, so cloning,
// status, commit and push leaked 0.5-2 MB per build (ASan, tests/tools/git_test.cpp): without
// bound in a server that runs builds for months.
//
// The fix: kiln defines pcre2_match_data_create_8, pcre2_match_8 and pcre2_match_data_free_8
// itself. The executable's definitions bind before libpcre2's, also for libgit2's calls, and
// forward to the real ones (dlsym RTLD_NEXT). For match data that libgit2 creates (the caller's
// address lies in libgit2), a failed match is remembered per thread. libgit2 creates, matches
// and frees within one call, so a remembered match data still alive when the same thread's
// libgit2 creates the next one (or when the thread ends) was left behind, and is freed then.
// A libgit2 that frees it itself (later versions do) clears the record first, so nothing is
// freed twice. Match data that kiln's own code creates (the grep tool reuses one across
// failed matches) is never tracked.
#include "tools/regex_leak_guard.h"

#include <dlfcn.h>

#include <atomic>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace kiln::tools {
namespace {

using CreateFn = pcre2_match_data_8* (*)(uint32_t, pcre2_general_context_8*);
using MatchFn = int (*)(const pcre2_code_8*, PCRE2_SPTR8, PCRE2_SIZE, PCRE2_SIZE, uint32_t, pcre2_match_data_8*,
                        pcre2_match_context_8*);
using FreeFn = void (*)(pcre2_match_data_8*);

struct Real {
  CreateFn create = nullptr;
  MatchFn match = nullptr;
  FreeFn free = nullptr;
  const void* libgit2_base = nullptr;  // libgit2's load address: callers in it are libgit2
};

const Real& real() {
  static const Real r = [] {
    Real x;
    x.create = reinterpret_cast<CreateFn>(dlsym(RTLD_NEXT, "pcre2_match_data_create_8"));
    x.match = reinterpret_cast<MatchFn>(dlsym(RTLD_NEXT, "pcre2_match_8"));
    x.free = reinterpret_cast<FreeFn>(dlsym(RTLD_NEXT, "pcre2_match_data_free_8"));
    Dl_info info{};
    if (void* init = dlsym(RTLD_DEFAULT, "git_libgit2_init"); init != nullptr && dladdr(init, &info) != 0)
      x.libgit2_base = info.dli_fbase;
    return x;
  }();
  return r;
}

bool called_from_libgit2(const void* return_address) {
  const void* base = real().libgit2_base;
  Dl_info info{};
  return base != nullptr && dladdr(return_address, &info) != 0 && info.dli_fbase == base;
}

std::atomic<int64_t> g_created{0}, g_freed{0}, g_reclaimed{0};

struct ThreadRecord {
  pcre2_match_data_8* created = nullptr;  // the last match data libgit2 created on this thread
  pcre2_match_data_8* failed = nullptr;   // it, after a failed match, until freed
  void reclaim() {
    if (failed == nullptr) return;
    real().free(failed);
    if (created == failed) created = nullptr;
    failed = nullptr;
    g_freed.fetch_add(1, std::memory_order_relaxed);
    g_reclaimed.fetch_add(1, std::memory_order_relaxed);
  }
  ~ThreadRecord() { reclaim(); }
};
thread_local ThreadRecord t_record;

}  // namespace

void install_regex_leak_guard() { (void)real(); }

RegexLeakGuardStats regex_leak_guard_stats() {
  RegexLeakGuardStats s;
  s.created = g_created.load();
  s.freed = g_freed.load();
  s.reclaimed = g_reclaimed.load();
  return s;
}

}  // namespace kiln::tools

using kiln::tools::t_record;

extern "C" {

pcre2_match_data_8* pcre2_match_data_create_8(uint32_t ovecsize, pcre2_general_context_8* context) {
  const kiln::tools::Real& r = kiln::tools::real();
  if (r.create == nullptr) return nullptr;
  if (!kiln::tools::called_from_libgit2(__builtin_return_address(0))) return r.create(ovecsize, context);
  t_record.reclaim();  // libgit2's previous one, if a failed match left it behind
  pcre2_match_data_8* data = r.create(ovecsize, context);
  if (data != nullptr) {
    t_record.created = data;
    kiln::tools::g_created.fetch_add(1, std::memory_order_relaxed);
  }
  return data;
}

int pcre2_match_8(const pcre2_code_8* code, PCRE2_SPTR8 subject, PCRE2_SIZE length, PCRE2_SIZE start_offset,
                  uint32_t options, pcre2_match_data_8* data, pcre2_match_context_8* context) {
  const kiln::tools::Real& r = kiln::tools::real();
  if (r.match == nullptr) return PCRE2_ERROR_NULL;
  const int rc = r.match(code, subject, length, start_offset, options, data, context);
  if (rc < 0 && data != nullptr && data == t_record.created) t_record.failed = data;
  return rc;
}

void pcre2_match_data_free_8(pcre2_match_data_8* data) {
  const kiln::tools::Real& r = kiln::tools::real();
  if (data != nullptr && data == t_record.created) {
    t_record.created = nullptr;
    kiln::tools::g_freed.fetch_add(1, std::memory_order_relaxed);
  }
  if (data != nullptr && data == t_record.failed) t_record.failed = nullptr;
  if (r.free != nullptr) r.free(data);
}

}  // extern "C"
