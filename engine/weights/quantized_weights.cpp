#include "engine/weights/quantized_weights.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "engine/cpu/matmul.h"

namespace kiln::engine {

namespace {

constexpr uint32_t kLayoutVersion = 2;  // bump when a block layout in quant.h changes
constexpr uint64_t kDataOffset = 4096;  // data starts page-aligned in the cache file
constexpr uint64_t kAlign = 64;

struct CacheHeader {
  char magic[8];  // "KILNWTS1"
  uint32_t version;
  uint32_t format;
  uint64_t fingerprint;
  uint64_t count;
  uint64_t data_bytes;
};

Dtype dtype_for(cpu::WeightFormat f) {
  switch (f) {
    case cpu::WeightFormat::f32: return Dtype::f32;
    case cpu::WeightFormat::bf16: return Dtype::bf16;
    case cpu::WeightFormat::q8: return Dtype::q8;
    case cpu::WeightFormat::q4: return Dtype::q4;
  }
  return Dtype::unsupported;
}

uint64_t fnv(uint64_t h, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

uint64_t fingerprint(const Checkpoint& ck, const WeightLoadOptions& o, const std::vector<Matrix*>& todo) {
  uint64_t h = 0xcbf29ce484222325ull;
  const uint32_t head[3] = {kLayoutVersion, uint32_t(o.format), uint32_t(o.quantize_lm_head)};
  h = fnv(h, head, sizeof head);
  for (const auto& [name, t] : ck.tensors()) {
    h = fnv(h, name.data(), name.size());
    h = fnv(h, t.dtype_string.data(), t.dtype_string.size());
    h = fnv(h, t.shape.data(), t.shape.size() * sizeof(int64_t));
    const size_t s = std::min<size_t>(256, t.nbytes);
    h = fnv(h, t.data, s);
    h = fnv(h, t.data + (t.nbytes - s) / 2, s);
    h = fnv(h, t.data + t.nbytes - s, s);
  }
  for (const Matrix* m : todo) {
    const int64_t rc[2] = {m->rows, m->cols};
    h = fnv(h, rc, sizeof rc);
  }
  // The sampled bytes miss a fine-tune that changes other rows; any rewrite of a shard changes
  // its size, mtime or inode (a copy, or an in-place write), so the cache is rebuilt once.
  for (const auto& f : ck.files()) {
    const uint64_t id[3] = {uint64_t(f->size()), f->mtime_ns(), f->inode()};
    h = fnv(h, id, sizeof id);
  }
  return h;
}

void progress_bar(const char* fmt_name, uint64_t done, uint64_t total) {
  const int width = 30, filled = total ? int(width * done / total) : width;
  std::fprintf(stderr, "\rkiln: quantizing weights to %s [%.*s%*s] %3d%% %.2f/%.2f GB", fmt_name, filled,
               "==============================", width - filled, "", total ? int(100 * done / total) : 100,
               done / 1e9, total / 1e9);
  if (done == total) std::fputc('\n', stderr);
  std::fflush(stderr);
}

void convert_matrix(const Matrix& src, cpu::WeightFormat f, uint8_t* dst, ThreadPool* pool) {
  const cpu::KernelTable& kt = cpu::kernels_best();
  const size_t stride = cpu::row_bytes(f, src.cols);
  auto work = [&](int64_t b, int64_t e) {
    thread_local std::vector<float> row;
    row.resize(size_t(src.cols));
    for (int64_t r = b; r < e; ++r) {
      to_f32(src.dtype, src.row_ptr(r), row.data(), src.cols);
      kt.quantize[int(f)](row.data(), dst + size_t(r) * stride, src.cols);
    }
  };
  if (pool) pool->parallel_for(src.rows, 16, work);
  else work(0, src.rows);
}

Status write_cache(const std::string& path, const CacheHeader& hdr, const uint8_t* data) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return make_error("cannot create weight cache " + tmp + ": " + std::strerror(errno));
    std::vector<char> head(kDataOffset, 0);
    std::memcpy(head.data(), &hdr, sizeof hdr);
    f.write(head.data(), std::streamsize(head.size()));
    f.write(reinterpret_cast<const char*>(data), std::streamsize(hdr.data_bytes));
    if (!f.flush()) {
      std::filesystem::remove(tmp);
      return make_error("cannot write weight cache " + tmp + " (disk full?)");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return make_error("cannot rename weight cache to " + path + ": " + ec.message());
  }
  return {};
}

// Caches an older kiln wrote (an earlier block layout) are never read again: this removes them,
// so an upgrade does not leave a model's worth of dead bytes beside every checkpoint. Files of
// this layout (other formats, other lm_head choices) and of newer ones are left alone.
std::vector<std::string> remove_outdated_caches(const std::string& dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("kiln-weights-", 0) != 0 || entry.path().extension() != ".bin") continue;
    CacheHeader h{};
    {
      std::ifstream f(entry.path(), std::ios::binary);
      if (!f.read(reinterpret_cast<char*>(&h), sizeof h)) continue;
    }
    if (std::memcmp(h.magic, "KILNWTS1", 8) != 0 || h.version >= kLayoutVersion) continue;
    std::error_code rm;
    if (std::filesystem::remove(entry.path(), rm))
      removed.push_back("removed weight cache " + entry.path().string() + " (layout version " +
                        std::to_string(h.version) + ", this kiln reads " + std::to_string(kLayoutVersion) + ")");
  }
  return removed;
}

}  // namespace

