// Flash attention forward and backward, batch (BSHD) and varlen (packed THD), over AITER's C++ MHA API
// (aiter::mha_fwd / aiter::mha_bwd from libmha_fwd.so / libmha_bwd.so, built by scripts/build-aiter.sh).
// AITER picks its ASM v3 kernels where they fit and Composable Kernel otherwise. Compiled only where the
// AITER submodule is present: the argument structs come from its headers (csrc/include/mha_{fwd,bwd}.h).
//
// Operand layouts (docs/aiter-bridge.md, "Attention"): q [B, Sq, Hq, D], k [B, Sk, Hk, D], v [B, Sk, Hk, Dv],
// out [B, Sq, Hq, Dv], lse float32 [B, Hq, Sq]; varlen: q [Tq, Hq, D], k/v [Tk, Hk, D/Dv], int32
// cu_seqlens_q/k [B+1], lse float32 [Hq, Tq]. The window is (left, right) aligned bottom-right, -1 unbounded.
// The backward pass writes dK/dV per query head ([.., Hq, ..]); the caller sums each group of Hq/Hk heads.

#include <hip/hip_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "asm_launcher.h"
#include "handler.h"
#include "mha_bwd.h"
#include "mha_fwd.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_aiter::aiter {
namespace {

// AITER's MHA libraries find their ASM code objects through AITER_ASM_DIR (<dir>/<arch>/<code object>).
// Point it at the assets installed beside this library unless the user chose a directory.
[[maybe_unused]] const bool kAsmDirSet = [] {
  const std::string dir = asset_dir() + "/hsa";
  return setenv("AITER_ASM_DIR", dir.c_str(), /*overwrite=*/0) == 0;
}();

// Round-to-nearest-even for the v3 kernels' bf16 conversions: the contract's rounding (AITER's other modes,
// round-half-away and truncation, are faster and differ in the last bit).
constexpr int kBf16RoundNearestEven = 0;

std::string data_type_name(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::BF16: return "bf16";
    case ffi::DataType::F16: return "fp16";
    default: return "";
  }
}

// AITER's mask encoding: 0 none, 2 bottom-right aligned window (left/right, -1 unbounded). A side at least as
// wide as every sequence allows is no bound: passing -1 there lets AITER take its unmasked kernels.
struct Mask {
  int type = 0;
  int left = -1;
  int right = -1;
};

Mask make_mask(int left, int right, int64_t max_seqlen_q, int64_t max_seqlen_k) {
  if (left >= max_seqlen_k - 1) left = -1;
  if (right >= max_seqlen_q - 1) right = -1;
  if (left < 0 && right < 0) return Mask{};
  return Mask{2, left, right};
}

// Sizes shared by all four entry points, read from the operands' shapes.
struct Dims {
  bool varlen = false;
  int64_t batch = 0, seqlen_q = 0, seqlen_k = 0, max_seqlen_q = 0, max_seqlen_k = 0;
  int64_t heads_q = 0, heads_k = 0, head_dim_q = 0, head_dim_v = 0;
};

