// shardopt: the ZeRO engine's fused reduce-scatter + update (stage 2, one
// node; lib/zero/reduction.hpp, "The fused stage-2 step"): the memory every
// rank maps and the other ranks' gradients, through the Communicator's node
// access (comm/node_access.hpp); the reduction of a block of the shard from
// every rank's gradients as the update reads it (reduce_block), or into the
// shard when something needs the reduced gradients first (materialize); the
// held buckets of streamed gradients; and the agreement that ends a fused
// reduction. The collectives' path is reduction.cpp.
#include <omp.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "comm/agree.hpp"
#include "comm/node_access.hpp"
#include "common/check.hpp"
#include "common/log.hpp"
#include "kernels/reduce.hpp"
#include "zero/reduction.hpp"

namespace shardopt::detail {

namespace {
// A rank's part of the shared bucket buffers: a page naming the buffers of
// its held buckets, then its two buffers, each starting on a page.
constexpr std::size_t kPage = 4096;
}  // namespace

std::unique_ptr<SharedParts> GradReducer::node_segment(std::size_t bytes, bool in_place,
                                                       const char* what) {
  std::string error;
  auto segment = node_access(comm_)->share(bytes, in_place, error);
  if (segment == nullptr && rank_ == 0)  // the same outcome on every rank
    SHARDOPT_LOG(warn, "ZeRO stage 2: " << what << ": " << error
                                        << " (SHARDOPT_FUSED_UPDATE=0 turns it off quietly)");
  return segment;
}

void GradReducer::share_pool(std::size_t pool_bytes) {
  // The segment's size is every rank's (the largest, should they differ).
  std::int64_t most = static_cast<std::int64_t>(pool_bytes);
  ctl_.allreduce(&most, &most, 1, DType::i64, ReduceOp::max);
  pool_bytes = pool_bytes_ = static_cast<std::size_t>(most);
  // Each rank's part: a page saying where its held buckets are, then its
  // two buffers, each starting on a page.
  pool_stride_ = (pool_bytes + kPage - 1) / kPage * kPage;
  // The transport reduces the buckets where every rank's are.
  shared_pool_ =
      node_segment(kPage + 2 * pool_stride_, true,
                   "the bucket buffers stay in each rank's own memory (copied to be reduced)");
  if (shared_pool_ == nullptr) return;
  std::byte* mine = pool_part(rank_);
  for (std::size_t k = 0; k < 2; ++k)
    pool_.push_back(SpaceBuffer::borrow(mine + kPage + k * pool_stride_, pool_bytes));
  // The update reduces the buckets that fill last where they are: the
  // first two, which launch last (element-wise optimizers).
  if (fusable_) {
    hold_ = std::min<std::size_t>(2, buckets_.size());
    held_src_.assign(std::size_t(nranks_) * hold_, nullptr);
    start_blocks();
  }
  SHARDOPT_LOG(info, "ZeRO stage 2: the streamed gradients' two bucket buffers in "
                         << (2 * pool_bytes) / (1024 * 1024)
                         << " MiB of shared memory per rank, reduced where they are");
}

void GradReducer::share_owned_grads(std::size_t bytes) {
  shared_ = node_segment(bytes, false,
                         "the fused update is off, the gradients stay in each rank's own memory");
  if (shared_ == nullptr) return;
  for (int q = 0; q < nranks_; ++q) peers_.push_back(shared_->part(q));
  shared_bytes_ = bytes;
  start_fused();
  SHARDOPT_LOG(info, "ZeRO stage 2: fused reduce-scatter + update, the owned gradients in "
                         << (bytes * std::size_t(nranks_)) / (1024 * 1024)
                         << " MiB of shared memory (" << bytes / (1024 * 1024) << " MiB per rank)");
}

void GradReducer::start_fused() {
  start_blocks();
  fused_ = true;
}

void GradReducer::start_blocks() {
  block_threads_ = std::max(1, omp_get_max_threads());
  blocks_ = space_.allocate(fused_block_bytes(layout_, block_threads_),
                            "the fused update's blocks of gradients");
  block_srcs_.assign(std::size_t(block_threads_) * std::size_t(nranks_), nullptr);
  iov_.resize(std::size_t(block_threads_));
  if (peer_read_)
    slices_ = space_.allocate(fused_slice_bytes(block_threads_, nranks_, dtype_),
                              "the fused update's slices of every rank's gradients");
}

// Every rank's gradient addresses, then one element read from each other
// rank's gradients: where the kernel refuses (a container's seccomp filter,
// Yama's ptrace_scope, a process that is not dumpable), the fused step is
// off on every rank, with a warning.
void GradReducer::read_peer_grads() {
  const std::size_t np = params_.size();
  std::vector<std::int64_t> mine(np), all(np * std::size_t(nranks_));
  for (std::size_t i = 0; i < np; ++i)
    mine[i] = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(grad_ptr_[i]));
  ctl_.allgather(mine.data(), all.data(), np, DType::i64);
  peer_grads_.assign(all.begin(), all.end());
  std::size_t first = 0;
  while (first < np && params_[first].numel == 0) ++first;
  std::string error;
  peer_reader_ = node_access(comm_)->peer_reader(first < np ? grad_ptr_[first] : nullptr,
                                                 first < np ? elem_ : 0, error);
  if (peer_reader_ == nullptr) {
    if (rank_ == 0)
      SHARDOPT_LOG(warn, "ZeRO stage 2: the fused update is off on every rank: "
                             << error << " (SHARDOPT_FUSED_UPDATE=0 turns it off quietly)");
    return;
  }
  peer_read_ = true;
  start_fused();
  SHARDOPT_LOG(info,
               "ZeRO stage 2: fused reduce-scatter + update, each rank reading the "
               "others' gradient slices from their buffers (process_vm_readv)");
}