void StoredWeights::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }
StoredWeights::~StoredWeights() = default;

void for_each_matrix(ModelWeights& w, const std::function<void(const char*, Matrix&, bool)>& fn,
                     bool quantize_lm_head) {
  auto visit = [&](const char* family, Matrix& m, bool convert) {
    if (m.data != nullptr && m.rows > 0) fn(family, m, convert);
  };
  visit("embedding", w.embed_tokens, false);
  for (LayerWeights& L : w.layers) {
    if (L.type == LayerType::full_attention) {
      for (Matrix* m : {&L.attn.q_proj, &L.attn.k_proj, &L.attn.v_proj, &L.attn.o_proj})
        visit("attention q/k/v/o_proj", *m, true);
    } else {
      for (Matrix* m : {&L.gdn.in_proj_qkv, &L.gdn.in_proj_z, &L.gdn.out_proj})
        visit("GDN in_proj_qkv/z, out_proj", *m, true);
      for (Matrix* m : {&L.gdn.in_proj_a, &L.gdn.in_proj_b}) visit("GDN in_proj_a/b", *m, false);
    }
    for (Matrix* m : {&L.mlp.gate_proj, &L.mlp.up_proj, &L.mlp.down_proj}) visit("MLP", *m, true);
    visit("router", L.moe.router, false);
    for (MlpWeights& e : L.moe.experts)
      for (Matrix* m : {&e.gate_proj, &e.up_proj, &e.down_proj}) visit("experts (routed)", *m, true);
    if (L.moe.has_shared_expert) {
      for (Matrix* m : {&L.moe.shared_expert.gate_proj, &L.moe.shared_expert.up_proj, &L.moe.shared_expert.down_proj})
        visit("shared expert", *m, true);
      visit("shared-expert gate", L.moe.shared_expert_gate, false);
    }
  }
  visit("lm_head", w.lm_head, quantize_lm_head);
}

