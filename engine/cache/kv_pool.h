// Paged KV memory for the full-attention layers, shared by every session of a model.
//
// A page holds `page_tokens` consecutive positions of one sequence for *all* full-attention
// layers: [layer][K|V][token][Hkv·D] in the cache dtype. The pool hands out at most max_pages
// pages (sized from the byte budget by capacity planning); page memory is allocated on first use
// and recycled through a free list, so an idle pool costs nothing.
//
// Thread safety: allocate/release may be called from any session's thread (a mutex guards the
// free list and counters). A page's bytes belong to the one session holding it, so reading and
// writing page data needs no lock.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "engine/status.h"

namespace kiln::engine {

enum class CacheDtype { f32, bf16 };
const char* cache_dtype_name(CacheDtype d);
// The names users write (`--cache-dtype`, a model's "cache_dtype"): "f32" or "bf16"; nullopt
// for anything else.
std::optional<CacheDtype> parse_cache_dtype(std::string_view name);
inline size_t cache_dtype_size(CacheDtype d) { return d == CacheDtype::f32 ? 4 : 2; }

struct KvLayout {
  int n_layers = 0;     // full-attention layers
  int64_t row = 0;      // Hkv·D elements per token per layer per K or V
  CacheDtype dtype = CacheDtype::f32;
  int64_t page_tokens = 16;
  int64_t bytes_per_token() const { return int64_t(n_layers) * 2 * row * int64_t(cache_dtype_size(dtype)); }
  int64_t page_bytes() const { return bytes_per_token() * page_tokens; }
};

class KvPool {
 public:
  KvPool(KvLayout layout, int64_t max_pages);
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  // A free page, or "context memory exhausted" when all max_pages are in use.
  Result<int32_t> allocate();
  void release(int32_t page);

  uint8_t* page_data(int32_t page) const { return pages_[size_t(page)].get(); }
  const KvLayout& layout() const { return layout_; }
  int64_t max_pages() const { return max_pages_; }
  int64_t pages_in_use() const;

 private:
  const KvLayout layout_;
  const int64_t max_pages_;
  mutable std::mutex mu_;
  std::vector<int32_t> free_;  // GUARDED_BY(mu_)
  int64_t created_ = 0;        // GUARDED_BY(mu_): pages with memory
  int64_t in_use_ = 0;         // GUARDED_BY(mu_)
  // Fixed-size table, never reallocated, so page_data() needs no lock.
  std::unique_ptr<std::unique_ptr<uint8_t[]>[]> pages_;
};

// One sequence's view of the pool: its page table and K/V access by position.
// Owned by one session (one thread at a time).
class SequenceKv {
 public:
  explicit SequenceKv(KvPool& pool) : pool_(&pool) {}
  ~SequenceKv() { truncate(0); }
  SequenceKv(const SequenceKv&) = delete;
  SequenceKv& operator=(const SequenceKv&) = delete;

  // Makes room for positions [0, n_tokens); on failure nothing changes.
  Status reserve(int64_t n_tokens);
  // Releases pages wholly beyond n_tokens.
  void truncate(int64_t n_tokens);
  int64_t capacity_tokens() const { return int64_t(pages_.size()) * pool_->layout().page_tokens; }
  int64_t page_tokens() const { return pool_->layout().page_tokens; }
  const KvPool& pool() const { return *pool_; }

  // k, v: one token's [Hkv·D] f32, stored at `pos` (which must be reserved) in the cache dtype.
  void write(int layer, int64_t pos, const float* k, const float* v);
  // Positions [0, n) of one layer as contiguous f32 [n][Hkv·D].
  void gather(int layer, int64_t n, float* k, float* v) const;
  // Where one layer's K and V rows of each page holding positions [0, n) start (ops::PagedKv).
  void page_rows(int layer, int64_t n, std::vector<const uint8_t*>& k, std::vector<const uint8_t*>& v) const;

 private:
  uint8_t* slot(int layer, int which, int64_t pos) const;
  KvPool* pool_;
  std::vector<int32_t> pages_;
};

}  // namespace kiln::engine