ffi::Error read_dims(const char* op, const ffi::AnyBuffer& q, const ffi::AnyBuffer& k, const ffi::AnyBuffer& v,
                     const ffi::AnyBuffer* cu_seqlens_q, const ffi::AnyBuffer* cu_seqlens_k, int64_t max_seqlen_q,
                     int64_t max_seqlen_k, Dims* d) {
  const auto qd = q.dimensions();
  const auto kd = k.dimensions();
  const auto vd = v.dimensions();
  d->varlen = cu_seqlens_q != nullptr;
  const size_t rank = d->varlen ? 3 : 4;
  if (qd.size() != rank || kd.size() != rank || vd.size() != rank)
    return invalid(op, d->varlen ? "q, k and v must be [T, H, D]" : "q, k and v must be [B, S, H, D]");
  if (data_type_name(q.element_type()).empty()) return invalid(op, "q must be bfloat16 or float16");
  if (k.element_type() != q.element_type() || v.element_type() != q.element_type())
    return invalid(op, "q, k and v must have one dtype");
  const size_t o = d->varlen ? 0 : 1;  // offset of the sequence axis
  d->seqlen_q = qd[o];
  d->seqlen_k = kd[o];
  d->heads_q = qd[o + 1];
  d->heads_k = kd[o + 1];
  d->head_dim_q = qd[o + 2];
  d->head_dim_v = vd[o + 2];
  if (kd[o + 2] != d->head_dim_q || vd[o] != d->seqlen_k || vd[o + 1] != d->heads_k)
    return invalid(op, "k must match q's head dim and v k's sequence and head counts");
  if (d->heads_k == 0 || d->heads_q % d->heads_k != 0) return invalid(op, "Hq must be a multiple of Hk");
  if (d->varlen) {
    const auto cq = cu_seqlens_q->dimensions();
    const auto ck = cu_seqlens_k->dimensions();
    if (cu_seqlens_q->element_type() != ffi::DataType::S32 || cu_seqlens_k->element_type() != ffi::DataType::S32 ||
        cq.size() != 1 || ck.size() != 1 || cq[0] != ck[0] || cq[0] < 1)
      return invalid(op, "cu_seqlens_q and cu_seqlens_k must be int32 [B+1]");
    d->batch = cq[0] - 1;
    d->max_seqlen_q = max_seqlen_q;
    d->max_seqlen_k = max_seqlen_k;
  } else {
    d->batch = qd[0];
    if (kd[0] != d->batch || vd[0] != d->batch) return invalid(op, "q, k and v must have one batch size");
    d->max_seqlen_q = d->seqlen_q;
    d->max_seqlen_k = d->seqlen_k;
  }
  return ffi::Error::Success();
}

// Element strides of a [B, S, H, D] (or [T, H, D]) tensor: per sequence position, per head, per batch entry.
struct Strides {
  int64_t row = 0, head = 0, batch = 0;
};
Strides bshd(const Dims& d, int64_t seqlen, int64_t heads, int64_t dim) {
  return Strides{heads * dim, dim, d.varlen ? 0 : seqlen * heads * dim};
}

// The float32 per-row statistics (lse, and the backward's D = rowsum(dO * O)): [B, Hq, Sq] or [Hq, Tq].
Strides lse_strides(const Dims& d) { return Strides{1, d.seqlen_q, d.varlen ? 0 : d.heads_q * d.seqlen_q}; }

int32_t i32(int64_t x) { return static_cast<int32_t>(x); }

// Pinned host blocks for mha_bwd's group-mode pipeline (mha_bwd_args::pinned_host_alloc). AITER keeps each
// block's shared_ptr alive until the stream has passed every use, so the deleter marks the block reusable.
// The pool is never destroyed: deleters may run from HIP callbacks during process exit.
class PinnedHostPool {
 public:
  std::shared_ptr<void> acquire(size_t bytes) {
    bytes = bytes == 0 ? 1 : bytes;
    std::unique_lock<std::mutex> lock(mutex_);
    for (size_t i = 0; i < free_.size(); ++i) {
      if (free_[i].second >= bytes) {
        const Block block = free_[i];
        free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
        return wrap(block);
      }
    }
    lock.unlock();
    void* ptr = nullptr;
    if (hipHostMalloc(&ptr, bytes, hipHostMallocDefault) != hipSuccess) return nullptr;
    return wrap(Block{ptr, bytes});
  }

 private:
  using Block = std::pair<void*, size_t>;
  std::shared_ptr<void> wrap(Block block) {
    return std::shared_ptr<void>(block.first, [this, block](void*) {
      std::lock_guard<std::mutex> lock(mutex_);
      free_.push_back(block);
    });
  }
  std::mutex mutex_;
  std::vector<Block> free_;
};

PinnedHostPool& pinned_host_pool() {
  static PinnedHostPool* pool = new PinnedHostPool();
  return *pool;
}

