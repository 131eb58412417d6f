#include "engine/tokenizer/bpe.h"

#include <limits>
#include <queue>

namespace kiln::engine {

namespace {
constexpr std::uint32_t kNoRank = std::numeric_limits<std::uint32_t>::max();
constexpr std::size_t kMaxCachedPiece = 64;    // bytes
constexpr std::size_t kMaxCacheEntries = 1 << 18;
constexpr std::size_t kHeapThreshold = 128;    // symbols; above this the O(n^2) scan is slower
}  // namespace

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

void BpeModel::merge_small(std::vector<TokenId>& ids) const {
  const std::size_t n = ids.size();
  if (n < 2) return;
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
  ids.resize(len);
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
  std::vector<TokenId> ids;
  ids.reserve(piece.size());
  for (char c : piece) {
    const TokenId id = byte_ids_[static_cast<unsigned char>(c)];
    if (id >= 0) ids.push_back(id);  // no unk token: a byte missing from the vocab is dropped
  }
  if (heap || ids.size() > kHeapThreshold) merge_heap(ids);
  else merge_small(ids);
  out.insert(out.end(), ids.begin(), ids.end());
}

void BpeModel::encode_piece(std::string_view piece, std::vector<TokenId>& out) const {
  if (piece.size() == 1) {
    const TokenId id = byte_ids_[static_cast<unsigned char>(piece[0])];
    if (id >= 0) out.push_back(id);
    return;
  }
  if (piece.size() > kMaxCachedPiece) {
    encode_piece_uncached(piece, out, false);
    return;
  }
  {
    std::lock_guard lock(cache_mu_);
    auto it = cache_.find(piece);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const std::size_t start = out.size();
  encode_piece_uncached(piece, out, false);
  std::lock_guard lock(cache_mu_);
  if (cache_.size() >= kMaxCacheEntries) cache_.clear();
  cache_.emplace(std::string(piece), std::vector<TokenId>(out.begin() + start, out.end()));
}

}  // namespace kiln::engine