Result<std::unique_ptr<StoredWeights>> StoredWeights::apply(ModelWeights& w, const Checkpoint& ck,
                                                            const std::string& dir, const WeightLoadOptions& o,
                                                            ThreadPool* pool) {
  std::unique_ptr<StoredWeights> sw(new StoredWeights());
  const Dtype target = dtype_for(o.format);
  std::vector<Matrix*> todo;
  for_each_matrix(
      w,
      [&](const char* family, Matrix& m, bool convert) {
        if (!convert || m.dtype == target) return;
        if (cpu::is_block_format(o.format) && m.cols % cpu::kQuantBlock != 0) {
          sw->warnings_.push_back(std::string(family) + ": " + std::to_string(m.cols) +
                                  " columns is not a multiple of 32; kept as " + dtype_name(m.dtype));
          return;
        }
        todo.push_back(&m);
      },
      o.quantize_lm_head);
  std::vector<uint64_t> offsets;
  uint64_t total = 0;
  for (const Matrix* m : todo) {
    offsets.push_back(total);
    total += (uint64_t(m->rows) * cpu::row_bytes(o.format, m->cols) + kAlign - 1) / kAlign * kAlign;
  }
  sw->bytes_ = total;
  if (todo.empty()) return sw;

  CacheHeader hdr{};
  std::memcpy(hdr.magic, "KILNWTS1", 8);
  hdr.version = kLayoutVersion;
  hdr.format = uint32_t(o.format);
  hdr.fingerprint = fingerprint(ck, o, todo);
  hdr.count = todo.size();
  hdr.data_bytes = total;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hdr.fingerprint));
  const std::string path = (std::filesystem::path(dir) / (std::string("kiln-weights-") +
                                                          cpu::weight_format_name(o.format) + "-" + hex + ".bin"))
                               .string();
  const uint8_t* base = nullptr;
  if (o.use_cache && std::filesystem::exists(path)) {
    auto mf = MappedFile::open(path);
    if (!mf) return make_error(mf.error());
    CacheHeader got{};
    if ((*mf)->size() >= sizeof got) std::memcpy(&got, (*mf)->data(), sizeof got);
    if ((*mf)->size() != kDataOffset + total || std::memcmp(&got, &hdr, sizeof hdr) != 0) {
      sw->warnings_.push_back("weight cache " + path + " does not match this checkpoint; re-quantizing");
    } else {
      sw->mapped_ = std::move(mf).value();
      sw->cache_path_ = path;
      base = sw->mapped_->data() + kDataOffset;
    }
  }
  if (base == nullptr) {
    sw->heap_.reset(static_cast<uint8_t*>(std::aligned_alloc(kAlign, total)));
    if (!sw->heap_) return make_error("cannot allocate " + std::to_string(total) + " bytes for quantized weights");
    uint64_t done = 0;
    int shown = -1;
    for (size_t i = 0; i < todo.size(); ++i) {
      convert_matrix(*todo[i], o.format, sw->heap_.get() + offsets[i], pool);
      done += (i + 1 < todo.size() ? offsets[i + 1] : total) - offsets[i];
      const int pct = int(100 * done / total);
      if (o.progress && pct / 5 != shown) {  // redraw every 5%
        shown = pct / 5;
        progress_bar(cpu::weight_format_name(o.format), done, total);
      }
    }
    base = sw->heap_.get();
    if (o.use_cache) {
      Status s = write_cache(path, hdr, base);
      if (s.ok()) sw->cache_path_ = path;
      else sw->warnings_.push_back(s.error() + "; the next load quantizes again");
    }
  }
  if (!sw->cache_path_.empty())
    for (std::string& note : remove_outdated_caches(dir)) sw->warnings_.push_back(std::move(note));
  for (size_t i = 0; i < todo.size(); ++i) *todo[i] = Matrix{base + offsets[i], target, todo[i]->rows, todo[i]->cols};
  return sw;
}

std::vector<WeightFamilyStorage> describe_weight_storage(const ModelWeights& w) {
  std::vector<WeightFamilyStorage> out;
  std::map<std::string, size_t> index;
  std::map<std::string, std::set<std::string>> kinds;
  for_each_matrix(const_cast<ModelWeights&>(w), [&](const char* family, Matrix& m, bool) {
    auto [it, fresh] = index.emplace(family, out.size());
    if (fresh) out.push_back({family, "", 0, 0});
    WeightFamilyStorage& f = out[it->second];
    ++f.tensors;
    f.bytes += uint64_t(m.rows) * dtype_row_bytes(m.dtype, m.cols);
    kinds[family].insert(dtype_name(m.dtype));
  });
  for (auto& f : out)
    for (const std::string& k : kinds[f.family]) f.storage += (f.storage.empty() ? "" : "+") + k;
  return out;
}

uint64_t weight_bytes_per_token(const ModelWeights& w, int experts_per_token) {
  uint64_t routed = 0, other = 0;
  int64_t n_experts = 0;
  for_each_matrix(const_cast<ModelWeights&>(w), [&](const char* family, Matrix& m, bool) {
    const uint64_t b = uint64_t(m.rows) * dtype_row_bytes(m.dtype, m.cols);
    if (std::strcmp(family, "embedding") == 0) other += dtype_row_bytes(m.dtype, m.cols);  // one row
    else if (std::strcmp(family, "experts (routed)") == 0) routed += b;
    else other += b;
  });
  for (const LayerWeights& L : w.layers) n_experts = std::max<int64_t>(n_experts, int64_t(L.moe.experts.size()));
  if (n_experts > 0) routed = routed * uint64_t(experts_per_token) / uint64_t(n_experts);
  return other + routed;
}

}  // namespace kiln::engine