// lse of a token in no sequence (varlen) is -inf.
ffi::Error fill_minus_inf(const char* op, ffi::Result<ffi::Buffer<ffi::F32>>& lse, hipStream_t stream) {
  const float minus_inf = -std::numeric_limits<float>::infinity();
  int32_t bits = 0;
  std::memcpy(&bits, &minus_inf, sizeof(bits));
  const std::string err = hip_status(
      hipMemsetD32Async(reinterpret_cast<hipDeviceptr_t>(lse->typed_data()), bits, lse->element_count(), stream),
      "hipMemsetD32Async");
  return err.empty() ? ffi::Error::Success() : internal(op, err);
}

ffi::Error MhaForward(const char* op, hipStream_t stream, int32_t device, ffi::AnyBuffer q, ffi::AnyBuffer k,
                      ffi::AnyBuffer v, const ffi::AnyBuffer* cu_seqlens_q, const ffi::AnyBuffer* cu_seqlens_k,
                      float softmax_scale, int32_t window_left, int32_t window_right, int64_t max_seqlen_q,
                      int64_t max_seqlen_k, ffi::Result<ffi::AnyBuffer>& out,
                      ffi::Result<ffi::Buffer<ffi::F32>>& lse) {
  Dims d;
  if (ffi::Error err = read_dims(op, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, &d);
      err.failure())
    return err;
  if (out->element_type() != q.element_type() ||
      out->element_count() != static_cast<size_t>(d.varlen ? 1 : d.batch) * d.seqlen_q * d.heads_q * d.head_dim_v)
    return invalid(op, "out must have q's dtype and [.., Sq, Hq, Dv] elements");
  if (lse->element_count() != static_cast<size_t>(d.varlen ? 1 : d.batch) * d.heads_q * d.seqlen_q)
    return invalid(op, "lse must hold one float32 per query row and head");
  ScopedDevice scoped(device);
  if (!scoped.error().empty()) return internal(op, scoped.error());
  if (d.varlen || d.seqlen_k == 0) {
    // Tokens past the last offset belong to no sequence and a query without keys sees nothing: AITER leaves
    // them alone, the contract wants out 0 and lse -inf.
    if (ffi::Error err = zero_async(op, out->untyped_data(), out->size_bytes(), stream); err.failure()) return err;
    if (ffi::Error err = fill_minus_inf(op, lse, stream); err.failure()) return err;
  }
  if (d.batch == 0 || d.seqlen_q == 0 || d.seqlen_k == 0) return ffi::Error::Success();

  const Mask mask = make_mask(window_left, window_right, d.max_seqlen_q, d.max_seqlen_k);
  const Strides sq = bshd(d, d.seqlen_q, d.heads_q, d.head_dim_q);
  const Strides sk = bshd(d, d.seqlen_k, d.heads_k, d.head_dim_q);
  const Strides sv = bshd(d, d.seqlen_k, d.heads_k, d.head_dim_v);
  const Strides so = bshd(d, d.seqlen_q, d.heads_q, d.head_dim_v);
  const Strides sl = lse_strides(d);

  // Value-initialized: every field not set below (descales, sinks, dropout, bias, padding arrays) is zero/null.
  ::aiter::mha_fwd_args args{};
  args.use_asm_v3 = true;
  args.v3_api_check = false;
  args.how_v3_bf16_cvt = kBf16RoundNearestEven;
  args.data_type = data_type_name(q.element_type());
  args.is_group_mode = d.varlen;
  args.bias_type = 0;
  args.has_lse = true;
  args.qscale_type = 0;
  args.q_ptr = q.untyped_data();
  args.k_ptr = k.untyped_data();
  args.v_ptr = v.untyped_data();
  args.lse_ptr = lse->untyped_data();
  args.o_ptr = out->untyped_data();
  if (d.varlen) {
    args.seqstart_q_ptr = cu_seqlens_q->untyped_data();
    args.seqstart_k_ptr = cu_seqlens_k->untyped_data();
  }
  args.seqlen_q = i32(d.seqlen_q);
  args.seqlen_k = i32(d.seqlen_k);
  args.batch = i32(d.batch);
  args.max_seqlen_q = i32(d.max_seqlen_q);
  args.hdim_q = i32(d.head_dim_q);
  args.hdim_v = i32(d.head_dim_v);
  args.nhead_q = i32(d.heads_q);
  args.nhead_k = i32(d.heads_k);
  args.scale_s = softmax_scale;
  args.logits_soft_cap = 0.0f;
  args.stride_q = i32(sq.row);
  args.stride_k = i32(sk.row);
  args.stride_v = i32(sv.row);
  args.stride_o = i32(so.row);
  args.nhead_stride_q = i32(sq.head);
  args.nhead_stride_k = i32(sk.head);
  args.nhead_stride_v = i32(sv.head);
  args.nhead_stride_lse = i32(sl.head);
  args.nhead_stride_o = i32(so.head);
  args.batch_stride_q = i32(sq.batch);
  args.batch_stride_k = i32(sk.batch);
  args.batch_stride_v = i32(sv.batch);
  args.batch_stride_lse = i32(sl.batch);
  args.batch_stride_o = i32(so.batch);
  args.window_size_left = mask.left;
  args.window_size_right = mask.right;
  args.mask_type = mask.type;
  args.p_drop = 0.0f;
  args.s_randval = false;
  args.drop_seed_offset = std::pair<uint64_t, uint64_t>{0, 0};

  float status = -1.0f;
  try {
    status = ::aiter::mha_fwd(args, ck_tile::stream_config{stream});
  } catch (const std::exception& e) {
    return internal(op, std::string("aiter::mha_fwd: ") + e.what());
  }
  if (status < 0) return invalid(op, "AITER has no forward kernel for this configuration");
  return ffi::Error::Success();
}

