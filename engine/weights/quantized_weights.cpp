#include "engine/weights/quantized_weights.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
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

// Bump when a block layout in quant.h, the header or the fingerprint changes (3: the header names
// the lm_head choice; the fingerprint covers the shard files' identity).
constexpr uint32_t kLayoutVersion = 3;
constexpr uint64_t kDataOffset = 4096;  // data starts page-aligned in the cache file
constexpr uint64_t kAlign = 64;

struct CacheHeader {
  char magic[8];  // "KILNWTS1"
  uint32_t version;
  uint32_t format;
  uint64_t fingerprint;
  uint64_t count;
  uint64_t data_bytes;
  uint32_t lm_head;  // 1: kept as stored, 2: converted (tells a dead cache from another choice's)
  uint32_t reserved;
};

// A temporary cache file nobody holds the lock of is a load that died; this long after its last
// write it is removed. Where the file system refuses locks, only age tells, so that is longer.
constexpr auto kStaleTempUnlocked = std::chrono::seconds(60);
constexpr auto kStaleTempNoLocks = std::chrono::minutes(10);

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

bool write_all(int fd, const uint8_t* p, uint64_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, size_t(std::min<uint64_t>(n, 1u << 30)));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= uint64_t(w);
  }
  return true;
}

// Written under a name unique to this writer (mkstemp: a pid is not unique across containers
// sharing the directory, where every kiln may be pid 1) and renamed over `path`, so readers see
// a whole file or none. The temp file is flock'ed while written: the lock tells another load's
// sweep it is in progress, and dies with the process if the load is killed.
Status write_cache(const std::string& path, const CacheHeader& hdr, const uint8_t* data) {
  std::string tmp = path + ".tmp.XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) return make_error("cannot create weight cache " + tmp + ": " + std::strerror(errno));
  ::flock(fd, LOCK_EX);  // best effort: without locks the sweep goes by age alone
  ::fchmod(fd, 0644);    // mkstemp makes 0600; a kiln of another user may read the cache
  std::vector<uint8_t> head(kDataOffset, 0);
  std::memcpy(head.data(), &hdr, sizeof hdr);
  if (!write_all(fd, head.data(), head.size()) || !write_all(fd, data, hdr.data_bytes)) {
    const std::string e = std::strerror(errno);
    ::unlink(tmp.c_str());
    ::close(fd);
    return make_error("cannot write weight cache " + tmp + ": " + e);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  const std::string why = ec.message();  // before the cleanup below reuses errno
  if (ec) ::unlink(tmp.c_str());
  ::close(fd);  // releases the lock only now: the file is under its final name (or gone)
  if (ec) return make_error("cannot rename weight cache " + tmp + " to " + path + ": " + why);
  return {};
}

bool older_than(const std::filesystem::path& p, std::filesystem::file_time_type::duration age) {
  std::error_code ec;
  const auto t = std::filesystem::last_write_time(p, ec);
  return !ec && std::filesystem::file_time_type::clock::now() - t > age;
}

// A temporary cache file left by a load that did not finish (killed, crashed): nobody holds its
// lock and it has not been written for a while. One being written now is never touched.
bool is_stale_temp(const std::filesystem::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  bool stale;
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) stale = older_than(p, kStaleTempUnlocked);
  else stale = errno != EWOULDBLOCK && older_than(p, kStaleTempNoLocks);  // locks unsupported here
  ::close(fd);
  return stale;
}

// Keeps the model directory from filling with dead caches; returns a note per removed file.
// Removed: temporary files of loads that died; caches an older kiln wrote (an earlier layout);
// caches of this format and lm_head choice with another fingerprint (an earlier state of the
// checkpoint: each update would otherwise leave a full-size dead cache). Left alone: other
// formats and lm_head choices (another server may use them), and newer layouts.
std::vector<std::string> tidy_cache_dir(const std::string& dir, const CacheHeader& ours) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    std::error_code type_ec;
    if (name.rfind("kiln-weights-", 0) != 0 || !entry.is_regular_file(type_ec)) continue;
    std::string why;
    if (name.find(".bin.tmp.") != std::string::npos) {
      if (!is_stale_temp(entry.path())) continue;
      why = "left by a load that did not finish";
    } else if (entry.path().extension() == ".bin") {
      CacheHeader h{};
      {
        std::ifstream f(entry.path(), std::ios::binary);
        if (!f.read(reinterpret_cast<char*>(&h), sizeof h)) continue;
      }
      if (std::memcmp(h.magic, "KILNWTS1", 8) != 0) continue;
      if (h.version < kLayoutVersion)
        why = "layout version " + std::to_string(h.version) + ", this kiln reads " + std::to_string(kLayoutVersion);
      else if (h.version == kLayoutVersion && h.format == ours.format && h.lm_head == ours.lm_head &&
               h.fingerprint != ours.fingerprint)
        why = "made from an earlier state of the checkpoint";
      else
        continue;
    } else {
      continue;
    }
    std::error_code rm;
    if (std::filesystem::remove(entry.path(), rm)) removed.push_back("removed weight cache " + entry.path().string() + " (" + why + ")");
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
  hdr.lm_head = o.quantize_lm_head ? 2 : 1;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hdr.fingerprint));
  const std::string path = (std::filesystem::path(dir) / (std::string("kiln-weights-") +
                                                          cpu::weight_format_name(o.format) + "-" + hex + ".bin"))
                               .string();
  const uint8_t* base = nullptr;
  // Before a write too: the space of dead caches may be what the new one needs.
  if (o.use_cache)
    for (std::string& note : tidy_cache_dir(dir, hdr)) sw->warnings_.push_back(std::move(note));
  std::error_code exists_ec;
  auto mf = o.use_cache && std::filesystem::exists(path, exists_ec) ? MappedFile::open(path)
                                                                     : Result<std::unique_ptr<MappedFile>>(nullptr);
  if (!mf) {
    // A cache that cannot be opened or mapped (permissions, not a file) costs its speed, never
    // the load: quantize again (in memory if the cache cannot be rewritten either).
    sw->warnings_.push_back("weight cache unusable: " + mf.error() + "; re-quantizing");
  } else if (*mf) {
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

uint64_t weight_bytes_per_token(const ModelWeights& w, double experts_per_token) {
  uint64_t routed = 0, other = 0;
  int64_t n_experts = 0;
  for_each_matrix(const_cast<ModelWeights&>(w), [&](const char* family, Matrix& m, bool) {
    const uint64_t b = uint64_t(m.rows) * dtype_row_bytes(m.dtype, m.cols);
    if (std::strcmp(family, "embedding") == 0) other += dtype_row_bytes(m.dtype, m.cols);  // one row
    else if (std::strcmp(family, "experts (routed)") == 0) routed += b;
    else other += b;
  });
  for (const LayerWeights& L : w.layers) n_experts = std::max<int64_t>(n_experts, int64_t(L.moe.experts.size()));
  if (n_experts > 0) routed = uint64_t(double(routed) * experts_per_token / double(n_experts) + 0.5);
  return other + routed;
}

}  // namespace kiln::engine