// Flat elements [f0, f0 + n) of rank q's gradients, contiguous: where they
// are (this rank's, inside one parameter) or in thread t's slice of q
// (padding as zeros). Throws if another rank's memory cannot be read.
const std::byte* GradReducer::slice_of(int q, std::size_t f0, std::size_t n, int t) const {
  const std::size_t np = params_.size();
  // The parameters from the one holding f0 on (flat offsets ascend).
  std::size_t p = static_cast<std::size_t>(
      std::upper_bound(layout_.flat.begin(), layout_.flat.end(), f0) - layout_.flat.begin());
  p = p > 0 ? p - 1 : 0;
  if (q == rank_ && p < np && layout_.flat[p] + params_[p].numel >= f0 + n)
    return grad_ptr_[p] + (f0 - layout_.flat[p]) * elem_;
  std::byte* out = slices_.as<std::byte>() +
                   (std::size_t(t) * std::size_t(nranks_) + std::size_t(q)) * kBlock * elem_;
  std::vector<iovec>& local = iov_[std::size_t(t)].first;
  std::vector<iovec>& remote = iov_[std::size_t(t)].second;
  local.clear();
  remote.clear();
  std::size_t covered = f0;
  for (; p < np && layout_.flat[p] < f0 + n; ++p) {
    const auto [s, e] = overlap(p, f0, f0 + n);
    if (s >= e) continue;
    std::byte* dst = out + (s - f0) * elem_;
    const std::size_t from = (s - layout_.flat[p]) * elem_, bytes = (e - s) * elem_;
    if (q == rank_) {
      std::memcpy(dst, grad_ptr_[p] + from, bytes);
    } else {
      local.push_back({dst, bytes});
      remote.push_back(
          {reinterpret_cast<void*>(peer_grads_[std::size_t(q) * np + p] + from), bytes});
    }
    covered = e;
  }
  // Past the last parameter: the bucket's padding.
  if (covered < f0 + n) std::memset(out + (covered - f0) * elem_, 0, (f0 + n - covered) * elem_);
  if (!local.empty() && !peer_reader_->read(q, local, remote))
    throw PeerReadError("ZeRO stage 2, fused update: reading rank " + std::to_string(q) +
                        "'s gradients (process_vm_readv) failed: " + std::strerror(errno));
  return out;
}

void GradReducer::node_barrier(const char* what) {
  watch_(what, SIZE_MAX, false);
  comm_.barrier();
}

void GradReducer::reduce_block(std::size_t storage, std::size_t count, float* out, int t) const {
  const void** srcs = block_srcs_.data() + std::size_t(t) * std::size_t(nranks_);
  std::byte* scratch = blocks_.as<std::byte>() + (std::size_t(block_threads_) + std::size_t(t)) *
                                                     fused_block_elements(layout_) * 4;
  const float* shard = grad_shard_.as<float>();
  // The bucket holding `storage`: the last starting at or before it.
  auto it = std::upper_bound(buckets_.begin(), buckets_.end(), storage,
                             [](std::size_t v, const Bucket& b) { return v < b.shard_offset; });
  for (std::size_t done = 0; done < count; ++it) {
    const Bucket& b = *(it - 1);
    const std::size_t bi = static_cast<std::size_t>(it - 1 - buckets_.begin());
    const std::size_t pc = piece(b), lo = storage + done - b.shard_offset;
    const std::size_t n = std::min(count - done, pc - lo);
    const std::size_t f0 = b.begin + std::size_t(rank_) * pc + lo;
    float* dst = out + done;
    if (holding_ && bi >= hold_) {  // reduced into the shard already
      const float* reduced = shard + storage + done;
      if (reduced != dst) std::memcpy(dst, reduced, n * 4);
      done += n;
      continue;
    }
    const std::size_t rsize = dtype_size(reduce_type_);
    for (int q = 0; q < nranks_; ++q)
      srcs[q] = holding_     ? held_of(q, bi) + (f0 - b.begin) * rsize
                : peer_read_ ? slice_of(q, f0, n, t)
                             : peers_[std::size_t(q)] + f0 * elem_;
    // As complete(): the piece reduced in rank order (reduce_arrays, as the
    // shm reduce-scatter), then converted into the shard or added to what
    // the earlier micro-batches left there.
    if (!pending_accumulate_ && reduce_type_ == DType::f32) {
      kernels::cpu::reduce_arrays(reduce_type_, ReduceOp::sum, srcs, nranks_, dst, n);
    } else {
      kernels::cpu::reduce_arrays(reduce_type_, ReduceOp::sum, srcs, nranks_, scratch, n);
      if (!pending_accumulate_) {
        space_.convert(scratch, reduce_type_, dst, DType::f32, n, 1.0f);
      } else {
        const float* acc = shard + storage + done;
        if (acc != dst) std::memcpy(dst, acc, n * 4);
        space_.accumulate(scratch, reduce_type_, dst, n);
      }
    }
    done += n;
  }
}