ffi::Error MhaBackward(const char* op, hipStream_t stream, int32_t device, ffi::ScratchAllocator& scratch,
                       ffi::AnyBuffer dout, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer out,
                       ffi::Buffer<ffi::F32> lse, const ffi::AnyBuffer* cu_seqlens_q,
                       const ffi::AnyBuffer* cu_seqlens_k, float softmax_scale, int32_t window_left,
                       int32_t window_right, bool deterministic, int64_t max_seqlen_q, int64_t max_seqlen_k,
                       ffi::Result<ffi::AnyBuffer>& dq, ffi::Result<ffi::AnyBuffer>& dk_per_q_head,
                       ffi::Result<ffi::AnyBuffer>& dv_per_q_head, ffi::Result<ffi::Buffer<ffi::F32>>& softmax_d) {
  Dims d;
  if (ffi::Error err = read_dims(op, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, &d);
      err.failure())
    return err;
  const size_t b = d.varlen ? 1 : static_cast<size_t>(d.batch);
  const size_t q_rows = b * d.seqlen_q * d.heads_q, k_rows = b * d.seqlen_k * d.heads_q;
  if (dout.element_type() != q.element_type() || out.element_type() != q.element_type() ||
      dout.element_count() != q_rows * d.head_dim_v || out.element_count() != q_rows * d.head_dim_v)
    return invalid(op, "dout and out must be [.., Sq, Hq, Dv] in q's dtype");
  if (lse.element_count() != q_rows || softmax_d->element_count() != q_rows)
    return invalid(op, "lse and softmax_d must hold one float32 per query row and head");
  if (dq->element_count() != q_rows * d.head_dim_q || dk_per_q_head->element_count() != k_rows * d.head_dim_q ||
      dv_per_q_head->element_count() != k_rows * d.head_dim_v)
    return invalid(op, "dq must be q's shape, dk and dv [.., Sk, Hq, D] (one slot per query head)");
  ScopedDevice scoped(device);
  if (!scoped.error().empty()) return internal(op, scoped.error());
  if (d.varlen) {
    // Tokens in no sequence get no gradient: AITER does not write them.
    for (auto* r : {&dq, &dk_per_q_head, &dv_per_q_head})
      if (ffi::Error err = zero_async(op, (*r)->untyped_data(), (*r)->size_bytes(), stream); err.failure()) return err;
  }
  if (d.batch == 0 || d.seqlen_q == 0 || d.seqlen_k == 0) {
    if (!d.varlen)
      for (auto* r : {&dq, &dk_per_q_head, &dv_per_q_head})
        if (ffi::Error err = zero_async(op, (*r)->untyped_data(), (*r)->size_bytes(), stream); err.failure())
          return err;
    return ffi::Error::Success();
  }

  const Mask mask = make_mask(window_left, window_right, d.max_seqlen_q, d.max_seqlen_k);
  const Strides sq = bshd(d, d.seqlen_q, d.heads_q, d.head_dim_q);
  const Strides sk = bshd(d, d.seqlen_k, d.heads_k, d.head_dim_q);
  const Strides sv = bshd(d, d.seqlen_k, d.heads_k, d.head_dim_v);
  const Strides so = bshd(d, d.seqlen_q, d.heads_q, d.head_dim_v);
  const Strides sdk = bshd(d, d.seqlen_k, d.heads_q, d.head_dim_q);
  const Strides sdv = bshd(d, d.seqlen_k, d.heads_q, d.head_dim_v);
  const Strides sl = lse_strides(d);

  std::string alloc_error;
  ::aiter::mha_bwd_args args{};
  args.use_asm_v3 = true;
  args.v3_atomic_fp32 = true;
  args.v3_bf16_cvt = kBf16RoundNearestEven;
  args.v3_api_check = false;
  args.hdim_q = i32(d.head_dim_q);
  args.hdim_v = i32(d.head_dim_v);
  args.data_type = data_type_name(q.element_type());
  args.is_group_mode = d.varlen;
  args.mask_type = mask.type;
  args.bias_type = 0;
  args.has_dbias = false;
  args.has_dropout = false;
  args.is_store_randval = false;
  args.is_deterministic = deterministic;
  args.q_ptr = q.untyped_data();
  args.k_ptr = k.untyped_data();
  args.v_ptr = v.untyped_data();
  args.o_ptr = out.untyped_data();
  args.lse_ptr = lse.typed_data();
  args.do_ptr = dout.untyped_data();
  args.d_ptr = softmax_d->typed_data();
  args.dq_ptr = dq->untyped_data();
  args.dk_ptr = dk_per_q_head->untyped_data();
  args.dv_ptr = dv_per_q_head->untyped_data();
  if (d.varlen) {
    args.seqstart_q_ptr = cu_seqlens_q->untyped_data();
    args.seqstart_k_ptr = cu_seqlens_k->untyped_data();
  }
  args.seqlen_q = i32(d.seqlen_q);
  args.seqlen_k = i32(d.seqlen_k);
  args.batch = i32(d.batch);
  args.max_seqlen_q = i32(d.max_seqlen_q);
  args.max_seqlen_k = i32(d.max_seqlen_k);
  args.nhead_q = i32(d.heads_q);
  args.nhead_k = i32(d.heads_k);
  args.scale = softmax_scale;
  args.stride_q = i32(sq.row);
  args.stride_k = i32(sk.row);
  args.stride_v = i32(sv.row);
  args.stride_o = i32(so.row);
  args.stride_do = i32(so.row);
  args.stride_dq = i32(sq.row);
  args.stride_dk = i32(sdk.row);
  args.stride_dv = i32(sdv.row);
  args.nhead_stride_q = i32(sq.head);
  args.nhead_stride_k = i32(sk.head);
  args.nhead_stride_v = i32(sv.head);
  args.nhead_stride_o = i32(so.head);
  args.nhead_stride_do = i32(so.head);
  args.nhead_stride_lsed = i32(sl.head);
  args.nhead_stride_dq = i32(sq.head);
  args.nhead_stride_dk = i32(sdk.head);
  args.nhead_stride_dv = i32(sdv.head);
  args.batch_stride_q = i32(sq.batch);
  args.batch_stride_k = i32(sk.batch);
  args.batch_stride_v = i32(sv.batch);
  args.batch_stride_o = i32(so.batch);
  args.batch_stride_do = i32(so.batch);
  args.batch_stride_lsed = i32(sl.batch);
  args.batch_stride_dq = i32(sq.batch);
  args.batch_stride_dk = i32(sdk.batch);
  args.batch_stride_dv = i32(sdv.batch);
  args.window_size_left = mask.left;
  args.window_size_right = mask.right;
  args.p_drop = 0.0f;
  args.p_undrop = 1.0f;
  args.drop_seed_offset = std::pair<uint64_t, uint64_t>{0, 0};
  // AITER sizes its own workspaces (dq accumulators, ...) and asks for memory here: XLA's scratch allocator,
  // which keeps it until this handler returns and reuses it only after this stream's work (stream order).
  // At e4048607 mha_bwd asks for its CK workspace unconditionally, possibly 0 bytes: no allocation then.
  args.workspace_alloc = [&](size_t bytes, bool zero_init) -> void* {
    if (bytes == 0) return nullptr;
    std::optional<void*> ptr = scratch.Allocate(bytes, 256);
    if (!ptr.has_value()) {
      alloc_error = "XLA could not allocate " + std::to_string(bytes) + " bytes of scratch";
      return nullptr;
    }
    if (zero_init && hipMemsetAsync(*ptr, 0, bytes, stream) != hipSuccess) alloc_error = "hipMemsetAsync failed";
    return *ptr;
  };
  args.pinned_host_alloc = [](size_t bytes) { return pinned_host_pool().acquire(bytes); };

  float status = -1.0f;
  try {
    status = ::aiter::mha_bwd(args, ck_tile::stream_config{stream});
  } catch (const std::exception& e) {
    return internal(op, std::string("aiter::mha_bwd: ") + e.what());
  }
  if (!alloc_error.empty()) return internal(op, alloc_error);
  if (status < 0) return invalid(op, "AITER has no backward kernel for this configuration");
  return ffi::Error::Success();
}

