#include "engine/cache/kv_pool.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "engine/weights/safetensors.h"

namespace kiln::engine {

const char* cache_dtype_name(CacheDtype d) { return d == CacheDtype::f32 ? "f32" : "bf16"; }

std::optional<CacheDtype> parse_cache_dtype(std::string_view name) {
  for (CacheDtype d : {CacheDtype::f32, CacheDtype::bf16})
    if (name == cache_dtype_name(d)) return d;
  return std::nullopt;
}

KvPool::KvPool(KvLayout layout, int64_t max_pages)
    : layout_(layout), max_pages_(max_pages), pages_(new std::unique_ptr<uint8_t[]>[size_t(max_pages)]) {}

Result<int32_t> KvPool::allocate() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!free_.empty()) {
    int32_t p = free_.back();
    free_.pop_back();
    ++in_use_;
    return p;
  }
  if (created_ >= max_pages_)
    return make_error("context memory exhausted: all " + std::to_string(max_pages_) + " KV pages (" +
                      std::to_string(max_pages_ * layout_.page_tokens) +
                      " tokens) are in use; raise the KV budget or close sessions");
  const int32_t p = int32_t(created_++);
  pages_[size_t(p)].reset(new uint8_t[size_t(std::max<int64_t>(1, layout_.page_bytes()))]);
  ++in_use_;
  return p;
}

void KvPool::release(int32_t page) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(page);
  --in_use_;
}

int64_t KvPool::pages_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}

Status SequenceKv::reserve(int64_t n_tokens) {
  const size_t before = pages_.size();
  while (capacity_tokens() < n_tokens) {
    auto p = pool_->allocate();
    if (!p) {
      while (pages_.size() > before) {  // give back what this call took: no partial effect
        pool_->release(pages_.back());
        pages_.pop_back();
      }
      return make_error(p.error());
    }
    pages_.push_back(*p);
  }
  return {};
}

void SequenceKv::truncate(int64_t n_tokens) {
  const int64_t pt = pool_->layout().page_tokens;
  const size_t keep = size_t((n_tokens + pt - 1) / pt);
  while (pages_.size() > keep) {
    pool_->release(pages_.back());
    pages_.pop_back();
  }
}

uint8_t* SequenceKv::slot(int layer, int which, int64_t pos) const {
  const KvLayout& l = pool_->layout();
  const int64_t in_page = pos % l.page_tokens;
  const size_t elt = cache_dtype_size(l.dtype);
  const int64_t index = ((int64_t(layer) * 2 + which) * l.page_tokens + in_page) * l.row;
  return pool_->page_data(pages_[size_t(pos / l.page_tokens)]) + size_t(index) * elt;
}

void SequenceKv::write(int layer, int64_t pos, const float* k, const float* v) {
  const KvLayout& l = pool_->layout();
  for (int which = 0; which < 2; ++which) {
    const float* src = which ? v : k;
    uint8_t* dst = slot(layer, which, pos);
    if (l.dtype == CacheDtype::f32) {
      std::memcpy(dst, src, size_t(l.row) * 4);
    } else {
      auto* d = reinterpret_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < l.row; ++i) d[i] = f32_to_bf16(src[i]);
    }
  }
}

void SequenceKv::gather(int layer, int64_t n, float* k, float* v) const {
  const KvLayout& l = pool_->layout();
  for (int64_t pos = 0; pos < n; pos += l.page_tokens) {
    const int64_t count = std::min(l.page_tokens, n - pos);  // tokens of one page are contiguous
    for (int which = 0; which < 2; ++which) {
      float* dst = (which ? v : k) + pos * l.row;
      const uint8_t* src = slot(layer, which, pos);
      to_f32(l.dtype == CacheDtype::f32 ? Dtype::f32 : Dtype::bf16, src, dst, count * l.row);
    }
  }
}

void SequenceKv::page_rows(int layer, int64_t n, std::vector<const uint8_t*>& k, std::vector<const uint8_t*>& v) const {
  const int64_t pt = pool_->layout().page_tokens, pages = (n + pt - 1) / pt;
  k.resize(size_t(pages)), v.resize(size_t(pages));
  for (int64_t p = 0; p < pages; ++p) k[size_t(p)] = slot(layer, 0, p * pt), v[size_t(p)] = slot(layer, 1, p * pt);
}

}  // namespace kiln::engine