void GradReducer::materialize() {
  if (!pending_) return;
  watch_("reducing the shared gradients into the gradient shard", SIZE_MAX, false);
  std::vector<std::pair<std::size_t, std::size_t>> blocks;  // storage, count
  for (std::size_t bi = 0; bi < (holding_ ? hold_ : buckets_.size()); ++bi) {
    const Bucket& b = buckets_[bi];
    for (std::size_t off = 0; off < piece(b); off += kBlock)
      blocks.emplace_back(b.shard_offset + off, std::min(kBlock, piece(b) - off));
  }
  float* shard = grad_shard_.as<float>();
  const long nb = static_cast<long>(blocks.size());
  std::string error;
#pragma omp parallel for schedule(static) num_threads(block_threads_) if (nb > 1)
  for (long k = 0; k < nb; ++k) {
    const auto [at, n] = blocks[std::size_t(k)];
    try {
      reduce_block(at, n, shard + at, omp_get_thread_num());
    } catch (const PeerReadError& e) {
#pragma omp critical(shardopt_fused_materialize)
      if (error.empty()) error = e.what();
    }
  }
  end_fused("the fused reduction: every rank has read the others' gradients", error);
}

void GradReducer::release_fused(const std::string& error) {
  if (!pending_) return;
  end_fused("the fused update: every rank has read the others' gradients", error);
}

void GradReducer::end_fused(const char* what, const std::string& error) {
  watch_(what, SIZE_MAX, false);
  pending_ = false;
  release_held();  // every rank is past the agreement below before any refills them
  agree_or_throw(ctl_, error, ErrorCode::mpi,
                 "a rank of this node ended, unmapped or protected its gradient buffers during "
                 "the step: end the job (SHARDOPT_FUSED_UPDATE=0 reduces through the "
                 "communicator instead)");
}

void GradReducer::release_held() noexcept {
  if (!holding_) return;
  holding_ = false;
  for (std::size_t b = 0; b < hold_; ++b) {
    if (buckets_[b].staging >= 0) pool_busy_[std::size_t(buckets_[b].staging)] = false;
    buckets_[b].staging = -1;
  }
}

std::byte* GradReducer::pool_part(int q) const noexcept { return shared_pool_->part(q); }

bool GradReducer::prepare_held() {
  const std::size_t rsize = dtype_size(reduce_type_);
  std::byte* header = pool_part(rank_);
  bool shared = true;
  for (std::size_t b = 0; b < hold_; ++b) {
    Bucket& k = buckets_[b];
    if (k.staging < 0) {  // nothing streamed into it
      k.staging = acquire_pool();
      std::byte* buf = pool_[std::size_t(k.staging)].as<std::byte>();
      space_.zero(buf + k.len * rsize, (k.padded - k.len) * rsize);
    }
    pack_grads(b, pool_[std::size_t(k.staging)].as<std::byte>());
    shared = shared && k.staging < 2;
    const std::int32_t slot = k.staging;
    std::memcpy(header + b * sizeof slot, &slot, sizeof slot);
  }
  return shared;
}

void GradReducer::find_held() {
  for (int q = 0; q < nranks_; ++q) {
    const std::byte* base = pool_part(q);
    for (std::size_t b = 0; b < hold_; ++b) {
      std::int32_t slot = 0;
      std::memcpy(&slot, base + b * sizeof slot, sizeof slot);
      held_src_[std::size_t(q) * hold_ + b] = base + kPage + std::size_t(slot) * pool_stride_;
    }
  }
}

}  // namespace shardopt::detail