ffi::Error Fwd(hipStream_t stream, int32_t device, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
               float softmax_scale, int32_t window_left, int32_t window_right, ffi::Result<ffi::AnyBuffer> out,
               ffi::Result<ffi::Buffer<ffi::F32>> lse) {
  return MhaForward("ja_aiter_mha_fwd", stream, device, q, k, v, nullptr, nullptr, softmax_scale, window_left,
                    window_right, 0, 0, out, lse);
}

ffi::Error VarlenFwd(hipStream_t stream, int32_t device, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                     ffi::AnyBuffer cu_seqlens_q, ffi::AnyBuffer cu_seqlens_k, float softmax_scale, int32_t window_left,
                     int32_t window_right, int32_t max_seqlen_q, int32_t max_seqlen_k,
                     ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::Buffer<ffi::F32>> lse) {
  return MhaForward("ja_aiter_mha_varlen_fwd", stream, device, q, k, v, &cu_seqlens_q, &cu_seqlens_k, softmax_scale,
                    window_left, window_right, max_seqlen_q, max_seqlen_k, out, lse);
}

ffi::Error Bwd(hipStream_t stream, int32_t device, ffi::ScratchAllocator scratch, ffi::AnyBuffer dout,
               ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::Buffer<ffi::F32> lse,
               float softmax_scale, int32_t window_left, int32_t window_right, bool deterministic,
               ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
               ffi::Result<ffi::Buffer<ffi::F32>> softmax_d) {
  return MhaBackward("ja_aiter_mha_bwd", stream, device, scratch, dout, q, k, v, out, lse, nullptr, nullptr,
                     softmax_scale, window_left, window_right, deterministic, 0, 0, dq, dk, dv, softmax_d);
}

