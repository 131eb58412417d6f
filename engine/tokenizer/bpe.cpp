#include "engine/tokenizer/bpe.h"

#include <atomic>
#include <cstring>
#include <limits>
#include <memory>
#include <queue>

namespace kiln::engine {

namespace {
constexpr std::uint32_t kNoRank = std::numeric_limits<std::uint32_t>::max();
constexpr std::size_t kHeapThreshold = 128;    // symbols; above this the O(n^2) scan is slower

// Piece cache: most pieces of real text repeat, and BPE on them costs many hash probes. The
// cache is direct-mapped, one 64-byte line per slot, and private to each thread (no lock, no
// sharing); it belongs to one BpeModel at a time, identified by instance id.
struct CacheSlot {
  std::uint64_t hash;
  std::uint8_t len;  // 0: empty
  std::uint8_t n_ids;
  char bytes[22];
  TokenId ids[8];
};
static_assert(sizeof(CacheSlot) == 64);
constexpr std::size_t kCacheSlots = 1 << 15;  // 2 MiB per thread
constexpr std::size_t kMaxCachedPiece = sizeof(CacheSlot::bytes);

struct ThreadCache {
  std::uint64_t owner = 0;
  std::unique_ptr<CacheSlot[]> slots;
};

CacheSlot* thread_cache(std::uint64_t owner) {
  thread_local ThreadCache cache;
  if (cache.owner != owner) {
    if (!cache.slots) cache.slots = std::make_unique<CacheSlot[]>(kCacheSlots);
    std::memset(cache.slots.get(), 0, kCacheSlots * sizeof(CacheSlot));
    cache.owner = owner;
  }
  return cache.slots.get();
}

std::uint64_t piece_hash(std::string_view s) {
  std::uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
  std::size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    std::uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  std::uint64_t w = 0;
  std::memcpy(&w, s.data() + i, s.size() - i);
  h = (h ^ w) * 0x94D049BB133111EBull;
  return h ^ (h >> 29);
}

std::atomic<std::uint64_t> next_instance_id{1};
}  // namespace

BpeModel::BpeModel(std::array<TokenId, 256> byte_ids, MergeTable merges)
    : byte_ids_(byte_ids), merges_(std::move(merges)), instance_id_(next_instance_id++) {}

void MergeTable::reserve(std::size_t n) {
  std::size_t cap = 16;
  int bits = 4;
  while (cap < n * 2) {
    cap <<= 1;
    ++bits;
  }
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  shift_ = 64 - bits;
  size_ = 0;
}

void MergeTable::insert(TokenId left, TokenId right, std::uint32_t rank, TokenId merged) {
  if (slots_.empty() || (size_ + 1) * 2 > slots_.size()) {
    // Grow: rebuild with double capacity.
    std::vector<Slot> old = std::move(slots_);
    reserve(std::max<std::size_t>(16, (size_ + 1) * 2));
    for (const Slot& s : old)
      if (s.key != kEmpty)
        insert(static_cast<TokenId>(s.key >> 32), static_cast<TokenId>(s.key & 0xFFFFFFFFu),
               s.rank, s.merged);
  }
  const std::uint64_t key = pack(left, right);
  for (std::size_t i = hash(key);; i = (i + 1) & mask_) {
    Slot& s = slots_[i];
    if (s.key == key) {
      // A later duplicate merge never wins: keep the lower rank.
      if (rank < s.rank) {
        s.rank = rank;
        s.merged = merged;
      }
      return;
    }
    if (s.key == kEmpty) {
      s = Slot{key, rank, merged};
      ++size_;
      return;
    }
  }
}

std::size_t BpeModel::merge_small(TokenId* ids, std::size_t n) const {
  if (n < 2) return n;
  // ranks[i], merged[i]: the merge of pair (i, i+1), kept in step with ids.
  std::uint32_t ranks[kHeapThreshold];
  TokenId merged[kHeapThreshold];
  for (std::size_t i = 0; i + 1 < n; ++i)
    if (!merges_.find(ids[i], ids[i + 1], ranks[i], merged[i])) ranks[i] = kNoRank;
  std::size_t len = n;
  while (len > 1) {
    std::size_t best = 0;
    std::uint32_t best_rank = kNoRank;
    for (std::size_t i = 0; i + 1 < len; ++i)
      if (ranks[i] < best_rank) {
        best_rank = ranks[i];
        best = i;
      }
    if (best_rank == kNoRank) break;
    ids[best] = merged[best];
    // Remove symbol best+1 and its pair entry.
    for (std::size_t i = best + 1; i + 1 < len; ++i) {
      ids[i] = ids[i + 1];
      ranks[i] = ranks[i + 1];
      merged[i] = merged[i + 1];
    }
    --len;
    if (best + 1 < len && !merges_.find(ids[best], ids[best + 1], ranks[best], merged[best]))
      ranks[best] = kNoRank;
    if (best > 0 && !merges_.find(ids[best - 1], ids[best], ranks[best - 1], merged[best - 1]))
      ranks[best - 1] = kNoRank;
  }
  return len;
}

void BpeModel::merge_heap(std::vector<TokenId>& ids) const {
  const std::size_t n = ids.size();
  if (n < 2) return;
  std::vector<std::int64_t> prev(n), next(n);
  for (std::size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<std::int64_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<std::int64_t>(i + 1) : -1;
  }
  struct Cand {
    std::uint32_t rank;
    std::size_t pos;
    TokenId left, right, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<>> heap;
  auto push = [&](std::size_t pos) {
    if (next[pos] < 0) return;
    std::uint32_t rank;
    TokenId m;
    const TokenId l = ids[pos], r = ids[static_cast<std::size_t>(next[pos])];
    if (merges_.find(l, r, rank, m)) heap.push(Cand{rank, pos, l, r, m});
  };
  std::vector<bool> alive(n, true);
  for (std::size_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    // Entries are invalidated lazily: apply only if the pair is still exactly there.
    if (!alive[c.pos] || ids[c.pos] != c.left || next[c.pos] < 0) continue;
    const auto r = static_cast<std::size_t>(next[c.pos]);
    if (ids[r] != c.right) continue;
    ids[c.pos] = c.merged;
    alive[r] = false;
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[static_cast<std::size_t>(next[r])] = static_cast<std::int64_t>(c.pos);
    if (prev[c.pos] >= 0) push(static_cast<std::size_t>(prev[c.pos]));
    push(c.pos);
  }
  std::size_t w = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (alive[i]) ids[w++] = ids[i];
  ids.resize(w);
}

void BpeModel::encode_piece_uncached(std::string_view piece, std::vector<TokenId>& out,
                                     bool heap) const {
  if (!heap && piece.size() <= kHeapThreshold) {
    TokenId ids[kHeapThreshold];
    std::size_t n = 0;
    for (char c : piece) {
      const TokenId id = byte_ids_[static_cast<unsigned char>(c)];
      if (id >= 0) ids[n++] = id;  // no unk token: a byte missing from the vocab is dropped
    }
    n = merge_small(ids, n);
    out.insert(out.end(), ids, ids + n);
    return;
  }
  std::vector<TokenId> ids;
  ids.reserve(piece.size());
  for (char c : piece) {
    const TokenId id = byte_ids_[static_cast<unsigned char>(c)];
    if (id >= 0) ids.push_back(id);
  }
  merge_heap(ids);
  out.insert(out.end(), ids.begin(), ids.end());
}

void BpeModel::encode_piece(std::string_view piece, std::vector<TokenId>& out) const {
  if (piece.size() == 1) {
    const TokenId id = byte_ids_[static_cast<unsigned char>(piece[0])];
    if (id >= 0) out.push_back(id);
    return;
  }
  if (piece.size() > kMaxCachedPiece || piece.empty()) {
    encode_piece_uncached(piece, out, false);
    return;
  }
  const std::uint64_t h = piece_hash(piece);
  CacheSlot& slot = thread_cache(instance_id_)[h & (kCacheSlots - 1)];
  if (slot.hash == h && slot.len == piece.size() &&
      std::memcmp(slot.bytes, piece.data(), piece.size()) == 0) {
    out.insert(out.end(), slot.ids, slot.ids + slot.n_ids);
    return;
  }
  const std::size_t start = out.size();
  encode_piece_uncached(piece, out, false);
  const std::size_t n = out.size() - start;
  if (n <= 8) {
    slot.hash = h;
    slot.len = static_cast<std::uint8_t>(piece.size());
    slot.n_ids = static_cast<std::uint8_t>(n);
    std::memcpy(slot.bytes, piece.data(), piece.size());
    std::memcpy(slot.ids, out.data() + start, n * sizeof(TokenId));
  }
}

}  // namespace kiln::engine