ffi::Error VarlenBwd(hipStream_t stream, int32_t device, ffi::ScratchAllocator scratch, ffi::AnyBuffer dout,
                     ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer out,
                     ffi::Buffer<ffi::F32> lse, ffi::AnyBuffer cu_seqlens_q, ffi::AnyBuffer cu_seqlens_k,
                     float softmax_scale, int32_t window_left, int32_t window_right, bool deterministic,
                     int32_t max_seqlen_q, int32_t max_seqlen_k, ffi::Result<ffi::AnyBuffer> dq,
                     ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
                     ffi::Result<ffi::Buffer<ffi::F32>> softmax_d) {
  return MhaBackward("ja_aiter_mha_varlen_bwd", stream, device, scratch, dout, q, k, v, out, lse, &cu_seqlens_q,
                     &cu_seqlens_k, softmax_scale, window_left, window_right, deterministic, max_seqlen_q,
                     max_seqlen_k, dq, dk, dv, softmax_d);
}

}  // namespace
}  // namespace jax_aiter::aiter

namespace {
namespace xffi = xla::ffi;

auto Common() {
  return xffi::Ffi::Bind().Ctx<xffi::PlatformStream<hipStream_t>>().Ctx<xffi::DeviceOrdinal>();
}
}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaAiterMhaFwd, jax_aiter::aiter::Fwd,
                              Common()
                                  .Arg<xffi::AnyBuffer>()  // q
                                  .Arg<xffi::AnyBuffer>()  // k
                                  .Arg<xffi::AnyBuffer>()  // v
                                  .Attr<float>("softmax_scale")
                                  .Attr<int32_t>("window_left")
                                  .Attr<int32_t>("window_right")
                                  .Ret<xffi::AnyBuffer>()                // out
                                  .Ret<xffi::Buffer<xffi::F32>>());      // lse

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaAiterMhaVarlenFwd, jax_aiter::aiter::VarlenFwd,
                              Common()
                                  .Arg<xffi::AnyBuffer>()  // q
                                  .Arg<xffi::AnyBuffer>()  // k
                                  .Arg<xffi::AnyBuffer>()  // v
                                  .Arg<xffi::AnyBuffer>()  // cu_seqlens_q
                                  .Arg<xffi::AnyBuffer>()  // cu_seqlens_k
                                  .Attr<float>("softmax_scale")
                                  .Attr<int32_t>("window_left")
                                  .Attr<int32_t>("window_right")
                                  .Attr<int32_t>("max_seqlen_q")
                                  .Attr<int32_t>("max_seqlen_k")
                                  .Ret<xffi::AnyBuffer>()            // out
                                  .Ret<xffi::Buffer<xffi::F32>>());  // lse

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaAiterMhaBwd, jax_aiter::aiter::Bwd,
                              Common()
                                  .Ctx<xffi::ScratchAllocator>()
                                  .Arg<xffi::AnyBuffer>()            // dout
                                  .Arg<xffi::AnyBuffer>()            // q
                                  .Arg<xffi::AnyBuffer>()            // k
                                  .Arg<xffi::AnyBuffer>()            // v
                                  .Arg<xffi::AnyBuffer>()            // out
                                  .Arg<xffi::Buffer<xffi::F32>>()    // lse
                                  .Attr<float>("softmax_scale")
                                  .Attr<int32_t>("window_left")
                                  .Attr<int32_t>("window_right")
                                  .Attr<bool>("deterministic")
                                  .Ret<xffi::AnyBuffer>()            // dq
                                  .Ret<xffi::AnyBuffer>()            // dk per query head
                                  .Ret<xffi::AnyBuffer>()            // dv per query head
                                  .Ret<xffi::Buffer<xffi::F32>>());  // softmax_d workspace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaAiterMhaVarlenBwd, jax_aiter::aiter::VarlenBwd,
                              Common()
                                  .Ctx<xffi::ScratchAllocator>()
                                  .Arg<xffi::AnyBuffer>()            // dout
                                  .Arg<xffi::AnyBuffer>()            // q
                                  .Arg<xffi::AnyBuffer>()            // k
                                  .Arg<xffi::AnyBuffer>()            // v
                                  .Arg<xffi::AnyBuffer>()            // out
                                  .Arg<xffi::Buffer<xffi::F32>>()    // lse
                                  .Arg<xffi::AnyBuffer>()            // cu_seqlens_q
                                  .Arg<xffi::AnyBuffer>()            // cu_seqlens_k
                                  .Attr<float>("softmax_scale")
                                  .Attr<int32_t>("window_left")
                                  .Attr<int32_t>("window_right")
                                  .Attr<bool>("deterministic")
                                  .Attr<int32_t>("max_seqlen_q")
                                  .Attr<int32_t>("max_seqlen_k")
                                  .Ret<xffi::AnyBuffer>()            // dq
                                  .Ret<xffi::AnyBuffer>()            // dk per query head
                                  .Ret<xffi::AnyBuffer>()            // dv per query head
                                  .Ret<xffi::Buffer<xffi::F32>>());  // softmax_d workspace
